"""The columnar cache: a parsed :class:`Trace` as Parquet, partitioned by rank, plus its metadata.

Layout of a cache directory (``traceroof ingest TRACE -o DIR``)::

    DIR/meta.json                       # {"format": "traceroof-cache", "cache_version": 1, ...}
    DIR/ops/rank=0/part.parquet         # the op table rows of rank 0
    DIR/host/rank=0/part.parquet        # the host table rows of rank 0
    DIR/ops/empty.parquet               # only when the table has no rows (keeps the schema)

Each part holds every column (``rank`` included) plus ``__row``, the row's position in the
original table, so :func:`read_cache` restores the exact row order and dtypes: the round
trip is exact on every column and on the metadata. ``meta.json`` is written last; a
directory without it is not a cache.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Any

import polars as pl

from .errors import TraceFormatError, UsageError
from .schema import HOST_SCHEMA, OP_SCHEMA
from .trace import DeviceInfo, Trace, TraceMeta

CACHE_FORMAT = "traceroof-cache"
CACHE_VERSION = 1
META_FILE = "meta.json"
_ROW = "__row"
_TABLES = {"ops": OP_SCHEMA, "host": HOST_SCHEMA}


def is_cache(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` is a directory with a ``meta.json`` (a traceroof cache, or a damaged one).

    A damaged ``meta.json`` still counts, so that reading it fails with a clear error instead
    of being mistaken for a folder of Kineto traces.
    """
    p = Path(path)
    meta = p / META_FILE
    if not (p.is_dir() and meta.is_file()):
        return False
    if (p / "ops").is_dir() or (p / "host").is_dir():
        return True
    try:
        with open(meta, "rb") as fh:
            return CACHE_FORMAT.encode() in fh.read(4096)
    except OSError:
        return False


def _partition_name(rank: Any) -> str:
    return "rank=__null__" if rank is None else f"rank={int(rank)}"


def _write_table(df: pl.DataFrame, root: Path) -> list[str]:
    root.mkdir(parents=True, exist_ok=True)
    if df.height == 0:
        f = root / "empty.parquet"
        df.with_columns(pl.lit(None, dtype=pl.Int64).alias(_ROW)).head(0).write_parquet(f)
        return [str(f.relative_to(root.parent))]
    indexed = df.with_row_index(_ROW).with_columns(pl.col(_ROW).cast(pl.Int64))
    files = []
    for part in indexed.partition_by("rank", maintain_order=True, include_key=True):
        d = root / _partition_name(part["rank"][0])
        d.mkdir(parents=True, exist_ok=True)
        f = d / "part.parquet"
        part.write_parquet(f, statistics=True)
        files.append(str(f.relative_to(root.parent)))
    return files


def _meta_to_json(meta: TraceMeta) -> dict[str, Any]:
    return dataclasses.asdict(meta)


def write_cache(trace: Trace, out_dir: str | os.PathLike[str], *,
                source_paths: list[str] | None = None) -> Path:
    """Write ``trace`` as a cache directory; returns the directory.

    ``out_dir`` must not exist, be empty, or be an earlier cache (which is replaced).

    Raises:
        UsageError: ``out_dir`` is a file, or a non-empty directory that is not a cache.
    """
    out = Path(out_dir)
    if out.exists():
        if not out.is_dir():
            raise UsageError(f"{out}: exists and is not a directory")
        if any(out.iterdir()) and not is_cache(out):
            raise UsageError(f"{out}: not empty and not a traceroof cache; refusing to overwrite")
        (out / META_FILE).unlink(missing_ok=True)
        for name in _TABLES:
            if (out / name).exists():
                shutil.rmtree(out / name)
    out.mkdir(parents=True, exist_ok=True)
    files: dict[str, list[str]] = {}
    rows: dict[str, int] = {}
    for name in _TABLES:
        df: pl.DataFrame = getattr(trace, name)
        files[name] = _write_table(df, out / name)
        rows[name] = df.height
    doc = {
        "format": CACHE_FORMAT,
        "cache_version": CACHE_VERSION,
        "source_paths": list(source_paths if source_paths is not None else trace.meta.sources),
        "tables": {name: {"rows": rows[name], "files": files[name]} for name in _TABLES},
        "meta": _meta_to_json(trace.meta),
    }
    tmp = out / (META_FILE + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, allow_nan=True) + "\n")
    tmp.replace(out / META_FILE)
    return out


def _load_meta(p: Path) -> dict[str, Any]:
    f = p / META_FILE
    try:
        doc = json.loads(f.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise TraceFormatError(f, "meta.json", f"a readable traceroof cache manifest ({type(exc).__name__}: {exc})") from exc
    if not isinstance(doc, dict) or doc.get("format") != CACHE_FORMAT:
        raise TraceFormatError(f, "meta.json", f'a traceroof cache manifest ("format": "{CACHE_FORMAT}")')
    version = doc.get("cache_version")
    if version != CACHE_VERSION:
        raise TraceFormatError(
            f, "cache_version", f"cache version {CACHE_VERSION}, found {version!r}; re-run `traceroof ingest`"
        )
    if not isinstance(doc.get("meta"), dict) or not isinstance(doc.get("tables"), dict):
        raise TraceFormatError(f, "meta.json", "a cache manifest with 'meta' and 'tables'")
    return doc


def _meta_from_json(f: Path, d: dict[str, Any]) -> TraceMeta:
    try:
        d = dict(d)
        devices = [DeviceInfo(**x) for x in d.pop("devices", [])]
        return TraceMeta(devices=devices, **d)
    except TypeError as exc:
        raise TraceFormatError(f, "meta", f"TraceMeta fields ({exc})") from exc


def _read_table(p: Path, name: str, entry: Any) -> pl.DataFrame:
    schema = _TABLES[name]
    if not isinstance(entry, dict) or not isinstance(entry.get("files"), list):
        raise TraceFormatError(p / META_FILE, f"tables.{name}", "a list of Parquet files")
    frames = []
    for rel in entry["files"]:
        f = p / rel
        if not f.is_file():
            raise TraceFormatError(f, "file", f"a Parquet part listed in {p / META_FILE}, found nothing")
        try:
            frames.append(pl.read_parquet(f))
        except Exception as exc:  # noqa: BLE001 - polars raises several types for damaged files
            raise TraceFormatError(f, "parquet", f"a readable Parquet file ({type(exc).__name__})") from exc
    if not frames:
        raise TraceFormatError(p / META_FILE, f"tables.{name}", "at least one Parquet file")
    try:
        df = pl.concat(frames, how="vertical_relaxed") if len(frames) > 1 else frames[0]
        df = df.sort(_ROW).drop(_ROW)
        # dtypes as declared (Parquet stores the kind Enum as a dictionary column)
        df = df.with_columns(pl.col(c).cast(t) for c, t in schema.items() if c in df.columns)
    except Exception as exc:  # noqa: BLE001
        raise TraceFormatError(p / name, "parquet", f"the {name} table columns ({type(exc).__name__}: {exc})") from exc
    if df.height != entry.get("rows"):
        raise TraceFormatError(p / name, "rows", f"{entry.get('rows')} rows as meta.json says, found {df.height}")
    return df


def read_cache(path: str | os.PathLike[str]) -> Trace:
    """Read a cache directory written by :func:`write_cache` back into the same :class:`Trace`.

    Raises:
        TraceFormatError: a missing or damaged ``meta.json`` or Parquet part, or a cache of
            another ``cache_version``; the message names the file.
    """
    p = Path(path)
    doc = _load_meta(p)
    tables = doc["tables"]
    ops = _read_table(p, "ops", tables.get("ops"))
    host = _read_table(p, "host", tables.get("host"))
    meta = _meta_from_json(p / META_FILE, doc["meta"])
    return Trace(ops=ops, host=host, meta=meta)


__all__ = ["write_cache", "read_cache", "is_cache", "CACHE_VERSION"]
