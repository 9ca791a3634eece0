"""The time base: each (rank, device) timeline partitioned into buckets (accounting rules 1, 2).

Every device op falls in exactly one bucket, by its device start:

* ``step``: the device window of one step (``step`` its number; null for the one
  unsegmented step of a trace without ``ProfilerStep#N`` markers);
* ``before_first_step`` / ``after_last_step``: recorded device time before the first step's
  window, after the last one's;
* ``graph_capture``: device time under a graph-capture window of the rank
  (:mod:`traceroof.graph_capture`: launches there produce no device op by design);
* ``outside_recording``: ops that cannot be placed on the recorded timeline: before or after
  the Kineto recording window (warm-up), stamped more than :data:`BEFORE_LAUNCH_TOL_NS`
  before their own launch, or at a raw timestamp ≤ 0 (clock trouble). They are counted, not
  placed: they define no step and no idle.

Step windows on a device (``docs/accounting.md``, rule 1): step N starts where the device
starts step N's work, the device-side ``ProfilerStep#N`` marker when the trace has one, else
the first device op the parser attributed to step N (by its launch: ``ops.step``), and ends
where step N+1 starts (the last step: at the end of its last op, or of its marker); starts
are made monotone (a running maximum in step order), so windows never overlap. The recorded
span of a device (first to last end of its placed ops, widened to its step and capture
windows) is covered exactly by its ``segments``: disjoint intervals, each one bucket. An op
running past its segment's end is split there (``pieces``), so per-device busy summed over
buckets equals the plain interval union.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import polars as pl

from . import graph_capture, units
from . import intervals as iv
from .frames import done, small
from .step_markers import (
    DEVICE_MARKER_CAT,
    STEP_MARKER,
    WINDOW_CAT,
    WINDOW_END,
    WINDOW_START,
    device_and_host_windows,
    marker_rows,
)
from .step_windows import step_starts
from .trace import TraceMeta

#: bucket names, in report order
BUCKETS = ("step", "before_first_step", "after_last_step", "graph_capture", "outside_recording")
#: a device op stamped more than this before its own launch (ns) is clock trouble, not work
BEFORE_LAUNCH_TOL_NS = 1_000_000
#: a rank whose device ops reach this raw time (1 h, ns) keeps an absolute clock: an op
#: stamped at ts ≤ 0 there is the CUPTI clock fallback, not the trace's own origin
ABSOLUTE_CLOCK_NS = 3_600_000_000_000

SEGMENT_SCHEMA = {"rank": pl.Int32, "device": pl.Int32, "bucket": pl.String, "step": pl.Int32,
                  "start_ns": pl.Int64, "end_ns": pl.Int64}
#: the op columns the pieces carry (for the per-step breakdown)
PIECE_COLUMNS = ("kind", "bound", "flops")


@dataclass(frozen=True)
class Timeline:
    """The partition of every device's timeline.

    Attributes:
        ops: the op table with ``step`` (the step whose window holds the op's device start;
            null outside steps) and ``bucket`` (one of :data:`BUCKETS`) set.
        segments: :data:`SEGMENT_SCHEMA`: per (rank, device), disjoint intervals (ns, end
            exclusive) that cover its recorded span, each labelled with its bucket and step.
        pieces: the placed ops cut at segment ends: ``rank``, ``device``, ``bucket``,
            ``step``, ``start_ns``, ``end_ns``, ``head`` (the piece holding the op's start:
            one per op), and :data:`PIECE_COLUMNS`, ``launch_start_ns``.
        captures: the capture windows (:func:`traceroof.graph_capture.windows`).
        host_steps: the host-side step windows (rank, step, start_ns, end_ns).
        outside: per reason (``before_recording``, ``after_recording``, ``before_launch``,
            ``ts_zero``), the ops put in ``outside_recording``.
        unions: :func:`piece_unions` once computed (None until then).
        notes: what the partition has to say (:class:`Notes`; :func:`say` words it).
        marked: whether the host table has a step marker (device- or host-side, any rank):
            what decides how a device without a step window is segmented (:func:`partition`).
        windowless: whether some (rank, device) had no step window, so that its segments
            depend on that decision (:func:`traceroof.steps.segments_agree`).
    """

    ops: pl.DataFrame
    segments: pl.DataFrame
    pieces: pl.DataFrame
    captures: pl.DataFrame
    host_steps: pl.DataFrame
    outside: dict[str, int]
    unions: pl.DataFrame | None = None
    notes: Notes | None = None
    marked: bool = False
    windowless: bool = False


@dataclass(frozen=True)
class Notes:
    """What :func:`partition` says, kept as counts and per-rank lines, so that the notes of
    ranks partitioned apart (:mod:`traceroof.rank_prep`) add up (:meth:`add`) to the whole
    trace's, and :func:`say` words them as the whole trace's partition would.

    Attributes:
        outside_ops, outside_ns: device ops put in ``outside_recording``, and their device
            time (ns, summed durations).
        outside: those ops per reason (:func:`outside_reasons`).
        capture_windows, capture_launches, capture_ns: graph-capture windows, the launch
            calls inside them, and the device time under them (ns).
        unclosed, clock: the per-rank warnings (capture begun and never ended; a device clock
            offset suspected), in rank order.
    """

    outside_ops: int = 0
    outside_ns: int = 0
    outside: dict[str, int] = dataclasses.field(default_factory=dict)
    capture_windows: int = 0
    capture_launches: int = 0
    capture_ns: int = 0
    unclosed: tuple[str, ...] = ()
    clock: tuple[str, ...] = ()

    @staticmethod
    def add(parts: list[Notes]) -> Notes:
        """The notes of disjoint ranks together (counts summed, lines concatenated in the
        order of ``parts``)."""
        return Notes(outside_ops=sum(p.outside_ops for p in parts), outside_ns=sum(p.outside_ns for p in parts),
                     outside=add_counts(p.outside for p in parts), capture_windows=sum(p.capture_windows for p in parts),
                     capture_launches=sum(p.capture_launches for p in parts),
                     capture_ns=sum(p.capture_ns for p in parts),
                     unclosed=tuple(w for p in parts for w in p.unclosed), clock=tuple(w for p in parts for w in p.clock))


def add_counts(counts: Iterable[dict[str, int]]) -> dict[str, int]:
    """Per-reason op counts (:attr:`Timeline.outside`, :attr:`Notes.outside`) of disjoint
    ranks, summed per reason (keys in first-seen order)."""
    out: dict[str, int] = {}
    for c in counts:
        for k, v in c.items():
            out[k] = out.get(k, 0) + v
    return out


def recording_windows(host: pl.DataFrame) -> dict[Any, tuple[int | None, int | None]]:
    """Per rank, the Kineto recording window (start, end) ns: the ``Iteration Start: PyTorch
    Profiler`` and ``Record Window End`` instants (host rows of category
    :data:`~traceroof.step_markers.WINDOW_CAT`); None where the trace lacks one."""
    if host.height == 0:
        return {}
    w = host.filter(pl.col("cat") == WINDOW_CAT)
    out: dict[Any, tuple[int | None, int | None]] = {}
    for (rank,), g in w.group_by(["rank"]):
        s = g.filter(pl.col("name").str.starts_with(WINDOW_START))["start_ns"]
        e = g.filter(pl.col("name") == WINDOW_END)["start_ns"]
        out[rank] = (int(s.min()) if s.len() else None, int(e.max()) if e.len() else None)
    return out


def outside_reasons(ops: pl.DataFrame, host: pl.DataFrame, meta: TraceMeta) -> pl.Series:
    """Why each op cannot be placed on the recorded timeline (null: it can): ``ts_zero`` (raw
    timestamp ≤ 0 on a rank whose clock is absolute, :data:`ABSOLUTE_CLOCK_NS`: the CUPTI
    clock fallback), ``before_launch`` (device start more than
    :data:`BEFORE_LAUNCH_TOL_NS` before its launch), ``before_recording`` /
    ``after_recording`` (launched outside the rank's :func:`recording_windows`; an op without
    a launch by its device start). A String Series."""
    win = recording_windows(host)
    origin = pl.col("rank").replace_strict(
        {r: meta.stats.get(f"origin_ns[{r}]", meta.origin_ns) for r in ops["rank"].unique().to_list()},
        default=meta.origin_ns, return_dtype=pl.Int64)
    ws = pl.col("rank").replace_strict({r: w[0] for r, w in win.items()}, default=None, return_dtype=pl.Int64)
    we = pl.col("rank").replace_strict({r: w[1] for r, w in win.items()}, default=None, return_dtype=pl.Int64)
    # a raw timestamp ≤ 0 is clock trouble only on a rank whose clock reads absolute time
    # (another op at least ABSOLUTE_CLOCK_NS in): hand-written traces start at 0
    absolute = (pl.col("start_ns").max().over("rank") + origin) >= ABSOLUTE_CLOCK_NS
    # an op is inside the recording when it was launched inside it: a device lagging the
    # host runs work launched before Record Window End after it (CUPTI still records it);
    # an op without a launch (warm-up kernels, XPlane) by its device start
    when = pl.coalesce("launch_start_ns", "start_ns")
    reason = (
        pl.when((pl.col("start_ns") + origin <= 0) & absolute).then(pl.lit("ts_zero"))
        .when(pl.col("start_ns") < pl.col("launch_start_ns") - BEFORE_LAUNCH_TOL_NS).then(pl.lit("before_launch"))
        .when(when < ws).then(pl.lit("before_recording"))
        .when(when >= we).then(pl.lit("after_recording"))
    )
    return ops.select(reason.alias("outside"))["outside"]


def partition(ops: pl.DataFrame, host: pl.DataFrame, meta: TraceMeta, *, warn: bool = True) -> Timeline:
    """Partition every (rank, device) timeline of ``ops`` into buckets (module docstring).

    ``ops``: the op table, ``step`` filled by the parser (launch attribution); ``host``: its
    host table. With ``warn``, says once, in ``meta.warnings``, how many ops (and ns) went to
    ``outside_recording``, and how much device time lay under capture windows (:func:`say`);
    without, ``meta`` is only read, and ``Timeline.notes`` holds what would be said. Every
    (rank, device) is partitioned on its own: the partition of a trace is the concatenation
    of its ranks' (their notes added, :meth:`Notes.add`) but for one input decided over the
    whole table: whether it has a step marker at all (``Timeline.marked``: without any, a
    device with no step window is one unsegmented step, else it is outside the steps; a rank
    partitioned alone decides it from its own, :func:`traceroof.steps.segments_agree`).
    Never raises.
    """
    gpu, cpu = _device_markers(host), device_and_host_windows(host)[1]
    every = graph_capture.windows(host, unclosed=True)
    caps, unclosed = ((every.filter(pl.col("closed")), every.filter(~pl.col("closed"))) if every.height
                      else (every, every))  # (no capture: no query)
    why = outside_reasons(ops, host, meta)
    everything_placed = why.null_count() == why.len()
    # the columns the partition reads (not a filtered copy, nor a join, of the whole op
    # table: ~60 MB each on the 1 GB replicated trace); only bucket and step are written back
    narrow = ops.select(*_PLACED_COLUMNS).with_columns(
        why.alias("_why"), pl.int_range(pl.len(), dtype=pl.Int64).alias("_i"))
    placed = narrow if everything_placed else narrow.filter(pl.col("_why").is_null())
    marked = bool(gpu.height or cpu.height)
    segments, windowless = _segments(placed, gpu, cpu, caps, marked)
    pieces, head = _cut(placed, segments)
    tags = narrow.select("_i", "_why").join(head, on="_i", how="left", maintain_order="left").select(
        pl.when(pl.col("_why").is_not_null()).then(pl.lit("outside_recording")).otherwise(pl.col("_bucket")).alias("bucket"),
        pl.when(pl.col("_why").is_null()).then(pl.col("_step")).cast(pl.Int32).alias("step"),
    )
    ops = ops.with_columns(tags.get_columns())
    outside = {} if everything_placed else {
        k: int(v) for k, v in narrow.filter(pl.col("_why").is_not_null()).group_by("_why").len().iter_rows()}
    notes = _notes(narrow, segments, caps, outside, unclosed, placed)
    if warn:
        say(notes, meta)
    return Timeline(ops=ops, segments=segments, pieces=pieces, captures=caps, host_steps=cpu, outside=outside,
                    notes=notes, marked=marked, windowless=windowless)


#: the op-table columns :func:`partition` reads (its segments, pieces and warnings)
_PLACED_COLUMNS = ("rank", "device", "step", "start_ns", "dur_ns", "launch_start_ns", *PIECE_COLUMNS)


def _notes(ops: pl.DataFrame, seg: pl.DataFrame, caps: pl.DataFrame, outside: dict[str, int],
           unclosed: pl.DataFrame, placed: pl.DataFrame) -> Notes:
    """The :class:`Notes` of a partition: the ops outside the recording, the capture time,
    the unclosed captures and the clock offsets suspected."""
    n_out = ns_out = 0
    if outside:
        out = ops.filter(pl.col("_why").is_not_null())
        n_out, ns_out = out.height, int(out["dur_ns"].sum())
    cap_ns = launches = 0
    if caps.height:
        cap = seg.filter(pl.col("bucket") == "graph_capture")
        cap_ns = int((cap["end_ns"] - cap["start_ns"]).sum()) if cap.height else 0
        launches = int(caps["launches"].sum())
    return Notes(outside_ops=n_out, outside_ns=ns_out, outside=dict(outside), capture_windows=caps.height,
                 capture_launches=launches, capture_ns=cap_ns, unclosed=tuple(_unclosed_lines(unclosed)),
                 clock=tuple(_clock_lines(placed)))


def say(notes: Notes, meta: TraceMeta) -> None:
    """Word ``notes`` into ``meta``: one warning for the ops outside the recording (and
    ``meta.stats['ops_outside_recording']``), one for capture time, then the per-rank lines."""
    if notes.outside:
        meta.stats["ops_outside_recording"] = notes.outside_ops
        what = ", ".join(f"{n:,} {_REASON_WORDS.get(k, k)}" for k, n in sorted(notes.outside.items()))
        meta.warn(f"{units.plural(notes.outside_ops, 'device op')} ({units.ns(notes.outside_ns)} of device time) "
                  f"lie outside the recorded timeline ({what}): they are in no step and not counted as idle "
                  "(accounting rule 2)")
    if notes.capture_windows:
        meta.warn(f"{units.plural(notes.capture_windows, 'graph-capture window')} "
                  f"({units.plural(notes.capture_launches, 'launch call')} inside, recorded into graphs: no "
                  f"device op by design): {units.ns(notes.capture_ns)} of device time under them is graph capture, "
                  "not idle and not a partial step")
    for w in (*notes.unclosed, *notes.clock):
        meta.warn(w)


#: how the warning words each reason of :func:`outside_reasons`
_REASON_WORDS = {
    "ts_zero": "stamped at time 0 (clock fallback)",
    "before_launch": f"stamped over {units.ns(BEFORE_LAUNCH_TOL_NS)} before their own launch",
    "before_recording": "launched before the recording window",
    "after_recording": "launched after the recording window",
}


#: a median queue lag (launch → device start) above this is more likely a clock offset
#: between host and device than work queued: said, never corrected
CLOCK_OFFSET_SUSPECT_NS = 1_000_000_000


def _clock_lines(ops: pl.DataFrame) -> list[str]:
    """A warning per rank whose device ops start a median over :data:`CLOCK_OFFSET_SUSPECT_NS`
    after their launches, in rank order."""
    lag = (ops.lazy().filter(pl.col("launch_start_ns").is_not_null())
           .group_by("rank").agg((pl.col("start_ns") - pl.col("launch_start_ns")).median().alias("lag")))
    return [f"rank {rank}: device ops start a median {units.ns(v)} after their launches: more likely "
            "a device clock offset from the host's than queued work (step windows and idle use device "
            "time; the queue lag includes the offset)"
            for rank, v in lag.sort("rank").collect().iter_rows() if v is not None and v > CLOCK_OFFSET_SUSPECT_NS]


def _unclosed_lines(unclosed: pl.DataFrame) -> list[str]:
    """One warning per rank for capture Begins the trace never closes (not windows)."""
    out: list[str] = []
    if unclosed.height == 0:
        return out
    for (rank,), g in unclosed.group_by(["rank"], maintain_order=True):
        at = ", ".join(units.ns(int(x)) for x in g["start_ns"].head(3).to_list())
        out.append(f"rank {rank}: {units.plural(g.height, 'graph capture')} begun (at {at}) and never ended in "
                   "the trace: not treated as capture windows; the launches after them are judged as any other")
    return out


# --------------------------------------------------------------------------- segments


def _device_markers(host: pl.DataFrame) -> pl.DataFrame:
    """Device-side step markers per device: ``rank``, ``device`` (the last integer of the
    marker's ``pid``: a Kineto device id, an XPlane ``/device:GPU:N`` plane; null when it has
    none), ``step``, ``start_ns``, ``end_ns``; a (rank, device, step) marked twice keeps its
    first window."""
    m = marker_rows(host).filter(pl.col("cat") == DEVICE_MARKER_CAT)
    return (m.with_columns(
        pl.col("name").str.extract(STEP_MARKER + r"(\d+)").cast(pl.Int32).alias("step"),
        pl.col("pid").cast(pl.String).str.extract(r"(\d+)\D*$").cast(pl.Int32, strict=False).alias("device"),
        (pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns"))
        .select("rank", "device", "step", "start_ns", "end_ns").sort("start_ns")
        .unique(["rank", "device", "step"], keep="first", maintain_order=True))


def _segments(placed: pl.DataFrame, gpu: pl.DataFrame, cpu: pl.DataFrame, caps: pl.DataFrame,
              segmented: bool) -> tuple[pl.DataFrame, bool]:
    """:data:`SEGMENT_SCHEMA` rows covering, on each device of a rank, the rank's recorded
    span (first device-op start to last end over all its devices, widened by capture
    windows and step windows); and whether a device had no step window (its segments are
    then one unsegmented step when not ``segmented``, else outside the steps)."""
    starts = step_starts(placed, gpu, cpu)
    windowless = False
    # every device of a rank covers the rank's recorded span: a process drives its devices
    # together, so a chip that starts late was idle (or outside the steps) meanwhile
    p = small(placed)  # (one lazy plan on a small table, :mod:`traceroof.frames`)
    rank_span = p.group_by("rank").agg(
        pl.col("start_ns").min().alias("lo"), (pl.col("start_ns") + pl.col("dur_ns")).max().alias("hi"))
    spans = done(p.select("rank", "device").unique().join(rank_span, on="rank").select("rank", "device", "lo", "hi")
                 .sort("rank", "device"))
    rows: list[tuple] = []
    # one split of each table, not a filter of it per (rank, device)
    starts_of = starts.partition_by(["rank", "device"], as_dict=True)
    caps_of = caps.partition_by(["rank"], as_dict=True) if caps.height else {}
    ops_of = (placed.select("rank", "device", "start_ns", "dur_ns", "launch_start_ns")
              .partition_by(["rank", "device"], as_dict=True)) if caps.height else {}
    empty = starts.clear()
    for rank, device, lo, hi in spans.iter_rows():
        w = starts_of.get((rank, device), empty)
        c = caps_of.get((rank,))
        cap = _device_captures(c, ops_of.get((rank, device))) if c is not None else []
        windowless |= w.height == 0
        base = _base(w, lo, hi, segmented)
        lo = min([lo, *(s for s, _ in cap)] + [b[2] for b in base])
        hi = max([hi, *(e for _, e in cap)] + [b[3] for b in base])
        rows += [(rank, device, *x) for x in _carve(_close(base, lo, hi), cap)]
    return pl.DataFrame(rows, schema=SEGMENT_SCHEMA, orient="row"), windowless


def _device_captures(caps: pl.DataFrame, ops: pl.DataFrame | None) -> list[tuple[int, int]]:
    """The capture windows ``caps`` (host times, ns) as they fall on one device: each starts
    only once the device has finished the work launched before the capture began (the
    device lags the host: kernels launched before ``BeginCapture`` run during it and are not
    capture); a window that work covers entirely is dropped."""
    import numpy as np  # only for a rank with graph-capture windows (rare): not on every run's imports

    out = []
    if ops is None or ops.height == 0:
        return [(a, b) for a, b in caps.select("start_ns", "end_ns").iter_rows() if b > a]
    o = ops.sort("start_ns")
    st = o["start_ns"].to_numpy()
    en = st + o["dur_ns"].to_numpy()
    la = o["launch_start_ns"].fill_null(np.iinfo(np.int64).max).to_numpy()
    run_end = np.maximum.accumulate(en)  # latest end of the ops started so far
    for a, b in caps.select("start_ns", "end_ns").iter_rows():
        i, j = np.searchsorted(st, a, "left"), np.searchsorted(st, b, "left")
        busy_to = int(run_end[i - 1]) if i else a  # ops started before the capture
        queued = en[i:j][la[i:j] < a]  # started inside it, launched before it
        a2 = max(a, busy_to, int(queued.max()) if queued.size else a)
        if b > a2:
            out.append((a2, b))
    return out


def _base(w: pl.DataFrame, lo: int, hi: int, segmented: bool) -> list[tuple]:
    """(bucket, step, start, end) of the step windows of one device: monotone starts, each
    step ending where the next starts, the last at its ``e``."""
    if w.height == 0:
        return [] if segmented else [("step", None, lo, hi)]
    out = []
    run = None
    steps = w.select("step", "s", "e").rows()
    for i, (step, s, e) in enumerate(steps):
        run = s if run is None else max(run, s)
        nxt = max(run, steps[i + 1][1]) if i + 1 < len(steps) else max(run, e if e is not None else run)
        out.append(("step", step, run, nxt))
    return out


def _close(base: list[tuple], lo: int, hi: int) -> list[tuple]:
    """``base`` with the ``before_first_step`` / ``after_last_step`` segments that make it
    cover [lo, hi) (no step window: all of it is ``before_first_step``)."""
    if not base:
        return [("before_first_step", None, lo, hi)]
    out = []
    if lo < base[0][2]:
        out.append(("before_first_step", None, lo, base[0][2]))
    out += base
    if base[-1][3] < hi:
        out.append(("after_last_step", None, base[-1][3], hi))
    return out


def _carve(base: list[tuple], caps: list[tuple[int, int]]) -> list[tuple]:
    """``base`` segments with the capture intervals cut out as ``graph_capture`` segments."""
    if not caps:
        return base
    cuts = sorted({p for s, e in caps for p in (s, e)} | {p for b in base for p in (b[2], b[3])})
    merged = _merge(caps)
    cs = [s for s, _ in merged]
    bs = [b[2] for b in base]
    out: list[tuple] = []
    for a, b in zip(cuts, cuts[1:]):
        k = bisect.bisect_right(cs, a) - 1
        if k >= 0 and a < merged[k][1]:
            lab: tuple = ("graph_capture", None)
        else:
            j = max(bisect.bisect_right(bs, a) - 1, 0)
            lab = base[j][:2]
        if out and out[-1][:2] == lab and out[-1][3] == a:
            out[-1] = (*lab, out[-1][2], b)
        else:
            out.append((*lab, a, b))
    # zero-length step windows (a step starting where the next starts) keep their row
    have = {(x[0], x[1]) for x in out}
    out += [b for b in base if b[0] == "step" and b[2] == b[3] and (b[0], b[1]) not in have]
    return sorted(out, key=lambda x: (x[2], x[3]))


def _merge(iv: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for s, e in sorted(iv):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


# --------------------------------------------------------------------------- pieces


def _cut(placed: pl.DataFrame, seg: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(pieces, head): the placed ops cut at the segment ends, and per op (``_i``) the bucket
    and step of the segment holding its start.

    Per (rank, device), with its segments in (start, end) order numbered ``_k``: an op
    ``[a, b)`` runs from segment ``k0`` (the last one starting at or before ``a``) to ``k1``
    (the last one starting at or before ``max(b - 1, a)``, at least ``k0``); its piece in
    segment ``k`` is the intersection, kept when non-empty or when ``k == k0`` (the head, which
    a zero-duration op still has). One query of as-of joins, with no per-device loop, over the
    op's row number and times only: the other columns are gathered once, for the pieces kept
    (session 8: carrying them through the joins, the explode and the filter was +80 MB on a
    1 GB trace)."""
    cols = ["_i", "rank", "device", "start_ns", "dur_ns", "launch_start_ns", *PIECE_COLUMNS]
    s = (seg.lazy().sort("rank", "device", "start_ns", "end_ns")
         .with_row_index("_k").with_columns(pl.col("_k").cast(pl.Int64)))
    # the last segment starting at each start (of equal starts, the last in order)
    firsts = s.group_by("rank", "device", "start_ns").agg(pl.col("_k").max()).sort("start_ns")
    o = placed.lazy().select("rank", "device", "start_ns", "dur_ns").with_row_index("_o").with_columns(
        (pl.col("start_ns") + pl.col("dur_ns")).alias("_b"))
    o = o.with_columns(pl.max_horizontal(pl.col("_b") - 1, "start_ns").alias("_last"))

    def at(key: str, name: str) -> pl.LazyFrame:
        return (o.select("_o", "rank", "device", key).sort(key)
                .join_asof(firsts, left_on=key, right_on="start_ns", by=["rank", "device"], strategy="backward",
                           check_sortedness=False)
                .select("_o", pl.col("_k").alias(name)))

    seg_cols = s.select("_k", pl.col("start_ns").alias("_st"), pl.col("end_ns").alias("_en"), "bucket", "step")
    p = (o.select("_o", "start_ns", "_b").join(at("start_ns", "_k0"), on="_o").join(at("_last", "_k1"), on="_o")
         .filter(pl.col("_k0").is_not_null())
         .with_columns(pl.int_ranges("_k0", pl.max_horizontal("_k0", "_k1") + 1).alias("_k"))
         .sort("_o").explode("_k")
         .join(seg_cols, on="_k", how="left", maintain_order="left")
         .with_columns(pl.max_horizontal("start_ns", "_st").alias("_ps"), pl.min_horizontal("_b", "_en").alias("_pe"),
                       (pl.col("_k") == pl.col("_k0")).alias("head"))
         .filter(pl.col("head") | (pl.col("_pe") > pl.col("_ps")))
         .select("_o", pl.col("_ps").alias("start_ns"), pl.max_horizontal("_pe", "_ps").alias("end_ns"),
                 "bucket", pl.col("step").cast(pl.Int32), "head"))
    cut = p.collect()
    pieces = pl.concat([placed.select([c for c in cols if c not in ("start_ns", "dur_ns")])[cut["_o"]],
                        cut.drop("_o")], how="horizontal")
    del cut
    head = pieces.filter("head").select("_i", pl.col("bucket").alias("_bucket"), pl.col("step").alias("_step"))
    return pieces.drop("_i"), head


__all__ = ["BUCKETS", "BEFORE_LAUNCH_TOL_NS", "SEGMENT_SCHEMA", "Timeline", "Notes", "say", "add_counts", "recording_windows",
           "outside_reasons", "partition", "bucket_rows", "window_rows", "only_step", "PIECE_SETS", "piece_unions"]


# --------------------------------------------------------------------------- report rows


def only_step(tl: Timeline, step: int) -> Timeline:
    """``tl`` limited to step ``step``: its step segments, pieces and ops (what ``--step``
    analyses), so the buckets reported are that step's, not the whole trace's."""
    def keep(df: pl.DataFrame) -> pl.DataFrame:
        return df.filter((pl.col("bucket") == "step") & (pl.col("step") == step))
    return Timeline(ops=keep(tl.ops), segments=keep(tl.segments), pieces=keep(tl.pieces),
                    captures=tl.captures.clear(), host_steps=tl.host_steps.filter(pl.col("step") == step),
                    outside={}, unions=keep(tl.unions) if tl.unions is not None else None, notes=tl.notes,
                    marked=tl.marked, windowless=tl.windowless)


def _piece_sets() -> dict[str, pl.Expr]:
    """The subsets of the op pieces :func:`piece_unions` measures: ``busy`` (every piece) and
    those of the step breakdown (:func:`traceroof.steps.step_tables`): ``coll``
    (collectives), ``comp`` (compute: kernels that are not communication, copies or fills),
    ``cb`` (compute-bound compute), ``noncoll``, ``coll_or_comp`` and ``known`` (not a
    collective, bound known)."""
    k = pl.col("kind")  # Enum or String: is_in/== compare the labels either way
    comp = ~k.is_in(["collective", "memcpy", "memset"])
    return {
        "busy": pl.lit(True),
        "coll": k == "collective",
        "comp": comp,
        "cb": comp & (pl.col("bound") == "compute"),
        "noncoll": k != "collective",
        "coll_or_comp": ~k.is_in(["memcpy", "memset"]),
        "known": (k != "collective") & pl.col("bound").is_in(["compute", "memory", "latency"]),
    }


#: the columns of :func:`piece_unions`, after its keys
PIECE_SETS = tuple(_piece_sets())


def piece_unions(tl: Timeline) -> pl.DataFrame:
    """Per (``rank``, ``device``, ``bucket``, ``step``) of ``tl.pieces``: the union length (ns,
    Int64) of each subset of :data:`PIECE_SETS` (:func:`traceroof.intervals.union_lengths`),
    sorted by the keys; computed once per timeline (kept in ``tl.unions``). One sorted pass
    serves both the buckets' busy time (:func:`bucket_rows`) and the step breakdown
    (session 9: they were two passes, each sorting every piece: 0.19 s on a 1 GB trace)."""
    if tl.unions is None:
        keys = ["rank", "device", "bucket", "step"]
        u = (iv.union_lengths(tl.pieces, _piece_sets(), keys) if tl.pieces.height else
             pl.DataFrame(schema={**{c: tl.pieces.schema[c] for c in keys}, **{c: pl.Int64 for c in PIECE_SETS}}))
        object.__setattr__(tl, "unions", u)
    assert tl.unions is not None
    return tl.unions


def bucket_rows(tl: Timeline) -> list[dict[str, Any]]:
    """Per (rank, device, bucket): ``ops`` (device ops whose start is in it), ``wall_ns``
    (its segments' length; null for ``outside_recording``, which is off the timeline) and
    ``busy_ns`` (union of its op pieces; for ``outside_recording`` the union of its ops).
    Sorted by rank, device, then :data:`BUCKETS` order; only buckets with time or ops."""
    seg = tl.segments.group_by("rank", "device", "bucket").agg((pl.col("end_ns") - pl.col("start_ns")).sum().alias("wall"))
    # per (rank, device, bucket, step) summed over the steps: the pieces of different
    # segments are disjoint (each lies in its segment), so the sum is the bucket's union
    busy = piece_unions(tl).group_by("rank", "device", "bucket").agg(pl.col("busy").sum())
    busy_of = {(r, d, b): int(x) for r, d, b, x in busy.iter_rows()}
    if (tl.ops["bucket"] == "outside_recording").any():
        o = tl.ops.filter(pl.col("bucket") == "outside_recording").select("rank", "device", pl.lit("outside_recording").alias("bucket"), "start_ns",
                           (pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns"))
        for r, d, b, x in iv.union_lengths(o, {"busy": pl.lit(True)}, ["rank", "device", "bucket"]).iter_rows():
            busy_of[(r, d, b)] = int(x)
    n_ops = {(r, d, b): int(n) for r, d, b, n in tl.ops.group_by("rank", "device", "bucket").len().iter_rows()}
    walls = {(r, d, b): int(w) for r, d, b, w in seg.iter_rows()}
    keys = set(walls) | set(n_ops)
    order = {b: i for i, b in enumerate(BUCKETS)}
    return [{"rank": r, "device": d, "bucket": b, "ops": n_ops.get((r, d, b), 0),
             "wall_ns": walls.get((r, d, b)) if b != "outside_recording" else None,
             "busy_ns": busy_of.get((r, d, b), 0)}
            for r, d, b in sorted(keys, key=lambda k: (k[0], -1 if k[1] is None else k[1], order.get(k[2], 99)))]


def window_rows(tl: Timeline) -> list[dict[str, Any]]:
    """Per (rank, device, step): the step's device window ``start_ns``, ``end_ns`` and
    ``wall_ns`` (its length less the graph-capture time inside), ns; and per (rank, device)
    a row with ``step`` null and bucket ``span``: the recorded span its segments cover."""
    seg = tl.segments
    if seg.height == 0:
        return []
    seg = seg.lazy()  # one query (eight eager operations before)
    st = (seg.filter(pl.col("bucket") == "step").group_by("rank", "device", "step")
          .agg(pl.col("start_ns").min(), pl.col("end_ns").max(), (pl.col("end_ns") - pl.col("start_ns")).sum().alias("wall_ns"))
          .with_columns(pl.lit("step").alias("bucket")))
    sp = seg.group_by("rank", "device").agg(pl.col("start_ns").min(), pl.col("end_ns").max()).with_columns(
        (pl.col("end_ns") - pl.col("start_ns")).alias("wall_ns"), pl.lit(None, pl.Int32).alias("step"),
        pl.lit("span").alias("bucket"))
    cols = ["rank", "device", "bucket", "step", "start_ns", "end_ns", "wall_ns"]
    return (pl.concat([sp.select(cols), st.select(cols)]).sort("rank", "device", "start_ns", "bucket")
            .collect().to_dicts())
