"""Kineto JSON (``torch.profiler`` / ``export_chrome_trace``) → :class:`~traceroof.trace.Trace`.

One file is one rank, except SGLang's merged traces: their pids carry rank labels
(``"[TP00-PP01] 1"``) and the file is split into those ranks (:mod:`.kineto_ranks`). Device ops are ``kernel``/``gpu_memcpy``/``gpu_memset`` events (and
their PyTorch 1.8 spellings, see :mod:`.kineto_vocab`); the host table keeps framework ops,
runtime/driver calls, annotations and syncs. Links: kernel ``correlation`` → runtime call
(launch time) → ``External id`` → innermost ``cpu_op`` (shapes, dtypes). Times are
converted once, exactly, to int64 ns relative to the first event of the file.

Raises :class:`~traceroof.errors.TraceFormatError` (naming the file, the byte offset and
what was expected) for input that is not a Kineto trace or has nothing recoverable. A
damaged trace keeps every event that can be read; what was lost is in ``meta.warnings``.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import polars as pl

from ..errors import InputNotFoundError, TraceFormatError, path_text
from ..host import no_device_ops_reason
from ..step_markers import WINDOW_CAT, WINDOW_END, WINDOW_START
from ..trace import DeviceInfo, Trace, TraceMeta
from . import kineto_vocab as V
from .gzip_stream import GZIP_MAGIC, byte_reader, gunzip
from .kineto_columns import as_int, device_frame, host_frame
from .kineto_decode import decode
from .kineto_events import Event
from .kineto_native import ENV_DECODER, Columns
from .kineto_ranks import build_labelled, has_rank_labels, label_from_file_name
from .kineto_stream import STREAM_BLOCK_BYTES, StreamFormatError, decode_stream
from .kineto_times import raw_us_to_ns
from .text_head import (
    bom_bytes,
    encoding_problem,
    only_ws_problem,
    other_encoding,
    skip_to_text,
)

logger = logging.getLogger(__name__)

#: Decompressed JSON below this many bytes is decoded by msgspec rather than the native
#: scanner. Measured (session 8, ``docs/performance.md`` "Small traces (session 8)", in one
#: process, CPU): the msgspec path costs 2.7-5.2 ms per decompressed MB more than the scanner
#: (+29 ms at 8.6 MB, +39 ms at 14.2 MB, +80 ms at 15.4 MB), and the scanner's numpy columns
#: cost ``import numpy`` (~55-90 ms) once per process, so below ~15 MB the msgspec path is the
#: faster. Both paths give equal tables (``tests/test_kineto_native_equal.py``), so this
#: changes the speed only.
NATIVE_MIN_BYTES = 15 * 10**6

#: Once numpy is loaded (by an earlier read, another reader, the caller) the scanner costs no
#: import: from this size on it is the faster (bert, 1.08 MB: msgspec 3 ms faster; 8.6 MB:
#: the scanner 29 ms faster).
NATIVE_WARM_MIN_BYTES = 2 * 10**6

#: decompressed JSON bytes msgspec has read in this process because of the size line; from
#: :data:`NATIVE_MIN_BYTES` on the scanner reads every file: many files each below the line
#: (ranks) pay at most about one ``import numpy`` of extra decoding, not one per file
_msgspec_json_bytes = 0

_RANK_IN_NAME = re.compile(r"(?:rank|worker)[-_]?(\d+)", re.I)


#: ``progress(bytes_read, events)``: see :func:`read`
Progress = Callable[[int, int], None]


def read(path: str | os.PathLike[str], *, rank: int | None = None, progress: Progress | None = None) -> Trace:
    """Read one Kineto trace file (``.json`` or ``.json.gz``), streaming it.

    The file is decoded block by block (a gzip file is inflated as it is read): memory holds
    the tables being built and a few MB of JSON, never the whole file. The result equals
    :func:`read_bytes` of the file's content.

    Args:
        path: the file.
        rank: override the rank (otherwise ``distributedInfo.rank``, else a ``rank-N`` /
            ``workerN`` pattern in the file name, else 0).
        progress: called as ``progress(bytes_read, events)`` after each decoded piece (every
            few MB): ``bytes_read`` is the number of bytes read from the FILE so far
            (compressed bytes for a ``.gz``, so ``bytes_read / file size`` is the fraction
            done), ``events`` the number of trace events decoded so far.

    Raises:
        InputNotFoundError: the file does not exist.
        TraceFormatError: not a Kineto trace, or nothing recoverable in it.
        OSError: the file cannot be read.
    """
    p = Path(path)
    if not p.is_file():
        raise InputNotFoundError(f"{path_text(p)}: no such file")
    with open(p, "rb") as fh:
        size = _json_size_bytes(fh, p.stat().st_size)
        return read_fileobj(fh, path=path_text(p), rank=rank, progress=progress, json_bytes=size)


def _json_size_bytes(fh: BinaryIO, file_bytes: int) -> int:
    """The decompressed JSON size of the file open as ``fh`` (left at offset 0), for the
    choice of decoder only (:data:`NATIVE_MIN_BYTES`): ``file_bytes`` for plain JSON; for
    gzip, the larger of ``file_bytes`` and the ISIZE trailer (the last member's size mod
    2**32, RFC 1952 section 2.3.1), so a multi-member or > 4 GiB file is at worst called big
    or sized by its compressed bytes. Never raises on a short or odd file (it is then sized
    by ``file_bytes``; the decoder reports what is wrong with it)."""
    try:
        magic = fh.read(2)
        if magic != GZIP_MAGIC or file_bytes < 18:  # 10-byte header + 8-byte trailer
            return file_bytes
        fh.seek(file_bytes - 4)
        return max(file_bytes, int.from_bytes(fh.read(4), "little"))
    finally:
        fh.seek(0)


def read_fileobj(
    fh: BinaryIO, *, path: str, rank: int | None = None, progress: Progress | None = None,
    block_bytes: int = STREAM_BLOCK_BYTES, json_bytes: int | None = None,
) -> Trace:
    """Read a Kineto trace from a binary file object (plain JSON or gzip, sniffed), streaming.

    For tar members (``tarfile.extractfile``) and other streams; see :func:`read`.

    Args:
        fh: read with ``fh.read(n)`` from its current position to its end; not closed.
        path: names the trace in messages and ``meta.sources`` (also the rank fallback).
        rank: see :func:`read`.
        progress: see :func:`read`; ``bytes_read`` counts bytes read from ``fh``.
        block_bytes: decompressed JSON bytes decoded at once (memory vs. per-piece overhead).
        json_bytes: the decompressed JSON size when known (None: unknown, taken as big); below
            :data:`NATIVE_MIN_BYTES` msgspec decodes it instead of the native scanner (the
            same tables, faster for a small file: no ``import numpy``) unless
            ``TRACEROOF_DECODER=native``.

    Raises:
        TraceFormatError: not a Kineto trace, or nothing recoverable in it.
        OSError: reading ``fh`` failed.
    """
    builder = _Builder(path)
    try:
        decoded = decode_stream(fh, builder.add_chunk, path=path, block_bytes=block_bytes, progress=progress,
                                native=_use_native(json_bytes, path))
    except StreamFormatError as exc:
        raise TraceFormatError(path, exc.where, exc.expected) from exc
    except ValueError as exc:
        raise TraceFormatError(path, "byte 0", f"a Kineto trace: {exc}") from exc
    return builder.finish(decoded, rank=rank)


def read_bytes(data: bytes, *, path: str = "<bytes>", rank: int | None = None) -> Trace:
    """Read a Kineto trace from bytes (gzip-compressed or plain JSON), in memory.

    The whole (decompressed) content is held while it is decoded; :func:`read` and
    :func:`read_fileobj` stream instead, with the same result. Raises as :func:`read`.
    """
    if data[:2] == GZIP_MAGIC:
        data, exc = gunzip(data)  # (of a cut or corrupt stream, what inflates before the fault)
        if exc is not None and not data:
            raise TraceFormatError(path, "byte 0", f"a readable gzip stream ({exc})") from exc
    data = _check_text(data, path)
    builder = _Builder(path)
    try:
        decoded = decode(data, builder.add_chunk, path=path, native=_use_native(len(data), path))
    except ValueError as exc:
        raise TraceFormatError(path, "byte 0", f"a Kineto trace: {exc}") from exc
    del data  # the file's bytes are no longer needed while the tables are linked
    return builder.finish(decoded, rank=rank)


def _check_text(data: bytes, path: str) -> bytes:
    """``data`` with a UTF-8 byte-order mark turned into white space (offsets unchanged: a
    copy, only when there is one), once its first byte of text, past white space (up to
    :data:`.text_head.MAX_LEADING_WS_BYTES`), is the ``{`` of a JSON object.

    Raises:
        TraceFormatError: empty, only white space, UTF-16/32 text, or not a JSON object.
    """
    encoding = other_encoding(data)  # first, on the bytes as they are (a UTF-16 "{" is "{" then a zero)
    if encoding is not None:
        raise TraceFormatError(path, "byte 0", encoding_problem(encoding))
    text, at, over = skip_to_text(data[:_HEAD_BYTES], byte_reader(data, _HEAD_BYTES), 1)
    if over or not text:
        raise TraceFormatError(path, f"byte {at if over else 0}", only_ws_problem() if over else
                               "a Kineto JSON trace, found an empty file")
    if text != b"{":
        raise TraceFormatError(path, f"byte {at}", "a JSON object with a 'traceEvents' array (Kineto / torch.profiler trace)")
    return b"   " + data[3:] if bom_bytes(data) else data


#: the bytes of a file's head looked at first for its first byte of text
_HEAD_BYTES = 4096


def _use_native(json_bytes: int | None, path: str) -> bool:
    """Whether to ask for the native scanner for ``path``, ``json_bytes`` decompressed bytes
    (None: unknown): at :data:`NATIVE_MIN_BYTES` and above (counting what msgspec has read
    in this process before), at :data:`NATIVE_WARM_MIN_BYTES` and above once numpy is
    loaded, or at any size with
    ``TRACEROOF_DECODER=native`` (the equality tests and fuzzing of the scanner's path;
    ``=python`` switches the scanner off at any size, :func:`.kineto_native.active`)."""
    if os.environ.get(ENV_DECODER, "").strip().lower() in ("native", "python"):
        return True  # forced either way: kineto_native.native_scanner obeys it and logs why
    global _msgspec_json_bytes
    if json_bytes is None or json_bytes + _msgspec_json_bytes >= NATIVE_MIN_BYTES:
        return True
    if "numpy" in sys.modules and json_bytes >= NATIVE_WARM_MIN_BYTES:
        return True
    _msgspec_json_bytes += json_bytes
    logger.debug("%s: Kineto decoder: msgspec (%d bytes of JSON, below %d)", path, json_bytes, NATIVE_MIN_BYTES)
    return False


class _Builder:
    """Accumulates column chunks; no per-event objects survive a chunk."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.dev_frames: list[pl.DataFrame] = []
        self.host_frames: list[pl.DataFrame] = []
        self.meta_names: dict[tuple[str, str], str] = {}
        self.counts: dict[str, int] = {}
        self.empty_events = 0
        self.negative_dur = 0
        self.unknown_phases: dict[str, int] = {}
        self.mem_samples = 0
        self.counter_samples = 0
        self.flows = 0
        self.python_events = 0
        self.profiler_ranges = 0
        #: the native pieces' rows (``kineto_native_frames.NativeRows``, which imports numpy),
        #: made at the first native piece: a file msgspec decodes never imports numpy
        self.native: Any = None

    # ------------------------------------------------------------------ chunk
    def add_chunk(self, events: list[Event] | Columns) -> None:
        """Turn one decoded chunk into a device and a host column frame.

        One pass sorts the events (and counts the ones that are not kept); the columns are
        then built field by field (:mod:`.kineto_columns`) and converted in bulk. A piece
        the native scanner read (:class:`~.kineto_native.Columns`) is sorted on its codes
        (:mod:`.kineto_native_frames`); its frames are made with the next msgspec chunk or
        at :meth:`finish`, so the frames stay in file order.
        """
        if isinstance(events, Columns):
            if self.native is None:
                from .kineto_native_frames import NativeRows

                self.native = NativeRows(self)
            self.native.add(events)
            return
        if self.native is not None:
            self.native.flush()
        dev, d_cat, host, h_cat = self._sort(events)
        # all the times of the chunk in one conversion (it works value by value): one query
        # instead of four, each with its fixed cost
        nd, nh = len(dev), len(host)
        if not (nd or nh):
            return
        times = raw_us_to_ns([e.ts for e in dev] + [e.dur for e in dev] + [e.ts for e in host] + [e.dur for e in host])
        if dev:
            self.dev_frames.append(device_frame(dev, d_cat, times.slice(0, nd), times.slice(nd, nd)))
        if host:
            self.host_frames.append(host_frame(host, h_cat, times.slice(2 * nd, nh), times.slice(2 * nd + nh, nh)))

    def _sort(self, events: list[Event]) -> tuple[list[Event], list[str], list[Event], list[str]]:
        """Sort a chunk's events into device ops and host events, each with its normalised
        category (:mod:`.kineto_vocab`); count the rest (per category, per phase, empty
        events, flows, samples) and keep the process/thread names of ``M`` events.

        Returns ``(device events, their kinds, host events, their host categories)``.
        """
        counts = self.counts
        dev_cats = V.DEVICE_CATEGORIES
        host_cats = V.HOST_CATEGORIES
        range_cats = V.PROFILER_RANGE_CATEGORIES
        dev: list[Event] = []
        d_cat: list[str] = []
        host: list[Event] = []
        h_cat: list[str] = []
        empty = python_events = profiler_ranges = flows = mem = counters = 0
        for e in events:
            ph = e.ph
            if ph == "X":
                if not len(e.ts):
                    empty += 1
                    continue
                cat = e.cat
                counts[cat] = counts.get(cat, 0) + 1
                dk = dev_cats.get(cat)
                if dk is not None:
                    dev.append(e)
                    d_cat.append(dk)
                    continue
                hk = host_cats.get(cat)
                if hk is not None:
                    host.append(e)
                    h_cat.append(hk)
                    continue
                if cat == "python_function":
                    python_events += 1
                elif cat in range_cats:
                    profiler_ranges += 1
            elif ph is None or (ph != "M" and not len(e.ts)):
                empty += 1
            else:
                cat = e.cat
                counts[cat] = counts.get(cat, 0) + 1
                if ph == "M":
                    a = e.args
                    if a is not None and isinstance(a.name, str) and e.name in ("process_name", "thread_name"):
                        self.meta_names[
                            (e.name, str(e.pid) if e.name == "process_name" else f"{e.pid}/{e.tid}")
                        ] = a.name
                elif ph in ("s", "f", "t"):
                    flows += 1
                elif ph in ("i", "I"):
                    if e.name == "[memory]":
                        mem += 1
                    elif isinstance(e.name, str) and (e.name.startswith(WINDOW_START) or e.name == WINDOW_END):
                        host.append(e)  # the recording window's edges (traceroof.timeline)
                        h_cat.append(WINDOW_CAT)
                elif ph == "C":
                    counters += 1
                else:
                    self.unknown_phases[str(ph)] = self.unknown_phases.get(str(ph), 0) + 1
        self.empty_events += empty
        self.python_events += python_events
        self.profiler_ranges += profiler_ranges
        self.flows += flows
        self.mem_samples += mem
        self.counter_samples += counters
        return dev, d_cat, host, h_cat

    @staticmethod
    def _take(frames: list[pl.DataFrame]) -> pl.DataFrame | None:
        """The frames as one (None when there are none), emptying the list."""
        if not frames:
            return None
        df = pl.concat(frames, how="vertical_relaxed")
        frames.clear()
        return df

    # ------------------------------------------------------------------ finish
    def finish(self, decoded: Any, *, rank: int | None) -> Trace:
        if self.native is not None:
            self.native.flush()
            # the frames hold what they need of the scanner's dictionary: the scanner (its string
            # table and the dictionary as Python strings, ~30 MB on a 1 GB trace) goes before linking
            self.native.scanner = None
        header = decoded.header
        st = decoded.stats
        meta = TraceMeta(format="kineto", sources=[self.path])
        meta.stats.update({f"events[{k}]": v for k, v in self.counts.items() if k is not None})
        meta.stats["events"] = st.events
        meta.stats["skipped_empty"] = self.empty_events
        meta.stats["memory_samples"] = self.mem_samples
        meta.stats["counter_samples"] = self.counter_samples
        meta.stats["flow_events"] = self.flows
        meta.stats["python_function_events"] = self.python_events
        if st.repaired or st.dropped or st.encoding_repairs:
            meta.stats["repaired_events"] = st.repaired
            meta.stats["malformed_events"] = st.dropped + st.repaired
            meta.stats["dropped_events"] = st.dropped
            meta.stats["encoding_repairs"] = st.encoding_repairs
        if not st.strict:
            where = ", ".join(f"byte {o}" for o in st.dropped_offsets[:5])
            msg = (
                f"{self.path}: not valid JSON; recovered {st.events} events "
                f"({st.repaired} repaired, {st.dropped} dropped"
                + (f" at {where}" if where else "")
                + ")"
            )
            if st.encoding_repairs:
                msg += f"; {st.encoding_repairs} invalid characters replaced"
            meta.warn(msg)
        if st.truncated_at is not None:
            meta.warn(
                f"{self.path}: trace is truncated at byte {st.truncated_at} "
                f"({'cut mid-event' if st.truncated_mid_event else 'cut between two events'}); "
                f"{st.events} complete events recovered; the last step is "
                "probably incomplete and header keys written after the events may be missing"
            )
        if st.events == 0 and not self.dev_frames and not self.host_frames:
            if not st.strict and st.dropped:
                raise TraceFormatError(
                    self.path, f"byte {st.dropped_offsets[0] if st.dropped_offsets else 0}",
                    "at least one readable trace event; none could be recovered",
                )
        if self.empty_events:
            meta.stats["skipped_empty"] = self.empty_events
        if self.unknown_phases:
            meta.warn(
                "ignored events with unsupported phases: "
                + ", ".join(f"{k}×{v}" for k, v in sorted(self.unknown_phases.items()))
            )

        _read_header(header, meta, self.path)
        ops, host_tbl = self._tables(header, meta, rank)
        if meta.record_shapes is None and "input_dims" in host_tbl.columns:
            # no record_shapes flag in the header (older Kineto): the events say it
            meta.record_shapes = bool(host_tbl["input_dims"].is_not_null().any())
        if ops.height == 0:
            if host_tbl.height == 0 and st.events > 0:
                meta.warn(f"{self.path}: no timed events (metadata only)")
            else:
                meta.warn(f"{self.path}: no device ops (kernels, memcpy, memset); {no_device_ops_reason(host_tbl)}")
        if self.profiler_ranges:
            meta.warn(
                f"{self.path}: recorded in CUPTI profiler-range mode: {self.profiler_ranges} "
                "kernel ranges carry hardware counters but no execution times; they are not "
                "device ops"
            )
        if self.python_events and self.python_events > 0.9 * max(st.events, 1) and ops.height < 10:
            meta.warn(
                f"{self.path}: {self.python_events} of {st.events} events are python_function "
                "frames with almost no device work (host-only noise, e.g. imports under with_stack)"
            )
        return Trace(ops=ops, host=host_tbl, meta=meta)


    def _tables(self, header: Any, meta: TraceMeta, rank: int | None) -> tuple[pl.DataFrame, pl.DataFrame]:
        """The op and host tables (with ``meta.ranks`` and the rank labels): one rank, or in a
        file whose pids carry rank labels (SGLang's merged traces) one rank per label."""
        from .kineto_link import build_tables

        if has_rank_labels(self.dev_frames + self.host_frames):
            # several ranks in one file: built one rank at a time, so links never cross ranks
            return build_labelled(self._take(self.dev_frames), self._take(self.host_frames), meta,
                                  self.path, header_rank=_declared_rank(header))
        if rank is None:
            rank = _rank_from(header, self.path, meta)
        meta.ranks = [rank]
        label = label_from_file_name(Path(self.path).name)
        if label is not None:  # an SGLang per-rank file: its label, as in the merged copy
            meta.rank_labels[rank] = label
        # the column chunks are handed over, not kept: build_tables can free them as it goes
        return build_tables(self._take(self.dev_frames), self._take(self.host_frames), meta, rank=rank)


def _read_header(header: Any, meta: TraceMeta, path: str) -> None:
    props = header.deviceProperties or header.computeProperties or []
    if isinstance(props, dict):
        props = [props]
    for p in props if isinstance(props, list) else []:
        if not isinstance(p, dict):
            continue
        meta.devices.append(
            DeviceInfo(
                name=str(p.get("name", "") or ""),
                index=as_int(p.get("id")),
                compute_major=as_int(p.get("computeMajor", p.get("major"))),
                compute_minor=as_int(p.get("computeMinor", p.get("minor"))),
                num_sms=as_int(p.get("numSms")),
                memory_bytes=as_int(p.get("totalGlobalMem")),
                extra={k: v for k, v in p.items() if isinstance(v, (int, float, str))},
            )
        )
    di = header.distributedInfo
    if isinstance(di, dict):
        ws = as_int(di.get("world_size"))
        if ws is not None and ws - 1 not in _RANKS:
            meta.warn(f"{path}: distributedInfo.world_size {ws} is not a world size (1 to 2^31): ignored")
            ws = None
        meta.world_size = ws
        if di.get("backend"):
            meta.versions["distributed_backend"] = str(di["backend"])
    base = as_int(header.baseTimeNanoseconds)
    if base is not None and not -(2**63) <= base < 2**63:
        meta.warn(f"{path}: baseTimeNanoseconds {base:.3g} is past int64 ns: ignored")
        base = None
    meta.base_time_ns = base
    for key in ("cuda_runtime_version", "cuda_driver_version", "hip_runtime_version", "roctracer_version"):
        v = getattr(header, key)
        if v is not None:
            meta.versions[key] = str(v)
    if header.schemaVersion is not None:
        meta.versions["kineto_schema"] = str(header.schemaVersion)
    if header.record_shapes is not None:
        meta.record_shapes = bool(header.record_shapes)
    tr = header.traceroof
    if isinstance(tr, dict) and tr.get("synthetic"):
        meta.synthetic = True
        meta.warn(f"{path}: SYNTHETIC trace generated by {tr.get('generator', 'traceroof')}, not recorded on hardware")


def _declared_rank(header: Any) -> int | None:
    """``distributedInfo.rank`` of the header, None when it has none."""
    di = header.distributedInfo
    return as_int(di.get("rank")) if isinstance(di, dict) else None


#: the ranks the ``rank`` column (Int32) holds
_RANKS = range(0, 2**31)


def _rank_from(header: Any, path: str, meta: TraceMeta) -> int:
    declared = _declared_rank(header)
    if declared is not None and declared in _RANKS:
        return int(declared)
    if declared is not None:
        meta.warn(f"{path}: distributedInfo.rank {declared} is not a rank (0 to 2^31-1): ignored")
    m = _RANK_IN_NAME.search(Path(path).name)
    if m and int(m.group(1)) in _RANKS:
        meta.warn(f"{path}: no distributedInfo; rank {m.group(1)} taken from the file name")
        return int(m.group(1))
    return 0
