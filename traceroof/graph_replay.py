"""Graph replays: give the kernels a CUDA/HIP graph replays the framework ops they come from.

A ``cudaGraphLaunch``/``hipGraphLaunch`` runs a recorded graph: its kernels carry the
launch's correlation but no framework op (``graph``, :mod:`traceroof.parsers.kineto_link`),
so nothing costs them. :func:`attribute` lends each replayed kernel the op (name, shapes,
dtypes) that launched it when the graph was recorded, from, in this order:

a. ``capture_window``: a capture window of the same trace (:mod:`traceroof.graph_capture`):
   its launch runtime calls, in order, against the replay's kernels, in device order; the
   counts must be equal, and where the same op with the same shapes ran eagerly in the trace
   its kernel names must agree with the replayed ones (a launch with no framework op leaves
   its kernel unattributed; a graph's kernels are taken in device order, start then stream,
   so the branches of a multi-stream graph are told apart only by their names);
b. ``capture_trace``: the same, from a capture trace: one given (``capture_traces``, the
   CLI's ``--capture-trace``) or, when none is given, the ``capture_traces/`` /
   ``graph_capture_profile/`` folders (:data:`traceroof.io.CAPTURE_DIRS`) beside the trace's
   files, which vLLM and SGLang write while they capture (one per batch size: when several
   fit, the one whose file name says the batch size that the step annotation around the
   launch says, :func:`batch_hint`);
c. ``eager_match``: the longest exact runs (of at least :data:`~traceroof.graph_match.MIN_RUN`
   kernels, :data:`~traceroof.graph_match.MIN_DISTINCT` distinct names) of the replayed kernel names in an eager run of the same trace, else of a capture
   trace (its warm-up): each matched kernel takes its eager twin's op
   (:func:`traceroof.graph_match.eager_runs`).

A graph is one distinct sequence of kernel names on a rank; its replays are its launches.
Each replay gets cost groups of its own: one per op instance, with a negative External id
(never a Kineto one) and a copy of the lending op's host row under that id, so the costing
(:mod:`traceroof.costing`) costs each replay of an op once, in full, split over that
replay's kernels of the op only. Nothing is guessed: a graph no source fits, or several
captures fit with different ops (ambiguous), stays unattributed, and is said.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from . import graph_capture
from .errors import TraceroofError
from .graph_match import (
    MIN_DISTINCT,
    MIN_RUN,
    Match,
    Sequence,
    eager_runs,
    name_check,
    whole,
)
from .host import innermost_cpu_ops
from .schema import HOST_SCHEMA, empty
from .sections import GraphInfo, UnlaunchedInfo

#: launch runtime calls a capture records as graph kernels (a graph launch inside a capture,
#: or a host-function node, ``cudaLaunchHostFunc``, is not one)
_LAUNCH_RE = r"(?i)launch"
_GRAPH_LAUNCH_RE = r"(?i)graphlaunch|launchhostfunc"
#: the parse warning this stage replaces (kineto_link._warn_links)
_PARSE_WARNING = "were replayed from CUDA/HIP graphs: their per-op attribution and shapes are unavailable"
ADVICE = ("record the capture (profile the graph-capture phase: vLLM "
          "--profiler-config.capture_torch_profiler_dir, SGLang's capture_traces/) and pass it with "
          "--capture-trace PATH, or profile an eager warm-up step with the same shapes")


@dataclass
class Source:
    """What one trace offers to attribute replays from: ``rows``, the framework ops it can
    lend (HOST_SCHEMA; a lender is a row index); ``captures``, per rank, the launch
    sequences of its capture windows; ``eager``, per rank, its eager kernels in device
    order; ``op_kernels``, lender → kernels it launched eagerly."""

    label: str
    same_trace: bool
    rows: pl.DataFrame
    captures: dict[int, list[Sequence]] = field(default_factory=dict)
    eager: dict[int, Sequence] = field(default_factory=dict)
    op_kernels: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Replays:
    """What :func:`attribute` gives: the op table (replayed kernels attributed: ``op`` and a
    negative ``external_id`` set), the host rows to cost them by (HOST_SCHEMA, one per
    replayed op instance, under its negative External id: for the costing only, never part
    of the trace's host table), one :class:`~traceroof.sections.GraphInfo` per graph, and the
    warnings (which replace the parser's replay warning, :func:`replace_warning`)."""

    ops: pl.DataFrame
    shape_rows: pl.DataFrame
    graphs: list[GraphInfo]
    warnings: list[str]
    #: the kernels with no launch in the trace, eager-matched by :mod:`traceroof.unlaunched`
    unlaunched: UnlaunchedInfo | None = None

    @property
    def changed(self) -> bool:
        """Whether any replayed kernel was attributed."""
        return self.shape_rows.height > 0


def attribute(ops: pl.DataFrame, host: pl.DataFrame, sources: list[str],
              capture_traces: list[str] | None = None) -> Replays:
    """Attribute the replayed kernels of ``ops`` (``graph`` True) to framework ops (module
    docstring: capture window, capture trace, eager match, in that order).

    Args:
        ops: the op table (OP_SCHEMA); host: its host table (HOST_SCHEMA).
        sources: the trace's files (``meta.sources``): where capture traces are looked for.
        capture_traces: capture-trace files or folders to use instead of those found beside
            ``sources``; ``[]``: none.

    Returns:
        :class:`Replays`; ``ops`` unchanged (and no graph rows) when nothing is replayed.

    Raises:
        InputNotFoundError: a given capture trace does not exist. A capture trace that
            cannot be read is not an error: a warning names it and it is not used.
    """
    kern = ops.with_row_index("_r").filter(pl.col("graph").fill_null(False),
                                           ~pl.col("kind").cast(pl.String).is_in(["memcpy", "memset"]))
    if kern.height == 0:
        return Replays(ops, empty(HOST_SCHEMA), [], [])
    graphs = _graphs(kern)
    own = build_source(ops, host, "capture window", same_trace=True)
    others: list[Source] | None = None
    warnings: list[str] = []
    plan = []
    launch_at = dict(zip(kern["_r"].to_list(), kern["launch_start_ns"].to_list()))
    for (rank, names), replays in graphs.items():
        how = _from_captures(rank, list(names), [own], "capture_window")
        if how[0] is None:
            if others is None:
                others = _capture_sources(sources, capture_traces, warnings)
            hint = batch_hint(host, rank, launch_at.get(replays[0][0]))
            how = _first(how, _from_captures(rank, list(names), others, "capture_trace", hint))
        if how[0] is None:
            how = _first(how, _from_eager(rank, list(names), [own, *others]))
        plan.append((rank, names, replays, how))
    return _apply(ops, kern, plan, warnings)


def _first(a: tuple, b: tuple) -> tuple:
    """``b`` when it attributes, else ``a`` with ``b``'s note added."""
    if b[0] is not None:
        return b
    return (None, None, None, "; ".join(x for x in (a[3], b[3]) if x))


def _graphs(kern: pl.DataFrame) -> dict[tuple[int, tuple[str, ...]], list[list[int]]]:
    """The graphs: ``(rank, kernel names in device order) → [row indices of each replay]``,
    a replay being one (rank, correlation), in order of first replay."""
    per = (kern.sort("rank", "correlation", "start_ns", "stream")
           .group_by("rank", "correlation", maintain_order=True)
           .agg(pl.col("name").fill_null(""), pl.col("_r"), pl.col("start_ns").min().alias("_t"))
           .sort("_t"))
    out: dict[tuple[int, tuple[str, ...]], list[list[int]]] = {}
    for rank, _c, names, rows, _t in per.iter_rows():
        out.setdefault((int(rank), tuple(names)), []).append(list(rows))
    return out


def build_source(ops: pl.DataFrame, host: pl.DataFrame, label: str, *, same_trace: bool) -> Source:
    """The :class:`Source` of one trace (its op and host tables)."""
    if host.height == 0:
        return Source(label, same_trace, empty(HOST_SCHEMA))
    rows = host[innermost_cpu_ops(host, ["rank", "external_id"])]
    lender = rows.select("rank", "external_id").with_row_index("_l")
    eager = (ops.filter(~pl.col("graph").fill_null(False), pl.col("external_id").is_not_null(),
                        ~pl.col("kind").cast(pl.String).is_in(["memcpy", "memset"]))
             .sort("rank", "start_ns", "stream")
             .join(lender, on=["rank", "external_id"], how="left", maintain_order="left"))
    src = Source(label, same_trace, rows)
    for (rank,), g in eager.group_by("rank", maintain_order=True):
        src.eager[int(rank)] = Sequence(g["name"].to_list(), g["_l"].to_list())
    counts = eager.filter(pl.col("_l").is_not_null()).group_by("_l").len()
    src.op_kernels = {int(a): int(b) for a, b in counts.iter_rows()}
    src.captures = _window_sequences(host, lender, _key(rows), _eager_names(eager, rows))
    return src


def _key(rows: pl.DataFrame) -> list[tuple]:
    """Per lender row: what identifies the op and its shapes (name, dims, types, concrete inputs)."""
    return list(rows.select("name", "input_dims", "input_types", "concrete_inputs").iter_rows())


def _eager_names(eager: pl.DataFrame, rows: pl.DataFrame) -> dict[tuple, list[str]]:
    """(op, shapes) → the kernel names its first eager instance launched, in order."""
    keys = _key(rows)
    out: dict[tuple, list[str]] = {}
    seen: dict[tuple, int] = {}
    for name, lend in eager.filter(pl.col("_l").is_not_null()).select("name", "_l").iter_rows():
        k = keys[lend]
        if seen.setdefault(k, lend) == lend:
            out.setdefault(k, []).append(name)
    return out


def _window_sequences(host: pl.DataFrame, lender: pl.DataFrame, rows_keys: list[tuple],
                      names: dict[tuple, list[str]]) -> dict[int, list[Sequence]]:
    """Per rank, the launch sequence of each capture window: its launch runtime calls on the
    capturing thread, in order, each lent the op of its External id; a launch's kernel name
    where the op ran eagerly with the same shapes (its j-th launch: the eager j-th kernel)."""
    win = graph_capture.windows(host)
    if win.height == 0:
        return {}
    calls = host.filter(pl.col("cat") == "runtime", pl.col("name").str.contains(_LAUNCH_RE),
                        ~pl.col("name").str.contains(_GRAPH_LAUNCH_RE)).sort("start_ns")
    calls = calls.join(lender, on=["rank", "external_id"], how="left", maintain_order="left")
    out: dict[int, list[Sequence]] = {}
    for rank, thread, s, e in win.select("rank", "thread", "start_ns", "end_ns").iter_rows():
        inside = calls.filter(pl.col("rank") == rank, pl.col("thread") == thread,
                              pl.col("start_ns") >= s, pl.col("start_ns") < e)
        lenders = inside["_l"].to_list()
        nth: dict[int, int] = {}
        known: list[str | None] = []
        for lend in lenders:
            if lend is None:
                known.append(None)
                continue
            j = nth.get(lend, 0)
            nth[lend] = j + 1
            eager = names.get(rows_keys[lend], [])
            known.append(eager[j] if j < len(eager) else None)
        out.setdefault(int(rank), []).append(Sequence(known, lenders))
    return out


def _capture_sources(sources: list[str], given: list[str] | None, warnings: list[str]) -> list[Source]:
    """The capture traces, read: those ``given``, else those beside ``sources``. One that
    cannot be read is named in ``warnings`` and left out."""
    from .io import read_one, resolve_inputs

    paths = resolve_inputs(given) if given else (capture_traces_beside(sources) if given is None else [])
    out = []
    for p in paths:
        try:
            t = read_one(p)
        except TraceroofError as exc:
            warnings.append(f"capture trace {p} not used: {exc}")
            continue
        out.append(build_source(t.ops, t.host, p, same_trace=False))
    return out


def capture_traces_beside(sources: list[str]) -> list[str]:
    """The trace files in the capture folders (:data:`traceroof.io.CAPTURE_DIRS`) of the
    folders holding ``sources``, sorted, without repeats."""
    from .io import CAPTURE_DIRS
    from .parsers import registry

    suffixes = registry.folder_suffixes()
    found: set[str] = set()
    for s in sources:
        for d in CAPTURE_DIRS:
            folder = Path(s).parent / d
            if folder.is_dir():
                found.update(str(p) for p in folder.rglob("*") if p.is_file() and p.name.endswith(suffixes))
    return sorted(found)


#: a batch size in a serving framework's step annotation: SGLang ``step[DECODE bs=32]``, vLLM
#: ``execute_32_context_0(…)_generation_32(…)`` (the tokens scheduled: a decode's batch size)
_ANNOTATION_BS_RE = re.compile(r"(?i)\bbs\s*=\s*(\d+)|^execute_(\d+)_")
#: the batch size in a capture trace's file name: SGLang ``bs_<bs>_rank<r>.json.gz``, vLLM
#: ``capture_<size>_FULL….json.gz``
_FILE_BS_RE = re.compile(r"(?i)(?:^|[_-])(?:bs|capture)_(\d+)(?=[_.-])")


def batch_hint(host: pl.DataFrame, rank: int, launch_ns: int | None) -> tuple[int, str] | None:
    """``(batch size, annotation)`` from the innermost host annotation on ``rank`` around
    the graph launch at ``launch_ns`` that names one (:data:`_ANNOTATION_BS_RE`), else None."""
    if launch_ns is None or host.height == 0:
        return None
    around = host.filter(pl.col("cat") == "annotation", pl.col("rank") == rank, pl.col("start_ns") <= launch_ns,
                         (pl.col("start_ns") + pl.col("dur_ns")) > launch_ns).sort("start_ns", descending=True)
    for name in around["name"].to_list():
        m = _ANNOTATION_BS_RE.search(name or "")
        if m:
            return int(m.group(1) or m.group(2)), name
    return None


def _file_batch(label: str) -> int | None:
    """The batch size a capture trace's file name says (:data:`_FILE_BS_RE`), else None."""
    m = _FILE_BS_RE.search(Path(label).name)
    return int(m.group(1)) if m else None


def _from_captures(rank: int, replay: list[str], srcs: list[Source], method: str,
                   hint: tuple[int, str] | None = None) -> tuple:
    """``(method, match, source, note)`` from the capture windows of ``srcs`` (of the same
    rank in the same trace; of any rank in a capture trace, which records one rank's capture
    of graphs every rank captures alike), or ``(None, None, None, why not)``."""
    n = len(replay)
    every = [(s, q) for s in srcs for r, qs in s.captures.items() for q in qs if s.same_trace is False or r == rank]
    if not every:
        return (None, None, None, "no capture window in the trace" if method == "capture_window"
                else "no capture trace" if not srcs else "no capture window in the capture traces")
    same = [(s, q) for s, q in every if len(q.lenders) == n and any(x is not None for x in q.lenders)]
    fits = []
    for s, q in same:
        agree, disagree = name_check(replay, q)
        if not disagree:
            fits.append((agree, s, q))
    if not fits:
        sizes = sorted({len(q.lenders) for _, q in every})
        why = (f"captures of {n} launches, but their kernel names differ" if same else
               f"no capture of {n} kernel launches (captures hold {', '.join(map(str, sizes[:6]))})")
        return (None, None, None, f"{method.replace('_', ' ')}: {why}")
    best = max(a for a, _, _ in fits)
    fits = [(a, s, q) for a, s, q in fits if a == best]
    ops_of = {tuple(_lent_keys(s, q)) for _, s, q in fits}
    note = None
    if len(ops_of) > 1 and hint is not None:
        picked = [(a, s, q) for a, s, q in fits if not s.same_trace and _file_batch(s.label) == hint[0]]
        if picked and len({tuple(_lent_keys(s, q)) for _, s, q in picked}) == 1:
            note = (f"{len(fits)} captures of {n} launches fit; the capture trace of batch size {hint[0]} "
                    f"(its file name) was taken, as the annotation {hint[1][:60]!r} around the launch says")
            fits, ops_of = picked, {0}  # type: ignore[assignment]
    if len(ops_of) > 1:
        return (None, None, None, f"{method.replace('_', ' ')}: ambiguous: {len(fits)} captures of {n} launches "
                                  "with different ops or shapes fit")
    _, s, q = fits[-1]
    return (method, whole(q), s, note)


def _lent_keys(s: Source, q: Sequence) -> list[tuple | None]:
    """The (op, shapes) each position of ``q`` lends (None: a launch with no op)."""
    keys = _key(s.rows[[x for x in q.lenders if x is not None]])
    it = iter(keys)
    return [None if x is None else next(it) for x in q.lenders]


def _from_eager(rank: int, replay: list[str], srcs: list[Source]) -> tuple:
    """``('eager_match', match, source, None)`` from the best eager run (same rank of the
    same trace first), or ``(None, None, None, why not)``."""
    best: tuple[int, Match | None, Source | None] = (0, None, None)
    for s in srcs:
        for r, seq in s.eager.items():
            if s.same_trace and r != rank:
                continue
            m = eager_runs(replay, seq, s.op_kernels)
            if m.matched > best[0]:
                best = (m.matched, m, s)
        if best[1] is not None and s.same_trace:
            break
    if best[1] is None:
        return (None, None, None, f"no run of {MIN_RUN} or more of its kernel names ({MIN_DISTINCT} distinct) "
                                  "in an eager run")
    return ("eager_match", best[1], best[2], None)


def _apply(ops: pl.DataFrame, kern: pl.DataFrame, plan: list, warnings: list[str]) -> Replays:
    """Write the plan into the op table, make the host rows under the new ids, describe it."""
    rows_r: list[int] = []
    ops_new: list[str] = []
    ext_new: list[int] = []
    shape_parts: list[pl.DataFrame] = []
    infos: list[GraphInfo] = []
    dur = dict(zip(kern["_r"].to_list(), kern["dur_ns"].to_list()))
    next_id = -1
    per_rank: dict[int, int] = {}
    for rank, names, replays, (method, match, src, note) in plan:
        per_rank[rank] = per_rank.get(rank, 0) + 1
        total_ns = sum(dur[r] or 0 for rep in replays for r in rep)
        if match is None or not match.matched:
            infos.append(GraphInfo(rank=rank, graph=per_rank[rank], launches=len(replays),
                                   kernels_per_replay=len(names), method="unattributed", source=None,
                                   kernels_matched=0, device_time_ns=total_ns, attributed_ns=0, note=note or None))
            continue
        lend_names = src.rows["name"].to_list()
        used = sorted({g for g in match.groups if g is not None})
        lender_of = {g: match.lenders[p] for p, g in enumerate(match.groups) if g is not None}
        attributed = 0
        for rep in replays:
            ids = {g: next_id - i for i, g in enumerate(used)}
            next_id -= len(used)
            for p, r in enumerate(rep):
                g = match.groups[p]
                if g is None:
                    continue
                rows_r.append(r)
                ops_new.append(lend_names[match.lenders[p]])
                ext_new.append(ids[g])
                attributed += dur[r] or 0
            shape_parts.append(_shape_rows(src, [lender_of[g] for g in used], [ids[g] for g in used], rank))
        infos.append(GraphInfo(rank=rank, graph=per_rank[rank], launches=len(replays),
                               kernels_per_replay=len(names), method=method,
                               source=None if src.same_trace else src.label,
                               kernels_matched=match.matched, device_time_ns=total_ns, attributed_ns=attributed,
                               note=note or None))
    if rows_r:
        upd = pl.DataFrame({"_r": rows_r, "_op": ops_new, "_ext": ext_new},
                           schema={"_r": pl.UInt32, "_op": pl.String, "_ext": pl.Int64})
        ops = (ops.with_row_index("_r").join(upd, on="_r", how="left", maintain_order="left")
               .with_columns(pl.coalesce("_op", "op").alias("op"), pl.coalesce("_ext", "external_id").alias("external_id"))
               .drop("_r", "_op", "_ext"))
    shape_rows = pl.concat(shape_parts) if shape_parts else empty(HOST_SCHEMA)
    warnings = warnings + _warnings(infos, int(ops["dur_ns"].sum() or 0))
    return Replays(ops, shape_rows, infos, warnings)


def _shape_rows(src: Source, lenders: list[int], ids: list[int], rank: int) -> pl.DataFrame:
    """Copies of ``src``'s lender rows under the new External ids, on ``rank``; from another
    trace without its pid/thread (its times are on another clock: no annotation is nested
    in them here)."""
    rows = src.rows[lenders].with_columns(pl.Series("external_id", ids, dtype=pl.Int64),
                                          pl.lit(rank, pl.Int32).alias("rank"))
    if not src.same_trace:
        rows = rows.with_columns(pl.lit(None, pl.String).alias("pid"), pl.lit(None, pl.String).alias("thread"))
    return rows.select(list(HOST_SCHEMA))


def _warnings(infos: list[GraphInfo], device_ns: int) -> list[str]:
    """One warning for the replayed kernels left without an op, naming each graph and the fix."""
    left = [g for g in infos if g.attributed_ns < g.device_time_ns]
    if not left:
        return []
    ns = sum(g.device_time_ns - g.attributed_ns for g in left)
    kernels = sum(g.launches * (g.kernels_per_replay - g.kernels_matched) for g in left)
    each = "; ".join(f"rank {g.rank} graph {g.graph} ({g.launches} launch{'es' if g.launches != 1 else ''}, "
                     f"{g.kernels_matched} of {g.kernels_per_replay} kernels per replay attributed"
                     + (f": {g.note}" if g.note else "") + ")" for g in left[:3])
    more = f"; … ({len(left) - 3} more graphs)" if len(left) > 3 else ""
    share = ns / device_ns if device_ns else 0.0
    return [f"{kernels} kernels ({share:.1%} of device time) replayed from CUDA/HIP graphs have no framework op "
            f"or shapes: {each}{more}; to attribute them, {ADVICE}"]


def replace_warning(warnings: list[str], replays: Replays) -> list[str]:
    """``warnings`` with the parser's replay warning replaced by ``replays.warnings``."""
    if not replays.graphs:
        return warnings
    kept = [w for w in warnings if _PARSE_WARNING not in w]
    return kept + [w for w in replays.warnings if w not in kept]


__all__ = ["ADVICE", "Replays", "Source", "attribute", "build_source", "capture_traces_beside",
           "replace_warning"]
