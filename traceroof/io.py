"""``read_trace``: any supported input (file, ``.gz``, directory, ``.tar.gz``) → one Trace.

Formats are sniffed from content, not only the suffix (:func:`detect_format`). A directory
is either a jax profile directory (``plugins/profile/<run>/*.xplane.pb``) or a folder of
per-rank Kineto traces, read in parallel processes and concatenated with a ``rank`` column.
"""

from __future__ import annotations

import gzip
import logging
import multiprocessing
import os
import tarfile
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import polars as pl

from .errors import InputNotFoundError, TraceFormatError
from .trace import Trace, TraceMeta

logger = logging.getLogger(__name__)

KINETO_SUFFIXES = (".json", ".json.gz", ".pt.trace.json", ".pt.trace.json.gz")


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


def read_trace(path: str | os.PathLike[str], *, jobs: int | None = None) -> Trace:
    """Read a trace file, a ``.tar.gz`` of traces, or a directory of them.

    Args:
        path: a Kineto ``.json``/``.json.gz``, an ``.xplane.pb``, a ``.tar.gz`` of per-rank
            Kineto files, a jax profile directory, or a folder of per-rank traces.
        jobs: worker processes for multi-file inputs (default: the core count).

    Raises:
        InputNotFoundError: the path does not exist, or a directory holds no trace.
        TraceFormatError: the content is not a supported trace.
    """
    p = Path(path)
    if not p.exists():
        raise InputNotFoundError(f"{p}: no such file or directory")
    if p.is_dir():
        from .cache import is_cache, read_cache

        if is_cache(p):
            return read_cache(p)
        return _read_dir(p, jobs=jobs)
    fmt = detect_format(p)
    if fmt == "kineto":
        from .parsers import kineto

        return kineto.read(p)
    if fmt == "xplane":
        from .parsers import xplane

        return xplane.read(p)
    return _read_tar(p)


def _read_one(path: str) -> Trace:
    return read_trace(path)


def _read_dir(p: Path, *, jobs: int | None) -> Trace:
    xplanes = sorted(p.rglob("*.xplane.pb"))
    if xplanes:
        from .parsers import xplane

        if hasattr(xplane, "read_dir"):
            return xplane.read_dir(p)
        return merge([xplane.read(x) for x in xplanes])
    files = sorted(
        f for f in p.rglob("*") if f.is_file() and f.name.endswith((".json", ".json.gz"))
    )
    if not files:
        raise InputNotFoundError(f"{p}: directory holds no *.json, *.json.gz or *.xplane.pb trace")
    return merge(_parallel([str(f) for f in files], _read_one, jobs))


def _parallel(items: list[str], fn: Callable[[str], Trace], jobs: int | None) -> list[Trace]:
    jobs = jobs or os.cpu_count() or 1
    if len(items) == 1 or jobs == 1:
        return [fn(i) for i in items]
    # spawn, not fork: forking a process whose polars/Rayon threads hold locks can deadlock
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(jobs, len(items)), mp_context=ctx) as pool:
        return list(pool.map(fn, items))


def _read_tar(p: Path) -> Trace:
    from .parsers import kineto

    traces = []
    try:
        with tarfile.open(p, "r:*") as tf:
            members = [m for m in tf.getmembers() if m.isfile() and m.name.endswith((".json", ".json.gz"))]
            if not members:
                raise TraceFormatError(p, "archive", "a tar holding *.json or *.json.gz Kineto traces")
            for m in sorted(members, key=lambda m: m.name):
                fh = tf.extractfile(m)
                assert fh is not None
                data = fh.read()
                traces.append(kineto.read_bytes(data, path=f"{p}!{m.name}"))
    except tarfile.TarError as exc:
        raise TraceFormatError(p, "archive", f"a readable tar archive ({exc})") from exc
    return merge(traces)


def merge(traces: list[Trace]) -> Trace:
    """Concatenate per-rank traces into one (ranks must differ; times stay per-rank).

    Each rank keeps its own time origin (``start_ns`` relative to its first event); the
    per-rank absolute origins are in ``meta.stats['origin_ns[rank]']``.
    """
    if len(traces) == 1:
        return traces[0]
    if not traces:
        raise InputNotFoundError("no traces to merge")
    meta = TraceMeta(format=traces[0].meta.format)
    seen_ranks: set[int] = set()
    ops_frames, host_frames = [], []
    for i, t in enumerate(traces):
        r = t.meta.ranks[0] if t.meta.ranks else i
        if r in seen_ranks:
            new = max(seen_ranks) + 1
            meta.warn(f"{t.meta.sources[0]}: rank {r} already seen; renumbered as rank {new}")
            t.ops = t.ops.with_columns(pl.lit(new, dtype=pl.Int32).alias("rank"))
            t.host = t.host.with_columns(pl.lit(new, dtype=pl.Int32).alias("rank"))
            r = new
        seen_ranks.add(r)
        ops_frames.append(t.ops)
        host_frames.append(t.host)
        meta.sources.extend(t.meta.sources)
        meta.stats[f"origin_ns[{r}]"] = t.meta.origin_ns
        for k, v in t.meta.stats.items():
            if isinstance(v, int):
                meta.stats[k] = meta.stats.get(k, 0) + v
        for w in t.meta.warnings:
            meta.warn(w)
        if not meta.devices:
            meta.devices = t.meta.devices
        meta.world_size = meta.world_size or t.meta.world_size
        meta.versions.update(t.meta.versions)
        meta.synthetic = meta.synthetic or t.meta.synthetic
        if meta.base_time_ns is None:
            meta.base_time_ns = t.meta.base_time_ns
        meta.record_shapes = meta.record_shapes or t.meta.record_shapes
    meta.ranks = sorted(seen_ranks)
    meta.origin_ns = traces[0].meta.origin_ns
    return Trace(
        ops=pl.concat(ops_frames, how="vertical_relaxed"),
        host=pl.concat(host_frames, how="vertical_relaxed"),
        meta=meta,
    )


__all__ = ["read_trace", "detect_format", "merge"]
