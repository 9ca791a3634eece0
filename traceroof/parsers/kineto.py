"""Kineto JSON (``torch.profiler`` / ``export_chrome_trace``) → :class:`~traceroof.trace.Trace`.

One file is one rank. Device ops are ``kernel``/``gpu_memcpy``/``gpu_memset`` events (and
their PyTorch 1.8 spellings, see :mod:`.kineto_vocab`); the host table keeps framework ops,
runtime/driver calls, annotations and syncs. Links: kernel ``correlation`` → runtime call
(launch time) → ``External id`` → innermost ``cpu_op`` (shapes, dtypes). Times are
converted once, exactly, to int64 ns relative to the first event of the file.

Raises :class:`~traceroof.errors.TraceFormatError` (naming the file, the byte offset and
what was expected) for input that is not a Kineto trace or has nothing recoverable. A
damaged trace keeps every event that can be read; what was lost is in ``meta.warnings``.
"""

from __future__ import annotations

import gzip
import logging
import os
import re
from pathlib import Path
from typing import Any

import polars as pl

from ..errors import InputNotFoundError, TraceFormatError
from ..schema import HOST_SCHEMA, OP_SCHEMA, empty
from ..trace import DeviceInfo, Trace, TraceMeta
from . import kineto_vocab as V
from .kineto_decode import Event, decode, raw_us_to_ns

logger = logging.getLogger(__name__)

_STREAM_RE = re.compile(r"(\d+)")
_RANK_IN_NAME = re.compile(r"(?:rank|worker)[-_]?(\d+)", re.I)


def read(path: str | os.PathLike[str], *, rank: int | None = None) -> Trace:
    """Read one Kineto trace file (``.json`` or ``.json.gz``).

    Args:
        path: the file.
        rank: override the rank (otherwise ``distributedInfo.rank``, else a ``rank-N`` /
            ``workerN`` pattern in the file name, else 0).

    Raises:
        InputNotFoundError: the file does not exist.
        TraceFormatError: not a Kineto trace, or nothing recoverable in it.
    """
    p = Path(path)
    if not p.is_file():
        raise InputNotFoundError(f"{p}: no such file")
    data = p.read_bytes()
    return read_bytes(data, path=str(p), rank=rank)


def read_bytes(data: bytes, *, path: str = "<bytes>", rank: int | None = None) -> Trace:
    """Read a Kineto trace from bytes (gzip-compressed or plain JSON). See :func:`read`."""
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            data = _gunzip_partial(data)
            if not data:
                raise TraceFormatError(path, "byte 0", f"a readable gzip stream ({exc})") from exc
    stripped = data.lstrip()
    if not stripped:
        raise TraceFormatError(path, "byte 0", "a Kineto JSON trace, found an empty file")
    if stripped[:1] != b"{":
        raise TraceFormatError(
            path, f"byte {len(data) - len(stripped)}",
            "a JSON object with a 'traceEvents' array (Kineto / torch.profiler trace)",
        )
    builder = _Builder(path)
    try:
        decoded = decode(data, builder.add_chunk, path=path)
    except ValueError as exc:
        raise TraceFormatError(path, "byte 0", f"a Kineto trace: {exc}") from exc
    return builder.finish(decoded, rank=rank)


def _gunzip_partial(data: bytes) -> bytes:
    """Decompress as much of a cut gzip stream as possible (BC-35 on .gz files)."""
    import zlib

    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        return d.decompress(data)
    except zlib.error:
        return b""


def _as_int(v: Any) -> int | None:
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return int(v)
    try:
        return int(str(v).strip())
    except ValueError:
        m = _STREAM_RE.search(str(v))
        return int(m.group(1)) if m else None


def _raw_text(r: Any) -> str | None:
    if r is None:
        return None
    b = bytes(r)
    if not b or b == b"null":
        return None
    return b.decode("utf-8", "replace")


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

    # ------------------------------------------------------------------ chunk
    def add_chunk(self, events: list[Event]) -> None:
        d_name: list[Any] = []
        d_cat: list[str] = []
        d_pid: list[Any] = []
        d_tid: list[Any] = []
        d_ts: list[Any] = []
        d_dur: list[Any] = []
        d_dev: list[Any] = []
        d_stream: list[Any] = []
        d_corr: list[Any] = []
        d_ext: list[Any] = []
        d_bytes: list[Any] = []
        d_cname: list[Any] = []
        d_in: list[Any] = []
        d_out: list[Any] = []
        d_gs: list[Any] = []
        d_cdt: list[Any] = []

        h_name: list[Any] = []
        h_cat: list[str] = []
        h_pid: list[Any] = []
        h_tid: list[Any] = []
        h_ts: list[Any] = []
        h_dur: list[Any] = []
        h_corr: list[Any] = []
        h_ext: list[Any] = []
        h_dims: list[Any] = []
        h_types: list[Any] = []
        h_conc: list[Any] = []
        h_cname: list[Any] = []
        h_in: list[Any] = []
        h_out: list[Any] = []
        h_gs: list[Any] = []
        h_cdt: list[Any] = []

        counts = self.counts
        dev_cats = V.DEVICE_CATEGORIES
        host_cats = V.HOST_CATEGORIES
        for e in events:
            ph = e.ph
            if ph is None or (not len(e.ts) and ph != "M"):
                self.empty_events += 1
                continue
            cat = e.cat
            counts[cat] = counts.get(cat, 0) + 1
            if ph == "X":
                a = e.args
                dk = dev_cats.get(cat)
                if dk is not None:
                    d_name.append(e.name)
                    d_cat.append(dk)
                    d_pid.append(e.pid)
                    d_tid.append(e.tid)
                    d_ts.append(e.ts)
                    d_dur.append(e.dur)
                    if a is None:
                        d_dev.append(None); d_stream.append(None); d_corr.append(None)
                        d_ext.append(None); d_bytes.append(None); d_cname.append(None)
                        d_in.append(None); d_out.append(None); d_gs.append(None); d_cdt.append(None)
                    else:
                        d_dev.append(a.device)
                        d_stream.append(a.stream)
                        d_corr.append(a.correlation)
                        d_ext.append(a.external_id if a.external_id is not None else a.external_id_lc)
                        d_bytes.append(a.nbytes)
                        d_cname.append(a.coll_name)
                        d_in.append(a.in_nelems)
                        d_out.append(a.out_nelems)
                        d_gs.append(a.group_size)
                        d_cdt.append(a.dtype)
                    continue
                hk = host_cats.get(cat)
                if hk is not None:
                    h_name.append(e.name)
                    h_cat.append(hk)
                    h_pid.append(e.pid)
                    h_tid.append(e.tid)
                    h_ts.append(e.ts)
                    h_dur.append(e.dur)
                    if a is None:
                        h_corr.append(None); h_ext.append(None); h_dims.append(None)
                        h_types.append(None); h_conc.append(None); h_cname.append(None)
                        h_in.append(None); h_out.append(None); h_gs.append(None); h_cdt.append(None)
                    else:
                        h_corr.append(a.correlation)
                        h_ext.append(a.external_id if a.external_id is not None else a.external_id_lc)
                        dims = a.input_dims if a.input_dims is not None else a.input_dims_lc
                        h_dims.append(dims)
                        h_types.append(a.input_type)
                        h_conc.append(a.concrete)
                        h_cname.append(a.coll_name)
                        h_in.append(a.in_nelems)
                        h_out.append(a.out_nelems)
                        h_gs.append(a.group_size)
                        h_cdt.append(a.dtype)
                    continue
                if cat == "python_function":
                    self.python_events += 1
                elif cat in V.PROFILER_RANGE_CATEGORIES:
                    self.profiler_ranges += 1
            elif ph == "M":
                a = e.args
                if a is not None and isinstance(a.name, str) and e.name in ("process_name", "thread_name"):
                    self.meta_names[(e.name, str(e.pid) if e.name == "process_name" else f"{e.pid}/{e.tid}")] = a.name
            elif ph in ("s", "f", "t"):
                self.flows += 1
            elif ph in ("i", "I"):
                if e.name == "[memory]":
                    self.mem_samples += 1
            elif ph == "C":
                self.counter_samples += 1
            elif ph in ("B", "E", "b", "e", "n"):
                self.unknown_phases[ph] = self.unknown_phases.get(ph, 0) + 1
            else:
                self.unknown_phases[str(ph)] = self.unknown_phases.get(str(ph), 0) + 1

        if d_name:
            self.dev_frames.append(
                pl.DataFrame(
                    {
                        "name": pl.Series(d_name, dtype=pl.String, strict=False),
                        "cat": pl.Series(d_cat, dtype=pl.String),
                        "pid": pl.Series([None if v is None else str(v) for v in d_pid], dtype=pl.String),
                        "tid": pl.Series([None if v is None else str(v) for v in d_tid], dtype=pl.String),
                        "ts_ns": raw_us_to_ns(d_ts),
                        "dur_ns": raw_us_to_ns(d_dur),
                        "device_arg": pl.Series([_as_int(v) for v in d_dev], dtype=pl.Int64),
                        "stream_arg": pl.Series([_as_int(v) for v in d_stream], dtype=pl.Int64),
                        "correlation": pl.Series([_as_int(v) for v in d_corr], dtype=pl.Int64),
                        "external_id": pl.Series([_as_int(v) for v in d_ext], dtype=pl.Int64),
                        "nbytes": pl.Series([_as_int(v) for v in d_bytes], dtype=pl.Int64),
                        "coll_name": pl.Series([None if v is None else str(v) for v in d_cname], dtype=pl.String),
                        "coll_in_nelems": pl.Series([_as_int(v) for v in d_in], dtype=pl.Int64),
                        "coll_out_nelems": pl.Series([_as_int(v) for v in d_out], dtype=pl.Int64),
                        "coll_group_size": pl.Series([_as_int(v) for v in d_gs], dtype=pl.Int64),
                        "coll_dtype": pl.Series([None if v is None else str(v) for v in d_cdt], dtype=pl.String),
                    }
                )
            )
        if h_name:
            self.host_frames.append(
                pl.DataFrame(
                    {
                        "name": pl.Series(h_name, dtype=pl.String, strict=False),
                        "cat": pl.Series(h_cat, dtype=pl.String),
                        "pid": pl.Series([None if v is None else str(v) for v in h_pid], dtype=pl.String),
                        "thread": pl.Series([None if v is None else str(v) for v in h_tid], dtype=pl.String),
                        "ts_ns": raw_us_to_ns(h_ts),
                        "dur_ns": raw_us_to_ns(h_dur),
                        "correlation": pl.Series([_as_int(v) for v in h_corr], dtype=pl.Int64),
                        "external_id": pl.Series([_as_int(v) for v in h_ext], dtype=pl.Int64),
                        "input_dims": pl.Series([_raw_text(v) for v in h_dims], dtype=pl.String),
                        "input_types": pl.Series([_raw_text(v) for v in h_types], dtype=pl.String),
                        "concrete_inputs": pl.Series([_raw_text(v) for v in h_conc], dtype=pl.String),
                        "coll_name": pl.Series([None if v is None else str(v) for v in h_cname], dtype=pl.String),
                        "coll_in_nelems": pl.Series([_as_int(v) for v in h_in], dtype=pl.Int64),
                        "coll_out_nelems": pl.Series([_as_int(v) for v in h_out], dtype=pl.Int64),
                        "coll_group_size": pl.Series([_as_int(v) for v in h_gs], dtype=pl.Int32),
                        "coll_dtype": pl.Series([None if v is None else str(v) for v in h_cdt], dtype=pl.String),
                    }
                )
            )

    # ------------------------------------------------------------------ finish
    def finish(self, decoded: Any, *, rank: int | None) -> Trace:
        from .kineto_link import build_tables

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
                f"(cut mid-event); {st.events} complete events recovered; the last step is "
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
        if rank is None:
            rank = _rank_from(header, self.path, meta)
        meta.ranks = [rank]

        dev = pl.concat(self.dev_frames, how="vertical_relaxed") if self.dev_frames else None
        host = pl.concat(self.host_frames, how="vertical_relaxed") if self.host_frames else None
        self.dev_frames = []
        self.host_frames = []
        ops, host_tbl = build_tables(dev, host, meta, rank=rank)
        if ops.height == 0:
            if host_tbl.height == 0 and st.events > 0:
                meta.warn(f"{self.path}: no timed events (metadata only)")
            else:
                meta.warn(f"{self.path}: no device ops (kernels, memcpy, memset): a CPU-only trace")
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
                index=_as_int(p.get("id")),
                compute_major=_as_int(p.get("computeMajor", p.get("major"))),
                compute_minor=_as_int(p.get("computeMinor", p.get("minor"))),
                num_sms=_as_int(p.get("numSms")),
                memory_bytes=_as_int(p.get("totalGlobalMem")),
                extra={k: v for k, v in p.items() if isinstance(v, (int, float, str))},
            )
        )
    di = header.distributedInfo
    if isinstance(di, dict):
        ws = _as_int(di.get("world_size"))
        meta.world_size = ws
        if di.get("backend"):
            meta.versions["distributed_backend"] = str(di["backend"])
    base = _as_int(header.baseTimeNanoseconds)
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


def _rank_from(header: Any, path: str, meta: TraceMeta) -> int:
    di = header.distributedInfo
    if isinstance(di, dict) and _as_int(di.get("rank")) is not None:
        return int(_as_int(di.get("rank")))  # type: ignore[arg-type]
    m = _RANK_IN_NAME.search(Path(path).name)
    if m:
        meta.warn(f"{path}: no distributedInfo; rank {m.group(1)} taken from the file name")
        return int(m.group(1))
    return 0


def empty_trace(path: str) -> Trace:
    """A Trace with no rows (used for files that hold only metadata)."""
    return Trace(ops=empty(OP_SCHEMA), host=empty(HOST_SCHEMA), meta=TraceMeta(format="kineto", sources=[path]))
