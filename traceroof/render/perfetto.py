"""A report's device ops, findings and steps as a Perfetto / Chrome trace-event JSON file.

``traceroof analyze TRACE --perfetto OUT.json.gz`` writes it; ui.perfetto.dev,
``chrome://tracing``, HTA's trace loader and traceroof's own Kineto reader open it. The format
is the Trace Event Format (Google, "Trace Event Format", the JSON Object Format:
``{"traceEvents": [...]}``; ``ts`` and ``dur`` in microseconds; ``ph`` ``X`` complete events,
``M`` metadata, ``C`` counters, ``s``/``f`` flow start/end bound by ``id``; ``bp: "e"`` binds a
flow end to its enclosing slice).

What it holds (docs/cli.md, "Perfetto export"):

* one process per (rank, device) (``pid = rank · 1000 + device``; a null device is 999), one
  thread per stream (``tid`` = the stream; a stream's ops that overlap each other go to extra
  "overlap" lanes, so every track's slices nest as the format requires). Each device op is an
  ``X`` slice named by its kernel, category ``kernel`` / ``gpu_memcpy`` / ``gpu_memset`` (the
  Kineto names, so Kineto readers see device ops), with its roofline as args: ``expected_ns``,
  ``gap_ns``, ``bound``, ``efficiency``, ``flops``, ``hbm_bytes``, ``intensity_flop_per_byte``,
  ``compute_dtype``, ``peak_dtype``, ``kind``, ``op``, ``step``, ``cost_source``, ``device``,
  ``stream``, ``correlation``. Unknown is JSON null, never 0.
* per rank, a process "rank R · host launches": each launch the op table links to its
  device ops (``launch_start_ns``, ``launch_dur_ns``, ``correlation``) as a ``cuda_runtime``
  slice, with a flow (``ac2g``, as Kineto writes) to each op it launched; the op table keeps no
  host thread, so a rank's launches share one track (in lanes where they overlap).
* one process "traceroof findings": each finding an ``X`` slice (lanes so that none overlap)
  with a flow to each op it names (at most :data:`MAX_FLOWS` per finding, largest gap first;
  the slice's args say how many ops matched and how many flows were drawn).
* per rank, a process "rank R · steps": each step an ``X`` slice, and two counter tracks set
  at each step's start: ``sum of expected op times, costed ops only (µs)`` (Σ ``expected_ns`` of the step's
  costed ops on all of the rank's devices: issue 16's step speed of light is not built, so the
  counter is named for what it is) and ``step wall time (µs)``.

Times are relative to the trace origin (the op table's ``start_ns``), written in µs with the
ns kept as three decimals (exact for traces shorter than ~100 days).
"""

from __future__ import annotations

import gzip
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import polars as pl

from ..report import Report
from ..roofline import group_label_expr

#: the most flows drawn from one finding to the ops it names (the largest gaps first)
MAX_FLOWS = 20
#: pid of the findings process
FINDINGS_PID = 1 << 30
#: pid of rank R's steps process: STEPS_PID_BASE + R
STEPS_PID_BASE = (1 << 30) + 1
#: pid of rank R's host-launches process: LAUNCH_PID_BASE + R
LAUNCH_PID_BASE = (1 << 30) + (1 << 24)
#: flow ids of launch → device op arrows start here (finding flows count from 1)
LAUNCH_FLOW_BASE = 1 << 40
#: Kineto category of a device op, by kind (every other kind is a ``kernel``)
DEVICE_CATEGORY = {"memcpy": "gpu_memcpy", "memset": "gpu_memset"}
#: the op-table columns each device-op slice carries as args (arg name → column)
OP_ARGS = {
    "kind": "kind", "op": "op", "step": "step", "device": "device", "stream": "stream",
    "expected_ns": "expected_ns", "gap_ns": "gap_ns", "bound": "bound", "efficiency": "efficiency",
    "flops": "flops", "hbm_bytes": "bytes", "intensity_flop_per_byte": "intensity",
    "compute_dtype": "dtype", "peak_dtype": "peak_dtype", "cost_source": "cost_source",
    "correlation": "correlation",
}


@dataclass
class PerfettoExport:
    """The trace events of a report and what the export counted.

    Attributes:
        events: the trace events (dicts in the Trace Event Format).
        ops: device-op slices written (every op of the report's op table).
        overlap_lanes: ops moved to an overlap lane of their stream (they overlapped an
            earlier op of the same stream).
        launches: host-launch slices written (each with a flow to every op it launched).
        findings: finding slices written; ``flows``: flows drawn from them to ops.
        steps: step slices written.
        notes: what the export left out or placed by a rule (shown by the CLI).
    """

    events: list[dict[str, Any]]
    ops: int = 0
    overlap_lanes: int = 0
    launches: int = 0
    findings: int = 0
    flows: int = 0
    steps: int = 0
    notes: list[str] = field(default_factory=list)


def _us(ns: int | float) -> float:
    """ns → µs with the ns as three decimals (the format's unit)."""
    return round(float(ns) / 1000.0, 3)


def _lanes(starts: list[int], ends: list[int]) -> list[int]:
    """Greedy interval partitioning of slices sorted by start: each goes to the first lane
    whose last slice ended at or before its start (lane 0 when nothing overlaps)."""
    last: list[int] = []
    out = []
    for s, e in zip(starts, ends):
        for i, end in enumerate(last):
            if end <= s:
                last[i] = e
                out.append(i)
                break
        else:
            last.append(e)
            out.append(len(last) - 1)
    return out


def _placed_ops(ops: pl.DataFrame) -> pl.DataFrame:
    """The op table sorted by track and start, with ``_pid``, ``_tid`` and ``_lane``."""
    df = ops.with_row_index("_row").with_columns(
        (pl.col("rank").fill_null(0).cast(pl.Int64) * 1000 + pl.col("device").fill_null(999).cast(pl.Int64)).alias("_pid"),
        pl.col("stream").fill_null(-1).cast(pl.Int64).alias("_stream"),
        (pl.col("start_ns") + pl.col("dur_ns")).alias("_end"),
    ).sort("_pid", "_stream", "start_ns", "_row")
    prev_end = pl.col("_end").cum_max().shift(1).over("_pid", "_stream")
    overlaps = df.select(((pl.col("start_ns") < prev_end).fill_null(False)).alias("o"))["o"]
    lanes = [0] * df.height
    if overlaps.any():
        keys = df.select("_pid", "_stream").with_row_index("_i")
        bad = set(keys.filter(overlaps).select("_pid", "_stream").unique().iter_rows())
        for (pid, stream), grp in keys.group_by("_pid", "_stream", maintain_order=True):
            if (pid, stream) in bad:
                idx = grp["_i"].to_list()
                sub = df[idx]
                for i, lane in zip(idx, _lanes(sub["start_ns"].to_list(), sub["_end"].to_list())):
                    lanes[i] = lane
    return df.with_columns(pl.Series("_lane", lanes, dtype=pl.Int64))


def _tid(stream: int, lane: int) -> int:
    """Thread id of a stream's lane: the stream for lane 0, else past every stream id."""
    return stream if lane == 0 else (1 << 40) + (stream + 1) * 64 + lane


def _op_events(placed: pl.DataFrame, multi_rank: bool) -> tuple[list[dict[str, Any]], dict[int, tuple[int, int]]]:
    """The device-op slices and their track metadata; the second value maps an op's row
    (its index in the report's op table) to its (pid, tid)."""
    events: list[dict[str, Any]] = []
    where: dict[int, tuple[int, int]] = {}
    cols = list(OP_ARGS.values())
    kinds = placed["kind"].cast(pl.String).to_list()
    for r, kind, pid, stream, lane, row in zip(
            placed.select("name", "start_ns", "dur_ns", *[c for c in cols if c != "kind"]).iter_rows(named=True), kinds,
            placed["_pid"].to_list(), placed["_stream"].to_list(), placed["_lane"].to_list(), placed["_row"].to_list()):
        tid = _tid(stream, lane)
        where[row] = (pid, tid)
        args = {k: (kind if c == "kind" else r[c]) for k, c in OP_ARGS.items()}
        events.append({"ph": "X", "cat": DEVICE_CATEGORY.get(kind, "kernel"), "name": r["name"], "pid": pid, "tid": tid,
                       "ts": _us(r["start_ns"]), "dur": _us(r["dur_ns"]), "args": args})
    tracks = placed.select("rank", "device", "_pid", "_stream", "_lane").unique().sort("_pid", "_stream", "_lane")
    named: set[int] = set()
    for rank, device, pid, stream, lane in tracks.iter_rows():
        if pid not in named:
            named.add(pid)
            proc = (f"rank {rank} · " if multi_rank else "") + ("device ?" if device is None else f"device {device}")
            events.append(_meta("process_name", pid, 0, proc))
        thread = ("stream ?" if stream == -1 else f"stream {stream}") + (f" · overlap lane {lane}" if lane else "")
        events.append(_meta("thread_name", pid, _tid(stream, lane), thread))
        events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": _tid(stream, lane),
                       "args": {"sort_index": int(stream) * 64 + int(lane)}})
    return events, where


def _meta(what: str, pid: int, tid: int, name: str) -> dict[str, Any]:
    return {"ph": "M", "name": what, "pid": pid, "tid": tid, "args": {"name": name}}


def _finding_window(f: Any, ops: pl.DataFrame) -> tuple[int, int, str]:
    """A finding's (start_ns, end_ns) and where it came from: its own window, else its
    rank's ops' span, else the whole trace's."""
    if f.start_ns is not None and f.end_ns is not None and f.end_ns >= f.start_ns:
        return int(f.start_ns), int(f.end_ns), "the finding's own"
    sub = ops.filter(pl.col("rank") == f.rank) if f.rank is not None else ops
    sub = sub if sub.height else ops
    s, e = int(sub["start_ns"].min()), int((sub["start_ns"] + sub["dur_ns"]).max())
    where = f"rank {f.rank}'s ops' span" if f.rank is not None else "the whole trace"
    return s, e, f"{where} (the finding names no time window)"


def _named_ops(f: Any, labelled: pl.DataFrame, s: int, e: int) -> pl.DataFrame:
    """The ops a finding names (label, framework op or kernel name in ``f.ops``), on its rank,
    overlapping [s, e]; largest gap first."""
    names = list(f.ops or [])
    if not names:
        return labelled.head(0)
    cond = (pl.col("_label").is_in(names) | pl.col("op").is_in(names) | pl.col("name").is_in(names)) & \
        (pl.col("start_ns") <= e) & ((pl.col("start_ns") + pl.col("dur_ns")) >= s)
    if f.rank is not None:
        cond = cond & (pl.col("rank") == f.rank)
    return labelled.filter(cond).sort("gap_ns", descending=True, nulls_last=True)


def _finding_events(report: Report, ops: pl.DataFrame, where: dict[int, tuple[int, int]],
                    out: PerfettoExport) -> None:
    """The findings process: one slice per finding, flows to the ops it names."""
    if not report.findings:
        return
    by = (report.filters.group_by if report.filters else None) or "op"
    labelled = ops.with_row_index("_row").with_columns(group_label_expr(by).alias("_label"))
    windows = [_finding_window(f, ops) for f in report.findings]
    order = sorted(range(len(windows)), key=lambda i: (windows[i][0], i))
    lanes = _lanes([windows[i][0] for i in order], [windows[i][1] + 1 for i in order])  # strict: flows bind inside
    out.events.append(_meta("process_name", FINDINGS_PID, 0, "traceroof findings"))
    for lane in sorted(set(lanes)):
        out.events.append(_meta("thread_name", FINDINGS_PID, lane, f"findings · lane {lane}"))
    for i, lane in zip(order, lanes):
        f = report.findings[i]
        s, e, origin = windows[i]
        named = _named_ops(f, labelled, s, e)
        drawn = named.head(MAX_FLOWS)
        out.events.append({
            "ph": "X", "cat": "traceroof_finding", "name": f.title or f.kind, "pid": FINDINGS_PID, "tid": lane,
            "ts": _us(s), "dur": _us(e - s),
            "args": {"rank": f.rank, "finding": i + 1, "kind": f.kind, "severity": f.severity,
                     "recoverable_ns": f.recoverable_ns, "step": f.step, "window": origin,
                     "explanation": f.explanation, "ops": list(f.ops or []), "occurrences": f.occurrences,
                     "ops_matched": named.height, "flows_drawn": drawn.height, "evidence": f.evidence},
        })
        for row, start in zip(drawn["_row"].to_list(), drawn["start_ns"].to_list()):
            out.flows += 1
            pid, tid = where[row]
            common = {"cat": "traceroof_flow", "name": f"finding #{i + 1}", "id": out.flows}
            out.events.append({"ph": "s", **common, "pid": FINDINGS_PID, "tid": lane, "ts": _us(s)})
            out.events.append({"ph": "f", "bp": "e", **common, "pid": pid, "tid": tid, "ts": _us(start)})
        out.findings += 1


def _launch_events(ops: pl.DataFrame, where: dict[int, tuple[int, int]], out: PerfettoExport) -> None:
    """Per rank, a "host launches" process: each distinct launch (correlation, start) of the
    op table as a ``cuda_runtime`` slice, and a flow (Kineto's ``ac2g``) to each device op it
    launched. The op table keeps no host thread, so the launches of a rank share one track,
    in lanes where they overlap."""
    if "launch_start_ns" not in ops.columns:
        return
    la = ops.with_row_index("_row").filter(pl.col("launch_start_ns").is_not_null()).select(
        "_row", "rank", "name", "correlation", "launch_start_ns", pl.col("launch_dur_ns").fill_null(0).alias("_d"))
    if la.height == 0:
        return
    calls = la.group_by("rank", "correlation", "launch_start_ns", maintain_order=True).agg(
        pl.col("_d").max(), pl.col("_row"), pl.col("name").first()).sort("rank", "launch_start_ns", "correlation")
    for (rank,), grp in calls.group_by("rank", maintain_order=True):
        pid = LAUNCH_PID_BASE + int(rank)
        starts = grp["launch_start_ns"].to_list()
        lanes = _lanes(starts, [s + d for s, d in zip(starts, grp["_d"].to_list())])
        out.events.append(_meta("process_name", pid, 0, f"rank {rank} · host launches"))
        for lane in sorted(set(lanes)):
            out.events.append(_meta("thread_name", pid, lane, "launches" + (f" · lane {lane}" if lane else "")))
        for (s, d, rows, name, corr), lane in zip(grp.select("launch_start_ns", "_d", "_row", "name", "correlation")
                                                  .iter_rows(), lanes):
            out.events.append({"ph": "X", "cat": "cuda_runtime", "name": "launch", "pid": pid, "tid": lane,
                               "ts": _us(s), "dur": _us(d), "args": {"correlation": corr, "device_ops": len(rows),
                                                                     "first_device_op": name}})
            out.launches += 1
            for row in rows:
                fid = LAUNCH_FLOW_BASE + row
                op_pid, op_tid = where[row]
                start = int(ops["start_ns"][row])
                out.events.append({"ph": "s", "cat": "ac2g", "name": "ac2g", "id": fid, "pid": pid, "tid": lane,
                                   "ts": _us(s)})
                out.events.append({"ph": "f", "bp": "e", "cat": "ac2g", "name": "ac2g", "id": fid, "pid": op_pid,
                                   "tid": op_tid, "ts": _us(start)})


#: the counter of each step's summed expected op times: over the ops with a cost only (a step
#: with uncosted ops sums less than its ops would take at their roofs; the slice's
#: ``ops_without_cost`` says how many)
EXPECTED_COUNTER = "sum of expected op times, costed ops only (µs)"


def _step_events(report: Report, ops: pl.DataFrame, out: PerfettoExport) -> None:
    """Per rank: step slices and the two counter tracks (sum of expected op times, wall)."""
    steps = report.steps
    if steps.height == 0 or "step" not in steps.columns:
        return
    # an unsegmented trace's one step has step null, like its ops: nulls match
    sums = ops.group_by("rank", "step").agg(
        pl.col("expected_ns").sum().alias("sum_expected_ns"),
        pl.col("expected_ns").is_null().sum().alias("ops_without_cost"),
        pl.len().alias("ops"))
    rows = steps.select("rank", "step", "start_ns", "end_ns").join(
        sums, on=["rank", "step"], how="left", nulls_equal=True).sort("rank", "start_ns")
    for rank in rows["rank"].unique().sort().to_list():
        pid = STEPS_PID_BASE + int(rank)
        out.events.append(_meta("process_name", pid, 0, f"rank {rank} · steps"))
        out.events.append(_meta("thread_name", pid, 0, "steps"))
        last_end = None
        mine = rows.filter(pl.col("rank") == rank)
        # a rank's step spans its devices' windows: on a multi-chip rank whose chips start the
        # next step before the last one ends them, consecutive steps overlap: lanes, so every
        # track's slices nest
        lanes = _lanes(mine["start_ns"].to_list(), mine["end_ns"].to_list())
        for lane in sorted(set(lanes) - {0}):
            out.events.append(_meta("thread_name", pid, lane, f"steps · lane {lane}"))
        for lane, r in zip(lanes, mine.iter_rows(named=True)):
            s, e = int(r["start_ns"]), int(r["end_ns"])
            n_ops, n_unknown = r["ops"] or 0, r["ops_without_cost"] or 0
            exp = float(r["sum_expected_ns"] or 0.0)
            out.events.append({"ph": "X", "cat": "traceroof_step", "name": f"step {r['step']}", "pid": pid, "tid": lane,
                               "ts": _us(s), "dur": _us(e - s),
                               # unknown when none of the step's ops has a cost (never 0)
                               "args": {"step": r["step"], "wall_ns": e - s,
                                        "sum_expected_ns": exp if n_ops > n_unknown else None,
                                        "ops": n_ops, "ops_without_cost": n_unknown}})
            out.events.append({"ph": "C", "name": EXPECTED_COUNTER, "pid": pid, "ts": _us(s),
                               "args": {"value": _us(exp)}})
            out.events.append({"ph": "C", "name": "step wall time (µs)", "pid": pid, "ts": _us(s),
                               "args": {"value": _us(e - s)}})
            last_end = e if last_end is None else max(last_end, e)
            out.steps += 1
        if last_end is not None:  # a counter holds its value until the next sample: end at 0
            for name in (EXPECTED_COUNTER, "step wall time (µs)"):
                out.events.append({"ph": "C", "name": name, "pid": pid, "ts": _us(last_end), "args": {"value": 0}})


def trace_events(report: Report) -> PerfettoExport:
    """The trace events of ``report`` (module docstring for the layout).

    Raises:
        ValueError: the report holds no op table (a report saved without ops).
    """
    if report.ops is None:
        raise ValueError("the report holds no op table (saved without ops): nothing to export")
    ops = report.ops
    missing = [c for c in OP_ARGS.values() if c not in ops.columns]  # no device ops: no roofline columns
    ops = ops.with_columns([pl.lit(None).alias(c) for c in missing]) if missing else ops
    out = PerfettoExport(events=[])
    multi_rank = ops["rank"].n_unique() > 1 if ops.height else False
    placed = _placed_ops(ops)
    op_events, where = _op_events(placed, multi_rank)
    out.events.extend(op_events)
    out.ops = ops.height
    out.overlap_lanes = int((placed["_lane"] > 0).sum())
    if out.overlap_lanes:
        out.notes.append(f"{out.overlap_lanes:,} ops overlap an earlier op of their stream: drawn on "
                         "'overlap lane' tracks of that stream")
    if ops.height:
        _launch_events(ops, where, out)
        _finding_events(report, ops, where, out)
        _step_events(report, ops, out)
    return out


def write_perfetto(report: Report, path: str | os.PathLike[str]) -> PerfettoExport:
    """Write ``report`` as a trace-event JSON file (gzip-compressed when ``path`` ends in
    ``.gz``) and return what was written.

    The top-level ``traceroof`` key holds the version, the chip and the counts
    (``ops``, ``findings``, ``flows``, ``steps``, ``notes``).

    Raises:
        ValueError: the report holds no op table.
        OSError: ``path`` cannot be written.
    """
    out = trace_events(report)
    ranks = report.trace.ranks or []
    doc: dict[str, Any] = {"displayTimeUnit": "ns"}
    if len(ranks) == 1:  # what Kineto writes for one rank (HTA reads the rank from it)
        doc["distributedInfo"] = {"rank": int(ranks[0])}
    doc |= {
        "traceroof": {"version": report.traceroof_version, "schema_version": report.schema_version,
                      "sources": report.trace.sources, "chip": report.chip.name if report.chip else None,
                      "ops": out.ops, "launches": out.launches, "findings": out.findings, "flows": out.flows, "steps": out.steps,
                      "overlap_lanes": out.overlap_lanes, "notes": out.notes,
                      "times": "µs since the trace origin (the report's start_ns = 0)"},
        "traceEvents": out.events,
    }
    data = msgspec.json.encode(doc)
    p = Path(path)
    if p.name.endswith(".gz"):
        data = gzip.compress(data, compresslevel=6)
    p.write_bytes(data)
    return out
