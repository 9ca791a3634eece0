"""Exposed collectives: communication time not hidden behind compute on the same device.

Per (rank, device): ``U_comm`` is the union of the intervals of the collective kernels of all
streams, ``U_compute`` the union of every other kernel (memcpy/memset are not compute).
Exposed communication = ``|U_comm − U_compute|`` (BC-33: unions, never per-stream sums;
two concurrent collectives count once). Each exposed nanosecond is shared evenly by the
collectives running at that instant, so the per-collective exposed times sum to exactly the
exposed total. Findings group collectives by type, message size and group size, and carry
each group's own roofline (``comm_ns`` = ring factor × message bytes ÷ link bandwidth, from
:mod:`traceroof.roofline`) so an exposed-but-fast collective is told apart from a slow one.

Recoverable = exposed time (what perfect overlap would hide). See ``docs/findings/exposed_collectives.md``.
"""

from __future__ import annotations

from collections import defaultdict

import polars as pl

from ..roofline import collective_link_bytes_per_s
from . import Finding, FindingContext, register
from ._common import (
    claim,
    fmt_bytes,
    fmt_ns,
    kind_str,
    overlap_with,
    scope_devices,
    scope_evidence,
    scope_wall_ns,
    short,
    subtract,
    total,
    union,
)

#: Report a group when its exposed time is at least this share of the rank's window ...
MIN_SHARE = 0.005
#: ... and at least this long (ns).
MIN_NS = 1_000
#: A collective slower than this multiple of its roofline is "slow", not only "exposed".
SLOW_FACTOR = 2.0
#: Groups reported per rank (the rest are summed into one finding).
MAX_FINDINGS = 10

NON_COMPUTE = ("collective", "memcpy", "memset")


def exposed_shares(comm: list[tuple[int, int]], compute_union: list[tuple[int, int]]) -> list[float]:
    """Exposed ns of each comm interval, exposed instants split evenly among concurrent ones.

    Args:
        comm: ``(start_ns, end_ns)`` per collective op.
        compute_union: disjoint sorted compute intervals.

    Returns:
        One float per ``comm`` entry; they sum to ``|union(comm) − compute_union|``.
    """
    out = [0.0] * len(comm)
    if not comm:
        return out
    bounds: list[tuple[int, int, int]] = []
    for i, (s, e) in enumerate(comm):
        if e > s:
            bounds.append((s, 1, i))
            bounds.append((e, -1, i))
    bounds.sort(key=lambda b: (b[0], b[1]))
    cstarts = [a for a, _ in compute_union]
    active: set[int] = set()
    k = 0
    while k < len(bounds):
        t = bounds[k][0]
        while k < len(bounds) and bounds[k][0] == t:
            _, d, i = bounds[k]
            if d < 0:
                active.discard(i)
            else:
                active.add(i)
            k += 1
        if not active or k >= len(bounds):
            continue
        nxt = bounds[k][0]
        seg = nxt - t
        if seg <= 0:
            continue
        covered = overlap_with(t, nxt, compute_union, cstarts)
        exposed = seg - covered
        if exposed > 0:
            share = exposed / len(active)
            for i in active:
                out[i] += share
    return out


@register("exposed_collectives")
def detect(ctx: FindingContext) -> list[Finding]:
    """Exposed-communication findings, one per (rank, collective type, message size, group)."""
    # ``kind`` compared as it is (an Enum: integer codes), not cast to strings row by row
    if not (ctx.ops["kind"] == "collective").any():
        return []
    ops = ctx.ops.with_columns((pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns"))
    coll = ops.filter(pl.col("kind") == "collective")
    out: list[Finding] = []
    _warn_no_device(ctx, coll)
    have = set(coll["rank"].unique().to_list())
    devices = _DeviceParts(ops, coll, claimed_waits_of(ctx))
    for rank, dev, devs in scope_devices(ctx, ops):
        if rank in have:
            out.extend(_rank_findings(ctx, devs, rank, dev, devices))
    return out


def _warn_no_device(ctx: FindingContext, coll: pl.DataFrame) -> None:
    """Say in ``ctx.warnings`` how many collectives (and how much of their device time, ns)
    are left out of the check because their device is null: their communication cannot be set
    against the compute of a device, so it is neither exposed nor overlapped."""
    lost = coll.filter(pl.col("device").is_null())
    if not lost.height:
        return
    ranks = sorted(r for r in lost["rank"].unique().to_list() if r is not None)
    ns = int(lost["dur_ns"].sum() or 0)
    ctx.warnings.append(
        f"exposed_collectives: {lost.height:,} collective kernel(s) ({fmt_ns(ns)} of device time) on rank(s) "
        f"{', '.join(map(str, ranks)) or 'unknown'} record no device and are left out of the exposed-communication "
        "check (neither exposed nor overlapped)")


def claimed_waits_of(ctx: FindingContext) -> dict[int, pl.DataFrame]:
    """Per rank, the straggler finding's waits (:func:`~traceroof.findings.straggler.claimed_waits`)."""
    from .straggler import claimed_waits

    waits = claimed_waits(ctx)
    return {int(k[0]): v for k, v in waits.partition_by("rank", as_dict=True).items()} if waits.height else {}


class _DeviceParts:
    """What :func:`_rank_findings` reads of every (rank, device) with collectives, computed for
    all of them at once (session 9: per rank and device it was a filter, a sort and a union
    of the compute kernels turned into a Python list: 0.13 s of CPU for 16 ranks):

    * ``coll[(rank, device)]``: its collectives (the op columns and ``end_ns``) in start order;
    * ``compute_ns[(rank, device)]``: the length of the union of its compute kernels (every
      kernel but collectives, copies and fills), ns;
    * ``compute_near[(rank, device)]``: the intervals of that union that reach into
      ``[first collective start, last collective end)``, as ``(start_ns, end_ns)`` pairs: the
      only ones the exposed time and its shares read (an interval ending at or before that
      span, or starting at or after it, overlaps no collective), so they are the same as
      with the whole union;
    * ``waits[rank]``: the straggler waits of the rank, if any.
    """

    def __init__(self, ops: pl.DataFrame, coll: pl.DataFrame, waits: dict[int, pl.DataFrame]) -> None:
        from .. import intervals as iv

        key = ["rank", "device"]
        c = coll.sort(*key, "start_ns", maintain_order=True)
        narrow = c.select(*key, *_ROW_COLS)
        self.coll = {(k[0], k[1]): v for k, v in narrow.partition_by(key, as_dict=True, maintain_order=True).items()}
        span = c.group_by(key).agg(pl.col("start_ns").min().alias("_lo"), pl.col("end_ns").max().alias("_hi"))
        # the four columns read, filtered in one lazy query (an eager filter copied every column)
        comp = (ops.lazy().filter(~kind_str().is_in(list(NON_COMPUTE))).select(*key, "start_ns", "end_ns").collect()
                .join(span.select(key), on=key, how="semi"))
        u = iv.union(comp, by=key)
        self.compute_ns = {(r, d): int(v) for r, d, v in u.group_by(key).agg(
            (pl.col("end_ns") - pl.col("start_ns")).sum().alias("_n")).iter_rows()}
        self.compute_near = {(k[0], k[1]): list(zip(v["start_ns"].to_list(), v["end_ns"].to_list()))
                             for k, v in _near(u, c, key).partition_by(key, as_dict=True, maintain_order=True).items()}
        self.waits = waits


#: the columns of a collective that :func:`_device_groups` reads
_ROW_COLS = ("collective", "op", "name", "comm_bytes", "group_size", "dur_ns", "comm_ns", "stream", "step",
             "start_ns", "end_ns")


def _near(u: pl.DataFrame, c: pl.DataFrame, key: list[str]) -> pl.DataFrame:
    """The intervals of the compute union ``u`` (disjoint, sorted by ``(*key, start_ns)``) that
    overlap a collective of ``c`` on their ``key`` (rank, device), in ``u``'s order.

    What the exposed time and its shares read of the union is its overlap with the
    collectives (:func:`~._common.subtract_sorted`, :func:`~._common.overlap_with` skip the
    rest, and an interval that overlaps no collective adds nothing), so they are the same
    with these intervals as with the whole union; a device with one collective per step
    overlaps a few of its thousands. An interval ``[s, e)`` overlaps one when the collectives
    starting before ``e`` reach past ``s`` (their running maximum end, in start order): one
    as-of join for every device.
    """
    reach = (c.select(*key, "start_ns", pl.col("end_ns").cum_max().over(key).alias("_reach"))
             .sort("start_ns", maintain_order=True))
    j = (u.with_row_index("_i").sort("end_ns", maintain_order=True)
         .join_asof(reach, left_on="end_ns", right_on="start_ns", by=key, strategy="backward",
                    allow_exact_matches=False, check_sortedness=False, suffix="_c"))
    keep = j.filter(pl.col("_reach") > pl.col("start_ns"))["_i"].sort()
    return u[keep]


def _rank_findings(ctx: FindingContext, devs: list, rank: int, dev_of: int | None,
                   parts: _DeviceParts) -> list[Finding]:
    """The findings of rank ``rank`` (``devs``: the devices of its ops, sorted; only ``dev_of``
    when it drives several devices: then the findings are that device's, a share of its
    window; ``parts``: its devices' collectives and compute unions)."""
    wall = scope_wall_ns(ctx, rank, dev_of)
    groups: dict[tuple, dict] = defaultdict(lambda: defaultdict(float))
    sums = {"comm": 0, "exposed": 0, "compute": 0, "waiting": 0}
    waits = parts.waits.get(int(rank))
    for dev in devs:
        c = parts.coll.get((rank, dev))
        if c is None or dev is None:  # ops without a device: never compared equal to one (as before)
            continue
        _device_groups(c, parts.compute_ns.get((rank, dev), 0), parts.compute_near.get((rank, dev), []),
                       waits.filter(pl.col("device") == dev) if waits is not None else None, groups, sums)
    rank_comm, rank_exposed, rank_waiting, rank_compute = sums["comm"], sums["exposed"], sums["waiting"], sums["compute"]
    totals = {
        "rank_comm_union_ns": rank_comm,
        "rank_comm_exposed_ns": rank_exposed,
        "rank_comm_waiting_on_straggler_ns": rank_waiting,
        "rank_comm_overlapped_ns": rank_comm - rank_exposed - rank_waiting,
        "rank_compute_union_ns": rank_compute,
        "window_ns": wall,
        **scope_evidence(ctx, rank, dev_of),
    }
    threshold = max(MIN_NS, MIN_SHARE * wall)
    ranked = sorted(groups.items(), key=lambda kv: -kv[1]["exposed_ns"])
    keep = [(k, g) for k, g in ranked if g["exposed_ns"] >= threshold]
    rest = [(k, g) for k, g in ranked if g["exposed_ns"] < threshold] + keep[MAX_FINDINGS:]
    keep = keep[:MAX_FINDINGS]
    out = [_finding(ctx, rank, k, g, totals) for k, g in keep]
    rest_ns = sum(g["exposed_ns"] for _, g in rest)
    for f in out:
        f.evidence["other_groups"] = len(rest)
        f.evidence["other_groups_exposed_ns"] = rest_ns
    if rest and rest_ns >= threshold:
        out.append(_rest_finding(rank, rest, rest_ns, totals))
    return out


def _device_groups(c: pl.DataFrame, compute_ns: int, u_comp: list[tuple[int, int]], waits: pl.DataFrame | None,
                   groups: dict[tuple, dict], sums: dict[str, int]) -> None:
    """Add one device's collectives ``c`` (in start order) to ``groups`` (per group key: counts,
    measured / exposed / roofline ns, streams, steps, the worst one) and its unions to ``sums``
    (ns); ``compute_ns``: its compute union's length, ``u_comp``: the part of that union
    within its collectives' span (:class:`_DeviceParts`); ``waits``: the straggler waits on it."""
    spans = list(zip(c["start_ns"].to_list(), c["end_ns"].to_list()))
    u_comm = union(spans)
    # time spent waiting for a straggler rank inside the collective is the straggler
    # finding's claim, not this one's: it is neither compute nor claimable here
    u_wait = union(waits.select("start_ns", "end_ns").rows()) if waits is not None and waits.height else []
    exposed_all = subtract(u_comm, u_comp)
    if u_wait:
        u_blocked = union(u_comp + u_wait)
        exposed = subtract(u_comm, u_blocked)
    else:
        u_blocked, exposed = u_comp, exposed_all
    sums["comm"] += total(u_comm)
    sums["exposed"] += total(exposed)
    sums["waiting"] += total(exposed_all) - total(exposed)
    sums["compute"] += compute_ns
    shares = exposed_shares(spans, u_blocked)
    for row, ex in zip(c.iter_rows(named=True), shares):
        key = (row["collective"] or "collective", row["op"] or short(row["name"], 60),
               row["comm_bytes"], row["group_size"])
        g = groups[key]
        g["count"] += 1
        g["measured_ns"] += row["dur_ns"]
        g["exposed_ns"] += ex
        if row["comm_ns"] is not None:
            g["roofline_ns"] += row["comm_ns"]
            g["roofline_count"] += 1
        g.setdefault("streams", set()).add(row["stream"])  # type: ignore[union-attr]
        g.setdefault("steps", set()).add(row["step"])  # type: ignore[union-attr]
        if ex > g.get("max_exposed_one_ns", -1.0):
            g["max_exposed_one_ns"] = ex
            g["worst_start_ns"] = row["start_ns"]
            g["worst_end_ns"] = row["end_ns"]
            g["worst_step"] = row["step"]


def _rest_finding(rank: int, rest: list[tuple[tuple, dict]], rest_ns: float, totals: dict) -> Finding:
    """One finding for the groups of rank ``rank`` below the report threshold or past
    :data:`MAX_FINDINGS` (``rest``: ``(key, group)`` pairs; ``rest_ns``: their exposed ns)."""
    dev = totals.get("device")
    return claim(
        "exposed_collectives",
        ("" if dev is None else f"device {dev}: ") + f"{len(rest)} more collective groups: {fmt_ns(rest_ns)} of communication exposed",
        float(rest_ns),
        totals["window_ns"],
        "Smaller collective groups whose exposed time is individually below the report "
        "threshold; together they are worth the same overlap work as the groups above.",
        {**totals, "groups": len(rest), "exposed_ns": rest_ns,
                        "count": int(sum(g["count"] for _, g in rest))},
        rank=rank, device=dev,
        ops=[k[1] for k, _ in rest[:10]],
        occurrences=int(sum(g["count"] for _, g in rest)),
    )


def _finding(ctx: FindingContext, rank: int, key: tuple, g: dict, totals: dict) -> Finding:
    ctype, label, nbytes, gsize = key
    n = int(g["count"])
    measured = float(g["measured_ns"])
    exposed = float(g["exposed_ns"])
    roof = float(g["roofline_ns"]) if g.get("roofline_count") else None
    slowdown = measured / roof if roof else None
    steps = sorted(s for s in g["steps"] if s is not None)
    per_step = n / len(steps) if steps else float(n)
    size = fmt_bytes(nbytes) if nbytes is not None else "size unknown"
    who = f"{ctype} {size}" + (f" (group {gsize})" if gsize else "")
    dev = totals.get("device")
    title = ("" if dev is None else f"device {dev}: ") + f"{who} ×{n}: {fmt_ns(exposed)} exposed of {fmt_ns(measured)}"
    if slowdown is not None and slowdown >= SLOW_FACTOR:
        title += f"; runs {slowdown:.3g}× its link roofline"
        verdict = "slow and exposed"
    elif roof is not None:
        verdict = "exposed (near its roofline)"
    else:
        verdict = "exposed (no roofline: message size or group unknown)"
    link = collective_link_bytes_per_s(ctx.chip, gsize)
    expl = (
        f"{n} {ctype} collectives ({label}) ran {fmt_ns(measured)} in total; {fmt_ns(exposed)} of it had no "
        f"compute kernel running beside it on any stream of the device, so the device only waited on the "
        f"network. "
    )
    if roof is not None:
        expl += (
            f"Their roofline (ring factor × {size} ÷ {link / 1e9 if link else float('nan'):.4g} GB/s) is "
            f"{fmt_ns(roof)}: "
        )
        expl += (
            "the collective itself is slow (check the link, NCCL algorithm/protocol, contention, stragglers on "
            "other ranks) and also not overlapped. "
            if slowdown is not None and slowdown >= SLOW_FACTOR
            else "the transfer is near its roofline, so the loss is the missing overlap. "
        )
    expl += (
        "Fix: overlap communication with compute (DDP gradient bucketing / bucket_cap_mb, FSDP forward/backward "
        "prefetch, async tensor parallelism), issue collectives earlier, or change the parallelism layout so "
        "less data crosses the slowest link."
    )
    wall = totals["window_ns"]
    evidence = {
        "collective": ctype,
        "op": label,
        "message_bytes": nbytes,
        "group_size": gsize,
        "count": n,
        "per_step": per_step,
        "steps": steps,
        "streams": sorted(s for s in g["streams"] if s is not None),
        "measured_ns": measured,
        "exposed_ns": exposed,
        "hidden_ns": measured - exposed,
        "exposed_share": exposed / measured if measured else None,
        "roofline_ns": roof,
        "roofline_per_op_ns": (roof / g["roofline_count"]) if roof else None,
        "slowdown_vs_roofline": slowdown,
        "link_bytes_per_s": link,
        "verdict": verdict,
        "worst_exposed_one_ns": g.get("max_exposed_one_ns"),
        "worst_step": g.get("worst_step"),
        **totals,
    }
    return claim(
        "exposed_collectives", title, exposed, wall, expl,
        evidence, rank=rank, device=dev, steps=steps,
        stream=next(iter(g["streams"])) if len(g["streams"]) == 1 else None,
        start_ns=g.get("worst_start_ns"),
        end_ns=g.get("worst_end_ns"),
        ops=[label],
        occurrences=n,
    )
