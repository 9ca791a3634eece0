"""The columnar cache: a parsed :class:`Trace` as Parquet, partitioned by rank, plus its metadata.

Two layouts, both read by :func:`read_cache` (and so by ``read_trace`` / ``traceroof analyze DIR``).

**Single cache** (``cache_version`` 1; :func:`write_cache`, ``traceroof ingest TRACE -o DIR``)::

    DIR/meta.json                       # {"format": "traceroof-cache", "cache_version": 1, ...}
    DIR/ops/rank=0/part.parquet         # the op table rows of rank 0
    DIR/host/rank=0/part.parquet        # the host table rows of rank 0
    DIR/ops/empty.parquet               # only when the table has no rows (keeps the schema)

**Dataset** (:func:`ingest_file` once per per-rank file, by independent workers, then
optionally :func:`finalize`; ``traceroof ingest A B ... -o DIR``)::

    DIR/ops/rank=N/part-<key>.parquet   # the op rows of one input file's rank N
    DIR/host/rank=N/part-<key>.parquet
    DIR/meta/<key>.json                 # that file's fragment: source, parts, row counts, TraceMeta
    DIR/meta.json                       # written by finalize (cache_version 2): lists the fragments

``<key>`` is the input's stem plus a hash of its absolute path, so workers never write the
same file and re-ingesting a file replaces its own parts. A fragment is written last (and
atomically): a part without a fragment is ignored. Reading a dataset reads each fragment's
parts and merges them with :func:`traceroof.io.merge`, so the result is exactly what
``read_trace`` of the same files gives.

Each part holds every column (``rank`` included) plus ``__row``, the row's position in the
original table, so the exact row order and dtypes are restored: the round trip is exact on
every column and on the metadata.

The op parts also hold the op's costs (``__cost_kind``, ``__cost_dtype``, ``__cost_flops``,
``__cost_bytes``, ``__cost_cost_source``: :data:`traceroof.costing.COST_COLUMNS` as
:func:`traceroof.costing.apply_costs` fills them), and the manifest or fragment a ``costs``
entry (the cost model's identifier and the :class:`~traceroof.costing.Coverage`). They are
chip-independent, so they are computed once at ingest; the trace read back carries them in
``Trace.costed`` (its op table is the parsed one, unchanged), and the analysis uses them
when the cost model is still the same.
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

from .errors import InputNotFoundError, TraceFormatError, TraceroofError, UsageError
from .schema import HOST_SCHEMA, OP_SCHEMA
from .trace import DeviceInfo, Trace, TraceMeta

if TYPE_CHECKING:
    from .progress import Progress

CACHE_FORMAT = "traceroof-cache"
CACHE_VERSION = 1  #: the single-cache layout written by write_cache
DATASET_VERSION = 2  #: the finalized dataset manifest written by finalize
READABLE_VERSIONS = (CACHE_VERSION, DATASET_VERSION)
META_FILE = "meta.json"
FRAGMENTS_DIR = "meta"
FRAGMENT_FORMAT = "traceroof-fragment"
FRAGMENT_VERSION = 1
_ROW = "__row"
_COST = "__cost_"  #: prefix of the stored cost columns in the op parts
_TABLES = {"ops": OP_SCHEMA, "host": HOST_SCHEMA}


def _fragments(p: Path) -> list[Path]:
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
    for f in _fragments(p)[:1]:
        try:
            with open(f, "rb") as fh:
                return FRAGMENT_FORMAT.encode() in fh.read(4096)
        except OSError:
            return True  # unreadable, but where a fragment belongs: reading it says why
    return False


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
        _write_parquet(df.with_columns(pl.lit(None, dtype=pl.Int64).alias(_ROW)).head(0), f)
        return [str(f.relative_to(root.parent))]
    indexed = df.with_row_index(_ROW).with_columns(pl.col(_ROW).cast(pl.Int64))
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
    ops = trace.ops.with_columns(costed.select(pl.col(c).alias(_COST + c) for c in COST_COLUMNS))
    return ops, {"model_id": cost_model_id(), "coverage": coverage.to_json()}


def _split_costs(trace: Trace, entries: list[Any], where: Path) -> Trace:
    """Move the stored ``__cost_*`` columns of ``trace.ops`` into ``trace.costed``.

    ``entries`` are the ``costs`` entries of the manifest or of every fragment merged; the
    costs are kept only when every one of them is there under one cost model (their
    coverages add up). The op table left is exactly the parsed one.

    Raises:
        TraceFormatError: a ``costs`` entry that is not a cost model id and a coverage.
    """
    from .costing import COST_COLUMNS, Costed, Coverage

    stored = [c for c in trace.ops.columns if c.startswith(_COST)]
    if not stored:
        return trace
    columns = trace.ops.select(pl.col(_COST + c).alias(c).cast(OP_SCHEMA[c]) for c in COST_COLUMNS)
    trace.ops = trace.ops.drop(stored)
    if not entries or any(not isinstance(e, dict) for e in entries):
        return trace
    models = {e.get("model_id") for e in entries}
    if len(models) != 1:
        return trace
    try:
        coverage = Coverage.merge([Coverage.from_json(e["coverage"]) for e in entries])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise TraceFormatError(where, "costs", f"a cost model id and a coverage ({type(exc).__name__}: {exc})") from exc
    trace.costed = Costed(model_id=str(models.pop()), columns=columns, coverage=coverage, ops=trace.ops)
    return trace


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
        for name in (*_TABLES, FRAGMENTS_DIR):
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
        "tables": {name: {"rows": rows[name], "files": files[name]} for name in _TABLES},
        "meta": _meta_to_json(trace.meta),
        "costs": costs,
    }
    _write_json(doc, out / META_FILE)
    return out


# -- the dataset layout: one fragment per input file, written by independent workers ----------

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
    from .io import read_one

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
        tables[name] = {"rows": df.height, "files": files}
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
    written = [out / f for name in _TABLES for f in tables[name]["files"]] + [frag]
    return written, int(trace.meta.stats.get("events", 0) or 0)


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
    try:
        return _ingest(trace_path, out_dir)[1]
    except TraceroofError:
        raise
    except (OSError, EOFError) as exc:
        raise TraceFormatError(trace_path, "file", f"a readable file ({type(exc).__name__}: {exc})") from exc
    except Exception as exc:  # noqa: BLE001 - re-raised with the file named
        raise RuntimeError(f"{trace_path}: {type(exc).__name__}: {exc}") from exc


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
    from .io import _size, resolve_inputs, run_parallel

    units = resolve_inputs(paths)
    out = Path(out_dir)
    _prepare_out(out)
    sizes = [_size(u) for u in units]
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


def _read_doc(f: Path, where: str, what: str, fmt: str) -> dict[str, Any]:
    """The JSON object in ``f`` whose ``"format"`` is ``fmt``.

    Raises:
        TraceFormatError: unreadable, not JSON, not an object or another format; ``where``
            and ``what`` (``"a readable " + what``) name the place and the expectation.
    """
    try:
        doc = json.loads(f.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise TraceFormatError(f, where, f"a readable {what} ({type(exc).__name__}: {exc})") from exc
    if not isinstance(doc, dict) or doc.get("format") != fmt:
        raise TraceFormatError(f, where, f'a {what} ("format": "{fmt}")')
    return doc


def _load_fragment(f: Path) -> dict[str, Any]:
    doc = _read_doc(f, "fragment", "dataset fragment", FRAGMENT_FORMAT)
    if doc.get("fragment_version") != FRAGMENT_VERSION:
        raise TraceFormatError(
            f, "fragment_version",
            f"fragment version {FRAGMENT_VERSION}, found {doc.get('fragment_version')!r}; re-ingest the file",
        )
    if not isinstance(doc.get("meta"), dict) or not isinstance(doc.get("tables"), dict):
        raise TraceFormatError(f, "fragment", "a fragment with 'meta' and 'tables'")
    return doc


def finalize(out_dir: str | os.PathLike[str], *, source_paths: list[str] | None = None) -> Path:
    """Check a dataset written by :func:`ingest_file` and write its manifest ``meta.json``.

    The manifest (``cache_version`` 2) lists the fragments, each table's row count and files,
    and the merged :class:`TraceMeta` (merged by :func:`traceroof.io.merge_meta`, exactly as
    reading the dataset merges it). Only metadata is read: every listed part must exist, but
    the tables are not loaded. A dataset also reads without it; with it, a fragment that went
    missing is an error instead of a silently absent rank. Run it once all workers are done.

    Raises:
        InputNotFoundError: ``out_dir`` holds no fragment.
        TraceFormatError: a damaged fragment, or a part it lists is missing (names the file).
    """
    from .io import merge_meta

    p = Path(out_dir)
    frags = _fragments(p)
    if not frags:
        raise InputNotFoundError(f"{p}: no dataset fragments ({FRAGMENTS_DIR}/*.json): nothing was ingested")
    docs = [_load_fragment(f) for f in frags]
    metas = [_meta_from_json(f, d["meta"]) for f, d in zip(frags, docs)]
    merged, order, _ = merge_meta(metas)
    tables: dict[str, dict[str, Any]] = {name: {"rows": 0, "files": []} for name in _TABLES}
    for i in order:
        for name in _TABLES:
            entry = docs[i]["tables"].get(name)
            if not isinstance(entry, dict) or not isinstance(entry.get("files"), list):
                raise TraceFormatError(frags[i], f"tables.{name}", "a list of Parquet files")
            for rel in entry["files"]:
                if not (p / rel).is_file():
                    raise TraceFormatError(p / rel, "file", f"a Parquet part listed in {frags[i]}, found nothing")
            tables[name]["rows"] += int(entry.get("rows") or 0)
            tables[name]["files"].extend(entry["files"])
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


def _meta_from_json(f: Path, d: dict[str, Any]) -> TraceMeta:
    try:
        d = dict(d)
        devices = [DeviceInfo(**x) for x in d.pop("devices", [])]
        return TraceMeta(devices=devices, **d)
    except TypeError as exc:
        raise TraceFormatError(f, "meta", f"TraceMeta fields ({exc})") from exc


def _read_table(p: Path, name: str, entry: Any, manifest: Path | None = None) -> pl.DataFrame:
    """Read one table's parts (paths relative to ``p``), restore the row order and dtypes."""
    schema = _TABLES[name]
    manifest = manifest or p / META_FILE
    if not isinstance(entry, dict) or not isinstance(entry.get("files"), list):
        raise TraceFormatError(manifest, f"tables.{name}", "a list of Parquet files")
    frames = []
    for rel in entry["files"]:
        f = p / rel
        if not f.is_file():
            raise TraceFormatError(f, "file", f"a Parquet part listed in {manifest}, found nothing")
        try:
            frames.append(pl.read_parquet(f))
        except Exception as exc:  # noqa: BLE001 - polars raises several types for damaged files
            raise TraceFormatError(f, "parquet", f"a readable Parquet file ({type(exc).__name__})") from exc
    if not frames:
        raise TraceFormatError(manifest, f"tables.{name}", "at least one Parquet file")
    try:
        df = pl.concat(frames, how="vertical_relaxed") if len(frames) > 1 else frames[0]
        # parts are written in row order: sort (a copy of every column) only when they are not
        if df.height and not df.select((pl.col(_ROW).diff().fill_null(1) > 0).all()).item():
            df = df.sort(_ROW)
        df = df.drop(_ROW)
        # dtypes as declared (Parquet stores the kind Enum as a dictionary column)
        df = df.with_columns(pl.col(c).cast(t) for c, t in schema.items() if c in df.columns)
    except Exception as exc:  # noqa: BLE001
        raise TraceFormatError(p / name, "parquet", f"the {name} table columns ({type(exc).__name__}: {exc})") from exc
    if df.height != entry.get("rows"):
        raise TraceFormatError(manifest if manifest != p / META_FILE else p / name, "rows",
                               f"{entry.get('rows')} rows as {manifest.name} says, found {df.height}")
    return df


def _read_dataset(p: Path, frags: list[Path]) -> Trace:
    from .io import merge

    traces = []
    costs = []
    for f in frags:
        doc = _load_fragment(f)
        tables = doc["tables"]
        ops = _read_table(p, "ops", tables.get("ops"), manifest=f)
        host = _read_table(p, "host", tables.get("host"), manifest=f)
        traces.append(Trace(ops=ops, host=host, meta=_meta_from_json(f, doc["meta"])))
        costs.append(doc.get("costs"))
    if not all(any(c.startswith(_COST) for c in t.ops.columns) for t in traces):
        # fragments written without costs (an older traceroof): none are used
        for t in traces:
            t.ops = t.ops.select(pl.exclude(f"^{_COST}.*$"))
    return _split_costs(merge(traces), costs, p)


def read_cache(path: str | os.PathLike[str]) -> Trace:
    """Read a cache directory back into the :class:`Trace` it was written from.

    A single cache (:func:`write_cache`, cache_version 1) gives the written trace; a dataset
    (:func:`ingest_file`, finalized or not) gives exactly what
    ``traceroof.io.read_trace(<its input files>)`` gives: same rows, order, dtypes, metadata.

    Raises:
        TraceFormatError: a missing or damaged ``meta.json``, fragment or Parquet part, a
            finalized dataset whose fragments differ from its manifest, or a cache of
            another ``cache_version``; the message names the file.
        InputNotFoundError: ``path`` holds neither a ``meta.json`` nor fragments.
    """
    p = Path(path)
    if not (p / META_FILE).is_file():
        frags = _fragments(p)
        if not frags:
            raise InputNotFoundError(f"{p}: not a traceroof cache (no {META_FILE}, no {FRAGMENTS_DIR}/*.json)")
        return _read_dataset(p, frags)
    doc = _load_meta(p)
    if doc["cache_version"] == DATASET_VERSION:
        listed = [p / str(f) for f in doc["fragments"]]
        present = set(_fragments(p))
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
    meta = _meta_from_json(p / META_FILE, doc["meta"])
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
        "rows": {name: int((tables.get(name) or {}).get("rows") or 0) for name in _TABLES},
        "ranks": list(doc["meta"].get("ranks") or []),
        "files": sorted(str(f.relative_to(p)) for f in p.rglob("*") if f.is_file()),
    }


__all__ = ["write_cache", "read_cache", "is_cache", "ingest_file", "ingest_files", "finalize",
           "fragment_key", "describe", "CACHE_VERSION", "DATASET_VERSION"]
