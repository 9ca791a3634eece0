"""Graph-capture windows: where launches produce no device op by design.

Between ``cudaStreamBeginCapture`` / ``hipStreamBeginCapture`` and the matching
``…StreamEndCapture`` runtime call (same rank and host thread), the kernels a framework
launches are recorded into a CUDA/HIP graph, not run: their launches have no device op, and
the device is not idle waiting for them. :func:`windows` finds those windows in a host
table; :mod:`traceroof.timeline` makes the device time under them the ``graph_capture``
bucket, and :mod:`traceroof.steps` never counts their launches as lost (a partial step).
"""

from __future__ import annotations

import polars as pl

#: runtime-call names that open and close a capture (CUDA and HIP spellings)
BEGIN_RE = r"^(?:cuda|hip)StreamBeginCapture"
END_RE = r"^(?:cuda|hip)StreamEndCapture"

WINDOW_SCHEMA = {"rank": pl.Int32, "thread": pl.String, "start_ns": pl.Int64, "end_ns": pl.Int64,
                 "launches": pl.Int64, "closed": pl.Boolean}


def windows(host: pl.DataFrame, *, unclosed: bool = False) -> pl.DataFrame:
    """The capture windows of ``host``, one row per Begin…End pair.

    Columns: ``rank``, ``thread`` (the host thread that captured), ``start_ns`` (the Begin
    call's start) and ``end_ns`` (the End call's end), ns on the host table's clock;
    ``launches``: launch runtime calls on that thread inside the window; ``closed``: whether
    an End closed it. Pairs are matched in time order per (rank, thread): each Begin with the
    next End after it (a nested Begin: the outer one counts). A Begin with no End before the
    table ends is not a window (nothing says where the capture stopped, and the launches after
    it may well have run): it is left out unless ``unclosed`` (then it runs to the last host
    event's end, ``closed`` False), so a caller can count and report it. No capture call: no
    rows. Never raises.
    """
    if host.height == 0 or "name" not in host.columns:
        return pl.DataFrame(schema=WINDOW_SCHEMA)
    calls = host.filter(pl.col("cat") == "runtime", pl.col("name").str.contains(BEGIN_RE + "|" + END_RE))
    if calls.height == 0:
        return pl.DataFrame(schema=WINDOW_SCHEMA)
    last_end = int((host["start_ns"] + host["dur_ns"].fill_null(0)).max())
    rows = []
    calls = calls.sort("rank", "thread", "start_ns")
    for (rank, thread), g in calls.group_by(["rank", "thread"], maintain_order=True):
        open_at = None
        for name, s, d in g.select("name", "start_ns", pl.col("dur_ns").fill_null(0)).iter_rows():
            if "Begin" in name:
                open_at = s if open_at is None else open_at  # nested Begin: the outer one counts
            elif open_at is not None:
                rows.append((rank, thread, open_at, s + d, True))
                open_at = None
        if open_at is not None and unclosed:
            rows.append((rank, thread, open_at, last_end, False))
    out = pl.DataFrame(rows, schema={k: WINDOW_SCHEMA[k] for k in ("rank", "thread", "start_ns", "end_ns", "closed")},
                       orient="row")
    return out.with_columns(_launches(host, out)).select(list(WINDOW_SCHEMA))


def _launches(host: pl.DataFrame, w: pl.DataFrame) -> pl.Series:
    """Per window of ``w``: launch calls (``*Launch*`` runtime calls) on its thread inside it
    (start in [start, end)), counted by two sorted searches per (rank, thread), not a filter
    of the host table per window."""
    import numpy as np

    counts = np.zeros(w.height, dtype=np.int64)
    if w.height == 0:
        return pl.Series("launches", counts, dtype=pl.Int64)
    calls = host.filter(pl.col("cat") == "runtime", pl.col("name").str.contains(r"(?i)launch"))
    wi = w.with_row_index("_w")
    for (rank, thread), g in wi.group_by(["rank", "thread"]):
        t = np.sort(calls.filter(pl.col("rank") == rank, pl.col("thread") == thread)["start_ns"].to_numpy())
        lo = np.searchsorted(t, g["start_ns"].to_numpy(), "left")
        hi = np.searchsorted(t, g["end_ns"].to_numpy(), "left")
        counts[g["_w"].to_numpy()] = hi - lo
    return pl.Series("launches", counts, dtype=pl.Int64)


def inside(host_rows: pl.DataFrame, w: pl.DataFrame) -> pl.Series:
    """Whether each row of ``host_rows`` (``rank``, ``thread``, ``start_ns``) starts inside a
    capture window of ``w`` on its own rank and thread: a Boolean Series, one per row.

    One backward as-of join on the windows' starts per (rank, thread) (the windows of one
    thread never overlap: each Begin is matched with the next End), not a cross product."""
    if w.height == 0 or host_rows.height == 0:
        return pl.Series("inside", [False] * host_rows.height, dtype=pl.Boolean)
    # the windows' thread is text (WINDOW_SCHEMA), the host table's dictionary-coded: both text
    t = (host_rows.select("rank", pl.col("thread").cast(pl.String), "start_ns").with_row_index("_i")
         .sort("start_ns"))
    win = w.select("rank", pl.col("thread").cast(pl.String), pl.col("start_ns").alias("_ws"), pl.col("end_ns").alias("_we")).sort("_ws")
    j = t.join_asof(win, left_on="start_ns", right_on="_ws", by=["rank", "thread"], strategy="backward",
                    check_sortedness=False)
    hit = (pl.col("_we").is_not_null() & (pl.col("start_ns") < pl.col("_we"))).fill_null(False)
    return j.sort("_i").select(hit.alias("inside"))["inside"]


__all__ = ["BEGIN_RE", "END_RE", "WINDOW_SCHEMA", "windows", "inside"]
