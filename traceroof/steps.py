"""Steps and the per-step breakdown (DESIGN §7), on the partitioned timeline.

The device timeline of every (rank, device) is first partitioned into buckets
(:func:`traceroof.timeline.partition`: step windows that never overlap, before/after the
steps, graph capture, outside the recording). One row here per (rank, step): the step's
device windows, and per device the breakdown of the op pieces inside its window (busy =
union over streams, clipped to the window; compute / memory / communication / idle from
interval unions), averaged over the rank's devices (``devices`` says how many), with its
hardware FLOPs (→ HFU) and the device's lag behind the host.
Without markers the whole trace is one step per rank (``step`` null), with a warning (BC-14).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from . import graph_capture, timeline
from .errors import UsageError
from .frames import done, smalls
from .sections import TimelineInfo
from .timeline import Notes, Timeline, piece_unions
from .trace import TraceMeta

#: the breakdown of a step on one device (ns), the same columns in the step table (as the
#: per-device mean over a rank's devices) and in the per-device step table
_BREAKDOWN = {
    "busy_ns": pl.Int64,
    "compute_bound_ns": pl.Int64,
    "memory_bound_ns": pl.Int64,
    "unknown_bound_ns": pl.Int64,  # busy with ops of no cost model (neither compute- nor memory-bound known)
    "comm_ns": pl.Int64,
    "comm_exposed_ns": pl.Int64,
    "idle_ns": pl.Int64,
}

STEP_SCHEMA = {
    "rank": pl.Int32,
    "step": pl.Int32,
    "start_ns": pl.Int64,  # earliest start of the step's window on the rank's devices
    "end_ns": pl.Int64,  # latest end of it
    "wall_ns": pl.Int64,  # per-device mean of the window length less its graph-capture time
    **_BREAKDOWN,
    "ops": pl.Int64,
    "flops": pl.Float64,
    "partial": pl.Boolean,
    "devices": pl.Int32,  # devices of the rank in this step (times are per-device means)
    "queue_lag_ns": pl.Int64,  # median over the step's launched ops of device start − launch start
    "device_lag_ns": pl.Int64,  # per-device mean of device window start − host ProfilerStep start
}

#: group key of a step bucket with no step number (the unsegmented step)
_NO_STEP = -(2**31)


#: one row per (rank, step, device): that device's own window and breakdown (ns); the
#: step table's times are the means of these over the rank's devices
DEVICE_STEP_SCHEMA = {
    "rank": pl.Int32,
    "step": pl.Int32,
    "device": pl.Int32,
    "wall_ns": pl.Int64,  # the device's window length less its graph-capture time
    **_BREAKDOWN,
    "ops": pl.Int64,  # device ops whose start is in the window
    "flops": pl.Float64,  # their FLOPs (null when none has a cost)
}


def step_table(tl: Timeline, host: pl.DataFrame, meta: TraceMeta) -> pl.DataFrame:
    """One row per (rank, step) with the breakdown in STEP_SCHEMA (all times ns): the first
    table of :func:`step_tables`."""
    return step_tables(tl, host, meta)[0]


def step_tables(tl: Timeline, host: pl.DataFrame, meta: TraceMeta) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(per-step table, per-device step table): one row per (rank, step) with the breakdown
    in STEP_SCHEMA, and one per (rank, step, device) in DEVICE_STEP_SCHEMA (all times ns).

    ``tl``: :func:`traceroof.timeline.partition` of the op table (its ops carry the roofline
    column ``bound``). Steps with no markers: one row per rank with ``step`` null, spanning
    the rank's recorded device time. Rule 3 holds per device: busy + idle = wall. Warns in
    ``meta`` (no step markers; partial steps): :func:`rank_steps` then :func:`finish_steps`.
    """
    rs = rank_steps(tl, host)
    return finish_steps(rs.steps, [rs], meta), rs.device_steps


@dataclass(frozen=True)
class RankSteps:
    """:func:`rank_steps`: the step tables of a timeline before the partial steps are known.

    Attributes:
        steps: STEP_SCHEMA rows, ``partial`` False throughout.
        device_steps: DEVICE_STEP_SCHEMA rows.
        step_segments, unnumbered: step segments of the timeline, and those without a step
            number (all of them: no step markers).
        has_ops: whether the timeline has ops.
        last_steps: each rank's last step that has a host window: (rank, step, launches in
            it without a device op).
    """

    steps: pl.DataFrame
    device_steps: pl.DataFrame
    step_segments: int
    unnumbered: int
    has_ops: bool
    last_steps: tuple[tuple[Any, Any, int], ...]


def rank_steps(tl: Timeline, host: pl.DataFrame) -> RankSteps:
    """The step tables of ``tl`` (:func:`step_tables`) without its warnings and partial steps,
    which :func:`finish_steps` adds (they depend on every rank: a truncated input makes each
    rank's last step partial). Each rank's rows depend on that rank alone: the tables of a
    trace are its ranks' concatenated, in rank order."""
    seg = tl.segments.filter(pl.col("bucket") == "step")
    if seg.height == 0:
        return RankSteps(pl.DataFrame(schema=STEP_SCHEMA), pl.DataFrame(schema=DEVICE_STEP_SCHEMA), 0, 0,
                         bool(tl.ops.height), ())
    key = pl.col("step").fill_null(_NO_STEP).alias("_sk")
    walls = seg.lazy().with_columns(key).group_by("rank", "_sk", "device").agg(
        pl.col("start_ns").min().alias("s"), pl.col("end_ns").max().alias("e"),
        (pl.col("end_ns") - pl.col("start_ns")).sum().alias("wall")).collect()  # lazy: one collect per chain
    bd = _device_breakdowns(piece_unions(tl))
    # the five columns the per-op statistics read, not a filtered copy of the whole op table
    stepped = (tl.ops.lazy().filter(pl.col("bucket") == "step")
               .select("rank", "device", "flops", "start_ns", "launch_start_ns", key).collect())
    per_op = _op_stats(stepped)
    per_dev_op = _device_op_stats(stepped)
    host_start = {(r, st): s0 for r, st, s0, _ in tl.host_steps.iter_rows()}
    rows, dev_rows = [], []
    for (rank, sk), g in walls.sort("rank", "_sk", "device").group_by(["rank", "_sk"], maintain_order=True):
        step = None if sk == _NO_STEP else sk
        devices = g["device"].to_list()
        parts = [bd.get((rank, sk, d), (0, 0, 0, 0, 0, 0)) for d in devices]
        for d, w, p in zip(devices, g["wall"].to_list(), parts):
            n_d, fl_d = per_dev_op.get((rank, sk, d), (0, None))
            dev_rows.append((rank, step, d, int(w), *p, int(w) - p[0], n_d, fl_d))
        n = len(parts)
        wall = int(round(float(g["wall"].mean())))
        busy, cb, mb, ub, comm, exposed = (int(round(sum(p[i] for p in parts) / n)) for i in range(6))
        count, flops, qlag = per_op.get((rank, sk), (0, None, None))
        h0 = host_start.get((rank, step))
        dlag = int(round(float((g["s"] - h0).mean()))) if h0 is not None else None
        rows.append((rank, step, int(g["s"].min()), int(g["e"].max()), wall, busy, cb, mb, ub, comm, exposed,
                     wall - busy, count, flops, False, n, qlag, dlag))
    out = pl.DataFrame(rows, schema=STEP_SCHEMA, orient="row").sort("rank", "start_ns")
    dev = pl.DataFrame(dev_rows, schema=DEVICE_STEP_SCHEMA, orient="row")
    lasts = _last_steps(tl.ops, host, out, tl.host_steps, tl.captures)
    return RankSteps(out, dev, seg.height, seg["step"].null_count(), bool(tl.ops.height), tuple(lasts))


def finish_steps(steps: pl.DataFrame, parts: list[RankSteps], meta: TraceMeta) -> pl.DataFrame:
    """``steps`` (the concatenated :attr:`RankSteps.steps` of ``parts``, disjoint ranks, in
    rank order) with ``partial`` set, and the warnings said in ``meta``: no step markers
    (when no part has a numbered step segment), then each partial step (BC-14: a launch in
    a rank's last step without a device op, or any input truncated)."""
    segs = sum(p.step_segments for p in parts)
    if segs and sum(p.unnumbered for p in parts) == segs and any(p.has_ops for p in parts):
        meta.warn("no step markers (torch ProfilerStep#N, jax StepTraceAnnotation): the whole trace is analysed "
                  "as one unsegmented step")
    truncated = any("truncated" in x for x in meta.warnings)
    partial = set()
    for rank, step, n in (x for p in parts for x in p.last_steps):
        if n or truncated:
            partial.add((rank, step))
            meta.warn(
                f"rank {rank} step {step} is partial ({n} launches without a device op in the "
                "trace window" + (", trace truncated" if truncated else "")
                + "): it is excluded from per-step averages"
            )
    if partial:
        marks = pl.DataFrame([(r, st, True) for r, st in partial], orient="row",
                             schema={"rank": pl.Int32, "step": pl.Int32, "_p": pl.Boolean})
        steps = (steps.join(marks, on=["rank", "step"], how="left", nulls_equal=True)
                 .with_columns(pl.col("_p").fill_null(False).alias("partial")).drop("_p"))
    return steps


def _device_op_stats(ops: pl.DataFrame) -> dict[tuple[Any, Any, Any], tuple[int, float | None]]:
    """Per (rank, step key ``_sk``, device): op count and FLOPs sum (None when no op has FLOPs)."""
    g = ops.group_by("rank", "_sk", "device").agg(
        pl.len().alias("n"), pl.col("flops").sum().alias("fl"), pl.col("flops").is_not_null().any().alias("has"))
    return {(r, k, d): (int(n), float(fl) if has else None) for r, k, d, n, fl, has in g.iter_rows()}


def _op_stats(ops: pl.DataFrame) -> dict[tuple[Any, Any], tuple[int, float | None, int | None]]:
    """Per (rank, step key ``_sk``): op count, FLOPs sum (None when no op has FLOPs) and the
    median queue lag (device start − launch start, ns; None when no op has a launch)."""
    g = ops.group_by("rank", "_sk").agg(
        pl.len().alias("n"), pl.col("flops").sum().alias("fl"), pl.col("flops").is_not_null().any().alias("has"),
        (pl.col("start_ns") - pl.col("launch_start_ns")).median().alias("lag"))
    return {(r, k): (int(n), float(fl) if has else None, int(round(lag)) if lag is not None else None)
            for r, k, n, fl, has, lag in g.iter_rows()}


def _device_breakdowns(unions: pl.DataFrame) -> dict[tuple[Any, ...], tuple[int, int, int, int, int, int]]:
    """(busy, compute-bound, memory/latency-bound, no cost model, comm, exposed comm) ns of
    the ops of every (rank, step key, device) with a device, from the step pieces' union
    lengths (:func:`traceroof.timeline.piece_unions`; the step key is ``step``, or
    ``_NO_STEP`` for the unsegmented step): compute = kernels that are not communication
    (copies and fills do not hide communication). The time of the non-communication ops
    splits exactly into compute-bound (union of the compute-bound compute kernels),
    memory/latency-bound (the rest of the ops with a known bound) and no cost model (the time
    only ops of unknown bound ran).

    The communication hidden under compute is ``|coll ∩ comp| = |coll| + |comp| − |coll ∪
    comp|`` (exact: integer measures of the same sets).
    """
    base = unions.filter(pl.col("bucket") == "step", pl.col("device").is_not_null())
    out = {}
    for r, d, st, all_, coll, comp_, cb, noncoll, coll_or_comp, known in base.select(
            "rank", "device", pl.col("step").fill_null(_NO_STEP), "busy", "coll", "comp", "cb", "noncoll",
            "coll_or_comp", "known").iter_rows():
        exposed = coll - (coll + comp_ - coll_or_comp)
        out[(r, st, d)] = (all_, cb, known - cb, noncoll - known, coll, exposed)
    return out


def _last_steps(
    ops: pl.DataFrame, host: pl.DataFrame, w: pl.DataFrame, cpu: pl.DataFrame, caps: pl.DataFrame
) -> list[tuple[Any, Any, int]]:
    """Each rank's last step with a host window, and its launches without a device op: the
    last step of a rank is partial when it has one (BC-14, :func:`finish_steps`); launches
    inside a graph-capture window (``caps``) have none by design and do not count.

    ``cpu``: the host-side step windows (:func:`~traceroof.step_markers.step_windows`).
    Returns (rank, step, lost launches), in the order of ``w``'s ranks.
    """
    if w.height == 0 or w["step"].null_count() == w.height:
        return []
    # each rank's last step: the latest start (of equal starts, the later row, as a stable
    # sort's tail); then its first host window. Python over the step rows (a few per rank):
    # three queries per rank before (session 10)
    last_of: dict[Any, tuple[Any, Any]] = {}
    for rank, step, s0 in zip(w["rank"].to_list(), w["step"].to_list(), w["start_ns"].to_list()):
        if rank not in last_of or s0 >= last_of[rank][1]:
            last_of[rank] = (step, s0)
    host_win: dict[tuple[Any, Any], tuple[int, int]] = {}
    for rank, step, s0, e0 in zip(cpu["rank"].to_list(), cpu["step"].to_list(), cpu["start_ns"].to_list(),
                                  cpu["end_ns"].to_list()):
        host_win.setdefault((rank, step), (int(s0), int(e0)))
    lasts = []  # (rank, step, host window start, end) of each rank's last step
    for rank, (step, _) in last_of.items():
        if rank is not None and step is not None and (rank, step) in host_win:
            lasts.append((rank, step, *host_win[(rank, step)]))
    lost = _lost_launches(ops, host, [(r, s, e) for r, _, s, e in lasts], caps)
    return [(rank, step, lost.get(rank, 0)) for rank, step, _, _ in lasts]


def _lost_launches(ops: pl.DataFrame, host: pl.DataFrame, windows: list[tuple[Any, int, int]],
                   caps: pl.DataFrame) -> dict[Any, int]:
    """Launch/memcpy/memset runtime calls starting in each rank's window ``(rank, start ns,
    end ns)``, outside the graph-capture windows ``caps``, whose correlation id has no device
    op of that rank: rank → count."""
    if not windows:
        return {}
    win = pl.DataFrame(
        windows, schema={"rank": host.schema["rank"], "_ws": pl.Int64, "_we": pl.Int64}, orient="row"
    )
    lo, hi = min(s for _, s, _ in windows), max(e for _, _, e in windows)
    # eager steps, integer filters first: in one lazy query polars fuses every predicate and
    # matches the name pattern against every host event
    near = host.filter(pl.col("start_ns") >= lo, pl.col("start_ns") < hi, pl.col("correlation").is_not_null())
    near, win = smalls(near, win)  # (the rest one lazy plan on small tables, :mod:`traceroof.frames`)
    calls = done(
        near.join(win, on="rank")
        .filter(pl.col("start_ns") >= pl.col("_ws"), pl.col("start_ns") < pl.col("_we"))
        .filter(pl.col("cat") == "runtime", pl.col("name").str.contains(r"(?i)launch|memcpy|memset"))
    )
    if calls.height and caps.height:
        calls = calls.filter(~graph_capture.inside(calls, caps))
    if calls.height == 0:
        return {}
    # only the ops whose correlation id is in the calls' range can match (a cheap integer
    # filter before hashing)
    c_lo, c_hi = calls["correlation"].min(), calls["correlation"].max()
    ran, calls_ = smalls(ops, calls)
    ran = ran.select("rank", "correlation").filter(pl.col("correlation").is_between(c_lo, c_hi))
    lost = done(calls_.join(ran, on=["rank", "correlation"], how="anti").group_by("rank").len())
    return dict(lost.iter_rows())


def complete(steps: pl.DataFrame) -> pl.DataFrame:
    """The complete (non-partial) step rows: the only ones any mean is taken over (rule 5);
    no fallback to the partial ones."""
    return steps.filter(~pl.col("partial")) if steps.height else steps


def summarize(steps: pl.DataFrame) -> dict[str, float | int | None]:
    """Averages over complete steps: step time, busy fraction, breakdown, lags (ns).

    Rule 5: only complete (non-partial) steps give a step time; with none, every mean is None
    (``complete_steps`` 0) and the report says so instead of printing a step time.
    """
    if steps.height == 0:
        return {"steps": 0}
    return summarize_complete(steps, complete(steps))


def summarize_complete(steps: pl.DataFrame, full: pl.DataFrame) -> dict[str, float | int | None]:
    """:func:`summarize` of the non-empty step table ``steps`` whose complete rows
    (:func:`complete`) the caller has already: ``full``."""
    n_full = full.height
    if n_full == 0:
        return {"steps": steps.height, "complete_steps": 0, "step_time_ns": None,
                "devices_per_rank": int(steps["devices"].max())}
    wall = float(full["wall_ns"].mean())
    busy = float(full["busy_ns"].mean())

    def mean(col: str) -> float | None:
        if col not in full.columns:
            return None
        v = full[col]
        if v.null_count():  # (without a null, drop_nulls is the column itself: no query for it)
            v = v.drop_nulls()
        return float(v.mean()) if v.len() else None

    return {
        "steps": steps.height,
        "complete_steps": n_full,
        "step_time_ns": wall,
        "step_time_median_ns": float(full["wall_ns"].median()),
        "busy_ns": busy,
        "busy_fraction": busy / wall if wall else None,
        "compute_bound_ns": float(full["compute_bound_ns"].mean()),
        "memory_bound_ns": float(full["memory_bound_ns"].mean()),
        "unknown_bound_ns": float(full["unknown_bound_ns"].mean()),
        "comm_ns": float(full["comm_ns"].mean()),
        "comm_exposed_ns": float(full["comm_exposed_ns"].mean()),
        "idle_ns": float(full["idle_ns"].mean()),
        "flops_per_step": None if full["flops"].is_null().all() else float(full["flops"].mean()),
        "devices_per_rank": int(full["devices"].max()),
        "queue_lag_ns": mean("queue_lag_ns"),
        "device_lag_ns": mean("device_lag_ns"),
    }


# --------------------------------------------------------------------------- one rank's segmentation


@dataclass(frozen=True)
class Segments:
    """What :func:`traceroof.analysis.segment_steps` gives: the ops (``step`` and ``bucket``
    from the partitioned timeline), the per-step table (:data:`STEP_SCHEMA`), the timeline
    section (buckets and windows), the per-device step table (:data:`DEVICE_STEP_SCHEMA`),
    the graph-capture windows of the whole trace (:func:`traceroof.graph_capture.windows`,
    for the detectors), and the speed of light's sums of every device-step
    (:func:`step_terms`, of the whole trace, before any ``step`` filter)."""

    ops: pl.DataFrame
    steps: pl.DataFrame
    timeline: TimelineInfo
    device_steps: pl.DataFrame
    captures: pl.DataFrame
    terms: pl.DataFrame | None = None


@dataclass(frozen=True)
class RankSegments:
    """:func:`segment_rank` of one rank's ops (or of a whole trace's): everything
    :func:`join_segments` needs, small enough to send from the process that read the rank.

    Attributes:
        tags: ``bucket`` (String) and ``step`` (Int32), one row per op of the table given,
            in its order.
        steps: the step tables (:func:`rank_steps`).
        buckets, windows: the timeline section's rows (:func:`~traceroof.timeline.bucket_rows`,
            :func:`~traceroof.timeline.window_rows`; of ``step`` alone when it is given).
        outside: ops outside the recording per reason (empty with ``step``).
        capture_windows: graph-capture windows reported (0 with ``step``).
        captures: the graph-capture windows (every one).
        notes: what the partition says (:class:`~traceroof.timeline.Notes`).
        terms: :func:`step_terms` of every device-step.
        marked, windowless: the partition's ``Timeline.marked`` / ``Timeline.windowless``
            (:func:`segments_agree`).
    """

    tags: pl.DataFrame
    steps: RankSteps
    buckets: list[dict[str, Any]]
    windows: list[dict[str, Any]]
    outside: dict[str, int]
    capture_windows: int
    captures: pl.DataFrame
    notes: Notes
    terms: pl.DataFrame
    marked: bool = False
    windowless: bool = False


def segment_rank(ops: pl.DataFrame, host: pl.DataFrame, meta: TraceMeta, step: int | None = None) -> RankSegments:
    """Partition the timeline of ``ops`` (:func:`traceroof.timeline.partition`; the roofline's
    ``bound`` and the costing's ``flops`` columns filled) and build its step tables and
    timeline rows, ``meta`` only read. Every row depends on its own rank alone but for one
    decision taken over the whole table (whether it has a step marker at all), so the
    segmentation of several ranks is that of each, joined (:func:`join_segments`), when
    :func:`segments_agree` says their decisions do not matter: the processes that read a
    folder's ranks run it on each (:mod:`traceroof.rank_prep`)."""
    tl = timeline.partition(ops, host, meta, warn=False)
    rs = rank_steps(tl, host)
    view = timeline.only_step(tl, step) if step is not None else tl
    assert tl.notes is not None
    return RankSegments(tags=tl.ops.select("bucket", "step"), steps=rs, buckets=timeline.bucket_rows(view),
                        windows=timeline.window_rows(view), outside=dict(view.outside),
                        capture_windows=view.captures.height, captures=tl.captures, notes=tl.notes,
                        terms=step_terms(tl.ops, rs.device_steps), marked=tl.marked, windowless=tl.windowless)


def segments_agree(parts: list[RankSegments]) -> bool:
    """Whether the :func:`segment_rank` of disjoint ranks, each done alone, are together the
    segmentation of the table of all of them (:func:`join_segments` may join them).

    The partition (:func:`traceroof.timeline.partition`) decides one input over the whole
    table: whether it has a step marker at all (device- or host-side); without any, a device
    with no step window is one unsegmented step, with some (on any rank) its time is before
    the first step. A rank without markers beside ranks with some decided it otherwise alone;
    its segmentation differs when one of its devices had no step window (``windowless``), and
    then the whole table must be segmented at once. Every other input is the rank's own: its
    device- and host-side markers and which of them its devices take, the step numbers, the
    steps its ops were launched in (the parser's), its recording window and clock origin
    (``meta.stats['origin_ns[rank]']``), its capture windows, its last step's lost launches;
    the rest (the partial steps of a truncated input, the "no step markers" warning, the
    notes' wording) is decided in :func:`join_segments` from all the parts."""
    marked = any(p.marked for p in parts)
    return all(p.marked == marked or not p.windowless for p in parts)


def join_segments(ops: pl.DataFrame, parts: list[RankSegments], meta: TraceMeta, step: int | None) -> Segments:
    """The :class:`Segments` of ``ops`` from the :func:`segment_rank` of its ranks (``parts``:
    disjoint ranks, in the order of their rows in ``ops``, which is rank order): tables and
    rows concatenated, counts added, and the warnings said in ``meta`` as one partition of
    the whole table says them (:func:`~traceroof.timeline.say`, :func:`finish_steps`); then
    limited to ``step`` when given. The parts must agree (:func:`segments_agree`).

    Raises:
        UsageError: ``step`` is not in the trace.
    """
    one = len(parts) == 1

    def cat(frames: list[pl.DataFrame]) -> pl.DataFrame:
        return frames[0] if one else pl.concat(frames, how="vertical_relaxed")

    tags = cat([p.tags for p in parts])
    ops = ops.with_columns(tags.get_columns())
    timeline.say(parts[0].notes if one else Notes.add([p.notes for p in parts]), meta)
    steps = finish_steps(cat([p.steps.steps for p in parts]), [p.steps for p in parts], meta)
    dev_steps = cat([p.steps.device_steps for p in parts])
    if step is not None:
        have = sorted(x for x in steps["step"].unique().to_list() if x is not None)
        if step not in have:
            raise UsageError(f"--step {step}: the trace has steps {have or 'none (unsegmented)'}")
    outside = timeline.add_counts(p.outside for p in parts)
    info = TimelineInfo(buckets=[r for p in parts for r in p.buckets], windows=[r for p in parts for r in p.windows],
                        outside_recording=dict(sorted(outside.items())),
                        capture_windows=sum(p.capture_windows for p in parts))
    if step is not None:
        ops = ops.filter(pl.col("step") == step)
        steps = steps.filter(pl.col("step") == step)
        dev_steps = dev_steps.filter(pl.col("step") == step)
    terms = parts[0].terms if one else pl.concat([p.terms for p in parts], how="diagonal_relaxed")
    return Segments(ops, steps, info, dev_steps, cat([p.captures for p in parts]), terms)


# --------------------------------------------------------------------------- the speed of light's sums

#: the kind of ops that may hide behind compute (:mod:`traceroof.speed_of_light`)
COMM_KIND = "collective"
#: the sums :func:`step_terms` gives every device-step (Int64 ns), before its ``gap_<kind>_ns``
STEP_TERM_SUMS = ("ops_dur_ns", "compute_ns", "comm_overlapped_ns", "comm_alone_ns", "uncosted_ns")


def _overlapped(stepped: pl.DataFrame, keys: list[str]) -> pl.Series:
    """Per row of ``stepped``, whether it is a collective that ran beside a non-collective op
    of its own ``keys`` group (one (rank, step, device)): some non-collective op there starts
    before it ends and ends after it starts (both strict; times in int ns).

    One query for every group (no per-group loop, no numpy): per group the non-collective
    ops' ends, cumulative max in start order; each collective takes the last non-collective
    start strictly before its end (as-of join) and is overlapped when that running max end is
    after its start. A row with a null time is not overlapped.

    Returns:
        A Boolean series, one per row of ``stepped`` in order (never null).
    """
    t = stepped.select(
        pl.struct(keys).rank("dense").alias("_g"),  # one id per group, null keys included
        (pl.col("kind") == COMM_KIND).fill_null(False).alias("_c"),
        "start_ns", (pl.col("start_ns") + pl.col("dur_ns")).alias("_e"),
    ).with_row_index("_r").filter(pl.col("start_ns").is_not_null(), pl.col("_e").is_not_null())
    compute = (t.filter(~pl.col("_c")).group_by("_g", "start_ns").agg(pl.col("_e").max())
               .sort("_g", "start_ns").select("_g", pl.col("start_ns").alias("_cs"),
                                              pl.col("_e").cum_max().over("_g").alias("_ce"))
               .sort("_cs"))
    hit = (t.filter(pl.col("_c")).sort("_e")
           .join_asof(compute, left_on="_e", right_on="_cs", by="_g", strategy="backward",
                      allow_exact_matches=False, check_sortedness=False)
           .filter(pl.col("_ce") > pl.col("start_ns")))
    return pl.repeat(False, stepped.height, dtype=pl.Boolean, eager=True).alias("_ov").scatter(hit["_r"], True)


def step_terms(ops: pl.DataFrame, device_steps_table: pl.DataFrame) -> pl.DataFrame:
    """Per row of ``device_steps_table`` (DEVICE_STEP_SCHEMA; every step, partial or not):
    ``rank``, ``step``, ``device``, ``wall_ns``, ``busy_ns``, the :data:`STEP_TERM_SUMS` and a
    ``gap_<kind>_ns`` per op kind of the table (Int64 ns; 0 where the device-step has none of
    that kind), and ``_kinds`` (the kinds its ops hold, sorted; null when it holds none): the
    per-rank half of :func:`traceroof.speed_of_light.device_steps` (docs/speed-of-light.md),
    each row from its own device-step's ops alone, so the rows of several ranks are each
    rank's, concatenated. ``ops``: with ``bucket``, ``step``, ``kind``, ``start_ns``,
    ``dur_ns``, ``expected_ns``."""
    keys = ["rank", "step", "device"]
    dev = device_steps_table.select(*keys, "wall_ns", "busy_ns")
    # one lazy query over the six columns read (an eager filter copied every column first)
    stepped = (ops.lazy().filter(pl.col("bucket") == "step") if "bucket" in ops.columns else ops.lazy().clear())
    stepped = (stepped.select(*keys, pl.col("kind").cast(pl.String), "start_ns", "dur_ns", "expected_ns")
               .join(dev.lazy().select(keys), on=keys, how="semi", nulls_equal=True).collect())
    # the overlap test is per (rank, step, device), one query for all of them; without any
    # collective it is false on every row
    has_comm = stepped.height > 0 and bool((stepped["kind"] == COMM_KIND).any())
    stepped = stepped.with_columns(_overlapped(stepped, keys) if has_comm else pl.lit(False).alias("_ov"))
    exp = pl.col("expected_ns").round(0).cast(pl.Int64)
    stepped = stepped.with_columns(
        pl.when(pl.col("expected_ns").is_null()).then(pl.col("dur_ns")).otherwise(exp).alias("_exp"),
        pl.col("expected_ns").is_null().alias("_unc"),
        (pl.col("kind") == COMM_KIND).alias("_comm"))
    kinds = tuple(sorted(stepped["kind"].drop_nulls().unique().to_list())) if stepped.height else ()
    agg = [pl.col("dur_ns").sum().alias("ops_dur_ns"),
           pl.col("_exp").filter(~pl.col("_comm")).sum().alias("compute_ns"),
           pl.col("_exp").filter(pl.col("_comm") & pl.col("_ov")).sum().alias("comm_overlapped_ns"),
           pl.col("_exp").filter(pl.col("_comm") & ~pl.col("_ov")).sum().alias("comm_alone_ns"),
           pl.col("dur_ns").filter(pl.col("_unc")).sum().alias("uncosted_ns"),
           pl.col("kind").drop_nulls().unique().sort().alias("_kinds")]
    agg += [(pl.col("dur_ns") - pl.col("_exp")).filter(pl.col("kind") == k).sum().alias(f"gap_{k}_ns") for k in kinds]
    sums = stepped.group_by(keys).agg(agg)
    cols = [*STEP_TERM_SUMS, *(f"gap_{k}_ns" for k in kinds)]
    return dev.join(sums, on=keys, how="left", nulls_equal=True).with_columns(
        pl.col(c).fill_null(0).cast(pl.Int64) for c in cols)
