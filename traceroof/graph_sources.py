"""Graph-replay sources: what one trace offers to attribute CUDA/HIP graph replays from.

:mod:`traceroof.graph_replay` asks every source it has (the trace itself, then its capture
traces) for the framework ops of each replayed graph. Here: a :class:`Source` built from one
trace's op and host tables (:func:`build_source`: its capture windows' launch sequences, its
eager kernels in device order), the capture traces found or given (:func:`capture_sources`),
and the batch size a capture is of (:func:`capture_batch`: a capture trace's file name, else
its ops' leading dimension).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from . import graph_capture
from .costing_shapes import innermost_of, join_columns
from .errors import InputNotFoundError, TraceroofError
from .graph_match import KernelCounts, Sequence, leading_batch
from .schema import HOST_SCHEMA, empty

#: launch runtime calls a capture records as graph kernels (a graph launch inside a capture,
#: or a host-function node, ``cudaLaunchHostFunc``, is not one)
_LAUNCH_RE = r"(?i)launch"
_GRAPH_LAUNCH_RE = r"(?i)graphlaunch|launchhostfunc"


@dataclass
class Source:
    """What one trace offers to attribute replays from: its framework ops, the lenders (a
    lender is an index into ``at``, whose value is that op's row in ``host``, HOST_SCHEMA);
    ``captures``, per rank, the launch sequences of its capture windows; ``eager``, per
    rank, its eager kernels in device order; ``op_kernels``, lender → kernels it launched
    eagerly. The lenders' host rows are gathered only where asked (:meth:`rows_at`): a
    trace lends a few of its hundreds of thousands of ops."""

    label: str
    same_trace: bool
    host: pl.DataFrame
    #: UInt32, lender → its row in ``host``
    at: pl.Series
    captures: dict[int, list[Sequence]] = field(default_factory=dict)
    eager: dict[int, Sequence] = field(default_factory=dict)
    op_kernels: Mapping[int, int] = field(default_factory=dict)
    #: lender → the leading dimension of its first input (:func:`lead`'s cache)
    lead_dims: dict[int, int | None] = field(default_factory=dict)

    def rows_at(self, lenders: list[int]) -> pl.DataFrame:
        """The host rows (HOST_SCHEMA) of ``lenders``, in their order (repeats repeated)."""
        return self.host[self.at.gather(lenders)]


def shared_strings(col: pl.Series) -> list[str | None]:
    """``col.to_list()`` (a String column, nulls as None) with one Python string per distinct
    value, each row a reference to it: equal as a list, but a kernel name of hundreds of
    characters is made once, not once per row (on the 1 GB replicated trace the eager
    kernels' names would be ~0.1 GB of Python strings, which the interpreter's allocator
    keeps after they are freed)."""
    return _strings_and_codes(col)[0]


def _strings_and_codes(col: pl.Series) -> tuple[list[str | None], pl.Series]:
    """:func:`shared_strings` and each row's code (Int64: the value's rank of first
    appearance, nulls one more code after them): equal strings, equal codes, the integer
    names :func:`traceroof.graph_match.starts_of` indexes (made here once, from the codes
    the sharing needs anyway, instead of a Python dict over every name)."""
    values = col.drop_nulls().unique(maintain_order=True)
    codes = col.replace_strict(values, pl.int_range(values.len(), eager=True, dtype=pl.Int64),
                               default=None, return_dtype=pl.Int64)
    filled = codes.fill_null(values.len()).rename("c")
    if values.len() == col.len():
        return col.to_list(), filled
    table = values.to_list()
    return [None if c is None else table[c] for c in codes.to_list()], filled


def resolve_given(given: list[str] | None) -> list[str] | None:
    """The capture-trace files ``given`` names (None: look beside the trace; ``[]``: none).

    Raises:
        InputNotFoundError: one does not exist, or a given folder holds none.
    """
    from .io import resolve_inputs

    if not given:
        return given
    try:
        return resolve_inputs(given)
    except InputNotFoundError as exc:
        raise InputNotFoundError(f"capture trace {exc}") from None


def build_source(ops: pl.DataFrame, host: pl.DataFrame, label: str, *, same_trace: bool) -> Source:
    """The :class:`Source` of one trace (its op and host tables). Only integer columns are
    sorted and joined; only the framework ops an eager kernel or a capture's launch names
    are lenders (:func:`traceroof.costing_shapes.innermost_of`: a host table holds several times
    more); kernel names are read once per eager kernel; the op keys (:func:`key`) are
    formed only where a capture window needs them."""
    if host.height == 0:
        return Source(label, same_trace, empty(HOST_SCHEMA), pl.Series("_h", [], pl.UInt32))
    win = graph_capture.windows(host)
    eager = (ops.select("rank", "start_ns", "stream", "external_id", "name", "graph", "kind")
             .filter(~pl.col("graph").fill_null(False), pl.col("external_id").is_not_null(),
                     ~pl.col("kind").cast(pl.String).is_in(["memcpy", "memset"]))
             .sort("rank", "start_ns", "stream")
             .select("rank", "external_id", "name"))
    calls = _launch_calls(host) if win.height else None
    at = innermost_of(host, eager["external_id"] if calls is None else pl.concat([eager["external_id"],
                                                                                  calls["external_id"]]))
    lender = host.select("rank", "external_id")[at].with_row_index("_l")
    eager = join_columns(eager, lender, ["rank", "external_id"])  # the left join, on one packed integer key
    src = Source(label, same_trace, host, at)
    for (rank,), g in eager.group_by("rank", maintain_order=True):
        names, codes = _strings_and_codes(g["name"])
        src.eager[int(rank)] = seq = Sequence(names, g["_l"].to_list())
        object.__setattr__(seq, "_codes", codes)  # for starts_of (a cache, not a field)
    # per lender row, its eager kernels (a bincount without numpy: one scatter, no Python
    # loop over the lenders)
    vc = eager["_l"].drop_nulls().value_counts()
    counts = pl.zeros(at.len(), pl.Int64, eager=True).scatter(vc["_l"], vc["count"])
    src.op_kernels = KernelCounts(counts.to_list())
    if calls is not None:
        calls = calls.join(lender, on=["rank", "external_id"], how="left", maintain_order="left")
        src.captures = _window_sequences(win, calls, _eager_names(host, at, eager))
    return src


def _launch_calls(host: pl.DataFrame) -> pl.DataFrame:
    """The launch runtime calls a capture records as graph kernels (:data:`_LAUNCH_RE`, not
    :data:`_GRAPH_LAUNCH_RE`) on a known thread at a known time, in time order: ``rank,
    thread, start_ns, external_id``."""
    return (host.select("rank", "thread", "start_ns", "cat", "name", "external_id")
            .filter(pl.col("cat") == "runtime", pl.col("name").str.contains(_LAUNCH_RE),
                    ~pl.col("name").str.contains(_GRAPH_LAUNCH_RE)).sort("start_ns")
            .filter(pl.col("start_ns").is_not_null(), pl.col("thread").is_not_null())
            .select("rank", "thread", "start_ns", "external_id"))


#: the columns that identify an op and its shapes (:func:`key`)
KEY_COLUMNS = ("name", "input_dims", "input_types", "concrete_inputs")


def key(rows: pl.DataFrame) -> list[tuple]:
    """Per lender row: what identifies the op and its shapes (name, dims, types, concrete inputs)."""
    return list(rows.select(KEY_COLUMNS).iter_rows())


def _eager_names(host: pl.DataFrame, at: pl.Series, eager: pl.DataFrame) -> tuple[list[int], dict[int, list[str]]]:
    """Per lender its key's id (one per distinct :func:`key`), and key id → the kernel names
    the key's first eager instance (the first lender of that key in device order) launched,
    in order. Keys equal as tuples are equal here (a null equals a null)."""
    ids = (host.select(KEY_COLUMNS)[at].with_row_index("_l")
           .group_by(KEY_COLUMNS, maintain_order=True).agg("_l").with_row_index("_k")
           .select("_k", "_l").explode("_l"))
    key_of = ids.sort("_l")["_k"].to_list()
    e = (eager.filter(pl.col("_l").is_not_null()).select("name", "_l")
         .join(ids, on="_l", how="left", maintain_order="left"))
    first = e.group_by("_k").agg(pl.col("_l").first().alias("_first"))
    e = (e.join(first, on="_k", how="left", maintain_order="left").filter(pl.col("_l") == pl.col("_first"))
         .group_by("_k", maintain_order=True).agg("name"))
    return key_of, dict(zip(e["_k"].to_list(), e["name"].to_list(), strict=True))


def _window_sequences(win: pl.DataFrame, calls: pl.DataFrame,
                      names: tuple[list[int], dict[int, list[str]]]) -> dict[int, list[Sequence]]:
    """Per rank, the launch sequence of each capture window of ``win``: its launch runtime
    calls (``calls``, :func:`_launch_calls` with their lender ``_l``) on the capturing
    thread, in order, each lent the op of its External id; a launch's kernel name where the
    op ran eagerly with the same shapes (its j-th launch: the eager j-th kernel;
    ``names``: :func:`_eager_names`). Each window's calls are found by two sorted searches
    in its thread's calls (never a filter of the host table per window)."""
    import numpy as np

    per_thread = {k: (g["start_ns"].to_numpy(), g["_l"].to_list())
                  for k, g in calls.partition_by("rank", "thread", as_dict=True, maintain_order=True).items()}
    key_of, eager_names = names
    out: dict[int, list[Sequence]] = {}
    for rank, thread, s, e in win.select("rank", "thread", "start_ns", "end_ns").iter_rows():
        t, thread_lenders = per_thread.get((rank, thread), (np.zeros(0, np.int64), []))
        lenders = thread_lenders[int(np.searchsorted(t, s, "left")):int(np.searchsorted(t, e, "left"))]
        nth: dict[int, int] = {}
        known: list[str | None] = []
        for lend in lenders:
            if lend is None:
                known.append(None)
                continue
            j = nth.get(lend, 0)
            nth[lend] = j + 1
            kernels = eager_names.get(key_of[lend], [])
            known.append(kernels[j] if j < len(kernels) else None)
        out.setdefault(int(rank), []).append(Sequence(known, lenders))
    return out


def capture_sources(sources: list[str], given: list[str] | None,
                     warnings: list[str]) -> tuple[list[Source], int]:
    """The capture traces, read, and how many could not be: those ``given`` (resolved,
    :func:`resolve_given`), else those beside ``sources``. One that cannot be read is named
    in ``warnings`` and left out."""
    from .io import read_one

    paths = given if given is not None else capture_traces_beside(sources)
    out = []
    for p in paths:
        try:
            t = read_one(p)
        except TraceroofError as exc:
            warnings.append(f"capture trace {p} not used: {exc}")
            continue
        out.append(build_source(t.ops, t.host, p, same_trace=False))
    return out, len(paths) - len(out)


def capture_traces_beside(sources: list[str]) -> list[str]:
    """The trace files in the capture folders (:data:`traceroof.io.CAPTURE_DIRS`) of the
    folders holding ``sources``, sorted, without repeats. A trace read from stdin
    (``<stdin>``, the members of a tar piped in ``<stdin>!…``, a cache ingested from it) has
    no folder: nothing is beside it (not the current directory), its capture traces are only
    those given (``--capture-trace``). A FIFO is beside its own folder, as a file."""
    from .io import CAPTURE_DIRS
    from .parsers import registry
    from .parsers.piped import STDIN_NAME

    suffixes = registry.folder_suffixes()
    found: set[str] = set()
    for s in sources:
        if s == STDIN_NAME or s.startswith(STDIN_NAME + "!"):
            continue
        for d in CAPTURE_DIRS:
            folder = Path(s).parent / d
            if folder.is_dir():
                found.update(str(p) for p in folder.rglob("*") if p.is_file() and p.name.endswith(suffixes))
    return sorted(found)


#: the batch size in a capture trace's file name: SGLang ``bs_<bs>_rank<r>.json.gz``, vLLM
#: ``capture_<size>_FULL….json.gz``
_FILE_BS_RE = re.compile(r"(?i)(?:^|[_-])(?:bs|capture)_(\d+)(?=[_.-])")


def file_batch(label: str) -> int | None:
    """The batch size a capture trace's file name says (:data:`_FILE_BS_RE`), else None."""
    m = _FILE_BS_RE.search(Path(label).name)
    return int(m.group(1)) if m else None


def lead(s: Source, lender: int) -> int | None:
    """The leading dimension of lender ``lender``'s first input (``Input Dims[0][0]``), None
    when not recorded."""
    if lender not in s.lead_dims:
        try:
            dims = json.loads(s.rows_at([lender])["input_dims"][0] or "null")
            first = dims[0] if isinstance(dims, list) and dims else None
            s.lead_dims[lender] = int(first[0]) if isinstance(first, list) and first and isinstance(first[0], int) else None
        except (ValueError, TypeError):
            s.lead_dims[lender] = None
    return s.lead_dims[lender]


def ops_batch(s: Source, lenders: list[int | None]) -> int | None:
    """The batch size the ops of ``lenders`` say (:func:`~traceroof.graph_match.leading_batch`
    over each op instance once)."""
    return leading_batch([lead(s, x) for x in dict.fromkeys(x for x in lenders if x is not None)])


def capture_batch(s: Source, q: Sequence) -> tuple[int, str] | None:
    """``(batch size, how it is known)`` of capture ``q`` of ``s``: a capture trace's file
    name (:func:`file_batch`), else its ops' leading dimension (:func:`ops_batch`); None:
    unknown."""
    b = None if s.same_trace else file_batch(s.label)
    if b is not None:
        return b, "its file name"
    b = ops_batch(s, q.lenders)
    return None if b is None else (b, "its ops' leading dimension")


__all__ = ["KEY_COLUMNS", "Source", "build_source", "capture_batch", "capture_sources", "capture_traces_beside", "file_batch",
           "key", "shared_strings", "lead", "ops_batch", "resolve_given"]
