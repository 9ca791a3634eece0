"""XPlane op rows: device ops (kernels, TPU XLA ops, with their event-metadata attributes and
costs), XLA CPU thunks of CPU-only profiles, and the device description of a plane.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import polars as pl

from ..costs.hlo import attach_hlo_costs
from ..costs.hlo_text import collective_size, parse_hlo_expression, xla_dtype
from ..costs.kinds import kind_of_hlo as op_kind
from ..schema import KIND
from ..trace import DeviceInfo
from . import xplane_proto as xp
from .hlo_modules import Modules
from .xplane_planes import Parts, Plane, factorize, masked, nulls, times


def device_info(plane: Plane, dev_type: str, ordinal: int, hostname: str) -> DeviceInfo:
    """The :class:`DeviceInfo` of device plane ``plane`` (``/device:<dev_type>:<ordinal>``)
    from its stats: name, compute capability, cores, memory, peaks (FLOP/s, HBM B/s)."""
    s = plane.stats
    name = s.get("device_type_string") or s.get("gpu_device_name") or s.get("device_name") or ""
    peak_tf = s.get("peak_teraflops_per_second")
    peak_bw = s.get("peak_hbm_bw_gigabytes_per_second")
    known = {"device_type_string", "gpu_device_name", "peak_teraflops_per_second",
             "peak_hbm_bw_gigabytes_per_second", "compute_cap_major", "compute_cap_minor",
             "core_count", "memory_size"}
    extra = {k: v for k, v in s.items() if k not in known and not isinstance(v, bytes)}
    extra["device_type"] = dev_type
    extra["plane"] = plane.name
    if hostname:
        extra["host"] = hostname
    return DeviceInfo(
        name=str(name),
        index=ordinal,
        compute_major=_int(s.get("compute_cap_major")),
        compute_minor=_int(s.get("compute_cap_minor")),
        num_sms=_int(s.get("core_count")),
        memory_bytes=_int(s.get("memory_size")),
        peak_flops_per_s=float(peak_tf) * 1e12 if peak_tf else None,
        peak_hbm_bytes_per_s=float(peak_bw) * 1e9 if peak_bw else None,
        extra=extra,
    )


def _int(v: Any) -> int | None:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _md_frame(plane: Plane, mids: np.ndarray, modules: Modules) -> pl.DataFrame:
    """One row per event-metadata id: name, op, kind, dtype, flops, bytes, HLO attributes."""
    keys = ("metadata_id", "name", "op", "kind", "dtype", "flops", "bytes", "comm_bytes",
            "group_size", "md_cost", "hlo_category", "long_name", "program_id", "hlo_op_md")
    rows: dict[str, list] = {k: [] for k in keys}
    cache = plane.md_rows
    for mid in mids.tolist():
        row = cache.get(mid)
        if row is None:
            row = cache[mid] = _md_row(plane, mid, modules)
        for k, v in zip(keys, row):
            rows[k].append(v)
    return pl.DataFrame(rows, schema={
        "metadata_id": pl.Int64, "name": pl.String, "op": pl.String, "kind": KIND,
        "dtype": pl.String, "flops": pl.Float64, "bytes": pl.Float64,
        "comm_bytes": pl.Float64, "group_size": pl.Int32, "md_cost": pl.Boolean,
        "hlo_category": pl.String, "long_name": pl.String, "program_id": pl.UInt64,
        "hlo_op_md": pl.String})


def _md_row(plane: Plane, mid: int, modules: Modules) -> tuple:
    """The :func:`_md_frame` row of event metadata ``mid`` (computed once per plane)."""
    d = plane.md(mid)
    raw = d.get("_name", "")
    disp = d.get("_display_name", "")
    expr = d.get("long_name") or (raw if raw.startswith("%") or " = " in raw else None)
    name = disp or (re.match(r"^%?([^\s=]+)", raw).group(1) if expr and raw else raw)
    category = d.get("hlo_category")
    opcode, shape, operand_shape = parse_hlo_expression(expr) if expr else (None, None, None)
    pid = d.get("program_id")
    pid = int(pid) if isinstance(pid, (int, float)) else None
    fused: frozenset = frozenset()
    targets: frozenset = frozenset()
    hlo_op = name if expr else None
    info = None
    if pid is not None and hlo_op:
        minfo = modules.info(pid) if pid in modules.protos else None
        info = minfo.instructions.get(hlo_op) if minfo else None
    if info is not None:
        opcode = opcode or info.opcode
        shape = shape or info.shape
        operand_shape = operand_shape or (info.operand_shapes[0] if info.operand_shapes else None)
        fused, targets = info.fused_opcodes, info.custom_call_targets_inside
        if info.custom_call_target:
            targets = targets | {info.custom_call_target}
    kind = op_kind(opcode, category, fused, targets, kernel_name=raw)
    dtype = xla_dtype(operand_shape if kind in ("matmul", "conv", "attention") and
                      operand_shape else shape)
    flops = d.get("flops")
    nbytes = d.get("bytes_accessed")
    comm, group = collective_size(opcode, expr or (info.text if info else None))
    return (mid, name, opcode or category, kind, dtype,
            float(flops) if isinstance(flops, (int, float)) else None,
            float(nbytes) if isinstance(nbytes, (int, float)) else None,
            comm, group,
            isinstance(flops, (int, float)) or isinstance(nbytes, (int, float)),
            category, expr, pid, hlo_op)


def device_ops(plane: Plane, line: xp.LineScan, ordinal: int, device_clock: bool,
                modules: Modules, out: Parts) -> pl.DataFrame | None:
    """The op frame of one device op line (kernels, or TPU ``XLA Ops`` timed on the device
    clock when ``device_clock``): event-metadata attributes, times (ns), HLO costs; None
    when the line has no events. Aggregated events are skipped (counted in ``out.stats``)."""
    cols = line.events
    if cols is None or not len(cols):
        return None
    start, dur = times(line, cols, plane, device_clock)
    mids, pos = factorize(cols.metadata_id)
    md = _md_frame(plane, mids, modules)
    pid, has_pid = plane.numeric(cols, "program_id")
    corr, has_corr = plane.numeric(cols, "correlation_id")
    frame = md[pos].with_columns(
        pl.Series("start_ns", start, dtype=pl.Int64),
        pl.Series("dur_ns", dur, dtype=pl.Int64),
        pl.coalesce(plane.strings(cols, "hlo_op"), pl.col("hlo_op_md")).alias("hlo_op"),
        plane.strings(cols, "hlo_module").alias("hlo_module"),
        pl.coalesce("program_id", masked(pid, has_pid, pl.UInt64)).alias("program_id"),
        masked(corr, has_corr, pl.Int64).alias("correlation"),
        pl.lit(ordinal, pl.Int32).alias("device"),
        pl.lit(line.id, pl.Int64).alias("stream"),
    ).drop("hlo_op_md")
    frame = _kernel_details(plane, cols, frame)
    if cols.aggregated.any():
        out.stats["xplane.aggregated_events_skipped"] += int(cols.aggregated.sum())
        frame = frame.filter(pl.Series(~cols.aggregated))
    out.stats["xplane.device_events"] += frame.height
    return drop_loop_containers(attach_hlo_costs(_by_start(frame), modules, out.stats), out)


def _by_start(frame: pl.DataFrame) -> pl.DataFrame:
    """The frame in start order (lines are written in time order; this is the rare case)."""
    start = frame["start_ns"].to_numpy()
    if len(start) > 1 and (start[1:] < start[:-1]).any():
        return frame.sort("start_ns", maintain_order=True)
    return frame


def _kernel_details(plane: Plane, cols: xp.EventColumns, frame: pl.DataFrame) -> pl.DataFrame:
    """memcpy sizes (bytes moved, from ``memcpy_details``) and TensorFlow op types (from the
    ``level 0`` annotation ``name:Type``) of kernels; null columns when the plane has none."""
    memcpy = plane.strings(cols, "memcpy_details") if plane.sids("memcpy_details") else None
    level0 = plane.strings(cols, "level 0") if plane.sids("level 0") else None
    size = (memcpy.str.extract(r"size:(\d+)").cast(pl.Float64) if memcpy is not None
            else nulls("m", len(cols), pl.Float64))
    tf_type = (level0.str.split("#").list.first().str.extract(r":([^:/]+)$")
               if level0 is not None else nulls("t", len(cols), pl.String))
    return frame.with_columns(
        pl.Series("memcpy_bytes", size).replace(0.0, None).alias("memcpy_bytes"),
        pl.Series("tf_type", tf_type),
    )


def cpu_thunk_ops(plane: Plane, line: xp.LineScan, modules: Modules,
             out: Parts) -> pl.DataFrame | None:
    """XLA CPU thunk events of a ``/host:CPU`` thread (events with ``hlo_op`` and a module;
    launch calls, which carry ``correlation_id``, excluded)."""
    cols = line.events
    if not plane.sids("hlo_op"):
        return None
    hlo_op = plane.strings(cols, "hlo_op")
    is_op = hlo_op.is_not_null().to_numpy() & ~cols.aggregated
    if plane.sids("correlation_id"):
        is_op &= ~plane.numeric(cols, "correlation_id")[1]
    if not is_op.any():
        return None
    pid, has_pid = plane.numeric(cols, "program_id")
    ordinal, has_ord = plane.numeric(cols, "device_ordinal")
    start, dur = times(line, cols)
    frame = pl.DataFrame([
        plane.names(cols),
        pl.Series("start_ns", start, dtype=pl.Int64),
        pl.Series("dur_ns", dur, dtype=pl.Int64),
        hlo_op.alias("hlo_op"),
        plane.strings(cols, "hlo_module").alias("hlo_module"),
        masked(pid, has_pid, pl.UInt64).alias("program_id"),
        pl.Series("device", np.where(has_ord, ordinal, 0), dtype=pl.Int32),
    ]).filter(pl.Series(is_op))
    frame = frame.with_columns(
        pl.lit(line.id, pl.Int64).alias("stream"),
        pl.lit(None, pl.String).alias("op"), pl.lit("other", KIND).alias("kind"),
        pl.lit(None, pl.String).alias("dtype"), pl.lit(None, pl.Float64).alias("flops"),
        pl.lit(None, pl.Float64).alias("bytes"), pl.lit(None, pl.Float64).alias("comm_bytes"),
        pl.lit(None, pl.Int32).alias("group_size"), pl.lit(False).alias("md_cost"),
        pl.lit(None, pl.String).alias("hlo_category"), pl.lit(None, pl.String).alias("long_name"),
        pl.lit(None, pl.Int64).alias("correlation"),
    )
    out.stats["xplane.cpu_op_events"] += frame.height
    return drop_loop_containers(attach_hlo_costs(_by_start(frame), modules, out.stats), out)


#: HLO opcodes whose event spans the events of the computations they run (loop bodies,
#: branches, called computations), recorded on the same line.
CONTAINER_OPCODES = frozenset({"while", "conditional", "call"})


def drop_loop_containers(frame: pl.DataFrame, out: Parts) -> pl.DataFrame:
    """``frame`` (one line, in start order) without its control-flow container rows: a
    ``while`` / ``conditional`` / ``call`` event that encloses other op events of the line.
    Its time is its body's, whose ops are rows of their own (one per iteration), so as a row
    it would count that time twice in the busy union and rank a loop as an op. The rows left
    out are counted in ``out.stats`` (``xplane.loop_containers``,
    ``xplane.loop_container_ns``) and said in a warning by the reader. A container that
    encloses no recorded op stays a row (costed as trip count x one body pass)."""
    if frame.height < 2 or "op" not in frame.columns:
        return frame
    is_cf = frame["op"].is_in(list(CONTAINER_OPCODES)).fill_null(False).to_numpy()
    if not is_cf.any():
        return frame
    start = frame["start_ns"].to_numpy()
    end = start + frame["dur_ns"].to_numpy()
    device = frame["device"].to_numpy()
    drop = np.zeros(frame.height, np.bool_)
    for i in np.flatnonzero(is_cf).tolist():
        inside = ((start >= start[i]) & (end <= end[i]) & (device == device[i]) & ~is_cf)
        inside[i] = False
        drop[i] = bool(inside.any())
    if not drop.any():
        return frame
    out.stats["xplane.loop_containers"] += int(drop.sum())
    out.stats["xplane.loop_container_ns"] += int(frame["dur_ns"].to_numpy()[drop].sum())
    return frame.filter(pl.Series(~drop))
