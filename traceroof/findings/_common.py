"""Helpers shared by the detectors: windows, shares, severity, formatting, interval lists.

Every time figure a detector claims is a union or a difference of unions of device
intervals, never a per-stream sum (BC-33). The helpers here work on plain Python lists of
``(start_ns, end_ns)`` pairs for the small sets a detector handles (collectives, copies,
one stream's runs); the big per-op passes stay in polars.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from typing import Any

import polars as pl

from .. import units
from ..frames import done, small
from . import Finding, FindingContext

#: Share of the rank's window (``wall_ns``) a finding must give back to be ``high`` / ``medium``.
HIGH_SHARE = 0.10
MEDIUM_SHARE = 0.03

Interval = tuple[int, int]


def kind_str() -> pl.Expr:
    """The ``kind`` column as a string expression."""
    return pl.col("kind").cast(pl.String)


def by_rank(df: pl.DataFrame) -> list[tuple[int, pl.DataFrame]]:
    """``(rank, rows of that rank)`` in rank order: one pass over ``df``, not one filter per
    rank (hundreds of ranks would make the per-rank filters quadratic)."""
    if df.height == 0:
        return []
    parts = df.partition_by("rank", as_dict=True, maintain_order=True)
    return sorted(((int(k[0]), v) for k, v in parts.items() if k[0] is not None), key=lambda kv: kv[0])


def end_expr() -> pl.Expr:
    """``start_ns + dur_ns`` as the ``end_ns`` column (ns)."""
    return (pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns")


def name_tests(names: pl.Series, patterns: dict[str, str]) -> dict[str, pl.Series]:
    """Per row of ``names``: whether its name contains each regex of ``patterns`` (a Boolean
    Series per key; false for a null name).

    Each regex runs once per distinct name, not once per row (host tables repeat a few hundred
    names across millions of rows). The rows are then matched to the matching names by their
    64-bit hash: an integer ``is_in`` per pattern instead of a string one (several times
    cheaper). Exact: the hashes of the distinct names (a null included) are checked to differ,
    so a row's hash is in a set of hashes only if its name is in the set of names; when two
    distinct names share a hash, the strings are compared instead. Every pattern runs in one
    ``select`` over the distinct names and every ``is_in`` in one over the rows (two frame
    operations, not two per pattern: issue 19, small traces).
    """
    distinct = names.unique()
    hashes = distinct.hash()
    by_hash = hashes.n_unique() == distinct.len()
    rows, keys = (names.hash(), hashes) if by_hash else (names, distinct)
    sets = pl.DataFrame({"name": distinct, "key": keys}).select(
        pl.col("key").filter(pl.col("name").str.contains(p).fill_null(False)).implode().alias(k)
        for k, p in patterns.items()
    )
    hit = pl.DataFrame({"row": rows}).select(
        pl.col("row").is_in(sets[k]).fill_null(False).alias(k) for k in patterns
    )
    return {k: hit[k].alias(names.name) for k in patterns}


def windows(ctx: FindingContext) -> dict[int, tuple[int, int]]:
    """Per rank: ``(first device-op start, last device-op end)`` in ns.

    This is the window every claim of a rank lies in; claims across detectors sum to at most
    its length (BC-33), and severity is the recoverable share of it.
    """
    shared = ctx.shared

    def compute() -> dict[int, tuple[int, int]]:
        # the device order (when an idle detector built it) holds every op's start and end,
        # sorted by rank: a cheaper group-by than the op table's, with the same result
        if shared.device_order is not None:
            d, end = shared.device_order, pl.col("end_ns")
        else:
            d, end = ctx.ops, end_expr()
        w = d.group_by("rank").agg(pl.col("start_ns").min().alias("s"), end.max().alias("e"))
        return {int(r): (int(s), int(e)) for r, s, e in w.iter_rows()}

    return shared.once("windows", compute)


def devices(ctx: FindingContext) -> dict[int, int]:
    """Per rank: how many devices its ops run on (a null device counts as one), computed once
    per context from the first op of each (rank, device) in :func:`device_order`."""
    def compute() -> dict[int, int]:
        firsts = device_order(ctx).filter("new_group")
        return {int(r): int(n) for r, n in firsts.group_by("rank").len().iter_rows()}

    return ctx.shared.once("devices", compute)


def wall_ns(ctx: FindingContext, rank: int) -> int:
    """Device time (ns) of rank ``rank``'s window (see :func:`windows`): its length times the
    number of devices the rank drives, so shares of summed per-device times (busy, idle,
    recoverable) stay ≤ 100 % on hosts with several devices (an XPlane host with 4 TPU chips)."""
    s, e = windows(ctx).get(int(rank), (0, 0))
    return max(e - s, 0) * max(devices(ctx).get(int(rank), 1), 1)


def several_devices(ctx: FindingContext, rank: int) -> bool:
    """Whether rank ``rank`` drives several devices (its idle-type findings are then per device)."""
    return devices(ctx).get(int(rank), 1) > 1


def scopes(ctx: FindingContext, df: pl.DataFrame) -> list[tuple[int, int | None, pl.DataFrame]]:
    """``(rank, device, rows)`` of ``df`` (rows with ``rank`` and ``device``), in rank then device
    order: one scope per rank driving one device (``device`` None: the rank's findings are on
    its only device), one per (rank, device) for a rank driving several (rule 3: a process
    driving several devices is accounted per device; rule 6: a finding's claim is bounded by
    the idle of the device it names)."""
    out: list[tuple[int, int | None, pl.DataFrame]] = []
    for rank, r in by_rank(df):
        if not several_devices(ctx, rank):
            out.append((rank, None, r))
            continue
        parts = r.partition_by("device", as_dict=True, maintain_order=True)
        for (dev,), g in sorted(parts.items(), key=lambda kv: (kv[0][0] is None, kv[0][0] or 0)):
            out.append((rank, None if dev is None else int(dev), g))
    return out


def scope_devices(ctx: FindingContext, df: pl.DataFrame) -> list[tuple[int, int | None, list[int | None]]]:
    """The scopes of :func:`scopes` without their rows: ``(rank, device, devices)`` in the same
    order, ``devices`` being the sorted devices of the scope's rows of ``df`` (the rank's, or
    ``[device]`` for one device of a rank driving several); one ``unique`` of ``(rank,
    device)`` over ``df``, not a partition of it."""
    per: dict[int, set[int | None]] = {}
    for r, d in df.select("rank", "device").unique().iter_rows():
        if r is not None:
            per.setdefault(int(r), set()).add(d)
    out: list[tuple[int, int | None, list[int | None]]] = []
    for rank in sorted(per):
        devs = per[rank]
        if not several_devices(ctx, rank):
            out.append((rank, None, sorted(devs)))  # type: ignore[type-var]
            continue
        for dev in sorted(devs, key=lambda v: (v is None, v or 0)):
            out.append((rank, None if dev is None else int(dev), [dev]))
    return out


def scope_wall_ns(ctx: FindingContext, rank: int, device: int | None) -> int:
    """The device-time (ns) a claim of scope ``(rank, device)`` is a share of: the rank's window
    on that one device (its length) when ``device`` is given, else :func:`wall_ns` (the window
    × the rank's devices)."""
    if device is None:
        return wall_ns(ctx, rank)
    s, e = windows(ctx).get(int(rank), (0, 0))
    return max(e - s, 0)


def device_busy_ns(ctx: FindingContext, rank: int, device: int | None) -> int:
    """Busy time (ns) of one device of a rank: the union of its ops' intervals over all its
    streams, computed once per context for every (rank, device) from :func:`device_order`."""
    def compute() -> dict[tuple[int, int | None], int]:
        d = device_order(ctx)
        grow = pl.col("cover_ns") - pl.max_horizontal("start_ns", "gap_start_ns")
        u = d.group_by("rank", "device").agg(grow.sum().alias("busy"))
        return {(int(r), None if dv is None else int(dv)): int(v) for r, dv, v in u.iter_rows() if r is not None}

    return ctx.shared.once("device_busy", compute).get((int(rank), device), 0)


def device_idle_ns(ctx: FindingContext, rank: int, device: int) -> int:
    """Idle time (ns) of one device of a rank: the rank's window length minus the device's
    busy union (:func:`device_busy_ns`); the most an idle claim on that device can give back."""
    return max(scope_wall_ns(ctx, rank, device) - device_busy_ns(ctx, rank, device), 0)


def scope_evidence(ctx: FindingContext, rank: int, device: int | None) -> dict[str, Any]:
    """The evidence that names a per-device finding's device and bounds its claim: ``device``,
    ``devices_of_rank``, ``device_busy_ns`` and ``device_idle_ns`` (ns); empty for a rank
    with one device."""
    if device is None:
        return {}
    return {"device": device, "devices_of_rank": devices(ctx).get(int(rank), 1),
            "device_busy_ns": device_busy_ns(ctx, rank, device), "device_idle_ns": device_idle_ns(ctx, rank, device)}


def _bounds(d: pl.DataFrame, new_group: str) -> tuple[int, int, int]:
    """``(lowest time, highest time, number of groups)`` of a frame with ``start_ns``/``end_ns``
    and a group-start flag column: the arguments :func:`group_cum_max` needs."""
    lo, hi, groups = d.select(
        pl.min_horizontal(pl.col("start_ns").min(), pl.col("end_ns").min()).alias("lo"),
        pl.max_horizontal(pl.col("start_ns").max(), pl.col("end_ns").max()).alias("hi"),
        pl.col(new_group).sum().alias("n"),
    ).row(0)
    return (0, 0, 0) if lo is None else (int(lo), int(hi), int(groups))


def group_cum_max(value: str, new_group: pl.Expr, lo: int, hi: int, groups: int) -> pl.Expr:
    """Running maximum of the integer column ``value`` within contiguous groups of a frame sorted
    by its group keys (``new_group``: true on each group's first row; ``groups``: how many).

    ``lo``/``hi`` bound the column's values. Trick (exact integer arithmetic): group ``g`` is
    lifted by ``g × span`` with ``span = hi − lo + 1``, so each group's values lie above every
    earlier group's and one global running maximum never looks back across a group boundary
    (a per-group window costs several times more). When ``span × groups`` could overflow
    Int64, the per-group window is used instead; one group needs neither.
    """
    if groups <= 1:
        return pl.col(value).cum_max().alias(value)
    span = hi - lo + 1
    if span * (groups + 1) >= 2**62:
        return pl.col(value).cum_max().over(new_group.cum_sum()).alias(value)
    lift = new_group.cast(pl.Int64).cum_sum() * span
    return ((pl.col(value) - lo + lift).cum_max() - lift + lo).alias(value)


def device_order(ctx: FindingContext) -> pl.DataFrame:
    """The device ops of ``ctx.ops`` in ``(rank, device, start_ns, end_ns)`` order, with
    where the union of the ops so far ends: a narrow integer table, computed once per context.

    Columns: ``op_row`` (UInt32: the op's row in ``ctx.ops``), ``rank``, ``device``, ``start_ns``,
    ``end_ns``, ``new_group`` (first op of its rank/device), ``cover_ns`` (running maximum of
    ``end_ns`` within the rank/device: where the union of this op and all earlier ones ends),
    ``gap_start_ns`` (``cover_ns`` of the previous op of the rank/device; null on its first op)
    and ``gap_ns`` (idle before the op: ``start_ns − gap_start_ns`` when positive, else 0), ns.
    """
    return ctx.shared.once("device_order", lambda: _device_order(ctx.ops))


def _device_order(ops: pl.DataFrame) -> pl.DataFrame:
    """:func:`device_order` of the op table ``ops``."""
    new_group = (
        pl.col("rank").ne_missing(pl.col("rank").shift(1)) | pl.col("device").ne_missing(pl.col("device").shift(1))
    ).fill_null(True)
    d = done(  # (two lazy plans on a small table, :mod:`traceroof.frames`; five eager steps on a large one)
        small(ops).select("rank", "device", "start_ns", end_expr())
        .with_row_index("op_row")
        .sort("rank", "device", "start_ns", "end_ns")
        .with_columns(new_group.alias("new_group"))
    )
    lo, hi, groups = _bounds(d, "new_group")
    gap_start = pl.when(~pl.col("new_group")).then(pl.col("cover_ns").shift(1))
    gap = (pl.col("start_ns") - gap_start).clip(lower_bound=0).fill_null(0)
    return done(small(d).with_columns(group_cum_max("end_ns", pl.col("new_group"), lo, hi, groups).alias("cover_ns"))
                .with_columns(gap_start.alias("gap_start_ns"), gap.alias("gap_ns")))


def busy_ns(ctx: FindingContext, rank: int) -> int:
    """Device busy time of a rank: the union of its device ops' intervals (all streams, summed
    over its devices), ns."""
    def compute() -> dict[int, int]:
        d = device_order(ctx)
        # In start order each op extends the union by ``cover_ns − max(start_ns, previous
        # cover_ns)`` (≥ 0 as durations are ≥ 0): summed, that is the union's length, exactly.
        grow = pl.col("cover_ns") - pl.max_horizontal("start_ns", "gap_start_ns")
        u = d.group_by("rank").agg(grow.sum().alias("busy"))
        return {int(r): int(v) for r, v in u.iter_rows() if r is not None}

    return ctx.shared.once("busy", compute).get(int(rank), 0)


def union_of(df: pl.DataFrame) -> list[Interval]:
    """The merged ``[start_ns, start_ns + dur_ns)`` intervals of an op table, as a Python list
    (computed in polars: fast for large tables)."""
    from .. import intervals as iv

    if df.height == 0:
        return []
    return [(int(a), int(b)) for a, b in iv.union(df.select("start_ns", end_expr())).iter_rows()]


def severity(recoverable_ns: float, wall: float) -> str:
    """``high`` (≥ 10 % of the window), ``medium`` (≥ 3 %) or ``low``."""
    share = recoverable_ns / wall if wall > 0 else 0.0
    if share >= HIGH_SHARE:
        return "high"
    if share >= MEDIUM_SHARE:
        return "medium"
    return "low"


def claim(kind: str, title: str, recoverable_ns: float, wall: float, explanation: str,
          evidence: dict[str, Any], rank: int, steps: list[int] | None = None, **where: Any) -> Finding:
    """A finding of detector ``kind`` that gives back ``recoverable_ns`` (ns) of a rank's
    ``wall`` (ns, :func:`wall_ns`): its severity from their ratio (:func:`severity`; ``low``
    for a finding that gives back nothing), its evidence JSON-ready (:func:`plain`), its
    ``step`` the one step of ``steps`` (None for several or none), its doc page
    ``docs/findings/<kind>.md``. ``where``: the other :class:`Finding` fields (``stream``,
    ``start_ns``, ``end_ns``, ``ops``, ``occurrences``)."""
    return Finding(
        kind=kind,
        title=title,
        severity=severity(recoverable_ns, wall),
        recoverable_ns=recoverable_ns,
        explanation=explanation,
        evidence=plain(evidence),
        rank=rank,
        step=steps[0] if steps is not None and len(steps) == 1 else None,
        docs=f"docs/findings/{kind}.md",
        **where,
    )


def fmt_ns(v: float | None) -> str:
    """A duration with its unit (``3.1 ms``, :func:`traceroof.units.ns`); ``?`` when unknown."""
    return units.ns(v, none="?")


#: a byte count with a binary unit (``16 MiB``, 3 significant digits); ``? B`` when unknown
fmt_bytes = units.bytes_binary


def short(name: str | None, n: int = 48) -> str:
    """``name`` cut to at most ``n`` characters (:func:`traceroof.units.short`); ``""`` for None."""
    return units.short(name, n, none="")


def plain(v: Any) -> Any:
    """A JSON-ready copy of an evidence value (ints stay ints, NaN becomes None)."""
    if isinstance(v, float):
        return None if v != v else v
    if isinstance(v, dict):
        return {str(k): plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    return v


# --------------------------------------------------------------------------- intervals


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Merge ``[start, end)`` intervals into disjoint sorted ones (empty ones dropped)."""
    out: list[list[int]] = []
    for s, e in sorted((int(a), int(b)) for a, b in intervals if b > a):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1][1] = e
        else:
            out.append([s, e])
    return [(a, b) for a, b in out]


def total(intervals: Iterable[Interval]) -> int:
    """Summed length (ns) of disjoint ``[start, end)`` intervals."""
    return sum(b - a for a, b in intervals)


def subtract(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """``a − b`` for disjoint sorted interval lists (:func:`subtract_sorted`)."""
    return subtract_sorted(a, [s for s, _ in b], [e for _, e in b])


def subtract_sorted(a: list[Interval], starts: list[int], ends: list[int]) -> list[Interval]:
    """``a − b`` for disjoint sorted ``a`` and ``b`` given as its sorted ``starts``/``ends``
    lists: each interval of ``a`` finds its place in ``b`` by bisection, so the cost grows
    with ``a``, not with ``b`` (a few copies against every kernel of a device)."""
    out: list[Interval] = []
    n = len(starts)
    for s, e in a:
        i = bisect.bisect_right(ends, s)  # the first interval of b ending after s
        cur = s
        while i < n and starts[i] < e:
            if starts[i] > cur:
                out.append((cur, starts[i]))
            cur = max(cur, ends[i])
            if cur >= e:
                break
            i += 1
        if cur < e:
            out.append((cur, e))
    return out


def intersect(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """``a ∩ b`` for disjoint sorted interval lists."""
    out: list[Interval] = []
    i = j = 0
    while i < len(a) and j < len(b):
        s = max(a[i][0], b[j][0])
        e = min(a[i][1], b[j][1])
        if s < e:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def overlap_with(s: int, e: int, sorted_union: list[Interval], starts: list[int]) -> int:
    """Length of ``[s, e) ∩ sorted_union`` (``starts``: the union's start points, for bisect)."""
    i = max(bisect.bisect_right(starts, s) - 1, 0)
    acc = 0
    while i < len(sorted_union) and sorted_union[i][0] < e:
        a, b = sorted_union[i]
        lo, hi = max(a, s), min(b, e)
        if hi > lo:
            acc += hi - lo
        i += 1
    return acc
