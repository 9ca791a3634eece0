"""``read_trace``: any supported input (file, ``.gz``, directory, ``.tar.gz``, glob, ``-`` for
stdin, a FIFO) → one Trace.

Formats are sniffed from content, not only the suffix (:func:`detect_format`). A directory
is either a cache (:mod:`traceroof.cache`), a jax profile directory
(``plugins/profile/<run>/*.xplane.pb``) or a folder of per-rank Kineto traces (its
CUDA-graph ``capture_traces/`` left out, and named). Several inputs (a folder of per-rank
files, a glob, a list) are read in parallel processes, the copies among them left out
(:mod:`traceroof.duplicates`), and merged by :func:`merge`, ordered by rank.
"""

from __future__ import annotations

import contextlib
import functools
import glob as _glob
import os
import re
import stat
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Union

import polars as pl

from .duplicates import find_copies, op_identities
from .errors import (
    InputNotFoundError,
    TraceFormatError,
    TraceroofError,
    UsageError,
    file_kind,
    path_text,
)
from .merge import event_count, merge
from .parallel import (
    default_jobs,
    drop_early,
    input_size,
    run_parallel,
    tar_shared,
)
from .parsers import piped, registry
from .parsers.piped import STDIN
from .trace import Trace

if TYPE_CHECKING:
    from .progress import Progress

PathArg = Union[str, "os.PathLike[str]"]
_GLOB_CHARS = re.compile(r"[*?\[]")


def detect_format(path: str | os.PathLike[str], head: bytes | None = None) -> str:
    """The name of the format of the file ``path`` (``kineto``, ``xplane``, ``tar``, ...),
    sniffed from its content and name by the format registry
    (:func:`traceroof.parsers.registry.detect`). ``head``: its first bytes, when already
    read (a member of an archive, a stream): then ``path`` is only a name and nothing more
    is read, unless the head is all white space and ``path`` is a readable file.

    Raises:
        TraceFormatError: no format claims it (an empty file, a gzip of something else,
            UTF-16/32 text, bytes of no known format); the message lists what was expected.
        OSError: without ``head``, the file cannot be opened or read (``FileNotFoundError``:
            it does not exist).
    """
    return registry.detect(path, head).name


def resolve_inputs(path: PathArg | Sequence[PathArg]) -> list[str]:
    """The units ``read_trace`` reads for ``path``: one entry per trace file (or per cache /
    jax profile directory), in a stable order, duplicates dropped.

    A folder of per-rank Kineto traces expands to its ``*.json``/``*.json.gz`` files (sorted,
    recursively); a cache or a jax profile directory stays one unit; a string that names no
    existing path but holds ``*``, ``?`` or ``[`` is a glob (``**`` recurses), expanded the
    same way, sorted. A folder's CUDA-graph capture sub-folders (:data:`CAPTURE_DIRS`) are
    not expanded (:func:`resolve` lists what they hold).

    Raises:
        InputNotFoundError: a path does not exist, a glob matches nothing, or a folder holds
            no trace.
        UsageError: ``"-"`` (stdin, one unit as it is) among other inputs.
    """
    return resolve(path)[0]


def resolve(path: PathArg | Sequence[PathArg]) -> tuple[list[str], list[str]]:
    """:func:`resolve_inputs`, and the CUDA-graph capture traces left out of the folders
    expanded (see :data:`CAPTURE_DIRS`), sorted.

    Raises:
        InputNotFoundError: as :func:`resolve_inputs`; a folder holding only capture traces
            says so and names their folder.
    """
    items: list[PathArg] = [path] if isinstance(path, (str, os.PathLike)) else list(path)
    if not items:
        raise InputNotFoundError("no trace given")
    out: list[str] = []
    skipped: list[str] = []
    for item in items:
        s = os.fspath(item)
        p = Path(s)
        if s == STDIN:
            if len(items) > 1:
                raise UsageError(f"'{STDIN}' (a trace on stdin) is read alone, not with other inputs")
            out.append(s)
        elif p.exists():
            out.extend(_expand(p, skipped))
        elif _GLOB_CHARS.search(s):
            matches = sorted(_glob.glob(s, recursive=True))
            if not matches:
                raise InputNotFoundError(f"{s}: no file matches this pattern")
            for m in matches:
                if Path(m).parent.name in CAPTURE_DIRS and Path(m).parent.name not in s:
                    skipped.append(m)  # a '**' glob reaching into capture traces: not ranks
                    continue
                out.extend(_expand(Path(m), skipped))
            if not out:
                raise InputNotFoundError(f"{s}: matches only CUDA-graph capture traces ({skipped[0]}, …); "
                                         "name their folder in the pattern to analyse them")
        else:
            raise InputNotFoundError(f"{path_text(p)}: no such file or directory")
    units = list(dict.fromkeys(out))
    return units, sorted(set(skipped) - set(units))


#: sub-folders where serving frameworks write the torch-profiler traces of their CUDA-graph
#: capture phase beside the run's traces: vLLM (``--profiler-config.capture_torch_profiler_dir
#: <dir>/capture_traces``, PR #37524) and SGLang (``capture_traces/bs_<bs>_rank<r>.json.gz``,
#: PR #24370; ``graph_capture_profile/``, PR #28551). Not ranks of the run: a folder expanded
#: skips them (named in a warning); passed themselves, they are read as any folder.
CAPTURE_DIRS = ("capture_traces", "graph_capture_profile")


def _expand(p: Path, skipped: list[str] | None = None) -> list[str]:
    """A path → its inputs: a file or a directory that is one input of a format (a cache, a
    jax profile directory) stays one; a plain folder expands to the files of the registry's
    folder suffixes (sorted, recursively; folders that are one input are skipped: a cache
    inside the folder holds JSON that is not a trace). Capture-trace sub-folders
    (:data:`CAPTURE_DIRS`) are not expanded: their trace files go to ``skipped``."""
    if not p.is_dir():
        return [str(p) if str(p) != STDIN else os.path.join(os.curdir, STDIN)]  # (a file named '-': './-', not stdin)
    if registry.unit_format(p) is not None:
        return [str(p)]
    suffixes = registry.folder_suffixes()
    files, captures = [], []
    for root, dirs, names in os.walk(p):
        dirs[:] = [d for d in dirs if registry.unit_format(Path(root, d)) is None]
        if Path(root) != p and Path(root).name in CAPTURE_DIRS:
            captures.extend(str(Path(root, n)) for n in names if n.endswith(suffixes))
            dirs[:] = []
            continue
        files.extend(Path(root, n) for n in names if n.endswith(suffixes))
    files.sort()
    if skipped is not None:
        skipped.extend(captures)
    if not files:
        if captures:
            where = sorted({str(Path(c).parent) for c in captures})
            raise InputNotFoundError(
                f"{p}: directory holds only CUDA-graph capture traces (in {', '.join(where)}); "
                f"to analyse them, pass that folder itself: traceroof analyze {where[0]}"
            )
        raise InputNotFoundError(f"{p}: directory holds no {registry.no_trace_in_dir()} trace")
    return [str(f) for f in files]


def read_trace(path: PathArg | Sequence[PathArg], *, jobs: int | None = None,
               progress: Progress | None = None, prepare: bool = False,
               while_waiting: Callable[[], None] | None = None, chip: Any = None) -> Trace:
    """Read a trace file, a ``.tar.gz`` of traces, a directory, a glob, or several of them.

    Args:
        path: a Kineto ``.json``/``.json.gz``, an ``.xplane.pb``, a ``.tar.gz`` of per-rank
            Kineto files, a jax profile directory, a folder of per-rank traces, a cache
            directory (:mod:`traceroof.cache`), a glob pattern string
            (``'run/rank-*.json.gz'``; ``**`` recurses), or a list of any of these. Several
            inputs are per-rank traces, merged by :func:`merge` (ordered by rank) once the
            copies among them are left out (:func:`merge_inputs`, docs/distributed.md); a
            folder's CUDA-graph capture traces (:data:`CAPTURE_DIRS`) are not read, and a
            warning names them. ``"-"`` is the trace piped into stdin, and a FIFO is read as
            a stream too (:mod:`traceroof.parsers.piped`: sniffed from its first bytes, a
            Kineto trace streamed, another format copied to a temporary file first).
        jobs: worker processes for multi-file inputs, a tar's members included (default:
            the core count; 1 reads them one after another in this process).
        progress: a :class:`~traceroof.progress.Progress` to report files, bytes and events
            to; ``None`` (the default) prints nothing.
        prepare: with several inputs, also do the per-rank stages of the analysis in the
            processes that read them (:mod:`traceroof.rank_prep`; ``Trace.prepared``), so
            that :func:`traceroof.analysis.analyze` need not do them in this one.
        chip: with ``prepare``, the chip the analysis will be given (as ``analyze``'s
            ``chip``: a name, a TOML path, a :class:`~traceroof.chips.ChipSpec`; None: the
            trace's devices say), for the per-rank segmentation, which needs its roofline
            (used only if the analysis resolves the same chip).
        while_waiting: with several inputs read in parallel, called once in this process when
            it has no file left to read and waits for the workers' last ones
            (:func:`traceroof.parallel.run_parallel`): the caller's next work (imports, ...)
            done in what would be idle time.

    Raises:
        InputNotFoundError: a path does not exist, a glob matches nothing, a directory
            holds no trace, or ``"-"`` is given while stdin is a terminal.
        UsageError: ``"-"`` among other inputs.
        TraceFormatError: a file is not a supported trace or cannot be read (exit code 4);
            the message names the file. A character or block device or a socket is not
            read (one that never ends would hang the read). A *damaged* trace is not an error: it is recovered
            as far as possible, with what was lost in ``meta.warnings``.
        MixedInputsError: inputs of different formats or chips, or inputs sharing device
            ops without one holding the other's (exit code 4; the message names them).
    """
    units, captures = resolve(path)
    sizes = [input_size(u) for u in units]
    if progress is not None:
        progress.start(files=len(units), bytes=sum(sizes))
    ok = False
    try:
        if len(units) == 1 and _archive_in_parallel(units[0], jobs):
            trace = _read_archive(units[0], jobs=jobs, progress=progress, prepare=prepare, chip=chip,
                                  while_waiting=while_waiting)
        elif len(units) == 1:
            drop_early()  # workers started for a read of several files: not needed
            trace = read_one(units[0], progress=progress)
            if progress is not None:
                progress.file_done(units[0], sizes[0], event_count(trace))
        else:
            segment = prepare and min(jobs or default_jobs(), len(units)) >= SEGMENT_MIN_PROCESSES
            worker = functools.partial(_read_worker, prepare=prepare, identify=True, chip=chip, segment=segment)
            read = run_parallel(worker, units, jobs=jobs, progress=progress, sizes=sizes,
                                events_of=lambda r: event_count(r.trace), while_waiting=while_waiting)
            trace = merge_inputs([r.trace for r in read], [r.identities for r in read])
        if captures:
            _say_captures_skipped(trace, captures)
        if len(units) > 1 and all(Path(u).parent.name in CAPTURE_DIRS for u in units):
            trace.meta.warn(
                f"{len(units)} CUDA-graph capture traces read together: each records one capture pass "
                "(one captured batch size), told apart here as ranks; they are not ranks of a run"
            )
        ok = True
        return trace
    finally:
        if progress is not None:
            progress.close(ok=ok)


#: the fewest reading processes with which the readers segment each rank themselves
#: (``read_trace(prepare=True)``); with fewer the parent's analysis segments the merged table
#: once. A rank segmented alone costs ~25–45 ms of CPU (~93 small queries, mostly fixed), the
#: merged table's segmentation ~7–13 ms per rank (16 ranks of ``bench_ranks.py``: 0.11–0.21 s
#: in the parent's serial tail); the readers' share of the per-rank cost is that over the
#: processes, so it pays from about three (with two: ~0.3 s more CPU in all, the parent's
#: path ~0.07–0.15 s longer; docs/performance.md, "Ranks in parallel: where `--jobs 2` costs
#: more than half of `--jobs 1` (session 13)")
SEGMENT_MIN_PROCESSES = 3


def _archive_in_parallel(unit: str, jobs: int | None) -> bool:
    """Whether the one input ``unit`` is a tar of traces (a regular file the registry sniffs
    as one) that more than one process reads (:func:`traceroof.parallel.tar_processes`)."""
    if (jobs or default_jobs()) < 2 or unit == STDIN:
        return False
    p = Path(unit)
    try:
        if not (stat.S_ISREG(p.stat().st_mode) and registry.detect(p).name == "tar"):
            return False
        from .parsers.tar import compressed

        return tar_shared(p, jobs or default_jobs(), compressed(p))
    except (OSError, TraceroofError):
        return False  # (read_one says what is wrong with it)


def _read_archive(unit: str, *, jobs: int | None, progress: Progress | None, prepare: bool, chip: Any,
                  while_waiting: Callable[[], None] | None) -> Trace:
    """A tar of per-rank traces read as a folder of them is: its members shared among
    ``jobs`` processes (:func:`run_parallel`, each share read in one pass over the archive by
    :func:`traceroof.parsers.tar.read_share`; with ``prepare`` each member's per-rank stages
    done there too), merged as :func:`traceroof.parsers.tar.read` merges them
    (:func:`merge_inputs`: the copies among them left out, the prepared stages attached).

    Raises:
        TraceFormatError: as :func:`traceroof.parsers.tar.read`.
    """
    from .parsers import tar

    shares = jobs or default_jobs()
    size = input_size(unit)
    items = [f"{path_text(unit)} (share {k + 1} of {shares})" for k in range(shares)]
    worker = functools.partial(_read_share, archive=unit, shares=shares, prepare=prepare, chip=chip,
                               segment=prepare and shares >= SEGMENT_MIN_PROCESSES)
    parts = run_parallel(worker, items, jobs=shares, while_waiting=while_waiting)
    read = sorted((r for members, _ in parts for r in members), key=lambda r: (r[0], r[1]))
    notes = [n for _, part_notes in parts for n in part_notes]  # (one share says each: tar.read_share)
    if not read:
        raise tar.nothing_read(unit, notes)
    if progress is not None:  # (the members are counted once read: the shares are no files)
        for i, (name, _, r) in enumerate(read):
            progress.file_done(name, size // len(read) + (size % len(read) if i == 0 else 0), event_count(r.trace))
    trace = merge_inputs([r.trace for _, _, r in read], [r.identities for _, _, r in read])
    for note in notes:
        trace.meta.warn(note)
    return trace


def _read_share(item: str, *, archive: str, shares: int, prepare: bool, chip: Any,
                segment: bool) -> tuple[list[tuple[str, int, _Read]], list[str]]:
    """What a process runs for one share of a tar (``item``: its name, ``… (share K of N)``):
    the share's members (:func:`traceroof.parsers.tar.read_share`), each as :func:`_read_worker`
    sends a file back, and the share's notes of a cut or damaged archive:
    ``([(member name, place in the archive, _Read)], notes)``."""
    from .parsers import tar

    share = int(item.rsplit("(share ", 1)[1].split(" ", 1)[0]) - 1
    with worker_errors(archive, item):
        read, notes = tar.read_share(Path(archive), share, shares)
        return [(name, place, _sent(t, prepare, True, chip, segment)) for name, place, t in read], notes


@contextlib.contextmanager
def worker_errors(path: str, item: str | None = None) -> Iterator[None]:
    """What a worker process raises, named: ours as they are, an ``OSError`` as a
    :class:`TraceFormatError` naming the file ``path`` (exit code 4, as :func:`read_one`
    says it), anything else as a ``RuntimeError`` naming ``item`` (default: ``path``), so
    that a failure among hundreds of files says which one."""
    try:
        yield
    except TraceroofError:
        raise
    except (OSError, EOFError) as exc:
        raise TraceFormatError(path, "file", f"a readable file ({type(exc).__name__}: {exc})") from exc
    except Exception as exc:  # noqa: BLE001 - re-raised with the file named
        raise RuntimeError(f"{item or path}: {type(exc).__name__}: {exc}") from exc


def merge_inputs(traces: list[Trace], identities: Sequence[pl.DataFrame | None] | None = None) -> Trace:
    """:func:`~traceroof.merge.merge` of the inputs of one analysis, copies left out first
    (:func:`~traceroof.duplicates.find_copies`: each skipped input is named in a warning and
    counted in ``meta.stats['duplicate_inputs_skipped']``, its ops in
    ``['duplicate_device_ops_skipped']``). ``identities``: per input, its op identities as
    the worker that read it computed them (:func:`~traceroof.duplicates.op_identities`), or
    None.

    Raises:
        MixedInputsError: inputs that overlap without one holding the other, or that cannot
            be merged (:func:`~traceroof.merge.check_mergeable`).
    """
    copies = find_copies(traces, identities)
    kept = copies.keep(traces)
    trace = merge(kept)
    if any(t.prepared is not None for t in kept):
        from .rank_prep import attach

        trace = attach(trace, kept)
    copies.note(trace.meta)
    return trace


def _say_captures_skipped(trace: Trace, captures: list[str]) -> None:
    """The warning (and ``meta.stats['capture_traces_skipped']``) for capture traces left out."""
    where = sorted({str(Path(c).parent) for c in captures})
    names = ", ".join(Path(c).name for c in captures[:3]) + (f", … ({len(captures) - 3} more)" if len(captures) > 3 else "")
    trace.meta.stats["capture_traces_skipped"] = len(captures)
    trace.meta.warn(
        f"{len(captures)} CUDA-graph capture trace{'s' if len(captures) != 1 else ''} in {', '.join(where)} "
        f"not read ({names}): they record the graph capture at start-up, not the run, and are not a rank "
        f"(analyze reads them only to attribute the run's graph replays); to analyse them, pass that folder "
        f"itself: traceroof analyze {where[0]}"
    )


def read_one(path: str, *, progress: Progress | None = None) -> Trace:
    """Read one unit of :func:`resolve_inputs` (a file, a cache or a jax profile directory).

    Raises:
        InputNotFoundError: it does not exist.
        TraceFormatError: it is not a supported trace, or cannot be read (an ``OSError``
            such as a permission error becomes one, naming the file).
    """
    try:
        return _read_unit(path, progress)
    except TraceroofError:
        raise
    except (OSError, EOFError) as exc:
        raise TraceFormatError(path, "file", f"a readable file ({type(exc).__name__}: {exc})") from exc


class _Read(NamedTuple):
    """What :func:`_read_worker` sends back: the file's Trace, and its op identities
    (:func:`~traceroof.duplicates.op_identities` as input 0; None unless asked for)."""

    trace: Trace
    identities: pl.DataFrame | None


def _read_worker(path: str, prepare: bool = False, identify: bool = False, chip: Any = None,
                 segment: bool = True) -> _Read:
    """What a worker process runs: one file → its Trace (pickled back to the parent, with
    each column in one chunk: compact to send, and what the merged table is made of), with
    ``prepare`` its per-rank analysis stages done too (:func:`traceroof.rank_prep.prepare`,
    with ``segment`` its segmentation under ``chip``),
    with ``identify`` its op identities, which the parent's search for copies among the
    inputs needs (:func:`merge_inputs`): so the parent, which then analyses the merge alone,
    need not compute them.

    Exceptions are re-raised naming the file (:func:`worker_errors`), so that a failure among
    hundreds of files says which one."""
    with worker_errors(path):
        return _sent(read_one(path), prepare, identify, chip, segment)


def _sent(t: Trace, prepare: bool, identify: bool, chip: Any, segment: bool) -> _Read:
    """A trace read in a worker as it is sent back (:func:`_read_worker`)."""
    t.ops = t.ops.rechunk()
    t.host = t.host.rechunk()
    if prepare:
        from .rank_prep import prepare as prepare_rank

        t.prepared = prepare_rank(t, chip, segment=segment)
    return _Read(t, op_identities(t, 0).rechunk() if identify else None)


def warm_worker() -> None:
    """What a worker process imports before its first file (:data:`traceroof.parallel.WARM_UP`):
    the format registry's readers and the per-rank stages (:mod:`traceroof.rank_prep`, the
    costing, the eager match), while the parent is still importing its own modules. Not the
    segmentation's (``steps``, ``timeline``, ``roofline``, ``chip_detect``): the readers
    segment only with :data:`SEGMENT_MIN_PROCESSES` processes or more, and import them then."""
    import importlib

    registry.folder_suffixes()  # loads every registered format's module
    for name in ("parsers.kineto", "parsers.kineto_native", "rank_prep", "costing", "unlaunched", "graph_replay"):
        importlib.import_module(f"{__package__}.{name}")


def _read_unit(path: str, progress: Progress | None) -> Trace:
    if path == STDIN:
        return piped.read_stdin(progress)
    p = Path(path)
    if _is_fifo(p):
        return piped.read_fifo(p, progress)
    if p.is_dir():
        fmt = registry.unit_format(p)
        if fmt is None:  # a plain folder: its files, one after another
            return read_trace(p, jobs=1, progress=None)
        return fmt.read(p, None)
    return registry.detect(p).read(p, progress)


def _is_fifo(p: Path) -> bool:
    """True for a FIFO (named pipe: read as a stream, :mod:`.parsers.piped`), False for a
    regular file or a directory.

    Raises:
        InputNotFoundError: ``p`` does not exist.
        TraceFormatError: a character or block device (``/dev/zero``, a terminal), a socket:
            not read (a device may never end).
        OSError: ``p`` cannot be looked at (read_one names the file).
    """
    try:
        mode = p.stat().st_mode
    except FileNotFoundError:
        raise InputNotFoundError(f"{path_text(p)}: no such file or directory") from None
    if stat.S_ISFIFO(mode):
        return True
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return False
    raise TraceFormatError(p, "file", f"a trace file, a folder, a FIFO or '{STDIN}' (stdin), found {file_kind(mode)}")


__all__ = ["read_trace", "read_one", "resolve_inputs", "resolve", "merge_inputs", "detect_format", "CAPTURE_DIRS"]
