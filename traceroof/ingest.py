"""Writing the columnar cache (:mod:`traceroof.cache` describes the layouts and reads them back).

``write_cache`` writes one parsed trace as a single cache; ``ingest_file`` writes one input
file into a dataset (independent workers, no coordination), ``ingest_files`` ingests many in
worker processes, and ``finalize`` writes a dataset's manifest. Above the reader
(:mod:`traceroof.cache`) and the input door (:mod:`traceroof.io`): it reads with the one and
writes what the other reads.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from .cache import (
    CACHE_FORMAT,
    CACHE_VERSION,
    COST_PREFIX,
    DATASET_VERSION,
    FRAGMENT_FORMAT,
    FRAGMENT_VERSION,
    FRAGMENTS_DIR,
    META_FILE,
    ROW_COLUMN,
    TABLES,
    fragment_files,
    is_cache,
    load_fragment,
    meta_from_json,
    part_crc32,
)
from .errors import InputNotFoundError, TraceFormatError, UsageError
from .io import read_one, resolve_inputs, worker_errors
from .merge import event_count, merge_meta
from .parallel import input_size, run_parallel
from .trace import Trace, TraceMeta

if TYPE_CHECKING:
    from .progress import Progress


def _partition_name(rank: Any) -> str:
    return "rank=__null__" if rank is None else f"rank={int(rank)}"


def _write_parquet(df: pl.DataFrame, f: Path) -> None:
    """Write atomically (a temporary name, then a rename): a reader never sees half a part."""
    f.parent.mkdir(parents=True, exist_ok=True)
    tmp = f.with_name(f".{f.name}.{os.getpid()}.tmp")
    df.write_parquet(tmp, statistics=True)
    tmp.replace(f)


def _write_table(df: pl.DataFrame, root: Path, *, part: str = "part", empty_rank: Any = "empty") -> list[str]:
    """Write ``df`` under ``root`` partitioned by rank; returns the files, relative to ``root.parent``.

    ``part`` names each partition's file (``<part>.parquet``); a table with no rows is
    written as one zero-row file (``root/empty.parquet``, or in ``rank=<empty_rank>/``
    when ``empty_rank`` is a rank or None) so that its schema is kept.
    """
    root.mkdir(parents=True, exist_ok=True)
    if df.height == 0:
        if empty_rank == "empty":
            f = root / "empty.parquet"
        else:
            f = root / _partition_name(empty_rank) / f"{part}.parquet"
        _write_parquet(df.with_columns(pl.lit(None, dtype=pl.Int64).alias(ROW_COLUMN)).head(0), f)
        return [str(f.relative_to(root.parent))]
    indexed = df.with_row_index(ROW_COLUMN).with_columns(pl.col(ROW_COLUMN).cast(pl.Int64))
    files = []
    for chunk in indexed.partition_by("rank", maintain_order=True, include_key=True):
        f = root / _partition_name(chunk["rank"][0]) / f"{part}.parquet"
        _write_parquet(chunk, f)
        files.append(str(f.relative_to(root.parent)))
    return files


def _meta_to_json(meta: TraceMeta) -> dict[str, Any]:
    return dataclasses.asdict(meta)


def _with_costs(trace: Trace) -> tuple[pl.DataFrame, dict[str, Any]]:
    """The op table to store (with its costs as ``__cost_*`` columns) and the ``costs`` entry
    of the manifest or fragment (the cost model's identifier and the coverage)."""
    from .costing import COST_COLUMNS, apply_costs, cost_model_id

    costed, coverage = apply_costs(trace)
    ops = trace.ops.with_columns(costed.select(pl.col(c).alias(COST_PREFIX + c) for c in COST_COLUMNS))
    return ops, {"model_id": cost_model_id(), "coverage": coverage.to_json()}


def _write_json(doc: dict[str, Any], f: Path) -> None:
    f.parent.mkdir(parents=True, exist_ok=True)
    tmp = f.with_name(f".{f.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=1, allow_nan=True) + "\n")
    tmp.replace(f)


def _prepare_out(out: Path) -> None:
    """``out`` new, empty or an earlier cache (whose files are removed); else UsageError."""
    if out.exists():
        if not out.is_dir():
            raise UsageError(f"{out}: exists and is not a directory")
        if any(out.iterdir()) and not is_cache(out):
            raise UsageError(f"{out}: not empty and not a traceroof cache; refusing to overwrite")
        (out / META_FILE).unlink(missing_ok=True)
        for name in (*TABLES, FRAGMENTS_DIR):
            if (out / name).exists():
                shutil.rmtree(out / name)
    out.mkdir(parents=True, exist_ok=True)


def write_cache(trace: Trace, out_dir: str | os.PathLike[str], *,
                source_paths: list[str] | None = None) -> Path:
    """Write ``trace`` as a single cache directory (``cache_version`` 1); returns the directory.

    ``out_dir`` must not exist, be empty, or be an earlier cache of either layout (which is
    replaced).

    Raises:
        UsageError: ``out_dir`` is a file, or a non-empty directory that is not a cache.
    """
    out = Path(out_dir)
    _prepare_out(out)
    files: dict[str, list[str]] = {}
    rows: dict[str, int] = {}
    ops, costs = _with_costs(trace)
    for name, df in (("ops", ops), ("host", trace.host)):
        files[name] = _write_table(df, out / name)
        rows[name] = df.height
    del ops
    doc = {
        "format": CACHE_FORMAT,
        "cache_version": CACHE_VERSION,
        "source_paths": list(source_paths if source_paths is not None else trace.meta.sources),
        "tables": {name: {"rows": rows[name], "files": files[name],
                          "crc32": [part_crc32(out / f) for f in files[name]]} for name in TABLES},
        "meta": _meta_to_json(trace.meta),
        "costs": costs,
    }
    _write_json(doc, out / META_FILE)
    return out


_SUFFIXES = (".pt.trace.json.gz", ".pt.trace.json", ".json.gz", ".json", ".xplane.pb.gz", ".xplane.pb",
             ".tar.gz", ".tgz")


def fragment_key(trace_path: str | os.PathLike[str]) -> str:
    """The name of an input's files in a dataset: its stem and a hash of its absolute path.

    Two inputs with the same file name in different folders get different keys; the same
    input always gets the same key (re-ingesting it replaces its files).
    """
    s = os.fspath(trace_path)
    name = Path(s).name
    for suf in _SUFFIXES:
        if name.endswith(suf) and len(name) > len(suf):
            name = name[: -len(suf)]
            break
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._")[:80] or "trace"
    digest = hashlib.sha1(os.path.abspath(s).encode()).hexdigest()[:10]
    return f"{stem}-{digest}"


def _check_dataset_dir(out: Path) -> None:
    """Refuse a single cache or a file; drop a finalized manifest that a new fragment makes stale."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out}: exists and is not a directory")
    manifest = out / META_FILE
    if manifest.is_file():
        try:
            doc = json.loads(manifest.read_text())
        except (OSError, UnicodeDecodeError, ValueError):
            doc = None
        if isinstance(doc, dict) and doc.get("cache_version") == DATASET_VERSION:
            manifest.unlink(missing_ok=True)  # stale now; finalize() writes it again
        else:
            raise UsageError(
                f"{out}: holds a single-trace cache ({META_FILE} of cache_version "
                f"{doc.get('cache_version') if isinstance(doc, dict) else '?'}); "
                "ingest into a new directory or a dataset"
            )


def _ingest(trace_path: str | os.PathLike[str], out_dir: str | os.PathLike[str]) -> tuple[list[Path], int]:
    src = str(Path(os.fspath(trace_path)))
    out = Path(out_dir)
    _check_dataset_dir(out)
    trace = read_one(src)
    key = fragment_key(src)
    first_rank = trace.meta.ranks[0] if trace.meta.ranks else None
    tables = {}
    ops, costs = _with_costs(trace)
    for name, df in (("ops", ops), ("host", trace.host)):
        files = _write_table(df, out / name, part=f"part-{key}", empty_rank=first_rank)
        tables[name] = {"rows": df.height, "files": files, "crc32": [part_crc32(out / f) for f in files]}
    del ops
    doc = {
        "format": FRAGMENT_FORMAT,
        "fragment_version": FRAGMENT_VERSION,
        "source": src,
        "key": key,
        "tables": tables,
        "meta": _meta_to_json(trace.meta),
        "costs": costs,
    }
    frag = out / FRAGMENTS_DIR / f"{key}.json"
    _write_json(doc, frag)  # last: the fragment is what makes the parts part of the dataset
    written = [out / f for name in TABLES for f in tables[name]["files"]] + [frag]
    return written, event_count(trace)


def ingest_file(trace_path: str | os.PathLike[str], out_dir: str | os.PathLike[str]) -> list[Path]:
    """Parse one input (a per-rank trace file) and write it into the dataset ``out_dir``.

    Writes ``ops/rank=N/part-<key>.parquet`` and ``host/rank=N/part-<key>.parquet`` for each
    rank N the file holds (a zero-row part for an empty table), then the fragment
    ``meta/<key>.json`` (see :func:`fragment_key`). Needs no coordination: any number of
    workers, processes or machines sharing ``out_dir`` may call it at once, for different
    files. Calling it again for the same file replaces that file's parts. A finalized
    manifest (``meta.json``, cache_version 2) already in ``out_dir`` is removed, since it no
    longer lists every fragment: run :func:`finalize` again once all workers are done.

    Returns the files written (absolute when ``out_dir`` is), the fragment last.

    Raises:
        InputNotFoundError: ``trace_path`` does not exist.
        TraceFormatError: it is not a supported trace or cannot be read (names the file).
        UsageError: ``out_dir`` is a file or a single-trace cache (cache_version 1).
    """
    return _ingest(trace_path, out_dir)[0]


def _ingest_worker(trace_path: str, out_dir: str) -> int:
    """``ingest_file`` in a worker process: returns the file's event count, for progress."""
    with worker_errors(trace_path):
        return _ingest(trace_path, out_dir)[1]


def ingest_files(paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
                 out_dir: str | os.PathLike[str], *, jobs: int | None = None,
                 progress: Progress | None = None, source_paths: list[str] | None = None) -> Path:
    """Ingest many per-rank inputs into a new dataset ``out_dir`` in ``jobs`` processes, then
    :func:`finalize` it. Each worker writes its own file's parts; nothing is merged in memory.

    Args:
        paths: what :func:`traceroof.io.read_trace` takes (files, folders, globs, a list).
        out_dir: new, empty, or an earlier cache (replaced).
        jobs: worker processes (default: the core count).
        progress: reports files, bytes and events; None prints nothing.
        source_paths: recorded in the manifest (default: the inputs' paths).

    Raises:
        InputNotFoundError, TraceFormatError: as :func:`traceroof.io.read_trace` (the first
            file that fails is named; the dataset is left unfinalized).
        UsageError: ``out_dir`` is a file or a non-empty directory that is not a cache.
    """
    units = resolve_inputs(paths)
    out = Path(out_dir)
    _prepare_out(out)
    sizes = [input_size(u) for u in units]
    if progress is not None:
        progress.start(files=len(units), bytes=sum(sizes))
    ok = False
    try:
        run_parallel(functools.partial(_ingest_worker, out_dir=str(out)), units, jobs=jobs,
                     progress=progress, sizes=sizes, events_of=int)
        ok = True
    finally:
        if progress is not None:
            progress.close(ok=ok)
    return finalize(out, source_paths=source_paths)


def finalize(out_dir: str | os.PathLike[str], *, source_paths: list[str] | None = None) -> Path:
    """Check a dataset written by :func:`ingest_file` and write its manifest ``meta.json``.

    The manifest (``cache_version`` 2) lists the fragments, each table's row count and files,
    and the merged :class:`TraceMeta` (merged by :func:`traceroof.merge.merge_meta`, exactly as
    reading the dataset merges it). Only metadata is read: every listed part must exist, but
    the tables are not loaded. A dataset also reads without it; with it, a fragment that went
    missing is an error instead of a silently absent rank. Run it once all workers are done.

    Raises:
        InputNotFoundError: ``out_dir`` holds no fragment.
        TraceFormatError: a damaged fragment, or a part it lists is missing (names the file).
    """
    p = Path(out_dir)
    frags = fragment_files(p)
    if not frags:
        raise InputNotFoundError(f"{p}: no dataset fragments ({FRAGMENTS_DIR}/*.json): nothing was ingested")
    docs = [load_fragment(f) for f in frags]
    metas = [meta_from_json(f, d["meta"]) for f, d in zip(frags, docs)]
    merged, order, _ = merge_meta(metas)
    tables: dict[str, dict[str, Any]] = {name: {"rows": 0, "files": [], "crc32": []} for name in TABLES}
    for i in order:
        for name in TABLES:
            entry = docs[i]["tables"].get(name)
            if not isinstance(entry, dict) or not isinstance(entry.get("files"), list):
                raise TraceFormatError(frags[i], f"tables.{name}", "a list of Parquet files")
            for rel in entry["files"]:
                if not (p / rel).is_file():
                    raise TraceFormatError(p / rel, "file", f"a Parquet part listed in {frags[i]}, found nothing")
            tables[name]["rows"] += int(entry.get("rows") or 0)
            tables[name]["files"].extend(entry["files"])
            crcs = entry.get("crc32")  # a fragment written before CRCs: the table is listed without them
            ok = isinstance(crcs, list) and len(crcs) == len(entry["files"]) and tables[name]["crc32"] is not None
            tables[name]["crc32"] = tables[name]["crc32"] + crcs if ok else None
    doc = {
        "format": CACHE_FORMAT,
        "cache_version": DATASET_VERSION,
        "layout": "dataset",
        "source_paths": list(source_paths if source_paths is not None else merged.sources),
        "fragments": [str(frags[i].relative_to(p)) for i in order],
        "tables": tables,
        "meta": _meta_to_json(merged),
    }
    _write_json(doc, p / META_FILE)
    return p


__all__ = ["write_cache", "ingest_file", "ingest_files", "finalize", "fragment_key"]

