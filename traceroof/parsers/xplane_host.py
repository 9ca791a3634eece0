"""XPlane host rows and steps: step annotations, launch calls and jax dispatches of host
lines, device ``Steps``/``XLA Modules`` annotations, and each op's step.

Step markers are written in the common vocabulary of :mod:`traceroof.step_markers`
(``ProfilerStep#N``, the trace's own name kept in the ``annotation`` column).
"""

from __future__ import annotations

import re

import numpy as np
import polars as pl

from ..step_markers import STEP_MARKER, steps_containing
from . import xplane_proto as xp
from .xplane_planes import Plane, aligned, masked, nulls, times

_HOST_OP = re.compile(r"^PjitFunction\(|^PmapFunction\(")


def host_rows(plane: Plane, line: xp.LineScan):
    """Host-table rows of one host line: step annotations (``step_num`` stat; named
    ``ProfilerStep#N`` like every other step marker, the trace's own name in the extra
    ``annotation`` column), launch calls (``correlation_id`` stat) and jax dispatches
    (``PjitFunction(...)``). Also returns the step spans (start, end, step) of the line."""
    cols = line.events
    step, has_step = plane.numeric(cols, "step_num")
    corr, has_corr = plane.numeric(cols, "correlation_id")
    is_dispatch = plane.name_matches(cols, _HOST_OP)
    keep = (has_step | has_corr | is_dispatch) & ~cols.aggregated
    steps = None
    start, dur = times(line, cols)
    if has_step.any():
        s = has_step & ~cols.aggregated
        steps = (start[s], start[s] + dur[s], step[s].astype(np.int64))
    if not keep.any():
        return None, steps
    names = plane.names(cols)  # only for a line with rows to keep (most host lines have none)
    cat = pl.Series("cat", ["annotation", "runtime", "cpu_op"], dtype=pl.String).gather(
        np.where(has_step, 0, np.where(has_corr, 1, 2)))
    frame = pl.DataFrame([
        names,
        cat,
        pl.Series("start_ns", start, dtype=pl.Int64),
        pl.Series("dur_ns", dur, dtype=pl.Int64),
        masked(corr, has_corr, pl.Int64).alias("correlation"),
    ]).with_columns(
        pl.lit(plane.name, pl.String).alias("pid"),
        pl.lit(line.name or str(line.id), pl.String).alias("thread"),
        # step markers in the common vocabulary (``ProfilerStep#N``), the trace's own name kept
        pl.when(pl.Series(has_step)).then(pl.col("name")).alias("annotation"),
        pl.when(pl.Series(has_step))
        .then(pl.concat_str(pl.lit(STEP_MARKER), pl.Series(step).cast(pl.String)))
        .otherwise(pl.col("name")).alias("name"),
    ).filter(pl.Series(keep))
    return frame, steps


def annotation_rows(plane: Plane, line: xp.LineScan, cat: str, pid: str) -> pl.DataFrame | None:
    """Host-table rows (category ``cat``, pid ``pid``) for every event of a device line
    (``Steps``, ``XLA Modules``); None when the line has no events."""
    cols = line.events
    if cols is None or not len(cols):
        return None
    start, dur = times(line, cols)
    return pl.DataFrame([
        plane.names(cols),
        pl.Series("start_ns", start, dtype=pl.Int64),
        pl.Series("dur_ns", dur, dtype=pl.Int64),
    ]).with_columns(pl.lit(pid, pl.String).alias("pid"),
                    pl.lit(line.name, pl.String).alias("thread"),
                    pl.lit(cat, pl.String).alias("cat"))


def device_step_spans(plane: Plane, line: xp.LineScan):
    """(start ns, end ns, step) arrays of a device ``Steps`` line: the step is the
    ``step_num`` stat, else the event name when it is a number, else the event's index."""
    cols = line.events
    start, dur = times(line, cols)
    step_num, has = plane.numeric(cols, "step_num")
    names = [plane.md(int(m)).get("_name", "") for m in cols.metadata_id]
    steps = np.array([int(step_num[i]) if has[i] else (int(nm) if nm.isdigit() else i)
                      for i, nm in enumerate(names)], dtype=np.int64)
    return start, start + dur, steps


def assign_steps(ops: pl.DataFrame, device_steps: dict, host_steps: list) -> pl.DataFrame:
    """``step`` per op: the device's own ``Steps`` line if it has one, else the host's step
    annotations (``StepTraceAnnotation``: spans with a ``step_num`` stat). An op belongs to
    the step whose span contains its start; ops outside every span get null."""
    host = None
    if host_steps:
        s = np.concatenate([h[0] for h in host_steps])
        e = np.concatenate([h[1] for h in host_steps])
        n = np.concatenate([h[2] for h in host_steps])
        o = np.argsort(s, kind="stable")
        host = (s[o], e[o], n[o])
    if not device_steps and host is None:
        return ops.with_columns(aligned(ops, nulls("step", ops.height, pl.Int32)))
    start = ops["start_ns"].to_numpy()
    device = ops["device"].to_numpy()
    step = np.full(ops.height, -1, np.int64)
    has = np.zeros(ops.height, np.bool_)
    for dev in np.unique(device):
        m = device == dev
        spans = device_steps.get(int(dev), host)
        if spans is None:
            continue
        step[m], has[m] = steps_containing(start[m], spans)
    return ops.with_columns(aligned(ops, masked(step, has, pl.Int32).alias("step")))
