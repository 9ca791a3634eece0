"""Steps and the per-step breakdown (DESIGN §7).

Step windows come from the step markers of the host table (:mod:`traceroof.step_markers`:
``ProfilerStep#N`` rows, whatever format wrote them): the device-side window when the trace
has one, else the host-side one; ops are already assigned to steps by their parser.
Without markers the whole trace is one step, with a warning (BC-14).

Per step: wall time, device busy time (union over all streams), a compute / memory /
communication / idle breakdown from interval unions, and hardware FLOPs (→ HFU).
"""

from __future__ import annotations

from typing import Any

import polars as pl

from . import intervals as iv
from .step_markers import device_and_host_windows
from .trace import TraceMeta

STEP_SCHEMA = {
    "rank": pl.Int32,
    "step": pl.Int32,
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
    "wall_ns": pl.Int64,
    "busy_ns": pl.Int64,
    "compute_bound_ns": pl.Int64,
    "memory_bound_ns": pl.Int64,
    "comm_ns": pl.Int64,
    "comm_exposed_ns": pl.Int64,
    "idle_ns": pl.Int64,
    "ops": pl.Int64,
    "flops": pl.Float64,
    "partial": pl.Boolean,
    "devices": pl.Int32,  # devices of the rank in this step (times are per-device means)
}


def _windows(gpu: pl.DataFrame, cpu: pl.DataFrame, spans: pl.DataFrame | None) -> pl.DataFrame:
    """Step windows (rank, step, start_ns, end_ns): the device-side markers when the trace
    has them, else the host-side ones moved to the device span of their ops (``spans``:
    :func:`_step_groups`)."""
    src = gpu if gpu.height else cpu
    if src.height == 0 or spans is None:
        return src
    # extend each window to cover the device work of the ops assigned to it
    span = spans.select("rank", "step", pl.col("s").alias("_s"), pl.col("e").alias("_e"))
    w = src.join(span, on=["rank", "step"], how="left")
    if not gpu.height:
        # host windows run ahead of the device: the device window is the span of its ops
        w = w.with_columns(
            pl.coalesce("_s", "start_ns").alias("start_ns"), pl.coalesce("_e", "end_ns").alias("end_ns")
        )
    return w.select("rank", "step", "start_ns", "end_ns")


def step_table(ops: pl.DataFrame, host: pl.DataFrame, meta: TraceMeta) -> pl.DataFrame:
    """One row per (rank, step) with the breakdown in STEP_SCHEMA (all times ns).

    ``ops`` must carry roofline columns (``bound``). Steps with no markers: one row per rank
    with ``step`` null, spanning the rank's device ops.
    """
    gpu, cpu = device_and_host_windows(host)
    # only the columns the breakdown reads: filters then move no op names
    ends = ops.select(
        "rank", "step", "device", "kind", "bound", "flops", "start_ns",
        (pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns"),
    )
    stepped = ends.filter(pl.col("step").is_not_null())
    groups = _step_groups(stepped) if gpu.height or cpu.height else None
    w = _windows(gpu, cpu, groups)
    if w.height == 0:
        if ops.height:
            meta.warn(
                "no ProfilerStep#N markers: the whole trace is analysed as one unsegmented step"
            )
        per_rank = ops.group_by("rank").agg(
            pl.col("start_ns").min().alias("start_ns"),
            (pl.col("start_ns") + pl.col("dur_ns")).max().alias("end_ns"),
        )
        w = per_rank.with_columns(pl.lit(None, dtype=pl.Int32).alias("step")).select("rank", "step", "start_ns", "end_ns")
    partial = _partial_steps(ops, host, w, cpu, meta)
    segmented = bool(w["step"].is_not_null().any())
    if segmented:  # each op in the step it was assigned to
        scope, stats = stepped, _step_stats(groups)
    else:  # one unsegmented step (null) per rank: all of the rank's ops
        scope, stats = ends.with_columns(pl.lit(None, dtype=pl.Int32).alias("step")), {}
    # what each (rank, step) needs from its ops, and every (rank, step, device) breakdown of
    # those ops, each in one grouped query (no per-step copies)
    pre = _device_breakdowns(scope) if stats or not segmented else {}
    rows = []
    for rank, step, s, e in w.sort("rank", "start_ns").iter_rows():
        if (rank, step) in stats:
            summ, known = stats[(rank, step)], pre

            def frame(rank: Any = rank, step: Any = step) -> pl.DataFrame:
                return scope.filter(pl.col("rank") == rank, pl.col("step") == step)
        else:
            if step is not None:  # no op assigned to the step: device time inside the window
                sel = ends.filter(pl.col("rank") == rank, pl.col("start_ns") < e, pl.col("end_ns") > s)
            else:
                sel = ends.filter(pl.col("rank") == rank)
            # the unsegmented step of a rank is the rank's ops: its devices are in ``pre``
            # (its summary is not: FLOPs summed over the rank's ops in their order)
            summ, known = _summary(sel), (None if segmented or step is not None else pre)

            def frame(sel: pl.DataFrame = sel) -> pl.DataFrame:
                return sel
        rows.append(_breakdown(rank, step, s, e, summ, frame, (rank, step) in partial, known))
    return pl.DataFrame(rows, schema=STEP_SCHEMA, orient="row")


#: (ops, first start ns, last end ns, sorted devices, FLOPs or None) of one step's ops
_Summary = tuple[int, Any, Any, list, Any]


def _summary(sel: pl.DataFrame) -> _Summary:
    if sel.height == 0:
        return (0, None, None, [], None)
    flops = float(sel["flops"].sum()) if sel["flops"].is_not_null().any() else None
    return (sel.height, int(sel["start_ns"].min()), int(sel["end_ns"].max()),
            sorted(sel["device"].unique().to_list()), flops)


def _step_groups(ends: pl.DataFrame) -> pl.DataFrame:
    """Per (rank, step) of ``ends`` (ops with ``end_ns``): op count ``n``, first start ``s``
    and last end ``e`` (ns), sorted distinct ``devs``, FLOPs sum ``fl`` and whether any op
    has FLOPs ``has``."""
    return ends.group_by("rank", "step").agg(
        pl.len().alias("n"), pl.col("start_ns").min().alias("s"), pl.col("end_ns").max().alias("e"),
        pl.col("device").unique().sort().alias("devs"),
        pl.col("flops").sum().alias("fl"), pl.col("flops").is_not_null().any().alias("has"),
    )


def _step_stats(groups: pl.DataFrame) -> dict[tuple[Any, Any], _Summary]:
    """:func:`_summary` of the ops of every (rank, step) of :func:`_step_groups`."""
    return {
        (r, st): (int(n), int(s0), int(e0), list(devs), float(fl) if has else None)
        for r, st, n, s0, e0, devs, fl, has in groups.iter_rows()
    }


def _breakdown(
    rank: int, step: int | None, s: int, e: int, summ: _Summary, frame: Any, partial: bool,
    known: dict[tuple[Any, ...], tuple[int, int, int, int, int]] | None = None,
) -> tuple:
    """One step of one rank. A rank with several devices (an XPlane host with 4 TPU chips)
    gets each device's breakdown from its own unions, averaged over its devices; FLOPs are
    the rank's total and ``devices`` says how many devices share them. ``summ``: the step's
    :func:`_summary`; ``frame()``: its ops (only read for a device ``known`` lacks);
    ``known``: the precomputed :func:`_device_breakdown` of each (rank, step, device)."""
    height, smin, emax, devs, flops = summ
    if height:
        s = min(s, smin)
        e = max(e, emax)
    wall = e - s
    devices = devs if height else [0]
    parts = [
        known[(rank, step, d)] if known is not None and (rank, step, d) in known
        else _device_breakdown(frame().filter(pl.col("device") == d))
        for d in devices
    ] if height else [(0, 0, 0, 0, 0)]
    n = len(parts)
    busy_ns, cb, mb, comm_ns, exposed = (int(round(sum(p[i] for p in parts) / n)) for i in range(5))
    # FLOPs of the ops with a cost model; null (not 0) when no op in the step has one
    return (
        rank, step, s, e, wall, busy_ns, cb, mb, comm_ns, exposed, wall - busy_ns, height,
        flops, partial, n,
    )


def _device_breakdown(sel: pl.DataFrame) -> tuple[int, int, int, int, int]:
    """(busy, compute-bound, memory/latency-bound, comm, exposed comm) ns of one device."""
    kind = pl.col("kind").cast(pl.String)
    coll = sel.filter(kind == "collective")
    # compute = kernels that are not communication; copies and fills do not hide communication
    comp = sel.filter(~kind.is_in(["collective", "memcpy", "memset"]))
    u_coll = iv.union(coll)
    u_comp = iv.union(comp)
    comm_ns = iv.total(u_coll)
    exposed = comm_ns - iv.total(iv.intersect(u_coll, u_comp))
    cb = iv.total(iv.union(comp.filter(pl.col("bound") == "compute")))
    mb = iv.total(iv.union(sel.filter(kind != "collective"))) - cb
    return iv.total(iv.union(sel)), cb, mb, comm_ns, exposed


def _device_breakdowns(ends: pl.DataFrame) -> dict[tuple[Any, ...], tuple[int, int, int, int, int]]:
    """:func:`_device_breakdown` of the ops of every (rank, step, device) of ``ends``
    (device not null).

    The same interval measures, as union lengths of six subsets per (rank, step, device)
    from one sorted pass (:func:`traceroof.intervals.union_lengths`); the communication
    hidden under compute is ``|coll ∩ comp| = |coll| + |comp| − |coll ∪ comp|`` (exact:
    integer measures of the same sets).
    """
    keys = ["rank", "step", "device"]
    base = ends.filter(pl.col("device").is_not_null())
    if base.height == 0:
        return {}
    k = pl.col("kind")  # Enum or String: is_in/== compare the labels either way
    comp = ~k.is_in(["collective", "memcpy", "memset"])
    sets = {
        "all": pl.lit(True),
        "coll": k == "collective",
        "comp": comp,
        "cb": comp & (pl.col("bound") == "compute"),
        "noncoll": k != "collective",
        "coll_or_comp": ~k.is_in(["memcpy", "memset"]),
    }
    out = {}
    for r, st, d, all_, coll, comp_, cb, noncoll, coll_or_comp in iv.union_lengths(base, sets, keys).iter_rows():
        exposed = coll - (coll + comp_ - coll_or_comp)
        out[(r, st, d)] = (all_, cb, noncoll - cb, coll, exposed)
    return out


def _partial_steps(
    ops: pl.DataFrame, host: pl.DataFrame, w: pl.DataFrame, cpu: pl.DataFrame, meta: TraceMeta
) -> set:
    """The last step of a rank is partial when a launch in it has no device op (BC-14).

    ``cpu``: the host-side step windows (:func:`~traceroof.step_markers.step_windows`). Returns the partial (rank, step).
    """
    out: set = set()
    if w.height == 0 or w["step"].null_count() == w.height:
        return out
    truncated = any("truncated" in x for x in meta.warnings)
    lasts = []  # (rank, step, host window start, end) of each rank's last step
    for rank in w["rank"].unique().to_list():
        last = w.filter(pl.col("rank") == rank).sort("start_ns").tail(1)
        step = last["step"][0]
        win = cpu.filter(pl.col("rank") == rank, pl.col("step") == step)
        if win.height:
            lasts.append((rank, step, int(win["start_ns"][0]), int(win["end_ns"][0])))
    lost = _lost_launches(ops, host, [(r, s, e) for r, _, s, e in lasts])
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


def _lost_launches(ops: pl.DataFrame, host: pl.DataFrame, windows: list[tuple[Any, int, int]]) -> dict[Any, int]:
    """Launch/memcpy/memset runtime calls starting in each rank's window ``(rank, start ns,
    end ns)`` whose correlation id has no device op of that rank: rank → count."""
    if not windows:
        return {}
    win = pl.DataFrame(
        windows, schema={"rank": host.schema["rank"], "_ws": pl.Int64, "_we": pl.Int64}, orient="row"
    )
    lo, hi = min(s for _, s, _ in windows), max(e for _, _, e in windows)
    # eager steps, integer filters first: in one lazy query polars fuses every predicate and
    # matches the name pattern against every host event
    near = host.filter(pl.col("start_ns") >= lo, pl.col("start_ns") < hi, pl.col("correlation").is_not_null())
    calls = (
        near.join(win, on="rank")
        .filter(pl.col("start_ns") >= pl.col("_ws"), pl.col("start_ns") < pl.col("_we"))
        .filter(pl.col("cat") == "runtime", pl.col("name").str.contains(r"(?i)launch|memcpy|memset"))
    )
    if calls.height == 0:
        return {}
    # only the ops whose correlation id is in the calls' range can match (a cheap integer
    # filter before hashing)
    c_lo, c_hi = calls["correlation"].min(), calls["correlation"].max()
    done = ops.select("rank", "correlation").filter(pl.col("correlation").is_between(c_lo, c_hi))
    lost = calls.join(done, on=["rank", "correlation"], how="anti").group_by("rank").len()
    return dict(lost.iter_rows())


def summarize(steps: pl.DataFrame) -> dict[str, float | int | None]:
    """Averages over complete steps: step time, busy fraction, breakdown (ns)."""
    full = steps.filter(~pl.col("partial")) if steps.height else steps
    if full.height == 0:
        full = steps
    if full.height == 0:
        return {"steps": 0}
    wall = float(full["wall_ns"].mean())
    busy = float(full["busy_ns"].mean())
    return {
        "steps": steps.height,
        "complete_steps": int((~steps["partial"]).sum()),
        "step_time_ns": wall,
        "step_time_median_ns": float(full["wall_ns"].median()),
        "busy_ns": busy,
        "busy_fraction": busy / wall if wall else None,
        "compute_bound_ns": float(full["compute_bound_ns"].mean()),
        "memory_bound_ns": float(full["memory_bound_ns"].mean()),
        "comm_ns": float(full["comm_ns"].mean()),
        "comm_exposed_ns": float(full["comm_exposed_ns"].mean()),
        "idle_ns": float(full["idle_ns"].mean()),
        "flops_per_step": None if full["flops"].is_null().all() else float(full["flops"].mean()),
        "devices_per_rank": int(full["devices"].max()),
    }
