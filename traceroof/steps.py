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

from typing import Any

import polars as pl

from . import graph_capture
from .frames import done, smalls
from .timeline import Timeline, piece_unions
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
    the rank's recorded device time. Rule 3 holds per device: busy + idle = wall.
    """
    seg = tl.segments.filter(pl.col("bucket") == "step")
    if seg.height == 0:
        return pl.DataFrame(schema=STEP_SCHEMA), pl.DataFrame(schema=DEVICE_STEP_SCHEMA)
    if seg["step"].null_count() == seg.height and tl.ops.height:
        meta.warn("no step markers (torch ProfilerStep#N, jax StepTraceAnnotation): the whole trace is analysed "
                  "as one unsegmented step")
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
    partial = _partial_steps(tl.ops, host, out, tl.host_steps, tl.captures, meta)
    if partial:
        marks = pl.DataFrame([(r, st, True) for r, st in partial], orient="row",
                             schema={"rank": pl.Int32, "step": pl.Int32, "_p": pl.Boolean})
        out = (out.join(marks, on=["rank", "step"], how="left", nulls_equal=True)
               .with_columns(pl.col("_p").fill_null(False).alias("partial")).drop("_p"))
    return out, dev


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


def _partial_steps(
    ops: pl.DataFrame, host: pl.DataFrame, w: pl.DataFrame, cpu: pl.DataFrame, caps: pl.DataFrame, meta: TraceMeta
) -> set:
    """The last step of a rank is partial when a launch in it has no device op (BC-14);
    launches inside a graph-capture window (``caps``) have none by design and do not count.

    ``cpu``: the host-side step windows (:func:`~traceroof.step_markers.step_windows`). Returns the partial (rank, step).
    """
    out: set = set()
    if w.height == 0 or w["step"].null_count() == w.height:
        return out
    truncated = any("truncated" in x for x in meta.warnings)
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
    for rank, step, _, _ in lasts:
        n = lost.get(rank, 0)
        if n or truncated:
            out.add((rank, step))
            meta.warn(
                f"rank {rank} step {step} is partial ({n} launches without a device op in the "
                "trace window" + (", trace truncated" if truncated else "")
                + "): it is excluded from per-step averages"
            )
    return out


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
    full = complete(steps)
    n_full = full.height
    if n_full == 0:
        return {"steps": steps.height, "complete_steps": 0, "step_time_ns": None,
                "devices_per_rank": int(steps["devices"].max())}
    wall = float(full["wall_ns"].mean())
    busy = float(full["busy_ns"].mean())

    def mean(col: str) -> float | None:
        v = full[col].drop_nulls() if col in full.columns else None
        return float(v.mean()) if v is not None and v.len() else None

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
