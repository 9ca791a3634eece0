"""Steps and the per-step breakdown (DESIGN §7).

Step windows come from ``ProfilerStep#N`` annotations: the device-side window
(``gpu_user_annotation``) when the trace has one, else the host-side one; ops are already
assigned to steps by their launch time (:func:`traceroof.parsers.kineto_link.assign_steps`).
Without markers the whole trace is one step, with a warning (BC-14).

Per step: wall time, device busy time (union over all streams), a compute / memory /
communication / idle breakdown from interval unions, and hardware FLOPs (→ HFU).
"""

from __future__ import annotations

from typing import Any

import polars as pl

from . import intervals as iv
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


def _windows(ops: pl.DataFrame, host: pl.DataFrame) -> pl.DataFrame:
    from .parsers.kineto_link import profiler_steps

    gpu = profiler_steps(host, "gpu_annotation")
    cpu = profiler_steps(host, "annotation")
    src = gpu if gpu.height else cpu
    if src.height == 0:
        return src
    # extend each window to cover the device work of the ops assigned to it
    span = (
        ops.filter(pl.col("step").is_not_null())
        .group_by("rank", "step")
        .agg(pl.col("start_ns").min().alias("_s"), (pl.col("start_ns") + pl.col("dur_ns")).max().alias("_e"))
    )
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
    w = _windows(ops, host)
    rows = []
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
    partial = _partial_steps(ops, host, w, meta)
    ends = ops.with_columns((pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns"))
    segmented = bool(w["step"].is_not_null().any())
    # what each (rank, step) needs from its ops, in one grouped query (no per-step copies)
    stats = _step_stats(ends) if segmented else {}
    # every (rank, step, device) breakdown of those ops at once (one grouped query)
    pre = _device_breakdowns(ends) if stats else {}
    for rank, step, s, e in w.sort("rank", "start_ns").iter_rows():
        if step is not None and (rank, step) in stats:
            summ, known = stats[(rank, step)], pre

            def frame(rank: Any = rank, step: Any = step) -> pl.DataFrame:
                return ends.filter(pl.col("rank") == rank, pl.col("step") == step)
        else:
            if step is not None:  # no op assigned to the step: device time inside the window
                sel = ends.filter(pl.col("rank") == rank, pl.col("start_ns") < e, pl.col("end_ns") > s)
            else:
                sel = ends.filter(pl.col("rank") == rank)
            summ, known = _summary(sel), None

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


def _step_stats(ends: pl.DataFrame) -> dict[tuple[Any, Any], _Summary]:
    """:func:`_summary` of the ops of every (rank, step), steps not null, in one query."""
    g = ends.filter(pl.col("step").is_not_null()).group_by("rank", "step").agg(
        pl.len().alias("n"), pl.col("start_ns").min().alias("s"), pl.col("end_ns").max().alias("e"),
        pl.col("device").unique().sort().alias("devs"),
        pl.col("flops").sum().alias("fl"), pl.col("flops").is_not_null().any().alias("has"),
    )
    return {
        (r, st): (int(n), int(s0), int(e0), list(devs), float(fl) if has else None)
        for r, st, n, s0, e0, devs, fl, has in g.iter_rows()
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
    """:func:`_device_breakdown` of the ops of every (rank, step, device), steps not null.

    The same interval measures from unions grouped by (rank, step, device, set) in one query;
    the communication hidden under compute is ``|coll ∩ comp| = |coll| + |comp| − |coll ∪
    comp|`` (exact: integer measures of the same sets).
    """
    keys = ["rank", "step", "device"]
    base = ends.filter(pl.col("step").is_not_null(), pl.col("device").is_not_null()).select(
        *keys, "start_ns", "end_ns", pl.col("kind").cast(pl.String).alias("_k"), "bound"
    )
    if base.height == 0:
        return {}
    k = pl.col("_k")
    comp = ~k.is_in(["collective", "memcpy", "memset"])
    sets = {
        "all": pl.lit(True),
        "coll": k == "collective",
        "comp": comp,
        "cb": comp & (pl.col("bound") == "compute"),
        "noncoll": k != "collective",
        "coll_or_comp": ~k.is_in(["memcpy", "memset"]),
    }
    names = list(sets)
    lb = base.lazy()
    rows = pl.concat(
        [lb.filter(cond).select(*keys, pl.lit(i, dtype=pl.Int8).alias("_set"), "start_ns", "end_ns")
         for i, cond in enumerate(sets.values())]
    ).collect()
    u = iv.union(rows, by=[*keys, "_set"])
    tot = u.group_by([*keys, "_set"]).agg((pl.col("end_ns") - pl.col("start_ns")).sum().alias("ns"))
    m = {(r, st, d, names[i]): int(ns) for r, st, d, i, ns in tot.iter_rows()}
    out = {}
    for r, st, d in base.select(keys).unique().iter_rows():
        def g(name: str) -> int:
            return m.get((r, st, d, name), 0)

        comm = g("coll")
        cb = g("cb")
        exposed = comm - (comm + g("comp") - g("coll_or_comp"))
        out[(r, st, d)] = (g("all"), cb, g("noncoll") - cb, comm, exposed)
    return out


def _partial_steps(ops: pl.DataFrame, host: pl.DataFrame, w: pl.DataFrame, meta: TraceMeta) -> set:
    """The last step of a rank is partial when a launch in it has no device op (BC-14)."""
    out: set = set()
    if w.height == 0 or w["step"].null_count() == w.height:
        return out
    # launches whose correlation id has no device op of the same rank
    launches = host.lazy().filter(
        pl.col("cat") == "runtime",
        pl.col("correlation").is_not_null(),
        pl.col("name").str.contains(r"(?i)launch|memcpy|memset"),
    ).join(
        ops.lazy().select("rank", "correlation").filter(pl.col("correlation").is_not_null()).unique(),
        on=["rank", "correlation"], how="anti",
    ).select("rank", "start_ns").collect()
    from .parsers.kineto_link import profiler_steps

    cpu = profiler_steps(host, "annotation")
    truncated = any("truncated" in x for x in meta.warnings)
    for rank in w["rank"].unique().to_list():
        last = w.filter(pl.col("rank") == rank).sort("start_ns").tail(1)
        step = last["step"][0]
        win = cpu.filter(pl.col("rank") == rank, pl.col("step") == step)
        if win.height == 0:
            continue
        s, e = int(win["start_ns"][0]), int(win["end_ns"][0])
        lost = launches.filter(pl.col("rank") == rank, pl.col("start_ns") >= s, pl.col("start_ns") < e).height
        if lost or truncated:
            out.add((rank, step))
            meta.warn(
                f"rank {rank} step {step} is partial ({lost} launches without a device op in the "
                "trace window" + (", trace truncated" if truncated else "")
                + "): it is excluded from per-step averages"
            )
    return out


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
