"""Decoding Kineto JSON bytes into typed events, chunk by chunk, with recovery.

The fast path decodes the top-level object once with ``traceEvents`` kept as raw bytes
(msgspec validates it while skipping), then decodes the event array in chunks of a few MB
into typed :class:`Event` structs that hold only the fields traceroof uses. Each chunk is
turned into columns by the caller before the next is decoded, so no per-event Python
objects outlive their chunk.

When the strict decode fails (one bad string makes a whole Kineto file invalid JSON: BC-01,
BC-02; a crash cut the file: BC-35), the recovery path splits the array at event
boundaries, decodes what it can, repairs what it can (invalid UTF-8, raw control
characters, unescaped quotes/backslashes in names) and drops the rest, counting each and
recording byte offsets.

``ts``/``dur`` are kept as raw JSON number text and converted to int64 ns exactly by
:func:`raw_us_to_ns`, never through float64 (BC-10).
"""

from __future__ import annotations

import logging
import re
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

import msgspec
import polars as pl

logger = logging.getLogger(__name__)

Num = int | float | str | None

#: an absent raw field (msgspec cannot make ``Raw`` optional); ``len(_NO_RAW) == 0``.
_NO_RAW = msgspec.Raw(b"")


class Args(msgspec.Struct, gc=False):
    """The ``args`` keys traceroof reads. Unknown keys are skipped by the decoder."""

    correlation: Num = None
    external_id: Num = msgspec.field(default=None, name="External id")
    external_id_lc: Num = msgspec.field(default=None, name="external id")
    device: Num = None
    stream: Num = None
    input_dims: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input Dims")
    input_dims_lc: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input dims")
    input_type: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input type")
    concrete: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Concrete Inputs")
    nbytes: Num = msgspec.field(default=None, name="bytes")
    coll_name: Num = msgspec.field(default=None, name="Collective name")
    in_nelems: Num = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Num = msgspec.field(default=None, name="Out msg nelems")
    group_size: Num = msgspec.field(default=None, name="Group size")
    dtype: Num = None
    name: Any = None  # M events: process_name / thread_name value
    labels: Any = None
    mem_bytes: Num = msgspec.field(default=None, name="Bytes")


class Event(msgspec.Struct, gc=False):
    """One ``traceEvents`` element, only the fields traceroof uses."""

    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Num = None
    tid: Num = None
    ts: msgspec.Raw = _NO_RAW
    dur: msgspec.Raw = _NO_RAW
    id: Num = None
    args: Args | None = None


class Top(msgspec.Struct):
    """The top-level object. Header keys may come before or after ``traceEvents``."""

    traceEvents: msgspec.Raw = _NO_RAW
    schemaVersion: Any = None
    deviceProperties: Any = None
    computeProperties: Any = None
    distributedInfo: Any = None
    baseTimeNanoseconds: Any = None
    displayTimeUnit: Any = None
    record_shapes: Any = None
    traceName: Any = None
    traceroof: Any = None  # our own generator's marker (synthetic traces)
    cuda_runtime_version: Any = None
    cuda_driver_version: Any = None
    hip_runtime_version: Any = None
    roctracer_version: Any = None


_EVENTS_DECODER = msgspec.json.Decoder(list[Event])
_EVENT_DECODER = msgspec.json.Decoder(Event)
_TOP_DECODER = msgspec.json.Decoder(Top)
_HEADER_DECODER = msgspec.json.Decoder(Top)

#: Candidate boundary between two events: ``}`` ``,`` ``{`` with any whitespace.
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')

CHUNK_BYTES = 4 << 20
#: decompressed bytes per piece when streaming: the decoded events of a piece take ~2.7x its
#: size, so the transient memory is ~10x this; 1 MiB is as fast as 4 MiB on big traces
STREAM_BLOCK_BYTES = 1 << 20


@dataclass
class DecodeStats:
    """What the decoder saw and what it had to repair or drop."""

    events: int = 0
    repaired: int = 0
    encoding_repairs: int = 0
    dropped: int = 0
    truncated_at: int | None = None
    #: the cut fell inside an event (dropped), not between two complete events
    truncated_mid_event: bool = True
    dropped_offsets: list[int] = field(default_factory=list)
    strict: bool = True


@dataclass
class Decoded:
    header: Top
    stats: DecodeStats


def decode(
    data: bytes, on_chunk: Callable[[list[Event]], None], *, path: str = "<bytes>"
) -> Decoded:
    """Decode Kineto JSON ``data``, handing lists of events to ``on_chunk`` as they decode.

    Args:
        data: the whole (decompressed) file.
        on_chunk: called with each decoded list of :class:`Event`, in file order.
        path: for messages.

    Returns:
        The header and the decode statistics.

    Raises:
        ValueError: when ``data`` holds no ``traceEvents`` array at all (the caller turns
            it into a ``TraceFormatError`` naming the file).
    """
    stats = DecodeStats()
    try:
        top = _TOP_DECODER.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        logger.debug("%s: strict decode failed (%s); recovering", path, exc)
        stats.strict = False
        return _recover(data, on_chunk, stats)
    if not len(top.traceEvents):
        raise ValueError("top-level object has no 'traceEvents' array")
    # a view into ``data``, not a copy: the file is held in memory once
    raw = memoryview(top.traceEvents)
    if raw[:1] != b"[":
        raise ValueError("'traceEvents' is not an array")
    try:
        for events in _chunks(raw):
            stats.events += len(events)
            on_chunk(events)
    except _BadPiece as bad:
        # Not valid after all, past the chunks already handed over: the top-level pass does
        # not check what it skips for invalid UTF-8 (BC-02). The rest of the array is read
        # event by event, repairing what it can, as for any damaged file.
        logger.debug("%s: event array invalid from offset %d (%s); recovering", path, bad.pos, bad.__cause__)
        stats.strict = False
        piece = bytes(raw[bad.pos : bad.end])
        _recover_events(piece, 0, len(piece), _array_offset(data, raw) + bad.pos, on_chunk, stats)
    del raw
    top.traceEvents = _NO_RAW
    return Decoded(top, stats)


class _BadPiece(Exception):
    """A piece of the event array that does not decode: raw[pos:end] is left to recover."""

    def __init__(self, pos: int, end: int) -> None:
        super().__init__(pos, end)
        self.pos = pos
        self.end = end


#: how many event boundaries a chunk may be extended by when its cut fell inside a string
_MAX_EXTENSIONS = 16


def _array_offset(data: bytes, raw: memoryview) -> int:
    """Byte offset of the event array in the file (for messages), 0 if it cannot be told."""
    probe = bytes(raw[:256])
    for m in _EVENTS_KEY.finditer(data):
        if data[m.end() - 1 : m.end() - 1 + len(probe)] == probe:
            return m.end() - 1
    return 0


def _chunks(raw: memoryview) -> Iterator[list[Event]]:
    """Split a valid JSON array of events into ~CHUNK_BYTES pieces and decode each."""
    end = len(raw) - 1  # msgspec's Raw is exactly the array's text: it ends with its "]"
    if raw[end:] != b"]":
        end = bytes(raw).rstrip().rfind(b"]")
    body_start = 1
    n = len(raw)
    if n <= CHUNK_BYTES * 1.5:
        try:
            events = _EVENTS_DECODER.decode(raw)
        except msgspec.DecodeError as exc:
            raise _BadPiece(body_start, end) from exc
        yield events
        return
    pos = body_start
    while pos < end:
        target = pos + CHUNK_BYTES
        extensions = 0
        while True:
            m = _BOUNDARY.search(raw, target, end) if target < end else None
            stop = (m.start() + 1) if m else end
            piece = raw[pos:stop]
            try:
                events = _EVENTS_DECODER.decode(b"[" + piece + b"]")
                break
            except msgspec.DecodeError as exc:
                extensions += 1
                if m is None or extensions > _MAX_EXTENSIONS:
                    raise _BadPiece(pos, end) from exc  # bad content, not a cut inside a string
                target = m.end()  # the boundary was inside a string: extend
        yield events
        pos = (m.end() - 1) if m else end


# --------------------------------------------------------------------------- recovery


_LEADING_WS = re.compile(rb"\s*")


def _event_pieces(buf: bytes, start: int, end: int | None = None) -> list[tuple[int, int]]:
    """Byte ranges of the candidate events of ``buf[start:end]``, split at every ``}, {``
    boundary; the last range runs to ``end`` (it may hold the array's closing bracket and
    the header keys after it, or a cut-off event)."""
    end = len(buf) if end is None else end
    prev = _LEADING_WS.match(buf, start, end).end()  # type: ignore[union-attr]
    pieces: list[tuple[int, int]] = []
    for m in _BOUNDARY.finditer(buf, start, end):
        pieces.append((prev, m.start() + 1))
        prev = m.end() - 1  # the next event's '{'
    pieces.append((prev, end))
    return pieces


def _recover(data: bytes, on_chunk: Callable[[list[Event]], None], stats: DecodeStats) -> Decoded:
    m = _EVENTS_KEY.search(data)
    if m is None:
        raise ValueError("no 'traceEvents' array found")
    header = _decode_header_prefix(data[: m.start()])
    tail_header = _recover_region(data, m.end(), 0, on_chunk, stats)
    if tail_header is not None:
        header = _merge_headers(header, tail_header)
    return Decoded(header, stats)


def _recover_region(
    buf: bytes, start: int, base: int, on_chunk: Callable[[list[Event]], None], stats: DecodeStats
) -> Top | None:
    """Recover the events of ``buf[start:]``, the rest of the event array up to the END of
    the file (``buf[0]`` is byte ``base`` of the file), one by one; returns the header decoded
    after the array, if any.

    When the array's end can be told (:func:`_find_array_end`: ``}`` ``]`` and a header tail
    that decodes) the tail is not split into events, even when it holds arrays of objects
    (``deviceProperties``). Otherwise the last candidate event is split by
    :func:`_split_tail`, which also notices a file cut mid-event.
    """
    end = _find_array_end(buf, start)
    if end is not None:
        close, tail_header = end
        _recover_events(buf, start, close, base, on_chunk, stats)
        return tail_header
    pieces = _event_pieces(buf, start)
    tail_header: Top | None = None

    def chunks() -> Iterator[tuple[bytes, int]]:
        nonlocal tail_header
        for i, (a, b) in enumerate(pieces):
            chunk = buf[a:b].strip()
            if i == len(pieces) - 1:
                chunk, tail_header = _split_tail(chunk, stats, base + a, base + len(buf))
                if not chunk:
                    return
            yield chunk, base + a

    _decode_each(chunks(), on_chunk, stats)
    return tail_header


#: ``}`` ``]`` then ``,`` and a key, or the object's closing ``}`` at the very end: where the
#: event array may end (the last event's ``}``, the array's ``]``, the header tail)
_ARRAY_END = re.compile(rb'\}\s*(\])\s*(?:,\s*"|\}\s*\Z)')
#: how far from the end of the file the event array may end (the header tail is small)
_MAX_TAIL_BYTES = 64 << 20


def _find_array_end(buf: bytes, start: int) -> tuple[int, Top | None] | None:
    """``(index of the ']' closing the event array, header decoded after it)`` when the array
    ends in ``buf[start:]`` followed by a header tail that decodes to the end of ``buf``
    (the first such candidate from the left: a candidate inside the tail, e.g. after
    ``deviceProperties``, comes later); None when no candidate works (a cut or damaged end)."""
    for tries, m in enumerate(_ARRAY_END.finditer(buf, max(start, len(buf) - _MAX_TAIL_BYTES))):
        if tries >= 64:
            break
        close = m.start(1)
        tail = buf[close + 1 :].strip()
        if tail == b"}":
            return close, None
        try:
            return close, _HEADER_DECODER.decode(b"{" + tail[1:])
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue
    return None


def _recover_events(
    buf: bytes, start: int, end: int, base: int, on_chunk: Callable[[list[Event]], None], stats: DecodeStats
) -> None:
    """Events of ``buf[start:end]`` (a run of ``{...}, {...}`` from the event array, without
    its brackets; ``buf[0]`` is byte ``base`` of the file), one by one as :func:`_recover`
    reads them: repaired where possible, else dropped and counted."""
    pieces = ((buf[a:b].strip().rstrip(b",").rstrip(), base + a) for a, b in _event_pieces(buf, start, end))
    _decode_each(((chunk, at) for chunk, at in pieces if chunk), on_chunk, stats)


#: events handed over at a time by the event-by-event recovery
_RECOVERY_BATCH = 50_000


def _decode_each(
    chunks: Iterable[tuple[bytes, int]], on_chunk: Callable[[list[Event]], None], stats: DecodeStats
) -> None:
    """Decode ``(event bytes, file offset)`` pairs one by one (:func:`_decode_one`: repaired
    or dropped and counted), handing them to ``on_chunk`` in batches."""
    batch: list[Event] = []
    for chunk, at in chunks:
        ev = _decode_one(chunk, stats, at)
        if ev is not None:
            batch.append(ev)
            if len(batch) >= _RECOVERY_BATCH:
                stats.events += len(batch)
                on_chunk(batch)
                batch = []
    if batch:
        stats.events += len(batch)
        on_chunk(batch)


def _decode_one(chunk: bytes, stats: DecodeStats, offset: int) -> Event | None:
    try:
        return _EVENT_DECODER.decode(chunk)
    except (msgspec.DecodeError, msgspec.ValidationError):
        pass
    fixed, n_enc = _repair(chunk)
    try:
        ev = _EVENT_DECODER.decode(fixed)
    except (msgspec.DecodeError, msgspec.ValidationError):
        stats.dropped += 1
        if len(stats.dropped_offsets) < 20:
            stats.dropped_offsets.append(offset)
        return None
    stats.repaired += 1
    stats.encoding_repairs += n_enc
    return ev


_CTRL = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f]")
_WS_CTRL = re.compile(rb"[\n\r\t]")
_ESCAPE = re.compile(rb"\\(u[0-9a-fA-F]{4}|.)", re.S)
_NAME_VALUE = re.compile(
    rb'("name"\s*:\s*")(.*?)("\s*,\s*"(?:pid|tid|ts|dur|ph|cat|args|id|s|bp)"\s*:)', re.S
)


def _fix_escape(m: re.Match[bytes]) -> bytes:
    body = m.group(1)
    if len(body) == 5 or body in (b"\\", b'"', b"/", b"b", b"f", b"n", b"r", b"t"):
        return m.group(0)
    return b"\\\\" + body  # a lone backslash (Windows path): escape it


def _fix_quotes(m: re.Match[bytes]) -> bytes:
    inner = re.sub(rb'(?<!\\)"', rb'\\"', m.group(2))
    return m.group(1) + inner + m.group(3)


def _repair(chunk: bytes) -> tuple[bytes, int]:
    """Best-effort repair of one event's bytes; returns (bytes, encoding repairs made).

    Repairs, in order: invalid UTF-8 → U+FFFD (BC-02); raw control characters → ``\\u00XX``
    escapes (BC-02); lone backslashes → escaped (BC-01, Windows paths); unescaped double
    quotes inside the ``name`` value → escaped (BC-01, dynamo file names).
    """
    n_enc = 0
    try:
        chunk.decode("utf-8")
    except UnicodeDecodeError:
        text = chunk.decode("utf-8", errors="replace")
        n_enc += text.count("\ufffd")
        chunk = text.encode("utf-8")
    chunk, k = _CTRL.subn(lambda m: b"\\u%04x" % m.group(0)[0], chunk)
    n_enc += k
    chunk = _WS_CTRL.sub(b" ", chunk)
    chunk = _ESCAPE.sub(_fix_escape, chunk)
    chunk = _NAME_VALUE.sub(_fix_quotes, chunk, count=1)
    return chunk, n_enc


def _split_tail(chunk: bytes, stats: DecodeStats, offset: int, size: int) -> tuple[bytes, Top | None]:
    """The last piece: ``{event} ] , "header": ... }`` or a cut-off event."""
    chunk = chunk.rstrip().rstrip(b",").rstrip()
    try:
        _EVENT_DECODER.decode(chunk)
        # ends exactly with an event, no closing bracket: the file was cut between two events
        stats.truncated_at = size
        stats.truncated_mid_event = False
        return chunk, None
    except (msgspec.DecodeError, msgspec.ValidationError):
        pass
    idx = len(chunk)
    for _ in range(64):
        idx = chunk.rfind(b"]", 0, idx)
        if idx < 0:
            break
        head = chunk[:idx].rstrip()
        tail = chunk[idx + 1 :].lstrip()
        try:
            _EVENT_DECODER.decode(head) if head else None
        except (msgspec.DecodeError, msgspec.ValidationError):
            try:
                _EVENT_DECODER.decode(_repair(head)[0])
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue
        header = None
        if tail.startswith(b","):
            try:
                header = _HEADER_DECODER.decode(b"{" + tail[1:])
            except (msgspec.DecodeError, msgspec.ValidationError):
                header = None
        return head, header
    # no closing bracket that works: the file was cut inside the last event
    stats.truncated_at = size
    stats.dropped += 1
    if len(stats.dropped_offsets) < 20:
        stats.dropped_offsets.append(offset)
    return b"", None


def _decode_header_prefix(prefix: bytes) -> Top:
    """The header keys before ``"traceEvents"`` (``{"k": v, ...,``); empty when they do not
    decode."""
    top = _decode_prefix_strict(prefix)
    return Top() if top is None else top


def _decode_prefix_strict(prefix: bytes) -> Top | None:
    """As :func:`_decode_header_prefix`, None when the prefix is not valid JSON."""
    text = prefix.rstrip()
    if text.endswith(b","):
        text = text[:-1]
    try:
        return _HEADER_DECODER.decode(text + b"}")
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def _merge_headers(a: Top, b: Top) -> Top:
    for f in Top.__struct_fields__:
        if getattr(a, f) is None and getattr(b, f) is not None:
            setattr(a, f, getattr(b, f))
    return a


# --------------------------------------------------------------------------- streaming

#: a file whose layout the streaming decoder cannot follow (no ``"traceEvents": [`` key, or a
#: header before it that is not valid JSON) is decoded in memory when it is at most this big
STREAM_FALLBACK_BYTES = 64 << 20

_GZIP_MAGIC = b"\x1f\x8b"
_TRAILING = re.compile(r"trailing characters \(byte (\d+)\)")
#: what follows the ``]`` that closes the event array: ``, "key"`` or the closing ``}``
_AFTER_CLOSE = re.compile(rb'\]\s*(?:,\s*"|\})')
#: ``}`` ``]`` ``, "`` or ``}``: the event array may end here (see :func:`_find_array_end`)
_ARRAY_END_OPEN = re.compile(rb'\}\s*\]\s*(?:,\s*"|\})')


class StreamFormatError(ValueError):
    """The stream is not a Kineto JSON document: ``where`` (``byte N``) and what was
    ``expected`` there, for the caller's ``TraceFormatError``."""

    def __init__(self, where: str, expected: str) -> None:
        super().__init__(f"{where}: expected {expected}")
        self.where = where
        self.expected = expected


class _Source:
    """Decompressed blocks read from a binary file object, plain or gzip (sniffed by magic).

    ``raw_read`` counts the bytes read from the file object (compressed bytes for a gzip
    stream), ``size`` the decompressed bytes handed out. A gzip stream that ends early (a
    cut ``.gz``) or turns corrupt just ends there: everything inflated so far is kept and
    ``gzip_problem`` says why. Trailing bytes after the last gzip member are ignored.
    """

    def __init__(self, fh: Any, block: int) -> None:
        self.fh = fh
        self.block = max(int(block), 1 << 10)
        self.raw_read = 0
        self.size = 0
        self.eof = False
        self.gzip = False
        self.gzip_problem: str | None = None
        self._z: Any = None
        self._started = False

    def _raw(self, n: int) -> bytes:
        b = self.fh.read(n) or b""
        self.raw_read += len(b)
        return bytes(b)

    def read(self) -> bytes:
        """The next block of decompressed bytes (at most ``block``); ``b""`` at the end."""
        if self.eof:
            return b""
        if not self._started:
            self._started = True
            head = self._raw(self.block)
            if head[:2] == _GZIP_MAGIC:
                self.gzip = True
                self._z = zlib.decompressobj(16 + zlib.MAX_WBITS)
                return self._inflate(head)
            return self._out(head)
        if self._z is None:
            return self._out(self._raw(self.block))
        return self._inflate(b"")

    def _out(self, b: bytes) -> bytes:
        if not b:
            self.eof = True
        self.size += len(b)
        return b

    def _inflate(self, data: bytes) -> bytes:
        while True:
            z = self._z
            if not data:
                if z.unconsumed_tail:
                    data = z.unconsumed_tail
                elif z.eof:
                    rest = z.unused_data or self._raw(1 << 16)
                    if rest[:2] != _GZIP_MAGIC:
                        return self._out(b"")
                    self._z = zlib.decompressobj(16 + zlib.MAX_WBITS)  # the next member
                    data = rest
                    continue
                else:
                    data = self._raw(max(self.block // 4, 1 << 16))
                    if not data:
                        # gzip's own words, as the in-memory path reports them
                        self.gzip_problem = "Compressed file ended before the end-of-stream marker was reached"
                        return self._out(b"")
            try:
                out = z.decompress(data, self.block)
            except zlib.error as exc:
                self.gzip_problem = f"corrupt gzip data ({exc})"
                return self._out(b"")
            data = b""
            if out:
                return self._out(out)


class _Buffer:
    """The not yet decoded bytes of the stream: ``data[0]`` is byte ``base`` of the stream."""

    def __init__(self, src: _Source) -> None:
        self.src = src
        self.data = b""
        self.base = 0

    def fill(self, n: int) -> bool:
        """Read until ``data`` holds at least ``n`` bytes; False when the stream ended first."""
        have = len(self.data)
        if have >= n:
            return True
        parts = [self.data]
        while have < n:
            b = self.src.read()
            if not b:
                break
            parts.append(b)
            have += len(b)
        self.data = b"".join(parts)
        return have >= n

    def fill_all(self, cap: int | None = None) -> bool:
        """Read to the end of the stream, or until ``data`` holds ``cap`` bytes; True when the
        end was reached."""
        while not self.src.eof:
            if cap is not None and len(self.data) >= cap:
                return False
            self.fill(len(self.data) + (16 << 20))
        return True

    def take(self, n: int) -> bytes:
        """Remove and return the first ``n`` bytes."""
        out = self.data[:n]
        self.data = self.data[n:]
        self.base += n
        return out


class _Stream:
    """One streaming decode: see :func:`decode_stream`."""

    def __init__(
        self, fh: Any, on_chunk: Callable[[list[Event]], None], path: str, block: int,
        progress: Callable[[int, int], None] | None,
    ) -> None:
        self.src = _Source(fh, block)
        self.buf = _Buffer(self.src)
        self.block = self.src.block
        self.stats = DecodeStats()
        self.path = path
        self._on_chunk = on_chunk
        self._progress = progress

    def emit(self, events: list[Event]) -> None:
        """Hand events on (``stats.events`` counted by the caller) and report progress."""
        if events:
            self._on_chunk(events)
        if self._progress is not None:
            self._progress(self.src.raw_read, self.stats.events)

    def strict(self, events: list[Event]) -> None:
        self.stats.events += len(events)
        self.emit(events)

    # ------------------------------------------------------------------ header
    def _sniff(self) -> None:
        """The checks :func:`~traceroof.parsers.kineto.read_bytes` makes on the first bytes."""
        buf = self.buf
        buf.fill(4096)
        if not buf.data and self.src.gzip_problem:
            raise StreamFormatError("byte 0", f"a readable gzip stream ({self.src.gzip_problem})")
        while not buf.data.lstrip() and buf.fill(len(buf.data) + self.block):
            pass  # more than a block of leading whitespace (rare)
        first = buf.data.lstrip()[:1]
        if not first:
            raise StreamFormatError("byte 0", "a Kineto JSON trace, found an empty file")
        if first != b"{":
            head = buf.data[:4096]
            raise StreamFormatError(
                f"byte {len(head) - len(head.lstrip())}",
                "a JSON object with a 'traceEvents' array (Kineto / torch.profiler trace)",
            )

    def run(self) -> Decoded:
        self._sniff()
        buf = self.buf
        key = None
        scanned = 0
        while True:
            key = _EVENTS_KEY.search(buf.data, max(scanned - 64, 0))
            if key is not None:
                break
            scanned = len(buf.data)
            if scanned > STREAM_FALLBACK_BYTES:
                buf.take(max(scanned - 64, 0))  # a huge prefix: scan on, keep nothing
                scanned = len(buf.data)
            if not buf.fill(len(buf.data) + self.block):
                break
        prefix_ok = key is not None and buf.base == 0 and _decode_prefix_strict(buf.data[: key.start()]) is not None
        if not prefix_ok and buf.base == 0:
            # no events key, or a header that is not valid JSON: a small file is decoded in
            # memory, which gives exactly the in-memory outcome (its error, its recovery)
            if buf.fill_all(STREAM_FALLBACK_BYTES + 1) and len(buf.data) <= STREAM_FALLBACK_BYTES:
                data = buf.take(len(buf.data))
                return decode(data, self.emit, path=self.path)
        if key is None:
            raise ValueError("no 'traceEvents' array found")
        header = _decode_prefix_strict(buf.data[: key.start()]) if buf.base == 0 else None
        if header is None:
            logger.debug("%s: the header before the events is not valid JSON; recovering", self.path)
            self.stats.strict = False
            header = _decode_header_prefix(buf.data[: key.start()]) if buf.base == 0 else Top()
        buf.take(key.end())
        tail = self.events()
        if tail is not None:
            header = _merge_headers(header, tail)
        if self.src.gzip_problem:
            logger.debug("%s: %s at byte %d", self.path, self.src.gzip_problem, self.src.raw_read)
        return Decoded(header, self.stats)

    # ------------------------------------------------------------------ events
    def events(self) -> Top | None:
        """Decode the event array from ``buf`` (just after its ``[``) to its end; returns the
        header decoded after the array (None when there is none or it is broken)."""
        buf = self.buf
        while True:
            if not self._skip_ws():
                return self._recover_rest()  # cut right after '[' or a ','
            if buf.data[:1] == b"]":  # an empty array, or a ',' before it (recovered)
                buf.fill_all()
                return self._tail(buf.data[1:])
            target = self.block
            extensions = 0
            while True:
                m = _BOUNDARY.search(buf.data, target) if target < len(buf.data) else None
                if m is None and not self.src.eof:
                    buf.fill(max(len(buf.data), target) + self.block)
                    continue
                stop = (m.start() + 1) if m else len(buf.data)
                piece = b"".join((b"[", memoryview(buf.data)[:stop], b"]"))
                try:
                    events = _EVENTS_DECODER.decode(piece)
                    break
                except msgspec.DecodeError as exc:
                    end = _closing_bracket(piece, exc)
                    if end is not None:
                        # the array ends in this piece: the rest of the stream is the tail
                        del piece
                        buf.take(end[0])
                        self.strict(end[1])
                        buf.fill_all()
                        return self._tail(buf.data[1:])
                    extensions += 1
                    if m is None or extensions > _MAX_EXTENSIONS:
                        logger.debug("%s: events invalid at byte %d (%s); recovering", self.path, buf.base, exc)
                        self.stats.strict = False
                        return self._recover_piece(stop if m is not None else None)
                    target = m.end()  # the boundary was inside a string: extend
            del piece
            self.strict(events)
            if m is None:
                # the stream ended right after a complete event (no ']'): a cut file, read
                # the way the in-memory recovery reads it (cut between two events)
                self.stats.strict = False
                self.stats.truncated_at = buf.base + len(buf.data)
                self.stats.truncated_mid_event = False
                return None
            buf.take(m.end() - 1)

    def _skip_ws(self) -> bool:
        """Drop leading whitespace (and a stray ``,`` left by a recovered piece); False when
        the stream ends first."""
        buf = self.buf
        while True:
            buf.fill(1)
            n = _LEADING_WS.match(buf.data).end()  # type: ignore[union-attr]
            if n < len(buf.data):
                buf.take(n)
                return True
            buf.take(n)
            if not buf.fill(1):
                return False

    def _tail(self, tail: bytes) -> Top | None:
        """The header keys after the event array (``tail`` follows its ``]``)."""
        t = tail.strip()
        if t == b"}":
            return None
        if t.startswith(b","):
            try:
                return _HEADER_DECODER.decode(b"{" + t[1:])
            except (msgspec.DecodeError, msgspec.ValidationError):
                pass
        self.stats.strict = False  # a cut or broken tail: unreadable, as in memory
        return None

    def _recover_piece(self, stop: int | None) -> Top | None:
        """Recover ``buf.data[:stop]`` (a run of events that does not decode) event by event,
        then go on strictly after it; ``stop`` None: the piece runs to the end of the stream."""
        buf = self.buf
        if stop is not None and _ARRAY_END_OPEN.search(buf.data, 0, stop) is not None:
            # the array may end in the damaged piece: with the rest of the stream (when it
            # is small, as a header tail is) the end can be told
            if buf.fill_all(len(buf.data) + STREAM_FALLBACK_BYTES):
                stop = None
        if stop is None:
            return self._recover_rest()
        base = buf.base
        piece = buf.take(stop)
        _recover_events(piece, 0, len(piece), base, self.emit, self.stats)
        del piece
        self.buf.take(_LEADING_WS.match(buf.data).end())  # type: ignore[union-attr]
        if buf.data[:1] == b",":
            buf.take(1)
        return self.events()

    def _recover_rest(self) -> Top | None:
        """Recover everything left in the stream (bounded by a block or two, or by
        STREAM_FALLBACK_BYTES when a damaged piece may hold the array's end)."""
        buf = self.buf
        buf.fill_all()
        base = buf.base
        region = buf.take(len(buf.data))
        self.stats.strict = False
        return _recover_region(region, 0, base, self.emit, self.stats)


def _closing_bracket(wrapped: bytes, exc: Exception) -> tuple[int, list[Event]] | None:
    """Where the event array closes, when the strict decode of ``wrapped`` (``[`` + piece +
    ``]``) failed because the array ended inside the piece (msgspec: ``trailing characters
    (byte N)``, N at or just past the first character after the array) and the header tail
    follows (``, "key"`` or ``}``): the index of that ``]`` in the piece, and the events
    before it; None otherwise."""
    m = _TRAILING.search(str(exc))
    if m is None:
        return None
    at = int(m.group(1))
    close = wrapped.rfind(b"]", 0, at)
    if close < 1 or len(wrapped[close + 1 : at].strip()) > 1 or not _AFTER_CLOSE.match(wrapped, close):
        return None
    try:
        events = _EVENTS_DECODER.decode(memoryview(wrapped)[: close + 1])
    except msgspec.DecodeError:
        return None
    return close - 1, events


def decode_stream(
    fh: Any,
    on_chunk: Callable[[list[Event]], None],
    *,
    path: str = "<stream>",
    block_bytes: int = STREAM_BLOCK_BYTES,
    progress: Callable[[int, int], None] | None = None,
) -> Decoded:
    """Decode a Kineto JSON stream block by block, holding about two blocks of JSON at once.

    The result equals :func:`decode` on the whole decompressed content: the same events in
    the same order, the same header, the same repairs and drops on damaged input (except
    that a damaged piece does not make the rest of the file be read event by event: a
    string holding ``}, {`` after it is not split). Byte offsets in the statistics
    (``dropped_offsets``, ``truncated_at``) are offsets in the decompressed stream.

    Layout: the header keys before ``"traceEvents": [`` are decoded as a prefix; each piece
    of at least ``block_bytes`` is cut at an event boundary and decoded as one array (cut
    inside a string: extended, as :func:`decode` does). The array's end is where a piece's
    strict decode stops with ``trailing characters`` right after a ``]`` followed by
    ``, "key"`` or ``}``: everything from there to the end of the stream is the header tail
    (it may hold arrays of objects, e.g. ``deviceProperties``). A piece that does not decode
    is recovered event by event (the array's end found by :func:`_find_array_end` when it
    lies in the piece); a stream cut mid-event keeps every complete event and records
    ``truncated_at``. A header prefix that is not valid JSON, or no events key, in a stream
    of at most ``STREAM_FALLBACK_BYTES``: decoded in memory by :func:`decode`.

    Args:
        fh: a binary file object (``read(n)``): a plain file, a gzip stream (recognised by
            its magic bytes and inflated here, member after member), a tar member.
        on_chunk: called with each decoded list of :class:`Event`, in file order.
        path: for messages.
        block_bytes: decompressed bytes per decoded piece (at least 1 KiB; a piece ends at an
            event boundary, so it may be longer).
        progress: called as ``progress(bytes_read, events)`` after each piece: ``bytes_read``
            is the number of bytes read from ``fh`` so far (COMPRESSED bytes for a gzip
            stream, comparable with the file size), ``events`` the events decoded so far
            (``0`` while a small odd file is decoded in memory).

    Returns:
        The header and the decode statistics.

    Raises:
        StreamFormatError: not a Kineto document at all (empty, not a JSON object, not a
            readable gzip stream): where, and what was expected there.
        ValueError: the stream holds no ``traceEvents`` array (the caller names the file).
        OSError: reading ``fh`` failed.
    """
    return _Stream(fh, on_chunk, path, block_bytes, progress).run()


# --------------------------------------------------------------------------- times


def raw_us_to_ns(raws: list[Any]) -> pl.Series:
    """Exact conversion of JSON microsecond numbers (raw text) to int64 nanoseconds.

    ``1708722576381804.130`` → ``1708722576381804130``: the integer and fraction parts are
    combined as integers, never through float64, so 19-digit absolute timestamps keep their
    ns (BC-10). Quoted numbers (``"12.5"``) are accepted. Digits beyond the third decimal are
    rounded half-up. Entries that are ``None``/``null``/not numbers become null.

    Args:
        raws: ``msgspec.Raw`` (or bytes/None) per event, in µs.

    Returns:
        An ``Int64`` series, ns.
    """
    try:
        # the common case: all Raw/bytes (an empty one reads as null: "" is no number)
        joined = b"\n".join(raws)
    except TypeError:
        joined = b"\n".join(r if r is not None and len(r) else b"null" for r in raws)
    if _plain_numbers(joined):
        # Fast path: only ``[-]digits[.d[d[d]]]`` (or null): polars' exact decimal parser
        s = pl.Series("t", [joined.decode("ascii")], dtype=pl.String).str.split("\n").explode()
        if len(s) == len(raws):
            t = pl.col("t")
            missing = (t == "null") | (t == "")
            dec = (t.str.to_decimal(scale=3) * 1000).cast(pl.Int64, strict=False)
            out = s.to_frame("t").select(
                pl.when(missing).then(None).otherwise(dec).alias("ns"),
                (dec.is_null() & ~missing).any().alias("odd"),
            )
            if not out["odd"][0]:
                return out["ns"]
    try:
        text = joined.decode("utf-8")
    except UnicodeDecodeError:
        text = joined.decode("utf-8", "replace")
    s = pl.Series("t", [text], dtype=pl.String).str.split("\n").explode()
    if len(s) != len(raws):  # a raw newline inside a value (not valid JSON): one by one
        s = pl.Series(
            "t", [(bytes(r) if r is not None and len(r) else b"null").decode("utf-8", "replace") for r in raws],
            dtype=pl.String,
        )
    return _us_text_to_ns(s)


_DIGITS_AS_D = bytes.maketrans(b"0123456789", b"dddddddddd")


def _plain_numbers(joined: bytes) -> bool:
    """True when ``joined`` (values separated by newlines) holds only ``null`` and numbers
    of the form ``[-]digits[.ddd]`` (no exponent, quotes, spaces, sign ``+``, leading dot,
    4th decimal or 19th integer digit): the forms where polars' decimal parser and
    :func:`_us_text_to_ns` agree."""
    shape = joined.replace(b"null", b"").translate(_DIGITS_AS_D)  # every digit reads "d"
    return not (
        shape.translate(None, b"d.-\n")  # any other character
        or shape[:1] == b"."
        or b"\n." in shape
        or b"-." in shape
        or b".dddd" in shape
        or b"d" * 19 in shape  # beyond int64 ns anyway (and beyond polars' decimal width)
    )


def _us_text_to_ns(s: pl.Series) -> pl.Series:
    """µs number text (one per row) → int64 ns; see :func:`raw_us_to_ns`."""
    # integer and fraction parts as integers, half-up on the 4th decimal
    t = pl.col("t").str.strip_chars(' "')
    parts = t.str.split_exact(".", 1)
    ip = parts.struct.field("field_0")
    fp = parts.struct.field("field_1").fill_null("")
    neg = ip.str.starts_with("-")
    ip_abs = ip.str.strip_chars_start("-+")
    frac3 = fp.str.slice(0, 3).str.pad_end(3, "0")
    round_up = fp.str.slice(3, 1).fill_null("").is_in(["5", "6", "7", "8", "9"])
    ns = ip_abs.cast(pl.Int64, strict=False) * 1000 + frac3.cast(pl.Int64, strict=False)
    ns = ns + round_up.cast(pl.Int64)
    ns = pl.when(neg).then(-ns).otherwise(ns)
    ns = pl.when(t == "null").then(None).otherwise(ns)
    out = s.to_frame("t").select(ns.alias("ns"), t.str.contains("[eE]").alias("has_exp"))
    ns_s = out["ns"]
    has_exp = out["has_exp"]
    if has_exp.any():
        fixed = [
            _exp_to_ns(v) if e else None
            for v, e in zip(s.str.strip_chars(' "').to_list(), has_exp.to_list())
        ]
        ns_s = pl.select(
            pl.when(has_exp).then(pl.Series(fixed, dtype=pl.Int64)).otherwise(ns_s)
        ).to_series()
    return ns_s.alias("ns").cast(pl.Int64)


def _exp_to_ns(v: str) -> int | None:
    try:
        return int((Decimal(v) * 1000).to_integral_value())
    except (InvalidOperation, ValueError):
        return None
