"""Step markers, whatever format they came from: the one place that knows what a step marker is.

Every parser writes its step markers into the host table in one vocabulary: a row named
``ProfilerStep#N`` (:func:`marker_name`), with category ``annotation`` for a host-side
marker (Kineto ``user_annotation``; an XPlane host event with a ``step_num`` stat) or
``gpu_annotation`` for a device-side one (Kineto ``gpu_user_annotation``; an XPlane device
``Steps`` line). PyTorch 1.8/1.9 traces mark host steps as ``cpu_op`` events, also read here.
:func:`step_windows` finds those windows in a host table; :func:`steps_containing` assigns
times to windows. :mod:`traceroof.steps` and the parsers use these, not each other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

if TYPE_CHECKING:
    import numpy as np

#: the name prefix of every step marker row in the host table (``ProfilerStep#<step>``)
STEP_MARKER = "ProfilerStep#"
#: the categories of host-side and device-side markers
HOST_MARKER_CAT, DEVICE_MARKER_CAT = "annotation", "gpu_annotation"
#: the host-table category of the Kineto recording-window instants, and their names: the
#: active window opens at ``Iteration Start: PyTorch Profiler`` and closes at ``Record Window End``
WINDOW_CAT = "window"
WINDOW_START, WINDOW_END = "Iteration Start", "Record Window End"


def marker_name(step: int) -> str:
    """The host-table name of the marker of step ``step``: ``ProfilerStep#<step>``."""
    return f"{STEP_MARKER}{step}"


def marker_rows(host: pl.DataFrame) -> pl.DataFrame:
    """The rows of ``host`` named like a step marker (any category), in table order."""
    return host.filter(pl.col("name").str.starts_with(STEP_MARKER))


def step_windows(host: pl.DataFrame, cat: str = HOST_MARKER_CAT) -> pl.DataFrame:
    """Step windows from the markers of ``host``: columns rank, step, start_ns, end_ns (ns).

    ``cat`` is ``annotation`` (host-side markers: ``annotation`` rows, or ``cpu_op`` rows in
    PyTorch 1.8/1.9 traces) or ``gpu_annotation`` (device-side markers). Sorted by start; a
    (rank, step) marked twice keeps its first window. A table with no marker gives no rows.
    """
    cats = [HOST_MARKER_CAT, "cpu_op"] if cat == HOST_MARKER_CAT else [cat]
    return (  # one lazy query, one collect (not five eager operations)
        host.lazy().filter(pl.col("cat").is_in(cats), pl.col("name").str.starts_with(STEP_MARKER))
        .with_columns(
            pl.col("name").str.extract(STEP_MARKER + r"(\d+)").cast(pl.Int32).alias("step"),
            (pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns"),
        )
        .select("rank", "step", "start_ns", "end_ns")
        .sort("start_ns")
        .unique(["rank", "step"], keep="first", maintain_order=True)
        .collect()
    )


def device_and_host_windows(host: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(device-side, host-side) :func:`step_windows` of every rank, from one scan of the names.

    :func:`step_windows` keeps only rows named ``ProfilerStep#…``, so it sees the same rows in
    the same order in the :func:`marker_rows` subset as in the whole table: the same
    windows, without matching the category and name of every host event twice.
    """
    marks = marker_rows(host)
    return step_windows(marks, DEVICE_MARKER_CAT), step_windows(marks, HOST_MARKER_CAT)


def steps_containing(times: np.ndarray, spans: tuple[np.ndarray, np.ndarray, np.ndarray]
                     ) -> tuple[np.ndarray, np.ndarray]:
    """The step whose window contains each time: ``(step, found)`` arrays, ``len(times)`` long.

    ``spans`` = (starts, ends, steps), int64 ns and step numbers, in any order. A time
    belongs to the window with the latest start at or before it (stable order among equal
    starts: the last one), if it is before that window's end; else ``found`` is False
    (``step`` then holds -1).
    """
    import numpy as np

    s, e, n = spans
    o = np.argsort(s, kind="stable")
    s, e, n = s[o], e[o], n[o]
    k = np.searchsorted(s, times, "right") - 1
    ok = k >= 0
    kk = np.where(ok, k, 0)
    ok &= times < e[kk]
    return np.where(ok, n[kk], -1), ok


__all__ = ["STEP_MARKER", "WINDOW_CAT", "WINDOW_START", "WINDOW_END", "marker_name", "marker_rows", "step_windows", "device_and_host_windows",
           "steps_containing"]
