"""Device idle / host-bound stretches not already claimed by another detector.

Claims the idle gaps (between the union of all device ops of a rank) that
:mod:`traceroof.findings._idle` attributes to ``device_idle``: gaps of at least
``IDLE_MIN_GAP_NS`` where the next op was submitted only after the device had run dry and that
are not launch-bound stretches (``launch_bound``), host-sync stalls (``host_device_copies``),
graph replay (BC-13) or waits on already-queued work. Gaps whose next op has no host launch
in the trace are claimed too, with cause ``unknown``.

Recoverable = the claimed gaps. For the largest gaps the evidence lists what the host
thread that launched the next op was doing meanwhile. Waits with work already queued (a
dependency on another stream/event or on device work the trace did not record) are reported
separately with recoverable 0. See ``docs/findings/device_idle.md``.
"""

from __future__ import annotations

import polars as pl

from . import Finding, FindingContext, register
from ._common import claim, fmt_ns, scope_evidence, scope_wall_ns, scopes, short
from ._idle import IDLE_MIN_GAP_NS, OWNER_IDLE, timeline, with_launch_thread, with_names

#: Report when the claimed idle time is at least this share of the rank's window.
MIN_SHARE = 0.02
#: Report queued-work waits (recoverable 0) when they are at least this share of the window.
WAIT_MIN_SHARE = 0.10
#: Largest gaps described in the evidence.
TOP_GAPS = 5


@register("device_idle", heavy=True)
def detect(ctx: FindingContext) -> list[Finding]:
    """One finding per rank for host-bound idle time, one for queued-work waits; per
    (rank, device) for a rank driving several devices (:func:`~._common.scopes`)."""
    tl = timeline(ctx)
    # only the rows either finding reads: claimed gaps and long queued-work waits
    mine = tl.filter(
        (pl.col("owner") == OWNER_IDLE) | ((pl.col("label") == "wait") & (pl.col("gap_ns") >= IDLE_MIN_GAP_NS))
    )
    out: list[Finding] = []
    for rank, dev, r in scopes(ctx, mine):
        # the two sums each finding needs to reach its bar, from the rows as lists: a scope
        # below both makes no table of its own (each finding checks its bar again)
        idle_n = idle_ns = wait_n = wait_ns = 0
        for owner, label, gap in r.select("owner", "label", "gap_ns").iter_rows():
            if owner == OWNER_IDLE:
                idle_n += 1
                idle_ns += gap or 0
            if label == "wait" and gap is not None and gap >= IDLE_MIN_GAP_NS:
                wait_n += 1
                wait_ns += gap
        wall = scope_wall_ns(ctx, int(rank), dev)
        f = _idle_finding(ctx, int(rank), r, dev) if idle_n and idle_ns >= MIN_SHARE * wall else None
        if f is not None:
            out.append(f)
        f = _wait_finding(ctx, int(rank), r, dev) if wait_n and wait_ns >= WAIT_MIN_SHARE * wall else None
        if f is not None:
            out.append(f)
    return out


#: host event categories a gap may be explained by (framework ops, annotations, runtime calls, Python)
HOST_CATEGORIES = ("cpu_op", "annotation", "runtime", "python")


def _host_during(ctx: FindingContext, rank: int, gaps: list[tuple[str | None, int, int]]) -> list[list[list]]:
    """Per gap ``(thread, s, e)`` of rank ``rank``: the host events (:data:`HOST_CATEGORIES`,
    ProfilerStep markers left out) overlapping ``[s, e)`` on the thread (any thread when it is
    None), as ``[name, overlap ns]`` of the 3 names with the largest overlap, largest first.

    One pass over the host table finds the events that overlap any of the gaps, on integer
    columns only; the category, name and thread tests run on those few rows. The gaps (at most
    :data:`TOP_GAPS`) are then met in one join with those rows and ranked in one group-by,
    rather than a filter, a group-by and a sort per gap (issue 19: few small frames).
    """
    if not gaps:
        return []
    end = (pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns")
    overlaps_any = pl.any_horizontal([(pl.col("start_ns") < e) & (pl.col("end_ns") > s) for _, s, e in gaps])
    near = (
        ctx.host.lazy().select("rank", "thread", "name", "cat", "start_ns", end)
        .filter(pl.col("rank") == rank, overlaps_any)
        .filter(pl.col("cat").is_in(HOST_CATEGORIES), ~pl.col("name").str.starts_with("ProfilerStep#"))
    )
    spans = pl.LazyFrame({
        "_g": pl.Series(range(len(gaps)), dtype=pl.UInt32),
        "_thread": pl.Series([t for t, _, _ in gaps], dtype=pl.String),
        "_s": pl.Series([s for _, s, _ in gaps], dtype=pl.Int64),
        "_e": pl.Series([e for _, _, e in gaps], dtype=pl.Int64),
    })
    ov = (pl.min_horizontal("end_ns", "_e") - pl.max_horizontal("start_ns", "_s")).alias("ov")
    top = (
        near.join(spans, how="cross")
        # a gap whose launching thread is unknown (None) takes the events of any thread
        .filter(pl.col("start_ns") < pl.col("_e"), pl.col("end_ns") > pl.col("_s"),
                pl.col("_thread").is_null() | (pl.col("thread") == pl.col("_thread")))
        .group_by("_g", "name").agg(ov.max())
        .sort(["_g", "ov", "name"], descending=[False, True, False])
        .group_by("_g", maintain_order=True).head(3)
        .collect()
    )
    out: list[list[list]] = [[] for _ in gaps]
    for g, n, v in top.select("_g", "name", "ov").iter_rows():
        out[g].append([short(n, 80), int(v)])
    return out


def _idle_finding(ctx: FindingContext, rank: int, r: pl.DataFrame, dev: int | None) -> Finding | None:
    """The host-bound idle finding of rank ``rank`` (of its device ``dev`` when it drives
    several; None: its only device): the claimed gaps of ``r``, a share of that scope's window."""
    wall = scope_wall_ns(ctx, rank, dev)
    g = r.filter(pl.col("owner") == OWNER_IDLE)
    rec = float(g["gap_ns"].sum()) if g.height else 0.0
    if g.height == 0 or rec < MIN_SHARE * wall:
        return None
    by_cause = {c: int(v) for c, v in g.group_by("label").agg(pl.col("gap_ns").sum()).sort("label").iter_rows()}
    largest = with_launch_thread(ctx, with_names(ctx, g.sort("gap_ns", descending=True).head(TOP_GAPS)))
    rows = list(largest.iter_rows(named=True))
    hosts = _host_during(ctx, rank, [(x["launch_thread"], int(x["gap_start_ns"]), int(x["start_ns"])) for x in rows])
    described = []
    for row, host in zip(rows, hosts):
        described.append({
            "gap_ns": int(row["gap_ns"]),
            "start_ns": int(row["gap_start_ns"]),
            "end_ns": int(row["start_ns"]),
            "step": row["step"],
            "cause": row["label"],
            "next_op": short(row["op"] or row["name"], 80),
            "host": host,
        })
    big = described[0]
    host_cause = by_cause.get("host", 0) + by_cause.get("launch", 0)
    steps = sorted(s for s in g["step"].unique().to_list() if s is not None)
    title = ("device idle" if dev is None else f"device {dev} idle") + (
        f" {rec / wall:.0%} of the time: {g.height:,} gaps ≥ {fmt_ns(IDLE_MIN_GAP_NS)} "
        f"(largest {fmt_ns(big['gap_ns'])}" + (f" in step {big['step']}" if big["step"] is not None else "") + ")"
    )
    host_txt = ", ".join(f"{n} ({fmt_ns(v)})" for n, v in big["host"]) or "no host events recorded"
    expl = (
        ("The device" if dev is None else f"Device {dev} of rank {rank}")
        + f" had no work for {fmt_ns(rec)} ({rec / wall:.0%} of the window) in {g.height:,} gaps that no other "
        f"finding explains"
        + ("" if dev is None else
           f" (its idle in all: {fmt_ns(scope_evidence(ctx, rank, dev)['device_idle_ns'])}; each device of the "
           "rank has its own finding, each a share of the same window)")
        + f". {fmt_ns(host_cause)} of it is host-bound: the next kernel was launched only after the "
        "device ran dry, so the host thread was busy elsewhere"
        + (f"; {fmt_ns(by_cause.get('unknown', 0))} has no launch in the trace (cause unknown)" if by_cause.get("unknown") else "")
        + f". During the largest gap the launching thread was in: {host_txt}. "
        "Fix: keep the device queue full — move data loading and preprocessing off the training thread "
        "(DataLoader workers, pin_memory, prefetch to device), avoid per-step Python work and CPU-side ops between "
        "kernels, and overlap the host's work with the device's (asynchronous copies, CUDA graphs for the rest)."
    )
    evidence = {
        "idle_claimed_ns": rec,
        "gaps": g.height,
        "by_cause_ns": by_cause,
        "steps": steps,
        "window_ns": wall,
        "idle_share": rec / wall if wall else None,
        "largest_gaps": described,
        "min_gap_ns": IDLE_MIN_GAP_NS,
        **scope_evidence(ctx, rank, dev),
    }
    return claim(
        "device_idle", title, rec, wall, expl,
        evidence, rank=rank, device=dev, steps=steps,
        start_ns=big["start_ns"],
        end_ns=big["end_ns"],
        ops=[d["next_op"] for d in described],
        occurrences=g.height,
    )


def _wait_finding(ctx: FindingContext, rank: int, r: pl.DataFrame, dev: int | None) -> Finding | None:
    """The queued-work wait note (recoverable 0) of the scope ``(rank, dev)`` (see :func:`_idle_finding`)."""
    wall = scope_wall_ns(ctx, rank, dev)
    w = r.filter(pl.col("label") == "wait", pl.col("gap_ns") >= IDLE_MIN_GAP_NS)
    tot = float(w["gap_ns"].sum()) if w.height else 0.0
    if w.height == 0 or tot < WAIT_MIN_SHARE * wall:
        return None
    big = with_names(ctx, w.sort("gap_ns", descending=True).head(1)).row(0, named=True)
    title = ("device" if dev is None else f"device {dev}") + (
        f" waited {fmt_ns(tot)} ({tot / wall:.0%}) with work already queued: a dependency the trace does "
        "not show (not counted as recoverable)"
    )
    expl = (
        f"In {w.height:,} gaps the next kernel had been launched before the device went idle, yet it started only "
        f"later (largest: {fmt_ns(big['gap_ns'])} before {short(big['op'] or big['name'], 60)}). It waited on an "
        "event or another stream (cudaStreamWaitEvent), another process, or device work the profiler did not "
        "record. The host was not the bottleneck here; this time is not claimed as recoverable. Check the "
        "cross-stream dependencies and whether the capture is complete."
    )
    return claim(
        "device_idle", title, 0.0, wall, expl,
        {
            "queued_wait_ns": tot, "gaps": w.height, "largest_gap_ns": int(big["gap_ns"]),
            "largest_gap_start_ns": int(big["gap_start_ns"]), "window_ns": wall,
            **scope_evidence(ctx, rank, dev),
        },
        rank=rank, device=dev,
        start_ns=int(big["gap_start_ns"]),
        end_ns=int(big["start_ns"]),
        occurrences=w.height,
    )
