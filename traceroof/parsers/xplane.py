"""XPlane parser: jax / XLA / TensorFlow ``*.xplane.pb`` (an XSpace protobuf) -> :class:`Trace`.

Which events become op rows (see docs/xplane.md for the evidence behind each choice):

* **GPU planes** (``/device:GPU:N``): every event on the ``Stream #N...`` lines -- the kernels,
  memcpys and memsets as the device ran them. The ``XLA Ops`` / ``TensorFlow Ops`` lines of a
  GPU plane are *derived* from those same kernels by the profiler (one event per kernel, same
  spans), so they are skipped: reading both would count every kernel twice.
* **TPU planes** (``/device:TPU:N``): the ``XLA Ops`` line (a TPU has no stream lines). Times
  come from the ``device_offset_ps``/``device_duration_ps`` stats when present -- the device's
  own clock, and what xprof's ``hlo_stats`` reports (checked: identical per op); the XEvent span
  is the host-aligned copy and differs by up to 10 % per op. ``Async XLA Ops`` (in-flight async
  copies that overlap compute; their start/done ops are already on ``XLA Ops``) are not ops.
* **CPU-only profiles** (no device plane has ops): events on ``/host:CPU`` threads that carry
  ``hlo_op`` and ``hlo_module``/``program_id`` stats (XLA CPU thunks). ``device`` = the
  ``device_ordinal`` stat (0 when absent), ``stream`` = the thread's line id.

Per-op costs: ``flops``/``bytes_accessed`` from the event *metadata* stats (``cost_source =
"trace"``); otherwise, for ops with an HLO instruction (CPU, jax GPU), XLA's HloCostAnalysis of
that instruction from the module's ``Hlo Proto`` in ``/host:metadata``
(:mod:`traceroof.parsers.hlo_cost`, needs jax; ``cost_source = "shapes"``). When one HLO
instruction launched several kernels, its cost is spread over them by duration. Without jax,
those ops have unknown cost (null, never 0) and a warning says so.

Times, in integer arithmetic on the raw fields: ``start = XLine.timestamp_ns + offset_ps //
1000`` and ``dur = (offset_ps + duration_ps) // 1000 - offset_ps // 1000`` (the ns interval
is the floor-image of the ps interval: adjacent events stay adjacent, sums are unbiased).
``start_ns`` is relative to the earliest kept event (``meta.origin_ns``, on the file's own
clock); ``meta.base_time_ns`` is the ``Task Environment`` ``profile_start_time`` (unix ns of
that clock's zero) when the file has it. Several hosts' files are aligned through it.

Public API: :func:`read`, :func:`read_bytes`, :func:`read_dir`, :func:`find_xplanes`.
"""

from __future__ import annotations

import gzip
import logging
import os
import re
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from ..errors import InputNotFoundError, TraceFormatError
from ..schema import HOST_SCHEMA, KIND, OP_SCHEMA
from ..trace import DeviceInfo, Trace, TraceMeta
from . import xplane_proto as xp
from .hlo_cost import (
    Modules, attach_hlo_costs, collective_size, op_kind, parse_hlo_expression, xla_dtype,
)
from .xplane_proto import (
    STAT_BYTES, STAT_DOUBLE, STAT_INT64, STAT_REF, STAT_STR, STAT_UINT64, text,
)

log = logging.getLogger(__name__)

# --- vocabulary: line names, opcodes, categories (declarative, in one place) -------------

STREAM_LINE = re.compile(r"^Stream #(\d+)")
DEVICE_PLANE = re.compile(r"^/device:([A-Za-z_]+):(\d+)$")
XLA_OPS, XLA_MODULES, STEPS, ASYNC_XLA_OPS = "XLA Ops", "XLA Modules", "Steps", "Async XLA Ops"
#: Lines of device planes that are derived from the op/kernel lines or hold no ops.
DERIVED_LINES = frozenset({
    "XLA Ops", "TensorFlow Ops", "TensorFlow Name Scope", "Framework Ops",
    "Framework Name Scope", "Source code", "XLA TraceMe", "Overlay", "Launch Stats",
    "Async XLA Ops", "XLA Modules", "Steps", "_counters_", "SparseCore Ops",
})

EXTRA_COLUMNS = {
    "host": pl.String,  # hostname (XSpace.hostnames or the file name)
    "hlo_op": pl.String,  # HLO instruction name
    "hlo_module": pl.String,  # HLO module name
    "program_id": pl.UInt64,  # XLA program id of the module
    "hlo_category": pl.String,  # xprof category (TPU), e.g. "convolution fusion"
    "long_name": pl.String,  # HLO expression with shapes, when the trace or HLO has it
}


# --- stats ---------------------------------------------------------------------------------


def _nulls(name: str, n: int, dtype) -> pl.Series:
    """An all-null series of length ``n`` (without building a Python list)."""
    return pl.Series(name, [], dtype=dtype).extend_constant(None, n)


def _aligned(frame: pl.DataFrame, series: pl.Series) -> pl.Series:
    """``series`` (one value per row of ``frame``) split into chunks at the same row
    boundaries as ``frame``'s columns. A frame whose columns are chunked alike is operated on
    as is; one column chunked differently makes polars copy (rechunk) the whole frame on every
    later operation."""
    lengths = [len(c) for c in frame.get_column(frame.columns[0]).get_chunks()]
    if len(lengths) <= 1:
        return series.rechunk() if series.n_chunks() > 1 else series
    series = series.rechunk()
    pieces, at = [], 0
    for n in lengths:
        pieces.append(series.slice(at, n))
        at += n
    return pl.concat(pieces, rechunk=False)


def _factorize(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(ids, return_inverse=True)`` for integer ids: a lookup table when the ids
    are small non-negative numbers (metadata ids, refs: no sort), else numpy's."""
    if len(ids):
        lo, hi = int(ids.min()), int(ids.max())
        if lo >= 0 and hi < max(1 << 16, 4 * len(ids)):
            seen = np.zeros(hi + 1, np.bool_)
            seen[ids] = True
            uniq = np.flatnonzero(seen)
            lut = np.zeros(hi + 1, np.int64)
            lut[uniq] = np.arange(len(uniq))
            return uniq.astype(ids.dtype, copy=False), lut[ids]
    uniq, inv = np.unique(ids, return_inverse=True)
    return uniq, inv.reshape(-1)


def _stat_value(stat, names: dict[int, str]) -> Any:
    which = stat.WhichOneof("value")
    if which is None:
        return None
    if which == "ref_value":
        return names.get(stat.ref_value)
    if which == "str_value":
        return text(stat.str_value)
    return getattr(stat, which)


class _Plane:
    """A scanned plane with its stat names resolved and per-metadata stats cached."""

    def __init__(self, scan: xp.PlaneScan) -> None:
        self.scan = scan
        meta = scan.meta
        self.name = text(meta.name)
        self.stat_names = {k: text(v.name) for k, v in meta.stat_metadata.items()}
        self.stat_ids: dict[str, list[int]] = {}
        for k, v in self.stat_names.items():
            self.stat_ids.setdefault(v, []).append(k)
        self.stats = {self.stat_names.get(s.metadata_id, str(s.metadata_id)):
                      _stat_value(s, self.stat_names) for s in meta.stats}
        self._md: dict[int, dict[str, Any]] = {}
        self.md_rows: dict[int, tuple] = {}  # _md_frame rows, by metadata id
        self.prefetch_ids: list[int] = []
        self.feed: _LineFeed | None = None

    def md(self, mid: int) -> dict[str, Any]:
        """Event metadata ``mid`` as a dict: ``_name``, ``_display_name`` and its stats."""
        got = self._md.get(mid)
        if got is None:
            m = self.scan.meta.event_metadata.get(mid)
            got = {}
            if m is not None:
                got = {self.stat_names.get(s.metadata_id, str(s.metadata_id)):
                       _stat_value(s, self.stat_names) for s in m.stats}
                got["_name"] = text(m.name)
                got["_display_name"] = text(m.display_name)
            self._md[mid] = got
        return got

    def sids(self, name: str) -> list[int]:
        return self.stat_ids.get(name, [])

    def numeric(self, cols: xp.EventColumns, name: str) -> tuple[np.ndarray, np.ndarray]:
        """Per-event numeric stat ``name``: (values, present mask). int64 values (uint64
        reinterpreted), or float64 when any entry is a double."""
        n = len(cols)
        ints = np.zeros(n, np.int64)
        floats = None
        present = np.zeros(n, np.bool_)
        for sid in self.sids(name):
            ev, kind, val, _rows = cols.stat(sid)
            m = (kind == STAT_INT64) | (kind == STAT_UINT64)
            if m.all():
                ints[ev] = val.view(np.int64)
                present[ev] = True
                continue
            ints[ev[m]] = val[m].view(np.int64)
            present[ev[m]] = True
            d = kind == STAT_DOUBLE
            if d.any():
                if floats is None:
                    floats = np.full(n, np.nan)
                floats[ev[d]] = val[d].view(np.float64)
                present[ev[d]] = True
        if floats is not None:
            return np.where(np.isnan(floats), ints.astype(np.float64), floats), present
        return ints, present

    def strings(self, cols: xp.EventColumns, name: str) -> pl.Series:
        """Per-event string stat ``name`` (refs resolved through stat metadata) as a polars
        String series, null where absent. Built dictionary-style: one Python string per
        distinct value, then a vectorised gather."""
        n = len(cols)
        codes = np.full(n, -1, np.int64)
        cats: list[str | None] = []
        for sid in self.sids(name):
            ev, kind, val, rows = cols.stat(sid)
            ref = kind == STAT_REF
            if ref.any():
                uniq, inv = _factorize(val[ref])
                codes[ev[ref]] = len(cats) + inv
                cats.extend(self.stat_names.get(int(u)) for u in uniq)
            for j in np.flatnonzero(~ref).tolist():
                k = int(kind[j])
                if k in (STAT_STR, STAT_BYTES):
                    v = cols.stat_objects.get(int(rows[j]))
                    v = text(v) if isinstance(v, (str, bytes)) else None
                elif k in (STAT_INT64, STAT_UINT64):
                    v = str(int(val[j]))
                else:
                    v = None
                codes[ev[j]] = len(cats)
                cats.append(v)
        if not cats:
            return _nulls(name, n, pl.String)
        cats.append(None)
        codes[codes < 0] = len(cats) - 1
        return pl.Series(name, cats, dtype=pl.String).gather(codes)

    def names(self, cols: xp.EventColumns) -> pl.Series:
        """Per-event event-metadata name (``XEventMetadata.name``) as a String series."""
        uniq, inv = _factorize(cols.metadata_id)
        cats = [self.md(int(m)).get("_name", "") for m in uniq]
        return pl.Series("name", cats, dtype=pl.String).gather(inv)


def _times(line: xp.LineScan, cols: xp.EventColumns, plane: _Plane | None = None,
           device_clock: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(start_ns, dur_ns) on the file's clock, in integer arithmetic on the raw fields:
    ``start = timestamp_ns + offset_ps // 1000`` and ``dur = (offset_ps + duration_ps) // 1000
    - offset_ps // 1000`` -- the ns interval is the floor-image of the ps interval, so events
    that touch in ps still touch in ns and durations are not biased low. With
    ``device_clock`` the ``device_offset_ps``/``device_duration_ps`` stats replace the event's
    span where both are present (TPU ``XLA Ops``: the device's own timing)."""
    off = cols.offset_ps
    end = off + cols.duration_ps
    if device_clock and plane is not None:
        d_off, has_off = plane.numeric(cols, "device_offset_ps")
        d_dur, has_dur = plane.numeric(cols, "device_duration_ps")
        both = has_off & has_dur
        if both.any():
            off = np.where(both, d_off.astype(np.int64), off)
            end = np.where(both, d_off.astype(np.int64) + d_dur.astype(np.int64), end)
    first = off // 1000
    return line.timestamp_ns + first, end // 1000 - first


# --- reading ------------------------------------------------------------------------------


def _format_error(path: str, data: bytes, space: xp.SpaceScan | None) -> TraceFormatError:
    if not data:
        return TraceFormatError(path, "byte 0", "empty file (0 bytes); expected an XSpace "
                                                "protobuf (*.xplane.pb)")
    err = space.damage[0] if space and space.damage else None
    if err is None:
        err = xp.find_break(data, 0, len(data), "XSpace")
    where = f"byte {err.offset}" if err else "byte 0"
    why = err.reason if err else "the bytes hold no XPlane"
    hint = ""
    mangled = data.count(b"\xef\xbf\xbd")
    if mangled > 16:
        hint = (f" The file holds {mangled} U+FFFD replacement sequences (EF BF BD): it was "
                "decoded and re-encoded as UTF-8 text somewhere (a text editor, a git filter, "
                "a JSON/text pipeline); only the original bytes can be read.")
    return TraceFormatError(
        path, where,
        f"not a readable XSpace protobuf: {why}; expected a *.xplane.pb written by "
        f"jax/TensorFlow/xprof.{hint}",
    )


def read(path: str | Path) -> Trace:
    """Read one ``*.xplane.pb`` (or ``.xplane.pb.gz``) into a :class:`Trace`.

    Raises:
        InputNotFoundError: the file does not exist.
        TraceFormatError: not an XSpace, empty, or nothing readable in it (names the byte
            offset where the wire format breaks).
    """
    p = Path(path)
    if p.is_dir():
        return read_dir(p)
    if not p.exists():
        raise InputNotFoundError(f"{p}: no such file")
    return read_bytes(p.read_bytes(), str(p))


def read_bytes(data: bytes, path: str = "<bytes>", *, rank: int = 0) -> Trace:
    """Parse a serialized XSpace (``bytes``; gzip accepted) into a :class:`Trace`.

    ``rank`` fills the ``rank`` column. Raises :class:`TraceFormatError` as :func:`read`.
    """
    parts = _read_parts(data, path, rank)
    return _assemble([parts], [path])


def find_xplanes(path: str | Path) -> tuple[list[Path], list[Path]]:
    """The ``*.xplane.pb`` files of a jax profile directory: the log dir, its
    ``plugins/profile`` dir, or one run dir. When several run dirs exist, the latest (by name:
    they are timestamps) is used. Returns (files of that run sorted by name, other files seen
    and ignored: ``*.trace.json.gz`` etc. beside them and older runs' files)."""
    root = Path(path)
    files = sorted(root.rglob("*.xplane.pb")) + sorted(root.rglob("*.xplane.pb.gz"))
    if not files:
        return [], []
    runs: dict[Path, list[Path]] = {}
    for f in files:
        runs.setdefault(f.parent, []).append(f)
    latest = max(runs, key=lambda d: (d.name, str(d)))
    chosen = sorted(runs[latest])
    ignored = [f for d, fs in runs.items() if d != latest for f in fs]
    ignored += sorted(x for x in latest.iterdir() if x.is_file() and x not in chosen)
    return chosen, ignored


def read_dir(path: str | Path, host: str | None = None) -> Trace:
    """Read a jax profile directory: every host's ``<host>.xplane.pb`` of one run (BC-21).

    Each file is one host (one process); ranks are assigned in file-name order. ``host``
    (a file stem or hostname) picks one. Other files in the run dir (``*.trace.json.gz``,
    xprof caches) are ignored so nothing is counted twice; so are older runs (warned).
    Host clocks are aligned through each file's ``profile_start_time`` when present.

    Raises:
        InputNotFoundError: no ``*.xplane.pb`` under ``path``, or ``host`` matches none.
        TraceFormatError: when a file is unreadable (others are still read; if none is,
            the first error is raised).
    """
    root = Path(path)
    if not root.exists():
        raise InputNotFoundError(f"{root}: no such directory")
    files, ignored = find_xplanes(root)
    if not files:
        raise InputNotFoundError(f"{root}: no *.xplane.pb under it")
    if host is not None:
        files = [f for f in files if _stem(f) == host or _stem(f).startswith(host)]
        if not files:
            raise InputNotFoundError(f"{root}: no xplane for host {host!r}")
    all_parts = []
    errors: list[TraceFormatError] = []
    used = []
    for rank, f in enumerate(files):
        try:
            data = f.read_bytes()
            all_parts.append(_read_parts(data, str(f), rank))
            used.append(str(f))
        except TraceFormatError as exc:
            errors.append(exc)
    if not all_parts:
        raise errors[0]
    trace = _assemble(all_parts, used)
    for exc in errors:
        trace.meta.warn(f"skipped unreadable profile {exc}")
    other_runs = [f for f in ignored if f.name.endswith((".xplane.pb", ".xplane.pb.gz"))]
    if other_runs:
        trace.meta.warn(f"{root}: read the latest run {files[0].parent.name}; "
                        f"{len(other_runs)} xplane file(s) of other runs ignored")
    trace.meta.count("xplane.files_ignored", len(ignored))
    return trace


def _stem(f: Path) -> str:
    name = f.name
    for suffix in (".xplane.pb.gz", ".xplane.pb"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return f.stem


class _Parts:
    """What one file contributes: op/host frames on the file's clock, and metadata."""

    def __init__(self) -> None:
        self.ops: list[pl.DataFrame] = []
        self.host: list[pl.DataFrame] = []
        self.devices: list[DeviceInfo] = []
        self.versions: dict[str, str] = {}
        self.warnings: list[str] = []
        self.stats: Counter = Counter()
        self.profile_start_ns: int | None = None
        self.hostname = ""


def _read_parts(data: bytes, path: str, rank: int) -> _Parts:
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            raise TraceFormatError(path, "byte 0", f"gzip stream does not decompress: {exc}")
    if not data:
        raise _format_error(path, data, None)
    space = xp.scan_space(data)
    if not space.planes:
        raise _format_error(path, data, space)
    out = _Parts()
    for err in space.damage:
        out.warnings.append(
            f"{path}: {err}: the XSpace is damaged there; everything from that point on in "
            f"the affected plane(s) is lost"
        )
    for e in space.errors:
        out.warnings.append(f"profiler error recorded in the trace: {e}")
    for w in space.warnings:
        out.warnings.append(f"profiler warning recorded in the trace: {w}")
    out.hostname = space.hostnames[0] if space.hostnames and space.hostnames[0] else _stem(
        Path(path)) if path != "<bytes>" else ""
    _convert(space, path, rank, out)
    return out


def _convert(space: xp.SpaceScan, path: str, rank: int, out: _Parts) -> None:
    planes = [_Plane(p) for p in space.planes]
    by_name = {p.name: p for p in planes}
    meta_plane = by_name.get("/host:metadata")
    modules = Modules(meta_plane)
    if meta_plane is not None:
        for k in ("jax_version", "jaxlib_version", "tf_version", "xla_version"):
            if meta_plane.stats.get(k):
                out.versions[k.removesuffix("_version")] = str(meta_plane.stats[k])
    env = by_name.get("Task Environment")
    if env is not None and isinstance(env.stats.get("profile_start_time"), int):
        out.profile_start_ns = int(env.stats["profile_start_time"])

    # --- plan: which lines to decode (line names come first on the wire: cheap) ---
    plans = []
    for plane in planes:
        m = DEVICE_PLANE.match(plane.name)
        if not m:
            if plane.name.startswith("/device:"):
                out.stats["xplane.other_device_planes"] += 1
            continue
        headers = [_safe_line(plane, i, out, path, want=lambda _n: False)
                   for i in range(len(plane.scan.line_ranges))]
        names = [h.name if h is not None else "" for h in headers]
        streams = [i for i, n in enumerate(names) if STREAM_LINE.match(n)]
        for n in names:
            if not STREAM_LINE.match(n) and n not in DERIVED_LINES:
                out.stats["xplane.unknown_device_lines"] += 1
                log.debug("%s: line %r not read", plane.name, n)
        if streams:
            op_lines, device_clock = streams, False
            out.stats["xplane.derived_op_lines_skipped"] += sum(
                n in (XLA_OPS, "TensorFlow Ops") for n in names)
        else:
            op_lines, device_clock = [i for i, n in enumerate(names) if n == XLA_OPS], True
        extra = [i for i, n in enumerate(names) if n in (STEPS, XLA_MODULES, ASYNC_XLA_OPS)]
        plans.append((plane, m.group(1), int(m.group(2)), names, op_lines, device_clock))
        plane.prefetch_ids = op_lines + extra
    for plane in planes:
        if plane.name.startswith("/host:") and plane.name != "/host:metadata":
            plane.prefetch_ids = list(range(len(plane.scan.line_ranges)))
    feed = _LineFeed([(p, i) for p in planes for i in p.prefetch_ids])
    for p in planes:
        p.feed = feed
    try:
        _convert_planes(planes, plans, path, rank, out, modules, meta_plane)
    finally:
        feed.close()


def _convert_planes(planes, plans, path: str, rank: int, out: _Parts, modules: Modules,
                    meta_plane: _Plane | None) -> None:
    step_spans: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    host_frames: list[pl.DataFrame] = []
    op_frames: list[pl.DataFrame] = []

    # --- device planes ---
    for plane, dev_type, ordinal, names, op_lines, device_clock in plans:
        frames = []
        for i in op_lines:
            line = _safe_line(plane, i, out, path)
            df = _device_ops(plane, line, ordinal, device_clock, modules, out) if line else None
            if df is not None and df.height:
                frames.append(df)
        for i, n in enumerate(names):
            if n in (STEPS, XLA_MODULES):
                line = _safe_line(plane, i, out, path)
                if line is None or line.events is None or not len(line.events):
                    continue
                rows = _annotation_rows(plane, line, "gpu_annotation", plane.name)
                if n == STEPS:
                    step_spans[ordinal] = _device_steps(plane, line)
                    rows = rows.with_columns(
                        pl.col("name").alias("annotation"),
                        pl.Series("name", [f"ProfilerStep#{k}" for k in step_spans[ordinal][2]],
                                  dtype=pl.String))
                host_frames.append(rows)
            elif n == ASYNC_XLA_OPS:
                line = _safe_line(plane, i, out, path)
                out.stats["xplane.async_ops_skipped"] += len(line.events) if line and line.events else 0
        if not frames:
            out.stats["xplane.empty_device_planes"] += 1
            continue
        out.devices.append(_device_info(plane, dev_type, ordinal, out.hostname))
        op_frames.extend(frames)

    # --- host planes: annotations, launches; ops when the profile is CPU-only ---
    cpu_only = not op_frames
    host_steps: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    cpu_ops: list[pl.DataFrame] = []
    for plane in planes:
        if not plane.name.startswith("/host:") or plane.name == "/host:metadata":
            continue
        for i in range(len(plane.scan.line_ranges)):
            line = _safe_line(plane, i, out, path)
            if line is None or line.events is None or not len(line.events):
                continue
            frame, steps = _host_rows(plane, line)
            if frame is not None:
                host_frames.append(frame)
            if steps is not None:
                host_steps.append(steps)
            if cpu_only:
                df = _cpu_ops(plane, line, modules, out)
                if df is not None and df.height:
                    cpu_ops.append(df)
    if cpu_only and cpu_ops:
        op_frames = cpu_ops
        dev = DeviceInfo(name="CPU", index=0, extra={"platform": "cpu", "host": out.hostname})
        if meta_plane is not None:
            for k in ("cpu_version", "process_id"):
                if k in meta_plane.stats:
                    dev.extra[k] = meta_plane.stats[k]
        out.devices.append(dev)

    if modules.unavailable and out.stats.get("xplane.hlo_cost_needed"):
        out.warnings.append(
            f"{out.stats['xplane.hlo_cost_needed']} ops have no FLOPs/bytes in the trace and "
            f"their HLO could not be costed ({modules.unavailable}); install jax to cost them "
            f"from the trace's HLO. Their cost is unknown (not zero)."
        )
    for f in modules.failed:
        out.warnings.append(f"HLO module not costed: {f}")

    # row order: device, stream, start (as the Kineto reader): frames are whole lines, each
    # already in time order, so ordering the frames is enough -- no gather of the whole table
    op_frames.sort(key=lambda f: (f["device"][0], f["stream"][0]))
    # rank and host per frame: every column of the concatenation is then chunked alike
    op_frames = [f.with_columns(pl.lit(rank, pl.Int32).alias("rank"),
                                pl.lit(out.hostname, pl.String).alias("host"))
                 for f in op_frames]
    ops = pl.concat(op_frames, how="diagonal_relaxed") if op_frames else None
    if ops is not None:
        ops = _assign_steps(ops, step_spans, host_steps)
        out.ops.append(ops)
    host_frames = [h for h in host_frames if h is not None and h.height]
    if host_frames:
        host = pl.concat(host_frames, how="diagonal_relaxed")
        out.host.append(host.with_columns(pl.lit(rank, pl.Int32).alias("rank")))


#: Threads decoding lines in parallel (numpy releases the GIL in the decoder's array work).
MAX_THREADS = min(8, os.cpu_count() or 1)


def _decode(plane: _Plane, i: int):
    try:
        return plane.scan.line(i)
    except xp.WireError as err:
        return err


class _LineFeed:
    """Decodes the lines the conversion will ask for, in that order, a few ahead on a thread
    pool: parallel on multi-core machines, while at most ``2 * threads`` decoded lines wait
    in memory (a line's columns are freed once it has become a frame)."""

    def __init__(self, jobs: list[tuple[_Plane, int]], threads: int = MAX_THREADS) -> None:
        self.jobs = jobs
        self.next = 0
        self.futures: dict[tuple[int, int], Any] = {}
        self.pool = ThreadPoolExecutor(threads) if threads > 1 and len(jobs) > 1 else None
        for _ in range(2 * threads if self.pool else 0):
            self._submit()

    def _submit(self) -> None:
        if self.pool is not None and self.next < len(self.jobs):
            plane, i = self.jobs[self.next]
            self.futures[(id(plane), i)] = self.pool.submit(_decode, plane, i)
            self.next += 1

    def get(self, plane: _Plane, i: int):
        fut = self.futures.pop((id(plane), i), None)
        if fut is None:
            return _decode(plane, i)
        self._submit()
        return fut.result()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)


def _safe_line(plane: _Plane, i: int, out: _Parts, path: str, want=None) -> xp.LineScan | None:
    """Line ``i`` of ``plane``, or None (with a warning naming the byte) when it is damaged."""
    try:
        if want is None and plane.feed is not None:
            got = plane.feed.get(plane, i)
            if isinstance(got, xp.WireError):
                raise got
            return got
        return plane.scan.line(i, want)
    except xp.WireError as err:
        out.warnings.append(f"{path}: {plane.name} line {i} is damaged at {err}; "
                            "its events are lost")
        out.stats["xplane.damaged_lines"] += 1
        return None


def _device_info(plane: _Plane, dev_type: str, ordinal: int, hostname: str) -> DeviceInfo:
    s = plane.stats
    name = s.get("device_type_string") or s.get("gpu_device_name") or s.get("device_name") or ""
    peak_tf = s.get("peak_teraflops_per_second")
    peak_bw = s.get("peak_hbm_bw_gigabytes_per_second")
    known = {"device_type_string", "gpu_device_name", "peak_teraflops_per_second",
             "peak_hbm_bw_gigabytes_per_second", "compute_cap_major", "compute_cap_minor",
             "core_count", "memory_size"}
    extra = {k: v for k, v in s.items() if k not in known and not isinstance(v, bytes)}
    extra["device_type"] = dev_type
    extra["plane"] = plane.name
    if hostname:
        extra["host"] = hostname
    return DeviceInfo(
        name=str(name),
        index=ordinal,
        compute_major=_int(s.get("compute_cap_major")),
        compute_minor=_int(s.get("compute_cap_minor")),
        num_sms=_int(s.get("core_count")),
        memory_bytes=_int(s.get("memory_size")),
        peak_flops_per_s=float(peak_tf) * 1e12 if peak_tf else None,
        peak_hbm_bytes_per_s=float(peak_bw) * 1e9 if peak_bw else None,
        extra=extra,
    )


def _int(v: Any) -> int | None:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


# --- per-metadata attributes ----------------------------------------------------------------


def _md_frame(plane: _Plane, mids: np.ndarray, modules: Modules) -> pl.DataFrame:
    """One row per event-metadata id: name, op, kind, dtype, flops, bytes, HLO attributes."""
    keys = ("metadata_id", "name", "op", "kind", "dtype", "flops", "bytes", "comm_bytes",
            "group_size", "md_cost", "hlo_category", "long_name", "program_id", "hlo_op_md")
    rows: dict[str, list] = {k: [] for k in keys}
    cache = plane.md_rows
    for mid in mids.tolist():
        row = cache.get(mid)
        if row is None:
            row = cache[mid] = _md_row(plane, mid, modules)
        for k, v in zip(keys, row):
            rows[k].append(v)
    return pl.DataFrame(rows, schema={
        "metadata_id": pl.Int64, "name": pl.String, "op": pl.String, "kind": KIND,
        "dtype": pl.String, "flops": pl.Float64, "bytes": pl.Float64,
        "comm_bytes": pl.Float64, "group_size": pl.Int32, "md_cost": pl.Boolean,
        "hlo_category": pl.String, "long_name": pl.String, "program_id": pl.UInt64,
        "hlo_op_md": pl.String})


def _md_row(plane: _Plane, mid: int, modules: Modules) -> tuple:
    """The :func:`_md_frame` row of event metadata ``mid`` (computed once per plane)."""
    d = plane.md(mid)
    raw = d.get("_name", "")
    disp = d.get("_display_name", "")
    expr = d.get("long_name") or (raw if raw.startswith("%") or " = " in raw else None)
    name = disp or (re.match(r"^%?([^\s=]+)", raw).group(1) if expr and raw else raw)
    category = d.get("hlo_category")
    opcode, shape, operand_shape = parse_hlo_expression(expr) if expr else (None, None, None)
    pid = d.get("program_id")
    pid = int(pid) if isinstance(pid, (int, float)) else None
    fused: frozenset = frozenset()
    targets: frozenset = frozenset()
    hlo_op = name if expr else None
    info = None
    if pid is not None and hlo_op:
        minfo = modules.info(pid) if pid in modules.protos else None
        info = minfo.instructions.get(hlo_op) if minfo else None
    if info is not None:
        opcode = opcode or info.opcode
        shape = shape or info.shape
        operand_shape = operand_shape or (info.operand_shapes[0] if info.operand_shapes else None)
        fused, targets = info.fused_opcodes, info.custom_call_targets_inside
        if info.custom_call_target:
            targets = targets | {info.custom_call_target}
    kind = op_kind(opcode, category, fused, targets, kernel_name=raw)
    dtype = xla_dtype(operand_shape if kind in ("matmul", "conv", "attention") and
                      operand_shape else shape)
    flops = d.get("flops")
    nbytes = d.get("bytes_accessed")
    comm, group = collective_size(opcode, expr or (info.text if info else None))
    return (mid, name, opcode or category, kind, dtype,
            float(flops) if isinstance(flops, (int, float)) else None,
            float(nbytes) if isinstance(nbytes, (int, float)) else None,
            comm, group,
            isinstance(flops, (int, float)) or isinstance(nbytes, (int, float)),
            category, expr, pid, hlo_op)


def _device_ops(plane: _Plane, line: xp.LineScan, ordinal: int, device_clock: bool,
                modules: Modules, out: _Parts) -> pl.DataFrame | None:
    cols = line.events
    if cols is None or not len(cols):
        return None
    start, dur = _times(line, cols, plane, device_clock)
    mids, pos = _factorize(cols.metadata_id)
    md = _md_frame(plane, mids, modules)
    pid, has_pid = plane.numeric(cols, "program_id")
    corr, has_corr = plane.numeric(cols, "correlation_id")
    frame = md[pos].with_columns(
        pl.Series("start_ns", start, dtype=pl.Int64),
        pl.Series("dur_ns", dur, dtype=pl.Int64),
        pl.coalesce(plane.strings(cols, "hlo_op"), pl.col("hlo_op_md")).alias("hlo_op"),
        plane.strings(cols, "hlo_module").alias("hlo_module"),
        pl.coalesce("program_id", _masked(pid, has_pid, pl.UInt64)).alias("program_id"),
        _masked(corr, has_corr, pl.Int64).alias("correlation"),
        pl.lit(ordinal, pl.Int32).alias("device"),
        pl.lit(line.id, pl.Int64).alias("stream"),
    ).drop("hlo_op_md")
    frame = _kernel_details(plane, cols, frame)
    if cols.aggregated.any():
        out.stats["xplane.aggregated_events_skipped"] += int(cols.aggregated.sum())
        frame = frame.filter(pl.Series(~cols.aggregated))
    out.stats["xplane.device_events"] += frame.height
    return attach_hlo_costs(_by_start(frame), modules, out.stats)


def _by_start(frame: pl.DataFrame) -> pl.DataFrame:
    """The frame in start order (lines are written in time order; this is the rare case)."""
    start = frame["start_ns"].to_numpy()
    if len(start) > 1 and (start[1:] < start[:-1]).any():
        return frame.sort("start_ns", maintain_order=True)
    return frame


def _masked(values: np.ndarray, present: np.ndarray, dtype) -> pl.Series:
    """A polars series of ``values`` with nulls where ``present`` is False."""
    if dtype == pl.UInt64:
        values = values.astype(np.int64).view(np.uint64)
    series = pl.Series(values, dtype=dtype)
    if present.all():
        return series
    return pl.select(pl.when(pl.Series(present)).then(series)).to_series()


def _kernel_details(plane: _Plane, cols: xp.EventColumns, frame: pl.DataFrame) -> pl.DataFrame:
    """memcpy sizes (bytes moved, from ``memcpy_details``) and TensorFlow op types (from the
    ``level 0`` annotation ``name:Type``) of kernels; null columns when the plane has none."""
    memcpy = plane.strings(cols, "memcpy_details") if plane.sids("memcpy_details") else None
    level0 = plane.strings(cols, "level 0") if plane.sids("level 0") else None
    size = (memcpy.str.extract(r"size:(\d+)").cast(pl.Float64) if memcpy is not None
            else _nulls("m", len(cols), pl.Float64))
    tf_type = (level0.str.split("#").list.first().str.extract(r":([^:/]+)$")
               if level0 is not None else _nulls("t", len(cols), pl.String))
    return frame.with_columns(
        pl.Series("memcpy_bytes", size).replace(0.0, None).alias("memcpy_bytes"),
        pl.Series("tf_type", tf_type),
    )


def _cpu_ops(plane: _Plane, line: xp.LineScan, modules: Modules,
             out: _Parts) -> pl.DataFrame | None:
    """XLA CPU thunk events of a ``/host:CPU`` thread (events with ``hlo_op`` and a module;
    launch calls, which carry ``correlation_id``, excluded)."""
    cols = line.events
    if not plane.sids("hlo_op"):
        return None
    hlo_op = plane.strings(cols, "hlo_op")
    is_op = hlo_op.is_not_null().to_numpy() & ~cols.aggregated
    if plane.sids("correlation_id"):
        is_op &= ~plane.numeric(cols, "correlation_id")[1]
    if not is_op.any():
        return None
    pid, has_pid = plane.numeric(cols, "program_id")
    ordinal, has_ord = plane.numeric(cols, "device_ordinal")
    start, dur = _times(line, cols)
    frame = pl.DataFrame([
        plane.names(cols),
        pl.Series("start_ns", start, dtype=pl.Int64),
        pl.Series("dur_ns", dur, dtype=pl.Int64),
        hlo_op.alias("hlo_op"),
        plane.strings(cols, "hlo_module").alias("hlo_module"),
        _masked(pid, has_pid, pl.UInt64).alias("program_id"),
        pl.Series("device", np.where(has_ord, ordinal, 0), dtype=pl.Int32),
    ]).filter(pl.Series(is_op))
    frame = frame.with_columns(
        pl.lit(line.id, pl.Int64).alias("stream"),
        pl.lit(None, pl.String).alias("op"), pl.lit("other", KIND).alias("kind"),
        pl.lit(None, pl.String).alias("dtype"), pl.lit(None, pl.Float64).alias("flops"),
        pl.lit(None, pl.Float64).alias("bytes"), pl.lit(None, pl.Float64).alias("comm_bytes"),
        pl.lit(None, pl.Int32).alias("group_size"), pl.lit(False).alias("md_cost"),
        pl.lit(None, pl.String).alias("hlo_category"), pl.lit(None, pl.String).alias("long_name"),
        pl.lit(None, pl.Int64).alias("correlation"),
    )
    out.stats["xplane.cpu_op_events"] += frame.height
    return attach_hlo_costs(_by_start(frame), modules, out.stats)


# --- host rows, steps -------------------------------------------------------------------

_HOST_OP = re.compile(r"^PjitFunction\(|^PmapFunction\(")


def _host_rows(plane: _Plane, line: xp.LineScan):
    """Host-table rows of one host line: step annotations (``step_num`` stat; named
    ``ProfilerStep#N`` like every other step marker, the trace's own name in the extra
    ``annotation`` column), launch calls (``correlation_id`` stat) and jax dispatches
    (``PjitFunction(...)``). Also returns the step spans (start, end, step) of the line."""
    cols = line.events
    step, has_step = plane.numeric(cols, "step_num")
    corr, has_corr = plane.numeric(cols, "correlation_id")
    names = plane.names(cols)
    is_dispatch = names.str.contains(_HOST_OP.pattern).fill_null(False).to_numpy()
    keep = (has_step | has_corr | is_dispatch) & ~cols.aggregated
    steps = None
    start, dur = _times(line, cols)
    if has_step.any():
        s = has_step & ~cols.aggregated
        steps = (start[s], start[s] + dur[s], step[s].astype(np.int64))
    if not keep.any():
        return None, steps
    cat = pl.Series("cat", ["annotation", "runtime", "cpu_op"], dtype=pl.String).gather(
        np.where(has_step, 0, np.where(has_corr, 1, 2)))
    frame = pl.DataFrame([
        names,
        cat,
        pl.Series("start_ns", start, dtype=pl.Int64),
        pl.Series("dur_ns", dur, dtype=pl.Int64),
        _masked(corr, has_corr, pl.Int64).alias("correlation"),
    ]).with_columns(
        pl.lit(plane.name, pl.String).alias("pid"),
        pl.lit(line.name or str(line.id), pl.String).alias("thread"),
        # step markers in the common vocabulary (``ProfilerStep#N``), the trace's own name kept
        pl.when(pl.Series(has_step)).then(pl.col("name")).alias("annotation"),
        pl.when(pl.Series(has_step))
        .then(pl.concat_str(pl.lit("ProfilerStep#"), pl.Series(step).cast(pl.String)))
        .otherwise(pl.col("name")).alias("name"),
    ).filter(pl.Series(keep))
    return frame, steps


def _annotation_rows(plane: _Plane, line: xp.LineScan, cat: str, pid: str) -> pl.DataFrame | None:
    cols = line.events
    if cols is None or not len(cols):
        return None
    start, dur = _times(line, cols)
    return pl.DataFrame([
        plane.names(cols),
        pl.Series("start_ns", start, dtype=pl.Int64),
        pl.Series("dur_ns", dur, dtype=pl.Int64),
    ]).with_columns(pl.lit(pid, pl.String).alias("pid"),
                    pl.lit(line.name, pl.String).alias("thread"),
                    pl.lit(cat, pl.String).alias("cat"))


def _device_steps(plane: _Plane, line: xp.LineScan):
    cols = line.events
    start, dur = _times(line, cols)
    step_num, has = plane.numeric(cols, "step_num")
    names = [plane.md(int(m)).get("_name", "") for m in cols.metadata_id]
    steps = np.array([int(step_num[i]) if has[i] else (int(nm) if nm.isdigit() else i)
                      for i, nm in enumerate(names)], dtype=np.int64)
    return start, start + dur, steps


def _assign_steps(ops: pl.DataFrame, device_steps: dict, host_steps: list) -> pl.DataFrame:
    """``step`` per op: the device's own ``Steps`` line if it has one, else the host's step
    annotations (``StepTraceAnnotation``: spans with a ``step_num`` stat). An op belongs to
    the step whose span contains its start; ops outside every span get null."""
    host = None
    if host_steps:
        s = np.concatenate([h[0] for h in host_steps])
        e = np.concatenate([h[1] for h in host_steps])
        n = np.concatenate([h[2] for h in host_steps])
        o = np.argsort(s, kind="stable")
        host = (s[o], e[o], n[o])
    if not device_steps and host is None:
        return ops.with_columns(_aligned(ops, _nulls("step", ops.height, pl.Int32)))
    start = ops["start_ns"].to_numpy()
    device = ops["device"].to_numpy()
    step = np.full(ops.height, -1, np.int64)
    has = np.zeros(ops.height, np.bool_)
    for dev in np.unique(device):
        m = device == dev
        spans = device_steps.get(int(dev), host)
        if spans is None:
            continue
        s, e, n = spans
        o = np.argsort(s, kind="stable")
        s, e, n = s[o], e[o], n[o]
        k = np.searchsorted(s, start[m], "right") - 1
        ok = k >= 0
        kk = np.where(ok, k, 0)
        ok &= start[m] < e[kk]
        step[m] = np.where(ok, n[kk], -1)
        has[m] = ok
    return ops.with_columns(_aligned(ops, _masked(step, has, pl.Int32).alias("step")))


# --- assembling files into one Trace -----------------------------------------------------


def _assemble(all_parts: list[_Parts], sources: list[str]) -> Trace:
    meta = TraceMeta(format="xplane", sources=list(sources))
    starts = [p.profile_start_ns for p in all_parts]
    base = min(s for s in starts if s is not None) if any(s is not None for s in starts) else None
    if base is not None and any(s is None for s in starts) and len(all_parts) > 1:
        meta.warn("some profiles lack profile_start_time: their clocks are not aligned")
    ops_frames, host_frames = [], []
    for part in all_parts:
        shift = (part.profile_start_ns - base) if (base is not None and
                                                  part.profile_start_ns is not None) else 0
        for f in part.ops:
            ops_frames.append(f.with_columns(pl.col("start_ns") + shift))
        for f in part.host:
            host_frames.append(f.with_columns(pl.col("start_ns") + shift))
        meta.devices.extend(part.devices)
        meta.versions.update(part.versions)
        for w in part.warnings:
            meta.warn(w)
        for k, v in part.stats.items():
            meta.count(k, v)
    ops = pl.concat(ops_frames, how="diagonal_relaxed") if ops_frames else pl.DataFrame()
    host = pl.concat(host_frames, how="diagonal_relaxed") if host_frames else pl.DataFrame()
    mins = [int(x) for x in (ops["start_ns"].min() if ops.height else None,
                             host["start_ns"].min() if host.height else None) if x is not None]
    origin = min(mins) if mins else 0
    if ops.height:
        ops = ops.with_columns(pl.col("start_ns") - origin)
        ops = _link_launches(ops, host, origin)
    if host.height:
        host = host.with_columns(pl.col("start_ns") - origin)
    meta.origin_ns = origin
    meta.base_time_ns = base
    meta.ranks = sorted({int(r) for r in ops["rank"].unique().to_list()}) if ops.height else [0]
    meta.world_size = len(all_parts) if len(all_parts) > 1 else None
    meta.count("xplane.hosts", len(all_parts))
    if ops.height == 0:
        meta.warn("no device ops found in the XSpace (no GPU/TPU op lines, no XLA CPU ops)")
    ops = _finish_ops(ops)
    host = _finish_host(host)
    unknown = int(ops.filter(pl.col("cost_source") == "unknown").height) if ops.height else 0
    if unknown:
        meta.count("xplane.ops_cost_unknown", unknown)
    return Trace(ops=ops, host=host, meta=meta)


def _link_launches(ops: pl.DataFrame, host: pl.DataFrame, origin: int) -> pl.DataFrame:
    """``launch_start_ns``/``launch_dur_ns`` of each op from the host launch call with the
    same (rank, correlation id); the first such call wins."""
    if not host.height or "correlation" not in host.columns:
        return ops
    launches = host.filter((pl.col("cat") == "runtime") & pl.col("correlation").is_not_null())
    if not launches.height or ops["correlation"].null_count() == ops.height:
        return ops
    n = ops.height
    l_start = np.full(n, 0, np.int64)
    l_dur = np.full(n, 0, np.int64)
    found = np.zeros(n, np.bool_)
    o_rank = ops["rank"].to_numpy()
    o_corr = ops["correlation"].fill_null(-1).to_numpy()
    o_has = ops["correlation"].is_not_null().to_numpy()
    h_rank = launches["rank"].to_numpy()
    one_rank = len(o_rank) and o_rank.min() == o_rank.max()
    ranks = [int(o_rank[0])] if one_rank else np.unique(o_rank[o_has]).tolist()
    for r in ranks:
        hm = h_rank == r
        if not hm.any():
            continue
        hc = launches["correlation"].to_numpy()[hm]
        hs = launches["start_ns"].to_numpy()[hm]
        hd = launches["dur_ns"].to_numpy()[hm]
        order = np.argsort(hc, kind="stable")
        hc, hs, hd = hc[order], hs[order], hd[order]
        sel = np.flatnonzero(o_has) if one_rank else np.flatnonzero((o_rank == r) & o_has)
        oc = o_corr[sel]
        lo, hi = int(hc[0]), int(hc[-1])
        if lo >= 0 and hi < 4 * (len(hc) + len(sel)) + (1 << 16):
            # small ids: a direct lookup table (first launch of each id) instead of a search
            first = np.ones(len(hc), np.bool_)
            first[1:] = hc[1:] != hc[:-1]
            lut = np.full(hi + 2, -1, np.int64)
            lut[hc[first]] = np.flatnonzero(first)
            k = lut[np.clip(oc, -1, hi + 1)]
            ok = k >= 0
        else:
            k = np.searchsorted(hc, oc)
            ok = k < len(hc)
            ok[ok] = hc[k[ok]] == oc[ok]
        l_start[sel[ok]] = hs[k[ok]] - origin
        l_dur[sel[ok]] = hd[k[ok]]
        found[sel[ok]] = True
    return ops.with_columns(
        _aligned(ops, _masked(l_start, found, pl.Int64).alias("launch_start_ns")),
        _aligned(ops, _masked(l_dur, found, pl.Int64).alias("launch_dur_ns")))


def _finish_ops(ops: pl.DataFrame) -> pl.DataFrame:
    if ops.height == 0:
        return pl.DataFrame(schema={**dict(OP_SCHEMA.items()), **EXTRA_COLUMNS})
    cols = []
    for name, dtype in {**dict(OP_SCHEMA.items()), **EXTRA_COLUMNS}.items():
        if name in ops.columns:
            cols.append(pl.col(name).cast(dtype))
        else:
            cols.append(_aligned(ops, _nulls(name, ops.height, dtype)))
    ops = ops.select(cols)  # kind and cost_source are set on every row by the readers
    return ops


def _finish_host(host: pl.DataFrame) -> pl.DataFrame:
    if host.height == 0:
        return pl.DataFrame(schema=HOST_SCHEMA)
    cols = [pl.col(n).cast(t) if n in host.columns else pl.lit(None, t).alias(n)
            for n, t in HOST_SCHEMA.items()]
    extra = [c for c in ("annotation",) if c in host.columns]
    return host.select(cols + extra).sort(["rank", "start_ns"], maintain_order=True)
