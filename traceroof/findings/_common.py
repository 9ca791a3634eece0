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

from . import FindingContext

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
    return (pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns")


def windows(ctx: FindingContext) -> dict[int, tuple[int, int]]:
    """Per rank: ``(first device-op start, last device-op end)`` in ns.

    This is the window every claim of a rank lies in; claims across detectors sum to at most
    its length (BC-33), and severity is the recoverable share of it.
    """
    key = "windows"
    if key in ctx.cache:
        return ctx.cache[key]
    w = ctx.ops.group_by("rank").agg(
        pl.col("start_ns").min().alias("s"), (pl.col("start_ns") + pl.col("dur_ns")).max().alias("e")
    )
    out = {int(r): (int(s), int(e)) for r, s, e in w.iter_rows()}
    ctx.cache[key] = out
    return out


def wall_ns(ctx: FindingContext, rank: int) -> int:
    """Device time (ns) of rank ``rank``'s window (see :func:`windows`): its length times the
    number of devices the rank drives, so shares of summed per-device times (busy, idle,
    recoverable) stay ≤ 100 % on hosts with several devices (an XPlane host with 4 TPU chips)."""
    s, e = windows(ctx).get(int(rank), (0, 0))
    if "devices" not in ctx.cache:
        ctx.cache["devices"] = {
            int(r): int(n) for r, n in ctx.ops.group_by("rank").agg(pl.col("device").n_unique()).iter_rows()
        }
    return max(e - s, 0) * max(ctx.cache["devices"].get(int(rank), 1), 1)


def busy_ns(ctx: FindingContext, rank: int) -> int:
    """Device busy time of a rank: the union of its device ops' intervals (all streams, summed
    over its devices), ns."""
    if "busy" not in ctx.cache:
        from .. import intervals as iv

        u = iv.union(ctx.ops.with_columns(end_expr()), by=["rank", "device"])
        ctx.cache["busy"] = {
            int(r): int(v)
            for r, v in u.group_by("rank").agg((pl.col("end_ns") - pl.col("start_ns")).sum()).iter_rows()
        }
    return ctx.cache["busy"].get(int(rank), 0)


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


def fmt_ns(v: float | None) -> str:
    """A duration with its unit (``3.1 ms``); ``?`` when unknown."""
    from ..render.fmt import ns

    return "?" if v is None else ns(v)


def fmt_bytes(v: float | None) -> str:
    if v is None:
        return "? B"
    a = abs(float(v))
    for div, unit in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if a >= div:
            return f"{v / div:.3g} {unit}"
    return f"{v:.0f} B"


def short(name: str | None, n: int = 48) -> str:
    s = "" if name is None else str(name)
    return s if len(s) <= n else s[: n - 1] + "…"


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
    import bisect

    i = max(bisect.bisect_right(starts, s) - 1, 0)
    acc = 0
    while i < len(sorted_union) and sorted_union[i][0] < e:
        a, b = sorted_union[i]
        lo, hi = max(a, s), min(b, e)
        if hi > lo:
            acc += hi - lo
        i += 1
    return acc
