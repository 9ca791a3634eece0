"""``read_trace``: any supported input (file, ``.gz``, directory, ``.tar.gz``, glob) → one Trace.

Formats are sniffed from content, not only the suffix (:func:`detect_format`). A directory
is either a cache (:mod:`traceroof.cache`), a jax profile directory
(``plugins/profile/<run>/*.xplane.pb``) or a folder of per-rank Kineto traces. Several
inputs (a folder of per-rank files, a glob, a list) are read in parallel processes and
merged by :func:`merge`, ordered by rank.
"""

from __future__ import annotations

import glob as _glob
import gzip
import logging
import multiprocessing
import os
import re
import tarfile
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, Union

import polars as pl

from .errors import InputNotFoundError, TraceFormatError, TraceroofError, UnsupportedTraceVersion
from .trace import Trace, TraceMeta

if TYPE_CHECKING:
    from .progress import Progress

logger = logging.getLogger(__name__)

KINETO_SUFFIXES = (".json", ".json.gz", ".pt.trace.json", ".pt.trace.json.gz")
PathArg = Union[str, "os.PathLike[str]"]
_GLOB_CHARS = re.compile(r"[*?\[]")
T = TypeVar("T")


def detect_format(path: str | os.PathLike[str], head: bytes | None = None) -> str:
    """Sniff a file's format from its first bytes: ``kineto``, ``xplane`` or ``tar``.

    Raises:
        TraceFormatError: when the content is none of those.
    """
    p = Path(path)
    if head is None:
        with open(p, "rb") as fh:
            head = fh.read(4096)
    if head[:2] == b"\x1f\x8b":
        try:
            with gzip.open(p, "rb") as fh:
                inner = fh.read(4096)
        except (OSError, EOFError):
            inner = b""
        if len(inner) > 262 and inner[257:262] == b"ustar":
            return "tar"
        if inner.lstrip()[:1] in (b"{", b"["):
            return "kineto"
        if p.name.endswith(".xplane.pb.gz") or inner[:1] == b"\x0a":
            return "xplane"
        if p.name.endswith((".tar.gz", ".tgz")):
            return "tar"
        raise TraceFormatError(p, "byte 0", "gzip of a Kineto JSON trace or of a tar of traces")
    if len(head) > 262 and head[257:262] == b"ustar":
        return "tar"
    if head.lstrip()[:1] == b"{":
        return "kineto"
    if p.name.endswith(".xplane.pb") or (head[:1] == b"\x0a" and not head.lstrip().startswith(b"{")):
        return "xplane"
    if not head:
        raise TraceFormatError(p, "byte 0", "a trace, found an empty file")
    raise TraceFormatError(
        p, "byte 0", "a Kineto JSON trace (.json/.json.gz), an XSpace (.xplane.pb) or a .tar.gz of traces"
    )


def resolve_inputs(path: PathArg | Sequence[PathArg]) -> list[str]:
    """The units ``read_trace`` reads for ``path``: one entry per trace file (or per cache /
    jax profile directory), in a stable order, duplicates dropped.

    A folder of per-rank Kineto traces expands to its ``*.json``/``*.json.gz`` files (sorted,
    recursively); a cache or a jax profile directory stays one unit; a string that names no
    existing path but holds ``*``, ``?`` or ``[`` is a glob (``**`` recurses), expanded the
    same way, sorted.

    Raises:
        InputNotFoundError: a path does not exist, a glob matches nothing, or a folder holds
            no trace.
    """
    items: list[PathArg] = [path] if isinstance(path, (str, os.PathLike)) else list(path)
    if not items:
        raise InputNotFoundError("no trace given")
    out: list[str] = []
    for item in items:
        s = os.fspath(item)
        p = Path(s)
        if p.exists():
            out.extend(_expand(p))
        elif _GLOB_CHARS.search(s):
            matches = sorted(_glob.glob(s, recursive=True))
            if not matches:
                raise InputNotFoundError(f"{s}: no file matches this pattern")
            for m in matches:
                out.extend(_expand(Path(m)))
        else:
            raise InputNotFoundError(f"{p}: no such file or directory")
    return list(dict.fromkeys(out))


def _is_xplane_dir(p: Path) -> bool:
    return next(iter(p.rglob("*.xplane.pb")), None) is not None


def _expand(p: Path) -> list[str]:
    if not p.is_dir():
        return [str(p)]
    from .cache import is_cache

    if is_cache(p) or _is_xplane_dir(p):
        return [str(p)]
    files = []
    for root, dirs, names in os.walk(p):
        # a cache inside the folder (ingest -o run/cache) holds JSON that is not a trace
        dirs[:] = [d for d in dirs if not is_cache(Path(root, d))]
        files.extend(Path(root, n) for n in names if n.endswith((".json", ".json.gz")))
    files.sort()
    if not files:
        raise InputNotFoundError(f"{p}: directory holds no *.json, *.json.gz or *.xplane.pb trace")
    return [str(f) for f in files]


def _size(path: str) -> int:
    p = Path(path)
    try:
        if p.is_dir():
            return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
        return p.stat().st_size
    except OSError:
        return 0


def _events(t: Trace) -> int:
    return int(t.meta.stats.get("events", 0) or 0)


def read_trace(path: PathArg | Sequence[PathArg], *, jobs: int | None = None,
               progress: Progress | None = None) -> Trace:
    """Read a trace file, a ``.tar.gz`` of traces, a directory, a glob, or several of them.

    Args:
        path: a Kineto ``.json``/``.json.gz``, an ``.xplane.pb``, a ``.tar.gz`` of per-rank
            Kineto files, a jax profile directory, a folder of per-rank traces, a cache
            directory (:mod:`traceroof.cache`), a glob pattern string
            (``'run/rank-*.json.gz'``; ``**`` recurses), or a list of any of these. Several
            inputs are per-rank traces, merged by :func:`merge` (ordered by rank).
        jobs: worker processes for multi-file inputs (default: the core count; 1 reads them
            one after another in this process).
        progress: a :class:`~traceroof.progress.Progress` to report files, bytes and events
            to; ``None`` (the default) prints nothing.

    Raises:
        InputNotFoundError: a path does not exist, a glob matches nothing, or a directory
            holds no trace.
        TraceFormatError: a file is not a supported trace or cannot be read (exit code 4);
            the message names the file. A *damaged* trace is not an error: it is recovered
            as far as possible, with what was lost in ``meta.warnings``.
    """
    units = resolve_inputs(path)
    sizes = [_size(u) for u in units]
    if progress is not None:
        progress.start(files=len(units), bytes=sum(sizes))
    ok = False
    try:
        if len(units) == 1:
            trace = read_one(units[0], progress=progress)
            if progress is not None:
                progress.file_done(units[0], sizes[0], _events(trace))
        else:
            trace = merge(run_parallel(_read_worker, units, jobs=jobs, progress=progress, sizes=sizes,
                                      events_of=_events))
        ok = True
        return trace
    finally:
        if progress is not None:
            progress.close(ok=ok)


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


def default_jobs() -> int:
    """Worker processes when ``jobs`` is not given: the cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _read_worker(path: str) -> Trace:
    """What a worker process runs: one file → its Trace (pickled back to the parent, with
    each column in one chunk: compact to send, and what the merged table is made of).

    Unexpected exceptions are re-raised naming the file, so that a failure among hundreds of
    files says which one."""
    try:
        t = read_one(path)
        t.ops = t.ops.rechunk()
        t.host = t.host.rechunk()
        return t
    except TraceroofError:
        raise
    except Exception as exc:  # noqa: BLE001 - re-raised with the file named
        raise RuntimeError(f"{path}: {type(exc).__name__}: {exc}") from exc


def _read_unit(path: str, progress: Progress | None) -> Trace:
    p = Path(path)
    if not p.exists():
        raise InputNotFoundError(f"{p}: no such file or directory")
    if p.is_dir():
        from .cache import is_cache, read_cache

        if is_cache(p):
            return read_cache(p)
        if _is_xplane_dir(p):
            from .parsers import xplane

            return xplane.read_dir(p)
        return read_trace(p, jobs=1, progress=None)
    fmt = detect_format(p)
    if fmt == "kineto":
        from .parsers import kineto

        return kineto.read(p, progress=_file_cb(progress))
    if fmt == "xplane":
        from .parsers import xplane

        return xplane.read(p)
    return _read_tar(p, progress)


def _file_cb(progress: Progress | None) -> Callable[[int, int], None] | None:
    return None if progress is None else progress.update


def run_parallel(fn: Callable[[str], T], items: list[str], *, jobs: int | None = None,
                 progress: Progress | None = None, sizes: list[int] | None = None,
                 events_of: Callable[[T], int] | None = None) -> list[T]:
    """``[fn(item) for item in items]`` in ``jobs`` spawned processes; results in input order.

    ``fn`` must be picklable (a module-level function, or a ``functools.partial`` of one).
    The parent reports each finished item to ``progress`` as it completes (its size from
    ``sizes``, in bytes, and ``events_of(result)`` events). The first failure cancels the
    items not started yet and is raised as the worker raised it (ours name their file).
    ``jobs`` defaults to the core count; with 1 (or one item) everything runs in this process.
    """
    jobs = jobs or default_jobs()
    sizes = sizes if sizes is not None else [0] * len(items)
    out: list[Any] = [None] * len(items)

    def done(i: int, result: Any) -> None:
        out[i] = result
        if progress is not None:
            progress.file_done(items[i], sizes[i], events_of(result) if events_of else 0)

    if len(items) <= 1 or jobs == 1:
        for i, item in enumerate(items):
            done(i, fn(item))
        return out
    # spawn, not fork: forking a process whose polars/Rayon threads hold locks can deadlock
    ctx = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(max_workers=min(jobs, len(items)), mp_context=ctx)
    try:
        pending = {pool.submit(fn, item): i for i, item in enumerate(items)}
        while pending:
            finished, _ = wait(list(pending), return_when=FIRST_EXCEPTION)
            for fut in sorted(finished, key=lambda f: pending[f]):
                i = pending.pop(fut)
                try:
                    result = fut.result()  # raises the worker's error
                except BrokenProcessPool as exc:
                    raise RuntimeError(
                        f"{items[i]}: a worker process died while reading it (out of memory? "
                        "try fewer --jobs)") from exc
                done(i, result)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return out


def _offset_cb(progress: Progress, bytes0: int, events0: int) -> Callable[[int, int], None]:
    """A per-member progress callback that adds the members already read (tar archives)."""

    def cb(bytes_read: int, events: int) -> None:
        progress.update(bytes0 + bytes_read, events0 + events)

    return cb


def _read_tar(p: Path, progress: Progress | None = None) -> Trace:
    from .parsers import kineto

    traces = []
    done_bytes = done_events = 0
    try:
        with tarfile.open(p, "r:*") as tf:
            members = [m for m in tf.getmembers() if m.isfile() and m.name.endswith((".json", ".json.gz"))]
            if not members:
                raise TraceFormatError(p, "archive", "a tar holding *.json or *.json.gz Kineto traces")
            for m in sorted(members, key=lambda m: m.name):
                fh = tf.extractfile(m)
                assert fh is not None
                name = f"{p}!{m.name}"
                cb = None if progress is None else _offset_cb(progress, done_bytes, done_events)
                # streamed: the member is decompressed and parsed chunk by chunk
                t = kineto.read_fileobj(fh, path=name, rank=None, progress=cb)
                traces.append(t)
                done_bytes += m.size
                done_events += _events(t)
                if progress is not None:
                    progress.update(done_bytes, done_events)
    except tarfile.TarError as exc:
        raise TraceFormatError(p, "archive", f"a readable tar archive ({exc})") from exc
    return merge(traces)


def _rank_key(m: TraceMeta, i: int) -> tuple[Any, ...]:
    return (min(m.ranks) if m.ranks else i, list(m.sources), i)


def merge_meta(metas: Sequence[TraceMeta]) -> tuple[TraceMeta, list[int], list[dict[int, int]]]:
    """The metadata half of :func:`merge`, without the tables.

    Returns the merged :class:`TraceMeta`, the order the inputs are concatenated in (indices
    into ``metas``: by first rank, then sources), and for each input the renumbering of its
    ranks (``{old: new}``, empty when none of its ranks was seen before). The cache's dataset
    reader and ``finalize`` use it so that their metadata is exactly what :func:`merge` gives.

    Raises:
        InputNotFoundError: ``metas`` is empty.
    """
    if not metas:
        raise InputNotFoundError("no traces to merge")
    order = sorted(range(len(metas)), key=lambda i: _rank_key(metas[i], i))
    first = metas[order[0]]
    meta = TraceMeta(format=first.format)
    declared = {r for m in metas for r in m.ranks}
    seen_ranks: set[int] = set()
    remaps: list[dict[int, int]] = [{} for _ in metas]
    for i in order:
        m = metas[i]
        ranks = list(m.ranks) or [i]
        remap = remaps[i]
        for r in ranks:
            if r in seen_ranks:
                new = max(declared | seen_ranks) + 1
                src = m.sources[0] if m.sources else f"trace {i}"
                meta.warn(f"{src}: rank {r} already seen; renumbered as rank {new}")
                remap[r] = new
                r = new
            seen_ranks.add(r)
        meta.sources.extend(m.sources)
        if len(ranks) == 1:
            meta.stats[f"origin_ns[{remap.get(ranks[0], ranks[0])}]"] = m.origin_ns
        for k, v in m.stats.items():
            if isinstance(v, int):
                meta.stats[k] = meta.stats.get(k, 0) + v
        for w in m.warnings:
            meta.warn(w)
        if not meta.devices:
            meta.devices = m.devices
        meta.world_size = meta.world_size or m.world_size
        meta.versions.update(m.versions)
        meta.synthetic = meta.synthetic or m.synthetic
        if meta.base_time_ns is None:
            meta.base_time_ns = m.base_time_ns
        meta.record_shapes = meta.record_shapes or m.record_shapes
    meta.ranks = sorted(seen_ranks)
    meta.origin_ns = first.origin_ns
    return meta, order, remaps


def renumber(df: pl.DataFrame, remap: dict[int, int], ranks: Sequence[int]) -> pl.DataFrame:
    """Apply a :func:`merge_meta` renumbering to a table's ``rank`` column."""
    if not remap:
        return df
    if len(ranks) <= 1:
        # a one-rank trace: every row gets the new rank (rows without a rank too)
        return df.with_columns(pl.lit(next(iter(remap.values())), dtype=pl.Int32).alias("rank"))
    return df.with_columns(pl.col("rank").replace(remap).cast(pl.Int32))


def merge(traces: list[Trace]) -> Trace:
    """Concatenate per-rank traces into one, ordered by rank (ranks must differ; times stay per-rank).

    The result does not depend on the order of ``traces``: they are sorted by (first rank,
    sources). A rank seen twice is renumbered past the largest rank present (a warning says
    so). Each rank keeps its own time origin (``start_ns`` relative to its first event); the
    per-rank absolute origins are in ``meta.stats['origin_ns[rank]']``; integer stats add up.
    One trace is returned as it is.

    Raises:
        InputNotFoundError: ``traces`` is empty.
    """
    if len(traces) == 1:
        return traces[0]
    meta, order, remaps = merge_meta([t.meta for t in traces])
    ops_frames = [renumber(traces[i].ops, remaps[i], traces[i].meta.ranks) for i in order]
    host_frames = [renumber(traces[i].host, remaps[i], traces[i].meta.ranks) for i in order]
    return Trace(
        ops=pl.concat(ops_frames, how="vertical_relaxed"),
        host=pl.concat(host_frames, how="vertical_relaxed"),
        meta=meta,
    )


__all__ = ["read_trace", "read_one", "resolve_inputs", "detect_format", "merge", "merge_meta"]
