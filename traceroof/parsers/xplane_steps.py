"""Steps of a jax profile that has no step annotation, inferred from the repeated executions
of one XLA program.

Without ``jax.profiler.StepTraceAnnotation`` (and no device ``Steps`` line) the whole window
would be one step. A training or serving loop runs the same jitted program once per step, so
its executions mark the steps: execution ``k`` starts step ``k``, which ends where execution
``k + 1`` starts. ``n`` executions give ``n - 1`` steps; the ops of the last execution (whose
step's end is not in the window) and those before the first get no step (the timeline's
``before_first_step`` / ``after_last_step``).

Where the executions come from, in this order:

* the device ``XLA Modules`` line (GPU, TPU): one event per program execution, named
  ``<module>(<program id>)`` (host-table rows of category ``gpu_annotation``, thread
  ``XLA Modules``); one device per rank is used (the lowest plane name), its windows apply to
  all the rank's devices;
* else (CPU-only profiles, which have no such line) the host's jax dispatch calls
  ``PjitFunction(<fn>)`` of the program ``jit_<fn>``, the outermost call where they nest.

An execution without a usable program name -- empty, white space, or :data:`.xplane_planes.LOST_NAME` (a cut
file loses a plane's event metadata, so its events' names) -- is never a step: when no
execution has one, nothing is inferred and a warning says why.

The program is the one with the most device time among those executed at least twice on the
rank (the time of its ``XLA Modules`` events, else of its ops). Dispatch calls are host times:
on a GPU, where jax dispatches asynchronously, an op that starts after the next call is
counted in the next step (the steady-state step time is the same). The windows are written as host-side step markers (``ProfilerStep#k``, category
``annotation``, ``annotation`` = ``inferred: <module> execution``), every op gets its step,
and a warning says they were inferred and how to annotate.
"""

from __future__ import annotations

import re

import numpy as np
import polars as pl

from ..step_markers import HOST_MARKER_CAT, STEP_MARKER, marker_name, steps_containing
from ..trace import Trace
from .xplane_planes import LOST_HEAD, LOST_TAIL, aligned, masked

#: the thread name of the device line of program executions
XLA_MODULES = "XLA Modules"
_MODULE_EVENT = re.compile(r"^(.*?)(?:\(\d+\))?$")
_DISPATCH = re.compile(r"^PjitFunction\((.+)\)$")

ADVICE = ("annotate each step for exact boundaries: `with jax.profiler.StepTraceAnnotation("
          "\"train\", step_num=i):` around the step's work")


def infer_steps(trace: Trace) -> Trace:
    """``trace`` with steps inferred from program executions when it has no step of its own
    (no op with a step, no step marker); ``trace`` unchanged otherwise, or when no program
    ran twice. Times are int64 ns; the op table gets its ``step`` column, the host table the
    marker rows, ``meta`` a warning and the count ``xplane.steps_inferred``."""
    ops, host = trace.ops, trace.host
    if ops.height == 0 or host.height == 0 or ops["step"].null_count() < ops.height:
        return trace
    if host.filter(pl.col("name").str.starts_with(STEP_MARKER)).height:
        return trace
    found = _executions(host)
    execs = found.filter(_usable(pl.col("module")))
    if execs.height == 0:
        if found.height:
            trace.meta.warn(
                f"no step annotation in the profile, and none of its {found.height} program executions "
                "has a usable name (empty, or its event metadata is not in the file: a cut file): "
                f"no steps inferred; {ADVICE}")
        return trace
    windows, said = [], []
    for (rank,), ex in execs.group_by(["rank"], maintain_order=True):
        module = _program(ops.filter(pl.col("rank") == rank), ex)
        if module is None:
            continue
        starts = np.sort(ex.filter(pl.col("module") == module)["start_ns"].to_numpy())
        windows.append(pl.DataFrame({
            "rank": pl.Series([rank] * (len(starts) - 1), dtype=pl.Int32),
            "step": pl.Series(np.arange(len(starts) - 1), dtype=pl.Int32),
            "start_ns": pl.Series(starts[:-1], dtype=pl.Int64),
            "end_ns": pl.Series(starts[1:], dtype=pl.Int64),
            "module": module}))
        said.append((rank, module, len(starts)))
    if not windows:
        return trace
    win = pl.concat(windows)
    trace.ops = _assign(ops, win)
    trace.host = _with_markers(host, win)
    steps = win.height
    trace.meta.count("xplane.steps_inferred", steps)
    what = ", ".join(f"{n} executions of {m}" + (f" on rank {r}" if len(said) > 1 else "")
                     for r, m, n in said)
    trace.meta.warn(f"no step annotation in the profile: {steps} steps inferred from the "
                    f"{what} (each execution starts a step; the last one ends none); {ADVICE}")
    return trace


def _usable(module: pl.Expr) -> pl.Expr:
    """Whether a program name can mark steps: not empty, not white space, not
    :data:`.xplane_planes.LOST_NAME`, and (a dispatch's ``jit_<fn>``) not of an empty function name."""
    core = module.str.strip_prefix("jit_").str.strip_chars()
    return (module.is_not_null() & (core.str.len_chars() > 0)
            & ~(module.str.starts_with(LOST_HEAD) & module.str.ends_with(LOST_TAIL)))  # (is_lost_name)


def _executions(host: pl.DataFrame) -> pl.DataFrame:
    """rank, module, start_ns of each program execution (see the module docstring)."""
    mods = host.filter(pl.col("thread") == XLA_MODULES)
    if mods.height:
        first = mods.group_by("rank").agg(pl.col("pid").min().alias("first_pid"))
        mods = mods.join(first, on="rank").filter(pl.col("pid") == pl.col("first_pid"))
        return mods.select(
            "rank", pl.col("name").str.extract(_MODULE_EVENT.pattern, 1).alias("module"),
            "start_ns", pl.col("dur_ns").alias("device_ns"))
    calls = host.filter(pl.col("name").str.contains(_DISPATCH.pattern)).sort(["rank", "start_ns"])
    if calls.height == 0:
        return pl.DataFrame(schema={"rank": pl.Int32, "module": pl.String, "start_ns": pl.Int64,
                                    "device_ns": pl.Int64})
    # the outermost call where dispatches nest (jax writes two nested rows per call)
    end = (pl.col("start_ns") + pl.col("dur_ns"))
    calls = calls.with_columns(end.cum_max().shift(1).over("rank").alias("_open_until"))
    outer = calls.filter(pl.col("_open_until").is_null() | (pl.col("start_ns") >= pl.col("_open_until")))
    return outer.select(
        "rank", (pl.lit("jit_") + pl.col("name").str.extract(_DISPATCH.pattern, 1)).alias("module"),
        "start_ns", pl.lit(None, pl.Int64).alias("device_ns"))


def _program(ops: pl.DataFrame, execs: pl.DataFrame) -> str | None:
    """The module with the most device time among those executed twice or more: the time of
    its ``XLA Modules`` events, else of its ops in ``ops`` (by ``hlo_module``)."""
    counts = execs.group_by("module").len()
    repeated = sorted(counts.filter(pl.col("len") >= 2)["module"].to_list())
    if not repeated:
        return None
    if execs["device_ns"].null_count() == 0:
        busy = execs.filter(pl.col("module").is_in(repeated)).group_by("module").agg(
            pl.col("device_ns").sum())
    elif "hlo_module" in ops.columns:
        busy = (ops.filter(pl.col("hlo_module").is_in(repeated))
                .group_by(pl.col("hlo_module").alias("module")).agg(pl.col("dur_ns").sum().alias("device_ns")))
    else:
        return None
    busy = busy.sort(["device_ns", "module"], descending=[True, False])
    return busy["module"][0] if busy.height else None


def _assign(ops: pl.DataFrame, win: pl.DataFrame) -> pl.DataFrame:
    """``step`` of each op: the inferred window of its rank that contains its start."""
    step = np.full(ops.height, -1, np.int64)
    found = np.zeros(ops.height, np.bool_)
    rank = ops["rank"].to_numpy()
    start = ops["start_ns"].to_numpy()
    for (r,), w in win.group_by(["rank"]):
        m = rank == r
        spans = (w["start_ns"].to_numpy(), w["end_ns"].to_numpy(), w["step"].to_numpy().astype(np.int64))
        step[m], found[m] = steps_containing(start[m], spans)
    return ops.with_columns(aligned(ops, masked(step, found, pl.Int32).alias("step")))


def _with_markers(host: pl.DataFrame, win: pl.DataFrame) -> pl.DataFrame:
    """``host`` with one host-side step marker row per inferred window, in time order."""
    rows = win.select(
        "rank", pl.lit("inferred steps").alias("pid"), pl.lit("steps").alias("thread"),
        pl.col("step").map_elements(marker_name, return_dtype=pl.String).alias("name"),
        pl.lit(HOST_MARKER_CAT).alias("cat"), "start_ns",
        (pl.col("end_ns") - pl.col("start_ns")).alias("dur_ns"),
        (pl.lit("inferred: ") + pl.col("module") + pl.lit(" execution")).alias("annotation"))
    out = pl.concat([host, rows], how="diagonal_relaxed").select(host.columns + (
        [] if "annotation" in host.columns else ["annotation"]))
    # the host table's dictionary-coded columns stay so (a relaxed concat with text makes text)
    out = out.with_columns(pl.col(c).cast(host.schema[c]) for c in ("pid", "thread", "cat"))
    return out.sort(["rank", "start_ns"], maintain_order=True)
