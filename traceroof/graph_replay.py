"""Graph replays: give the kernels a CUDA/HIP graph replays the framework ops they come from.

A ``cudaGraphLaunch``/``hipGraphLaunch`` runs a recorded graph: its kernels carry the
launch's correlation but no framework op (``graph``, :mod:`traceroof.parsers.kineto_link`),
so nothing costs them. :func:`attribute` lends each replayed kernel the op (name, shapes,
dtypes) that launched it when the graph was recorded, from, in this order
(:mod:`traceroof.graph_sources` builds what each trace offers):

a. ``capture_window``: a capture window of the same trace (:mod:`traceroof.graph_capture`):
   its launch runtime calls, in order, against the replay's kernels, in device order; the
   counts must be equal, and where the same op with the same shapes ran eagerly in the trace
   its kernel names must agree with the replayed ones (a launch with no framework op leaves
   its kernel unattributed). A graph's kernels are taken in device order, start then stream,
   so the branches of a multi-stream graph are told apart only by their names: on a replay
   that runs on several streams, a position whose name is not known must at least have a
   kernel of the op's kind (:func:`traceroof.costs.kind_of_kernel` against
   :func:`traceroof.costs.kind_of_op`, where both are known), else the capture is refused;
b. ``capture_trace``: the same, from a capture trace: one given (``capture_traces``, the
   CLI's ``--capture-trace``) or, when none is given, the ``capture_traces/`` /
   ``graph_capture_profile/`` folders (:data:`traceroof.io.CAPTURE_DIRS`) beside the trace's
   files, which vLLM and SGLang write while they capture (one per batch size);
c. ``eager_match``: the longest exact runs (of at least :data:`~traceroof.graph_match.MIN_RUN`
   kernels, :data:`~traceroof.graph_match.MIN_DISTINCT` distinct names) of the replayed
   kernel names in an eager run of the same trace, else of a capture trace (its warm-up):
   each matched kernel takes its eager twin's op (:func:`traceroof.graph_match.eager_runs`).

**Batch size.** Where the step annotation around a launch names a batch size
(:func:`batch_hints`: SGLang ``step[DECODE bs=32]``, vLLM ``execute_32_…``), a source of
another batch size is never lent (a capture trace's batch size: its file name; else its
ops' leading dimension, :func:`traceroof.graph_sources.capture_batch`), and among several
captures that fit, the one of that batch size is taken. Replays of one sequence of kernel
names whose annotations give different batch sizes are different graphs (one per batch
size, vLLM and SGLang capture one per size), and then each must find a source shown to be
of its batch size, else it stays unattributed.

A graph is one distinct sequence of kernel names on a rank (and batch size, as above); its
replays are its launches. Each replay gets cost groups of its own: one per op instance,
with a negative External id (never a Kineto one) and a copy of the lending op's host row
under that id, so the costing (:mod:`traceroof.costing`) costs each replay of an op once,
in full, split over that replay's kernels of the op only. Nothing is guessed: a graph no
source fits, or several captures fit with different ops (ambiguous), stays unattributed,
and its note says why.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import polars as pl

from . import costs
from .graph_match import (
    MIN_DISTINCT,
    MIN_RUN,
    Match,
    Sequence,
    eager_runs,
    kind_clash,
    name_check,
    whole,
)
from .graph_sources import (
    Source,
    build_source,
    capture_batch,
    capture_sources,
    capture_traces_beside,
    key,
    ops_batch,
    resolve_given,
    shared_strings,
)
from .schema import HOST_SCHEMA, empty
from .sections import GraphInfo, UnlaunchedInfo

#: launch runtime calls a capture records as graph kernels (a graph launch inside a capture,
#: or a host-function node, ``cudaLaunchHostFunc``, is not one)
#: the parse warning this stage replaces (kineto_link._warn_links)
_PARSE_WARNING = "were replayed from CUDA/HIP graphs: their per-op attribution and shapes are unavailable"
ADVICE = ("record the capture (profile the graph-capture phase: vLLM "
          "--profiler-config.capture_torch_profiler_dir, SGLang's capture_traces/) and pass it with "
          "--capture-trace PATH, or profile an eager warm-up step with the same shapes")


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
            ``sources``; ``[]``: none. Resolved first, whether or not one is needed.

    Returns:
        :class:`Replays`; ``ops`` unchanged (and no graph rows) when nothing is replayed.

    Raises:
        InputNotFoundError: a given capture trace does not exist (or a given folder holds
            none); one line naming it. A capture trace that cannot be read is not an error:
            a warning names it and it is not used.
    """
    given = resolve_given(capture_traces)
    kern = ops.with_row_index("_r").filter(pl.col("graph").fill_null(False),
                                           ~pl.col("kind").cast(pl.String).is_in(["memcpy", "memset"]))
    if kern.height == 0:
        return Replays(ops, empty(HOST_SCHEMA), [], [])
    own = build_source(ops, host, "capture window", same_trace=True)
    found: tuple[list[Source], int] | None = None
    warnings: list[str] = []
    plan = []
    launch_at = dict(zip(kern["_r"].to_list(), kern["launch_start_ns"].to_list()))
    hints = batch_hints(host)
    for (rank, names), replays in _graphs(kern).items():
        for ask, reps, prefix in _split_by_batch(rank, list(names), replays, hints, launch_at):
            how = _from_captures(ask, [own], "capture_window")
            if how[0] is None:
                if found is None:
                    found = capture_sources(sources, given, warnings)
                others, unreadable = found
                how = _first(how, _from_captures(ask, others, "capture_trace", unreadable))
                if how[0] is None:
                    how = _first(how, _from_eager(ask, [own, *others]))
            plan.append((rank, names, reps, _with_prefix(how, prefix)))
    return _apply(ops, kern, plan, warnings)


@dataclass(frozen=True)
class _Ask:
    """What one graph asks of the sources: its ``rank``; its kernel ``names`` (device
    order); ``hint``, ``(batch size, annotation)`` from the step annotation around its
    launches (:func:`batch_hints`), or None; ``sizes``, the distinct batch sizes the
    annotations give over every replay of these kernel names on the rank (more than one:
    a source must be shown to be of ``hint``'s batch size); ``streams``, the most streams
    one of its replays runs on."""

    rank: int
    names: list[str]
    hint: tuple[int, str] | None = None
    sizes: tuple[int, ...] = ()
    streams: int = 1

    @property
    def strict(self) -> bool:
        """Whether these kernels are replayed at several batch sizes."""
        return len(self.sizes) > 1


def _first(a: tuple, b: tuple) -> tuple:
    """``b`` when it attributes, else ``a`` with ``b``'s note added."""
    if b[0] is not None:
        return b
    return (None, None, None, "; ".join(x for x in (a[3], b[3]) if x))


def _with_prefix(how: tuple, prefix: str | None) -> tuple:
    """``how`` with ``prefix`` (which replays the graph holds) before its note."""
    if prefix is None:
        return how
    return (*how[:3], prefix + (f": {how[3]}" if how[3] else ""))


def _graphs(kern: pl.DataFrame) -> dict[tuple[int, tuple[str, ...]], list[tuple[list[int], int]]]:
    """The graphs: ``(rank, kernel names in device order) → [(row indices, streams) of each
    replay]``, a replay being one (rank, correlation), in order of first replay."""
    per = (kern.sort("rank", "correlation", "start_ns", "stream")
           .group_by("rank", "correlation", maintain_order=True)
           .agg(pl.col("name").fill_null(""), pl.col("_r"), pl.col("start_ns").min().alias("_t"),
                pl.col("stream").n_unique().alias("_s"))
           .sort("_t"))
    out: dict[tuple[int, tuple[str, ...]], list[tuple[list[int], int]]] = {}
    for rank, _c, names, rows, _t, streams in per.iter_rows():
        out.setdefault((int(rank), tuple(names)), []).append((list(rows), int(streams)))
    return out


def _split_by_batch(rank: int, names: list[str], replays: list[tuple[list[int], int]],
                    hints: Callable[[int, int | None], tuple[int, str] | None],
                    launch_at: dict[int, int | None]) -> list[tuple[_Ask, list[list[int]], str | None]]:
    """The replays of one sequence of kernel names split by the batch size their step
    annotations give (one part when they all give the same, or none): per part, what it
    asks (:class:`_Ask`), its replays' rows, and the words that say which replays it holds
    (None when it holds them all)."""
    per = [(rows, streams, hints(rank, launch_at.get(rows[0]))) for rows, streams in replays]
    parts: dict[int | None, list[tuple[list[int], int, tuple[int, str] | None]]] = {}
    for item in per:
        parts.setdefault(item[2][0] if item[2] else None, []).append(item)
    sizes = tuple(sorted(k for k in parts if k is not None))
    out = []
    for bs, items in parts.items():
        prefix = None
        if len(parts) > 1:
            said = f"annotated batch size {bs}" if bs is not None else "whose annotations give no batch size"
            prefix = (f"its {len(items)} replay{'s' if len(items) != 1 else ''} {said} (of {len(per)} replays of "
                      f"these kernels, annotated {_sizes(sizes)})")
        ask = _Ask(rank, names, items[0][2], sizes, max(s for _, s, _ in items))
        out.append((ask, [rows for rows, _, _ in items], prefix))
    return out


#: a batch size in a serving framework's step annotation: SGLang ``step[DECODE bs=32]``, vLLM
#: ``execute_32_context_0(…)_generation_32(…)`` (the tokens scheduled: a decode's batch size)
_ANNOTATION_BS_RE = re.compile(r"(?i)\bbs\s*=\s*(\d+)|^execute_(\d+)_")


def batch_hints(host: pl.DataFrame) -> Callable[[int, int | None], tuple[int, str] | None]:
    """A function ``(rank, launch_ns) → (batch size, annotation)`` or None: the innermost host
    annotation of ``host`` on ``rank`` around the graph launch at ``launch_ns`` (ns) that
    names a batch size (:data:`_ANNOTATION_BS_RE`), its batch size and name; None when none
    does (or ``launch_ns`` is None). The annotations are read once."""
    spans: dict[int, list[tuple[int, int, int, str]]] = {}
    if host.height:
        ann = host.filter(pl.col("cat") == "annotation", pl.col("dur_ns").is_not_null()).sort("start_ns")
        for rank, start, dur, name in ann.select("rank", "start_ns", "dur_ns", "name").iter_rows():
            m = _ANNOTATION_BS_RE.search(name or "")
            if m:
                spans.setdefault(int(rank), []).append((start, start + dur, int(m.group(1) or m.group(2)), name))
    starts = {r: [x[0] for x in v] for r, v in spans.items()}

    def at(rank: int, launch_ns: int | None) -> tuple[int, str] | None:
        if launch_ns is None or rank not in spans:
            return None
        for i in range(bisect.bisect_right(starts[rank], launch_ns) - 1, -1, -1):
            _start, end, bs, name = spans[rank][i]
            if end > launch_ns:  # the latest-starting one around the launch: the innermost
                return bs, name
        return None

    return at


def _sizes(sizes: tuple[int, ...]) -> str:
    """``batch size 32`` or ``batch sizes 32, 64``."""
    return f"batch size{'s' if len(sizes) != 1 else ''} {', '.join(map(str, sizes))}"


def _from_captures(ask: _Ask, srcs: list[Source], method: str, unreadable: int = 0) -> tuple:
    """``(method, match, source, note)`` from the capture windows of ``srcs`` (of the same
    rank in the same trace; of any rank in a capture trace, which records one rank's capture
    of graphs every rank captures alike), or ``(None, None, None, why not)``. A capture fits
    when it holds as many launches as a replay has kernels, its known kernel names agree, on
    a replay that runs on several streams its ops' kinds agree with the kernels' where the
    names are unknown (:func:`~traceroof.graph_match.kind_clash`), and its batch size agrees
    with the annotation's (:func:`_by_batch`). ``unreadable``: capture traces found but not
    read."""
    n = len(ask.names)
    label = method.replace("_", " ")
    every = [(s, q) for s in srcs for r, qs in s.captures.items() for q in qs if s.same_trace is False or r == ask.rank]
    if not every:
        return (None, None, None, _no_capture(method, srcs, unreadable))
    same = [(s, q) for s, q in every if len(q.lenders) == n and any(x is not None for x in q.lenders)]
    fits = []
    clash = None
    for s, q in same:
        agree, disagree = name_check(ask.names, q)
        if disagree:
            continue
        why = _kind_clash(ask, s, q)
        if why is None:
            fits.append((agree, s, q))
        elif clash is None:
            clash = why
    if not fits:
        sizes = sorted({len(q.lenders) for _, q in every})
        why = (clash if clash is not None else f"captures of {n} launches, but their kernel names differ" if same else
               f"no capture of {n} kernel launches (captures hold {', '.join(map(str, sizes[:6]))})")
        return (None, None, None, f"{label}: {why}")
    best = max(a for a, _, _ in fits)
    fits, note = _by_batch([(a, s, q) for a, s, q in fits if a == best], ask)
    if not fits:
        return (None, None, None, f"{label}: {note}")
    if len({tuple(_lent_keys(s, q)) for _, s, q in fits}) > 1:
        return (None, None, None, f"{label}: ambiguous: {len(fits)} captures of {n} launches "
                                  "with different ops or shapes fit")
    _, s, q = fits[-1]
    return (method, whole(q), s, note)


def _no_capture(method: str, srcs: list[Source], unreadable: int) -> str:
    """Why no capture window is there to take: none in the trace, no capture trace (or
    ``unreadable`` found and not read), or none in the capture traces."""
    if method == "capture_window":
        return "no capture window in the trace"
    s = "s" if unreadable != 1 else ""
    if not srcs:
        return (f"{unreadable} capture trace{s} found, none could be read (the warnings say why)" if unreadable
                else "no capture trace")
    return "no capture window in the capture traces" + (
        f" ({unreadable} more capture trace{s} could not be read)" if unreadable else "")


def _kind_clash(ask: _Ask, s: Source, q: Sequence) -> str | None:
    """Why capture ``q`` of ``s`` cannot be lent position by position to a replay that runs
    on several streams (its kernels' device order need not be the capture's launch order):
    a kernel whose name ``q`` does not know is of another kind than the op it would take
    (:func:`traceroof.costs.kind_of_kernel`, :func:`traceroof.costs.kind_of_op`, both
    known). None when the replay runs on one stream, or every such position agrees."""
    if ask.streams <= 1:
        return None
    kernel_kinds = [None if k == "other" else k for k in map(costs.kind_of_kernel, ask.names)]
    op_names = iter(s.rows_at([x for x in q.lenders if x is not None])["name"].to_list())
    ops = [None if x is None else next(op_names) for x in q.lenders]
    p = kind_clash(kernel_kinds, q, [None if o is None else costs.kind_of_op(o) for o in ops])
    if p is None:
        return None
    return (f"the replay runs on {ask.streams} streams, so its kernels' device order need not be the capture's "
            f"launch order, and its kernel {p + 1} ({_short(ask.names[p])}, {kernel_kinds[p]}) would take "
            f"{ops[p]} ({costs.kind_of_op(ops[p] or '')}): refused, as no kernel name tells the branches apart")


def _short(name: str, n: int = 48) -> str:
    """``name`` cut to ``n`` characters (an ellipsis where cut)."""
    return name if len(name) <= n else name[:n - 1] + "…"


def _by_batch(fits: list[tuple], ask: _Ask) -> tuple[list[tuple], str | None]:
    """The fits ``(agree, source, capture)`` the annotation's batch size allows, and a note
    (which was taken, or why none). With a hint: those of its batch size, else those of an
    unknown one (none when the kernels are replayed at several batch sizes, ``ask.strict``);
    one of another batch size never. Without one: all, unless ``ask.strict``."""
    if ask.hint is None:
        if not ask.strict:
            return fits, None
        return [], (f"no batch size in the annotation around the launch, while these kernels are replayed at "
                    f"{_sizes(ask.sizes)}: which capture it replays is unknown")
    bs, ann = ask.hint
    said = f"the annotation {ann[:60]!r} around the launch says"
    sized = [(f, capture_batch(f[1], f[2])) for f in fits]
    match = [f for f, b in sized if b is not None and b[0] == bs]
    if match:
        if len(match) == len(fits):
            return match, None
        how = next(b[1] for f, b in sized if f is match[0] and b is not None)
        what = "capture" if match[0][1].same_trace else "capture trace"
        return match, (f"{len(fits)} captures of {len(ask.names)} launches fit; the {what} of batch size {bs} "
                       f"({how}) was taken, as {said}")
    unknown = [f for f, b in sized if b is None]
    if unknown and not ask.strict:
        return unknown, None
    if unknown:
        return [], (f"these kernels are replayed at batch sizes {', '.join(map(str, ask.sizes))}, and no capture "
                    f"that fits is known to be of batch size {bs}, which {said}")
    other = ", ".join(f"{b[0]} ({b[1]})" for b in dict.fromkeys(b for _, b in sized if b is not None))
    one = len(fits) == 1
    return [], (f"{said} batch size {bs}, but the capture{'' if one else 's'} that fit{'s' if one else ''} "
                f"{'is' if one else 'are'} of batch size {other}")


def _lent_keys(s: Source, q: Sequence) -> list[tuple | None]:
    """The (op, shapes) each position of ``q`` lends (None: a launch with no op)."""
    keys = key(s.rows_at([x for x in q.lenders if x is not None]))
    it = iter(keys)
    return [None if x is None else next(it) for x in q.lenders]


def _from_eager(ask: _Ask, srcs: list[Source]) -> tuple:
    """``('eager_match', match, source, None)`` from the best eager run (same rank of the
    same trace first) whose ops' batch size does not contradict the annotation's
    (:func:`_eager_batch_refusal`), or ``(None, None, None, why not)``."""
    best: tuple[int, Match | None, Source | None] = (0, None, None)
    refused = None
    for s in srcs:
        for r, seq in s.eager.items():
            if s.same_trace and r != ask.rank:
                continue
            m = eager_runs(ask.names, seq, s.op_kernels)
            if m.matched <= best[0]:
                continue
            why = _eager_batch_refusal(ask, s, m)
            if why is None:
                best = (m.matched, m, s)
            elif refused is None:
                refused = why
        if best[1] is not None and s.same_trace:
            break
    if best[1] is None:
        return (None, None, None, f"eager match: {refused}" if refused else
                f"no run of {MIN_RUN} or more of its kernel names ({MIN_DISTINCT} distinct) in an eager run")
    return ("eager_match", best[1], best[2], None)


def _eager_batch_refusal(ask: _Ask, s: Source, m: Match) -> str | None:
    """Why eager match ``m`` (of ``s``) is not lent: its ops are of another batch size
    (their leading dimension, :func:`~traceroof.graph_sources.ops_batch`) than the annotation says, or, when the
    kernels are replayed at several batch sizes (``ask.strict``), not known to be of it.
    None when nothing speaks against it."""
    if ask.hint is None and not ask.strict:
        return None
    b = ops_batch(s, m.lenders)
    if ask.hint is None:
        return (f"no batch size in the annotation around the launch, while these kernels are replayed at "
                f"{_sizes(ask.sizes)}: the eager ops' batch size cannot be checked")
    bs, ann = ask.hint
    if b is None:
        return None if not ask.strict else (
            f"these kernels are replayed at batch sizes {', '.join(map(str, ask.sizes))}, and the eager ops they "
            f"match are not known to be of batch size {bs}, which the annotation {ann[:60]!r} says")
    if b == bs:
        return None
    return (f"the annotation {ann[:60]!r} around the launch says batch size {bs}, but the eager ops its kernels "
            f"match are of batch size {b} (their ops' leading dimension)")


@dataclass
class Lending:
    """What an attribution lends kernels before it is written: per op-table row its lender
    and new External id, and the host rows the costing costs them by. ``next_id`` is the
    next negative External id (never a Kineto one): every instance an op is lent to (a
    replay, a run of unlaunched kernels) gets ids of its own, so it is costed once, in full.
    The lenders' names and host rows are gathered once per source when written, not per
    instance."""

    next_id: int = -1
    rows: list[int] = field(default_factory=list)
    ext: list[int] = field(default_factory=list)
    #: per lent row: its source (an index into ``sources``) and lender (two flat lists, not a
    #: tuple per row: fewer Python objects alive at once, issue 19)
    lent_source: list[int] = field(default_factory=list)
    lent_lender: list[int] = field(default_factory=list)
    sources: list[Source] = field(default_factory=list)
    #: per group of each lent instance: its source index, lender, new id and rank (four flat
    #: lists, not a tuple per group)
    part_source: list[int] = field(default_factory=list)
    part_lender: list[int] = field(default_factory=list)
    part_id: list[int] = field(default_factory=list)
    part_rank: list[int] = field(default_factory=list)

    def lend(self, src: Source, match: Match, rows: list[int], rank: int) -> list[int]:
        """Lend one instance its ops: ``rows`` are its kernels' op-table rows (position ``p``
        as ``match`` numbers them); one new id per matched group. Returns the rows given an
        op."""
        si = next((i for i, x in enumerate(self.sources) if x is src), None)
        if si is None:
            si = len(self.sources)
            self.sources.append(src)
        pos, rel, lenders, used_lenders = _plan(match)
        base = self.next_id  # group i (in the order of its id in ``match``) gets base - i
        self.next_id -= len(used_lenders)
        lent = [rows[p] for p in pos]
        self.rows += lent
        self.lent_source += [si] * len(pos)
        self.lent_lender += lenders
        self.ext += [base - i for i in rel]
        self.part_source += [si] * len(used_lenders)
        self.part_lender += used_lenders
        self.part_id += range(base, base - len(used_lenders), -1)
        self.part_rank += [rank] * len(used_lenders)
        return lent

    def _names(self) -> pl.Series:
        """Per lent row, its lender's op name (String; one gather of the name column per
        source)."""
        if len(self.sources) == 1:  # the usual case: one gather, no per-row Python
            src = self.sources[0]
            lenders = pl.Series(self.lent_lender, dtype=pl.UInt32)
            return src.host["name"].gather(src.at.gather(lenders)).alias("op")
        out: list[str | None] = [None] * len(self.rows)
        for si, src in enumerate(self.sources):
            at = [p for p, s in enumerate(self.lent_source) if s == si]
            lenders = pl.Series([self.lent_lender[p] for p in at], dtype=pl.UInt32)
            for p, name in zip(at, shared_strings(src.host["name"].gather(src.at.gather(lenders))), strict=True):
                out[p] = name
        return pl.Series("op", out, dtype=pl.String)

    def write(self, ops: pl.DataFrame) -> pl.DataFrame:
        """``ops`` with the lent ``op`` and ``external_id`` set on the lent rows (a lender
        with no name leaves the row's ``op`` as it was). Two scatters, no join."""
        if not self.rows:
            return ops
        rows, names = pl.Series(self.rows, dtype=pl.UInt32), self._names()
        named = names.is_not_null()
        op = ops["op"].cast(pl.String).clone().scatter(rows.filter(named), names.filter(named))
        ext = ops["external_id"].clone().scatter(rows, pl.Series(self.ext, dtype=pl.Int64))
        return ops.with_columns(op.alias("op"), ext.alias("external_id"))

    def shape_rows(self) -> pl.DataFrame:
        """The host rows under the new ids (HOST_SCHEMA), for the costing only: one gather
        per run of instances lent from one source, in the order they were lent."""
        out = []
        start = 0
        n, src = len(self.part_source), self.part_source
        for end in range(1, n + 1):
            if end == n or src[end] != src[start]:
                out.append(_shape_rows(self.sources[src[start]], self.part_lender[start:end], self.part_id[start:end],
                                       self.part_rank[start:end]))
                start = end
        return pl.concat(out) if out else empty(HOST_SCHEMA)


def _plan(match: Match) -> tuple[list[int], list[int], list[int], list[int]]:
    """What :meth:`Lending.lend` writes for ``match``, whatever the instance: the matched
    positions (ascending), each one's group as its index among the groups used (sorted by
    group id), each one's lender, and each used group's lender. Made once per match and kept
    on it (a match lent to many instances, the repeats of one run, is planned once)."""
    cached = match.__dict__.get("_plan")
    if cached is not None:
        return cached
    groups, lenders = match.groups, match.lenders
    pos = [p for p, g in enumerate(groups) if g is not None]
    used = sorted({groups[p] for p in pos})
    index = {g: i for i, g in enumerate(used)}
    lender_of = {groups[p]: lenders[p] for p in pos}
    plan = (pos, [index[groups[p]] for p in pos], [lenders[p] for p in pos], [lender_of[g] for g in used])
    object.__setattr__(match, "_plan", plan)  # a cache, not a field: the Match stays frozen
    return plan


def _apply(ops: pl.DataFrame, kern: pl.DataFrame, plan: list, warnings: list[str]) -> Replays:
    """Write the plan into the op table, make the host rows under the new ids, describe it."""
    lending = Lending()
    infos: list[GraphInfo] = []
    dur = dict(zip(kern["_r"].to_list(), kern["dur_ns"].to_list()))
    per_rank: dict[int, int] = {}
    for rank, names, replays, (method, match, src, note) in plan:
        per_rank[rank] = per_rank.get(rank, 0) + 1
        total_ns = sum(dur[r] or 0 for rep in replays for r in rep)
        if match is None or not match.matched:
            infos.append(GraphInfo(rank=rank, graph=per_rank[rank], launches=len(replays),
                                   kernels_per_replay=len(names), method="unattributed", source=None,
                                   kernels_matched=0, device_time_ns=total_ns, attributed_ns=0, note=note or None))
            continue
        attributed = sum(dur[r] or 0 for rep in replays for r in lending.lend(src, match, rep, rank))
        infos.append(GraphInfo(rank=rank, graph=per_rank[rank], launches=len(replays),
                               kernels_per_replay=len(names), method=method,
                               source=None if src.same_trace else src.label,
                               kernels_matched=match.matched, device_time_ns=total_ns, attributed_ns=attributed,
                               note=note or None))
    ops = lending.write(ops)
    warnings = warnings + _warnings(infos, int(ops["dur_ns"].sum() or 0))
    return Replays(ops, lending.shape_rows(), infos, warnings)


def _shape_rows(src: Source, lenders: list[int], ids: list[int], ranks: list[int]) -> pl.DataFrame:
    """Copies of ``src``'s lender rows under the new External ids, each on its rank; from
    another trace without its pid/thread (its times are on another clock: no annotation is
    nested in them here)."""
    rows = src.rows_at(lenders).with_columns(pl.Series("external_id", ids, dtype=pl.Int64),
                                             pl.Series("rank", ranks, dtype=pl.Int32))
    if not src.same_trace:
        rows = rows.with_columns(pl.lit(None, HOST_SCHEMA["pid"]).alias("pid"),
                                 pl.lit(None, HOST_SCHEMA["thread"]).alias("thread"))
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
