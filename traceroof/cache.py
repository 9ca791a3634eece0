"""The columnar cache: a parsed :class:`Trace` as Parquet, partitioned by rank, plus its metadata.

Two layouts, both read by :func:`read_cache` (and so by ``read_trace`` / ``traceroof analyze DIR``,
through the format registry's ``cache`` entry, :mod:`traceroof.parsers.cache_dir`). This module
is the reader; the writer, :mod:`traceroof.ingest`, sits above it and above :mod:`traceroof.io`.

**Single cache** (``cache_version`` 1; :func:`~traceroof.ingest.write_cache`, ``traceroof ingest TRACE -o DIR``)::

    DIR/meta.json                       # {"format": "traceroof-cache", "cache_version": 1, ...}
    DIR/ops/rank=0/part.parquet         # the op table rows of rank 0
    DIR/host/rank=0/part.parquet        # the host table rows of rank 0
    DIR/ops/empty.parquet               # only when the table has no rows (keeps the schema)

**Dataset** (:func:`~traceroof.ingest.ingest_file` once per per-rank file, by independent workers, then
optionally :func:`~traceroof.ingest.finalize`; ``traceroof ingest A B ... -o DIR``)::

    DIR/ops/rank=N/part-<key>.parquet   # the op rows of one input file's rank N
    DIR/host/rank=N/part-<key>.parquet
    DIR/meta/<key>.json                 # that file's fragment: source, parts, row counts, TraceMeta
    DIR/meta.json                       # written by finalize (cache_version 2): lists the fragments

``<key>`` is the input's stem plus a hash of its absolute path, so workers never write the
same file and re-ingesting a file replaces its own parts. A fragment is written last (and
atomically): a part without a fragment is ignored. Reading a dataset reads each fragment's
parts and merges them with :func:`traceroof.merge.merge`, so the result is exactly what
``read_trace`` of the same files gives.

Each part holds every column (``rank`` included) plus ``__row``, the row's position in the
original table, so the exact row order and dtypes are restored: the round trip is exact on
every column and on the metadata.

The op parts also hold the op's costs (``__cost_kind``, ``__cost_dtype``, ``__cost_flops``,
``__cost_bytes``, ``__cost_cost_source``, ``__cost_comm_bytes``, ``__cost_group_size``:
:data:`traceroof.costing.COST_COLUMNS` as
:func:`traceroof.costing.apply_costs` fills them), and the manifest or fragment a ``costs``
entry (the cost model's identifier and the :class:`~traceroof.costing.Coverage`). They are
chip-independent, so they are computed once at ingest; the trace read back carries them in
``Trace.stored_costs`` (its op table is the parsed one, unchanged), and the analysis uses them
when the cost model is still the same.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import types
import typing
import zlib
from pathlib import Path
from typing import Any

import polars as pl

from .duplicates import find_copies
from .errors import InputNotFoundError, TraceFormatError
from .merge import merge
from .schema import HOST_SCHEMA, OP_SCHEMA
from .trace import DeviceInfo, StoredCosts, Trace, TraceMeta

CACHE_FORMAT = "traceroof-cache"
CACHE_VERSION = 1  #: the single-cache layout written by write_cache
DATASET_VERSION = 2  #: the finalized dataset manifest written by finalize
READABLE_VERSIONS = (CACHE_VERSION, DATASET_VERSION)
META_FILE = "meta.json"
FRAGMENTS_DIR = "meta"
FRAGMENT_FORMAT = "traceroof-fragment"
FRAGMENT_VERSION = 1
ROW_COLUMN = "__row"
COST_PREFIX = "__cost_"  #: prefix of the stored cost columns in the op parts
TABLES = {"ops": OP_SCHEMA, "host": HOST_SCHEMA}


def fragment_files(p: Path) -> list[Path]:
    """The dataset fragments of ``p`` (``meta/*.json``; temporary files ignored), sorted."""
    d = p / FRAGMENTS_DIR
    if not d.is_dir():
        return []
    return sorted(f for f in d.glob("*.json") if f.is_file())


def is_cache(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` is a cache directory: a single cache or a dataset (finalized or not).

    A damaged ``meta.json`` still counts, so that reading it fails with a clear error instead
    of being mistaken for a folder of Kineto traces; so does a ``meta/`` folder of fragments.
    """
    p = Path(path)
    if not p.is_dir():
        return False
    meta = p / META_FILE
    if meta.is_file():
        if (p / "ops").is_dir() or (p / "host").is_dir():
            return True
        try:
            with open(meta, "rb") as fh:
                return CACHE_FORMAT.encode() in fh.read(4096)
        except OSError:
            return False
    for f in fragment_files(p)[:1]:
        try:
            with open(f, "rb") as fh:
                return FRAGMENT_FORMAT.encode() in fh.read(4096)
        except OSError:
            return True  # unreadable, but where a fragment belongs: reading it says why
    return False


def _read_doc(f: Path, where: str, what: str, fmt: str) -> dict[str, Any]:
    """The JSON object in ``f`` whose ``"format"`` is ``fmt``.

    Raises:
        TraceFormatError: unreadable, not JSON, not an object or another format; ``where``
            and ``what`` (``"a readable " + what``) name the place and the expectation.
    """
    try:
        doc = json.loads(f.read_text())
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:  # RecursionError: nested too deep
        raise TraceFormatError(f, where, f"a readable {what} ({type(exc).__name__}: {exc})") from exc
    if not isinstance(doc, dict) or doc.get("format") != fmt:
        raise TraceFormatError(f, where, f'a {what} ("format": "{fmt}")')
    return doc


def load_fragment(f: Path) -> dict[str, Any]:
    """The dataset fragment ``f`` (its JSON object).

    Raises:
        TraceFormatError: unreadable, not a fragment, of another ``fragment_version``, or
            without ``meta`` and ``tables`` (names the file).
    """
    doc = _read_doc(f, "fragment", "dataset fragment", FRAGMENT_FORMAT)
    if doc.get("fragment_version") != FRAGMENT_VERSION:
        raise TraceFormatError(
            f, "fragment_version",
            f"fragment version {FRAGMENT_VERSION}, found {doc.get('fragment_version')!r}; re-ingest the file",
        )
    if not isinstance(doc.get("meta"), dict) or not isinstance(doc.get("tables"), dict):
        raise TraceFormatError(f, "fragment", "a fragment with 'meta' and 'tables'")
    return doc


def _load_meta(p: Path) -> dict[str, Any]:
    f = p / META_FILE
    doc = _read_doc(f, "meta.json", "traceroof cache manifest", CACHE_FORMAT)
    version = doc.get("cache_version")
    if version not in READABLE_VERSIONS:
        raise TraceFormatError(
            f, "cache_version",
            f"cache version {' or '.join(map(str, READABLE_VERSIONS))}, found {version!r}; re-run `traceroof ingest`",
        )
    if not isinstance(doc.get("meta"), dict) or not isinstance(doc.get("tables"), dict):
        raise TraceFormatError(f, "meta.json", "a cache manifest with 'meta' and 'tables'")
    if version == DATASET_VERSION and not isinstance(doc.get("fragments"), list):
        raise TraceFormatError(f, "meta.json", "a dataset manifest with 'fragments'")
    return doc


def meta_from_json(f: Path, d: dict[str, Any]) -> TraceMeta:
    """The :class:`TraceMeta` stored as ``d`` (a ``dataclasses.asdict`` of one) in file ``f``.

    Raises:
        TraceFormatError: fields that are not TraceMeta fields (names the file).
    """
    bad = _field_problem(TraceMeta, d) or next(
        (p for x in (d.get("devices") if isinstance(d.get("devices"), list) else [])
         if isinstance(x, dict) for p in [_field_problem(DeviceInfo, x)] if p), None)
    if bad:
        raise TraceFormatError(f, "meta", f"TraceMeta fields of their types ({bad})")
    try:
        d = dict(d)
        devices = [DeviceInfo(**x) for x in d.pop("devices", [])]
        # JSON object keys are strings: the rank labels' ranks come back as ints
        labels = {int(k): str(v) for k, v in (d.pop("rank_labels", None) or {}).items()}
        return TraceMeta(devices=devices, rank_labels=labels, **d)
    except (TypeError, ValueError, AttributeError) as exc:  # a field of the wrong shape
        raise TraceFormatError(f, "meta", f"TraceMeta fields ({type(exc).__name__}: {exc})") from exc


def _json_fits(v: Any, hint: Any) -> bool:
    """``v`` (read from JSON) has the type ``hint`` (str, int, float, bool, None unions,
    ``list[X]``, ``dict[K, V]`` whose keys came back as text); a dataclass or Any: any dict /
    anything."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_json_fits(v, a) for a in args)
    if hint is type(None):
        return v is None
    if hint is bool:
        return isinstance(v, bool)
    if hint is int:
        return isinstance(v, int) and not isinstance(v, bool)
    if hint is float:
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if hint is str:
        return isinstance(v, str)
    if origin is list:
        return isinstance(v, list) and all(_json_fits(x, args[0]) for x in v) if args else isinstance(v, list)
    if origin is dict:
        return isinstance(v, dict) and (not args or all(_json_fits(x, args[1]) for x in v.values()))
    if dataclasses.is_dataclass(hint):
        return isinstance(v, dict)
    return True  # Any


def _field_problem(cls: type, d: dict[str, Any]) -> str | None:
    """The first field of dataclass ``cls`` whose value in ``d`` is not of its type."""
    hints = typing.get_type_hints(cls)
    for k, v in d.items():
        if k in hints and not _json_fits(v, hints[k]):
            return f"{cls.__name__}.{k} is {type(v).__name__} {v!r:.40}, expected {hints[k]}"
    return None


def part_crc32(f: Path) -> int:
    """The CRC-32 (``zlib.crc32``, ~0.4 s per GB) of a Parquet part's bytes, as the manifest
    lists it (``tables.<name>.crc32``, one per file)."""
    return zlib.crc32(f.read_bytes())


def _crcs(entry: dict[str, Any], manifest: Path, name: str) -> list[int] | None:
    """The manifest's CRC-32 of each part, None for a cache written before they were listed."""
    crcs = entry.get("crc32")
    if crcs is None:
        return None
    if not (isinstance(crcs, list) and len(crcs) == len(entry["files"])
            and all(isinstance(c, int) and not isinstance(c, bool) for c in crcs)):
        raise TraceFormatError(manifest, f"tables.{name}.crc32", "one CRC-32 (an integer) per Parquet file")
    return crcs


def _read_table(p: Path, name: str, entry: Any, manifest: Path | None = None) -> pl.DataFrame:
    """Read one table's parts (paths relative to ``p``), restore the row order and dtypes.
    A part whose bytes do not have the CRC-32 the manifest lists is a damaged part (polars
    aborts the process on some damaged pages rather than raising)."""
    schema = TABLES[name]
    manifest = manifest or p / META_FILE
    if not isinstance(entry, dict) or not isinstance(entry.get("files"), list):
        raise TraceFormatError(manifest, f"tables.{name}", "a list of Parquet files")
    crcs = _crcs(entry, manifest, name)
    frames = []
    for i, rel in enumerate(entry["files"]):
        if not isinstance(rel, str):
            raise TraceFormatError(manifest, f"tables.{name}.files", f"paths of Parquet files, found {rel!r}")
        f = p / rel
        if not f.is_file():
            raise TraceFormatError(f, "file", f"a Parquet part listed in {manifest}, found nothing")
        data = f.read_bytes()
        if crcs is not None and zlib.crc32(data) != crcs[i]:
            raise TraceFormatError(f, "crc32", f"the bytes {manifest.name} lists (CRC-32 {crcs[i]:#010x}, "
                                   f"found {zlib.crc32(data):#010x}): the part is damaged")
        try:
            frames.append(pl.read_parquet(io.BytesIO(data)))
        except (Exception, pl.exceptions.PanicException) as exc:  # noqa: BLE001 - polars raises several types (a
            # panic, a BaseException, among them) for damaged files
            raise TraceFormatError(f, "parquet", f"a readable Parquet file ({type(exc).__name__})") from exc
    if not frames:
        raise TraceFormatError(manifest, f"tables.{name}", "at least one Parquet file")
    try:
        df = pl.concat(frames, how="vertical_relaxed") if len(frames) > 1 else frames[0]
        # parts are written in row order: sort (a copy of every column) only when they are not
        if df.height and not df.select((pl.col(ROW_COLUMN).diff().fill_null(1) > 0).all()).item():
            df = df.sort(ROW_COLUMN)
        df = df.drop(ROW_COLUMN)
        # dtypes as declared (Parquet stores the kind Enum as a dictionary column)
        df = df.with_columns(pl.col(c).cast(t) for c, t in schema.items() if c in df.columns)
    except Exception as exc:  # noqa: BLE001
        raise TraceFormatError(p / name, "parquet", f"the {name} table columns ({type(exc).__name__}: {exc})") from exc
    if df.height != entry.get("rows"):
        raise TraceFormatError(manifest if manifest != p / META_FILE else p / name, "rows",
                               f"{entry.get('rows')} rows as {manifest.name} says, found {df.height}")
    return df


def _split_costs(trace: Trace, entries: list[Any], where: Path) -> Trace:
    """Move the stored ``__cost_*`` columns of ``trace.ops`` into ``trace.stored_costs``.

    ``entries`` are the ``costs`` entries of the manifest or of every fragment merged; the
    costs are kept only when every one of them is there under one cost model (their
    coverages add up). The op table left is exactly the parsed one.

    Raises:
        TraceFormatError: a ``costs`` entry that is not a cost model id and a coverage.
    """
    from .costing import COST_COLUMNS, Coverage

    stored = [c for c in trace.ops.columns if c.startswith(COST_PREFIX)]
    if not stored:
        return trace
    columns = trace.ops.select(pl.col(COST_PREFIX + c).alias(c).cast(OP_SCHEMA[c]) for c in COST_COLUMNS)
    trace.ops = trace.ops.drop(stored)
    if not entries or any(not isinstance(e, dict) for e in entries):
        return trace
    bad = next((e.get("model_id") for e in entries if not isinstance(e.get("model_id"), (str, type(None)))), None)
    if bad is not None:
        raise TraceFormatError(where, "costs.model_id", f"a cost model id (text), found {bad!r:.60}")
    models = {e.get("model_id") for e in entries}
    if len(models) != 1:
        return trace
    try:
        coverage = Coverage.merge([Coverage.from_json(e["coverage"]) for e in entries])
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:  # OverflowError: int(inf)
        raise TraceFormatError(where, "costs", f"a cost model id and a coverage ({type(exc).__name__}: {exc})") from exc
    trace.stored_costs = StoredCosts(model_id=str(models.pop()), columns=columns, coverage=coverage.to_json())
    return trace


def _read_dataset(p: Path, frags: list[Path]) -> Trace:
    traces = []
    costs = []
    for f in frags:
        doc = load_fragment(f)
        tables = doc["tables"]
        ops = _read_table(p, "ops", tables.get("ops"), manifest=f)
        host = _read_table(p, "host", tables.get("host"), manifest=f)
        traces.append(Trace(ops=ops, host=host, meta=meta_from_json(f, doc["meta"])))
        costs.append(doc.get("costs"))
    if not all(any(c.startswith(COST_PREFIX) for c in t.ops.columns) for t in traces):
        # fragments written without costs (an older traceroof): none are used
        for t in traces:
            t.ops = t.ops.select(pl.exclude(f"^{COST_PREFIX}.*$"))
    # the copies read_trace leaves out of these inputs, left out here too (same result)
    copies = find_copies(traces)
    trace = merge(copies.keep(traces))
    copies.note(trace.meta)
    return _split_costs(trace, copies.keep(costs), p)


def read_cache(path: str | os.PathLike[str]) -> Trace:
    """Read a cache directory back into the :class:`Trace` it was written from.

    A single cache (:func:`~traceroof.ingest.write_cache`, cache_version 1) gives the written trace; a dataset
    (:func:`~traceroof.ingest.ingest_file`, finalized or not) gives exactly what
    ``traceroof.io.read_trace(<its input files>)`` gives: same rows, order, dtypes, metadata.

    Raises:
        TraceFormatError: a missing or damaged ``meta.json``, fragment or Parquet part, a
            finalized dataset whose fragments differ from its manifest, or a cache of
            another ``cache_version``; the message names the file.
        InputNotFoundError: ``path`` holds neither a ``meta.json`` nor fragments.
    """
    p = Path(path)
    if not (p / META_FILE).is_file():
        frags = fragment_files(p)
        if not frags:
            raise InputNotFoundError(f"{p}: not a traceroof cache (no {META_FILE}, no {FRAGMENTS_DIR}/*.json)")
        return _read_dataset(p, frags)
    doc = _load_meta(p)
    if doc["cache_version"] == DATASET_VERSION:
        listed = [p / str(f) for f in doc["fragments"]]
        present = set(fragment_files(p))
        missing = [f for f in listed if f not in present]
        extra = sorted(present - set(listed))
        if missing:
            raise TraceFormatError(missing[0], "fragment",
                                   f"a fragment listed in {p / META_FILE}, found nothing ({len(missing)} missing)")
        if extra:
            raise TraceFormatError(p / META_FILE, "fragments",
                                   f"a manifest listing every fragment; {extra[0].name} and {len(extra) - 1} "
                                   "more are not listed (ingested after finalize?): run finalize again")
        return _read_dataset(p, listed)
    tables = doc["tables"]
    ops = _read_table(p, "ops", tables.get("ops"))
    host = _read_table(p, "host", tables.get("host"))
    meta = meta_from_json(p / META_FILE, doc["meta"])
    return _split_costs(Trace(ops=ops, host=host, meta=meta), [doc.get("costs")], p / META_FILE)


def describe(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A summary of a cache from its manifest alone (tables not read), for ``ingest``'s report.

    Returns ``{"layout": "cache" | "dataset", "cache_version", "rows": {"ops", "host"},
    "ranks", "files"}`` where ``files`` are all its files, relative to ``path``, sorted.

    Raises:
        TraceFormatError: a missing or damaged ``meta.json`` (names it).
    """
    p = Path(path)
    doc = _load_meta(p)
    tables = doc["tables"]
    return {
        "layout": "dataset" if doc["cache_version"] == DATASET_VERSION else "cache",
        "cache_version": doc["cache_version"],
        "rows": {name: int((tables.get(name) or {}).get("rows") or 0) for name in TABLES},
        "ranks": list(doc["meta"].get("ranks") or []),
        "files": sorted(str(f.relative_to(p)) for f in p.rglob("*") if f.is_file()),
    }


__all__ = ["read_cache", "is_cache", "describe", "load_fragment", "meta_from_json", "fragment_files", "part_crc32",
           "CACHE_VERSION", "DATASET_VERSION"]

