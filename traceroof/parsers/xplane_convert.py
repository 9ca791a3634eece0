"""XPlane conversion of one file: which planes and lines are read, decoded on a thread pool,
into the op and host frames of a :class:`~.xplane_planes.Parts`.

Vocabulary (line names, plane names) in one place, below; see :mod:`.xplane` for which events
become op rows and why.
"""

from __future__ import annotations

import logging
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from ..errors import TraceFormatError
from ..step_markers import marker_name
from ..trace import DeviceInfo
from . import xplane_proto as xp
from .gzip_stream import GZIP_MAGIC, gunzip
from .hlo_modules import Modules
from .xplane import file_stem
from .xplane_host import annotation_rows, assign_steps, device_step_spans, host_rows
from .xplane_ops import cpu_thunk_ops, device_info, device_ops
from .xplane_planes import LOST_NAME, Parts, Plane
from .xplane_proto_events import native_active
from .xplane_source import with_sources

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


def _format_error(path: str, data: bytes, space: xp.SpaceScan | None) -> TraceFormatError:
    if not data:
        return TraceFormatError(path, "byte 0", "empty file (0 bytes); expected an XSpace "
                                                "protobuf (*.xplane.pb)")
    err = space.damage[0] if space and space.damage else None
    if err is None and space is not None and space.cut is not None:
        cut = space.cut
        what = _SPACE_FIELDS.get(cut.field, f"field {cut.field}")
        declared = f", which declares {cut.declared:,} bytes" if cut.declared is not None else ""
        if space.planes:  # planes (or a plane's name) kept, but no line and no event in any
            last = space.planes[-1]
            if cut.field == 1 and last.cut is not None:
                what = f"plane '{xp.text(last.meta.name)}'"
            return TraceFormatError(path, f"byte {len(data):,}", (
                f"an XSpace with a complete line of events, found a file that ends inside {what} at byte "
                f"{cut.tag_pos:,}{declared}, before any plane's first line is complete: nothing usable before the "
                "cut (a file cut short, or still being written)"))
        return TraceFormatError(path, f"byte {len(data):,}", (
            f"an XSpace with a complete plane, found a file that ends inside its first {what} (at byte "
            f"{cut.tag_pos:,}{declared}): nothing before the cut is complete (a file cut short, or still being written)"))
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


def read_parts(data: bytes, path: str, rank: int) -> Parts:
    """What the serialized XSpace ``data`` (gzip accepted) of file ``path`` contributes, its
    rows on rank ``rank``: op and host frames on the file's clock, devices, warnings, stats.

    Raises:
        TraceFormatError: not an XSpace, empty, no plane readable (names the byte offset), or
            a cut file of which no line and no event is complete (names where it ends).
    """
    gz_problem = None
    if data[:2] == GZIP_MAGIC:
        data, gz_problem = _gunzip(data, path)
    if not data:
        raise _format_error(path, data, None)
    space = xp.scan_space(data)
    if not space.planes or (space.cut is not None and not any(p.line_ranges for p in space.planes)):
        raise _format_error(path, data, space)  # (a cut that left no line and no event: nothing to read)
    out = Parts()
    if gz_problem is not None:
        out.warnings.append(gz_problem)
    for err in space.damage:
        out.warnings.append(
            f"{path}: {err}: the XSpace is damaged there; everything from that point on in "
            f"the affected plane(s) is lost"
        )
    cut_at = None
    if space.cut is not None:
        cut_at = len(out.warnings)
        out.warnings.append(_cut_warning(path, len(data), space))
    for e in space.errors:
        out.warnings.append(f"profiler error recorded in the trace: {e}")
    for w in space.warnings:
        out.warnings.append(f"profiler warning recorded in the trace: {w}")
    out.hostname = space.hostnames[0] if space.hostnames and space.hostnames[0] else file_stem(
        Path(path)) if path != "<bytes>" else ""
    lost = _convert(space, path, rank, out)
    if lost:
        if cut_at is not None:
            out.warnings[cut_at] += "; " + _lost_names(lost, "lost with the cut")
        else:
            out.warnings.append(f"{path}: " + _lost_names(lost, "the file is damaged, or its writer is faulty"))
    return out


def _lost_names(lost: dict[str, list[int]], why: str) -> str:
    """What a file's events of undeclared event-metadata ids (plane name → ids) are named,
    and ``why`` their metadata is missing."""
    n = sum(len(v) for v in lost.values())
    where = ", ".join(f"'{p}' ({len(ids)}: {', '.join(map(str, ids[:5]))}{', …' if len(ids) > 5 else ''})"
                      for p, ids in lost.items())
    return (f"events of {n} event-metadata id(s) the file does not declare ({why}), in plane(s) "
            f"{where}, are named '" + LOST_NAME.format("<id>") + "': their names and stats are unknown, "
            "and no step is inferred from them")


def _gunzip(data: bytes, path: str) -> tuple[bytes, str | None]:
    """The content of the gzip stream ``data``, and None; of a cut or corrupt one, what
    inflates before the fault (:func:`.gzip_stream.gunzip`) and the warning saying so.

    Raises:
        TraceFormatError: nothing inflates.
    """
    got, exc = gunzip(data)
    if exc is None:
        return got, None
    problem = f"{type(exc).__name__}: {exc}"
    if not got:
        raise TraceFormatError(path, "byte 0", f"a gzip stream that decompresses ({problem})")
    return got, (f"{path}: the gzip stream is cut or corrupt ({problem}): read its first {len(got):,} "
                 "decompressed bytes")


#: what the XSpace's fields hold (XSpace message, xplane.proto), for the cut warning
_SPACE_FIELDS = {1: "plane", 2: "errors", 3: "warnings", 4: "hostnames"}


def _cut_warning(path: str, size: int, space: xp.SpaceScan) -> str:
    """The warning for a file that ends inside a field of its XSpace (``space.cut``): where,
    what was kept of that field, what was lost (the phrase ``trace is truncated at byte``
    is what :func:`traceroof.analysis.truncation` looks for)."""
    cut = space.cut
    assert cut is not None
    head = f"{path}: trace is truncated at byte {size:,}: the file ends inside "
    declared = f", which declares {cut.declared:,} bytes from byte {cut.start:,}" if cut.declared is not None else ""
    plane = space.planes[-1] if space.planes and space.planes[-1].cut is not None else None
    if cut.field != 1 or plane is None:
        what = _SPACE_FIELDS.get(cut.field, f"field {cut.field}")
        return head + f"the XSpace's {what} at byte {cut.tag_pos:,}{declared}; that field is lost"
    lines = len(plane.line_ranges)
    kept = (f"its {lines - plane.cut_line} complete line(s)" + (" and the complete events of the line the cut "
            "is in" if plane.cut_line else "") + f", {len(plane.meta.event_metadata)} event and "
            f"{len(plane.meta.stat_metadata)} stat metadata entries")
    lost = "the rest of the plane"
    if lines and not len(plane.meta.event_metadata):
        lost += " (its event metadata, written after its lines: its events' names and stats)"
    return head + (f"plane '{xp.text(plane.meta.name)}' at byte {cut.tag_pos:,}{declared}: kept {kept}; "
                   f"lost {lost} and every plane after it")


def _convert(space: xp.SpaceScan, path: str, rank: int, out: Parts) -> dict[str, list[int]]:
    """Convert ``space``'s planes into ``out``; returns, per plane name, the event-metadata
    ids its events use that it does not declare (named :data:`LOST_NAME`), sorted."""
    planes = [Plane(p) for p in space.planes]
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
    # the C decoder takes a line in well under the cost of a hand-over to a thread: no pool
    feed = LineFeed([(p, i) for p in planes for i in p.prefetch_ids], 1 if native_active() else MAX_THREADS)
    for p in planes:
        p.feed = feed
    try:
        _convert_planes(planes, plans, path, rank, out, modules, meta_plane)
    finally:
        feed.close()
        for p in planes:  # plane -> feed -> its jobs -> plane: a cycle holding the file's bytes
            p.feed = None
    return {p.name: sorted(p.lost_ids) for p in planes if p.lost_ids}


def _convert_planes(planes, plans, path: str, rank: int, out: Parts, modules: Modules,
                    meta_plane: Plane | None) -> None:
    """The planes' op and host frames into ``out``: device planes, then host planes (whose
    XLA CPU thunks are the ops when no device plane has any), then one frame each."""
    op_frames, host_frames, step_spans = _device_planes(plans, path, out, modules)
    cpu_only = not op_frames
    host_more, host_steps, cpu_ops = _host_planes(planes, path, out, modules, cpu_only)
    host_frames.extend(host_more)
    if cpu_only and cpu_ops:
        op_frames = cpu_ops
        dev = DeviceInfo(name="CPU", index=0, extra={"platform": "cpu", "host": out.hostname})
        if meta_plane is not None:
            for k in ("cpu_version", "process_id"):
                if k in meta_plane.stats:
                    dev.extra[k] = meta_plane.stats[k]
        out.devices.append(dev)

    if out.stats.get("xplane.loop_containers"):
        out.warnings.append(
            f"{out.stats['xplane.loop_containers']} XLA control-flow container events "
            f"(while/conditional/call, {out.stats['xplane.loop_container_ns'] / 1e6:.3f} ms in "
            "all) are not op rows: their time is that of the body ops they enclose, which are "
            "rows once per iteration; as rows they would count that time twice and rank a "
            "loop as an op")
    for f in modules.failed:
        out.warnings.append(f"HLO module not costed: {f}")
    op_frames = [with_sources(f, modules) for f in op_frames]  # jax source location columns
    _collect(op_frames, host_frames, step_spans, host_steps, rank, out)


def _device_planes(plans, path: str, out: Parts, modules: Modules):
    """The op frames of the device planes' op lines, their ``Steps``/``XLA Modules``
    annotation rows, and each device's step spans (ordinal → (start, end, step))."""
    step_spans: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    host_frames: list[pl.DataFrame] = []
    op_frames: list[pl.DataFrame] = []
    for plane, dev_type, ordinal, names, op_lines, device_clock in plans:
        frames = []
        for i in op_lines:
            line = _safe_line(plane, i, out, path)
            df = device_ops(plane, line, ordinal, device_clock, modules, out) if line else None
            if df is not None and df.height:
                frames.append(df)
        for i, n in enumerate(names):
            if n in (STEPS, XLA_MODULES):
                line = _safe_line(plane, i, out, path)
                if line is None or line.events is None or not len(line.events):
                    continue
                rows = annotation_rows(plane, line, "gpu_annotation", plane.name)
                if n == STEPS:
                    step_spans[ordinal] = device_step_spans(plane, line)
                    rows = rows.with_columns(
                        pl.col("name").alias("annotation"),
                        pl.Series("name", [marker_name(k) for k in step_spans[ordinal][2]],
                                  dtype=pl.String))
                host_frames.append(rows)
            elif n == ASYNC_XLA_OPS:
                line = _safe_line(plane, i, out, path)
                out.stats["xplane.async_ops_skipped"] += len(line.events) if line and line.events else 0
        if not frames:
            out.stats["xplane.empty_device_planes"] += 1
            continue
        out.devices.append(device_info(plane, dev_type, ordinal, out.hostname))
        op_frames.extend(frames)
    return op_frames, host_frames, step_spans


def _host_planes(planes, path: str, out: Parts, modules: Modules, cpu_only: bool):
    """The host planes' rows (annotations, launches), step spans, and (``cpu_only``) their
    XLA CPU thunk op frames."""
    host_frames: list[pl.DataFrame] = []
    host_steps: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    cpu_ops: list[pl.DataFrame] = []
    for plane in planes:
        if not plane.name.startswith("/host:") or plane.name == "/host:metadata":
            continue
        for i in range(len(plane.scan.line_ranges)):
            line = _safe_line(plane, i, out, path)
            if line is None or line.events is None or not len(line.events):
                continue
            frame, steps = host_rows(plane, line)
            if frame is not None:
                host_frames.append(frame)
            if steps is not None:
                host_steps.append(steps)
            if cpu_only:
                df = cpu_thunk_ops(plane, line, modules, out)
                if df is not None and df.height:
                    cpu_ops.append(df)
    return host_frames, host_steps, cpu_ops


def _collect(op_frames: list[pl.DataFrame], host_frames: list[pl.DataFrame], step_spans: dict,
             host_steps: list, rank: int, out: Parts) -> None:
    """One op frame (rows by device, stream, start; each op's step) and one host frame into ``out``."""
    # row order: device, stream, start (as the Kineto reader): frames are whole lines, each
    # already in time order, so ordering the frames is enough -- no gather of the whole table
    op_frames.sort(key=lambda f: (f["device"][0], f["stream"][0]))
    # rank and host per frame: every column of the concatenation is then chunked alike
    op_frames = [f.with_columns(pl.lit(rank, pl.Int32).alias("rank"),
                                pl.lit(out.hostname, pl.String).alias("host"))
                 for f in op_frames]
    ops = pl.concat(op_frames, how="diagonal_relaxed") if op_frames else None
    if ops is not None:
        ops = assign_steps(ops, step_spans, host_steps)
        out.ops.append(ops)
    host_frames = [h for h in host_frames if h is not None and h.height]
    if host_frames:
        host = pl.concat(host_frames, how="diagonal_relaxed")
        out.host.append(host.with_columns(pl.lit(rank, pl.Int32).alias("rank")))


#: Threads decoding lines in parallel (numpy releases the GIL in the decoder's array work).
MAX_THREADS = min(8, os.cpu_count() or 1)


def _decode(plane: Plane, i: int):
    try:
        return plane.scan.line(i)
    except xp.WireError as err:
        return err


class LineFeed:
    """Decodes the lines the conversion will ask for, in that order, a few ahead on a thread
    pool: parallel on multi-core machines, while at most ``2 * threads`` decoded lines wait
    in memory (a line's columns are freed once it has become a frame)."""

    def __init__(self, jobs: list[tuple[Plane, int]], threads: int = MAX_THREADS) -> None:
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

    def get(self, plane: Plane, i: int):
        """Line ``i`` of ``plane`` decoded (or the :class:`~.xplane_proto.WireError` it raised)."""
        fut = self.futures.pop((id(plane), i), None)
        if fut is None:
            return _decode(plane, i)
        self._submit()
        return fut.result()

    def close(self) -> None:
        """Stop the decoding threads (lines not asked for are dropped)."""
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
        self.jobs, self.futures = [], {}


def _safe_line(plane: Plane, i: int, out: Parts, path: str, want=None) -> xp.LineScan | None:
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
