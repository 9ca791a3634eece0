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
from collections.abc import Callable, Iterator
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


@dataclass
class DecodeStats:
    """What the decoder saw and what it had to repair or drop."""

    events: int = 0
    repaired: int = 0
    encoding_repairs: int = 0
    dropped: int = 0
    truncated_at: int | None = None
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
        _recover_events(bytes(raw[bad.pos : bad.end]), _array_offset(data, raw), bad.pos, on_chunk, stats)
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


def _event_pieces(buf: bytes, start: int) -> list[tuple[int, int]]:
    """Byte ranges of the candidate events of ``buf`` from ``start`` on, split at every
    ``}, {`` boundary; the last range runs to the end of ``buf`` (it may hold the array's
    closing bracket and the header keys after it, or a cut-off event)."""
    prev = _LEADING_WS.match(buf, start).end()  # type: ignore[union-attr]
    pieces: list[tuple[int, int]] = []
    for m in _BOUNDARY.finditer(buf, start):
        pieces.append((prev, m.start() + 1))
        prev = m.end() - 1  # the next event's '{'
    pieces.append((prev, len(buf)))
    return pieces


def _recover(data: bytes, on_chunk: Callable[[list[Event]], None], stats: DecodeStats) -> Decoded:
    m = _EVENTS_KEY.search(data)
    if m is None:
        raise ValueError("no 'traceEvents' array found")
    header = _decode_header_prefix(data[: m.start()])
    pieces = _event_pieces(data, m.end())
    tail_header: Top | None = None
    batch: list[Event] = []
    for i, (a, b) in enumerate(pieces):
        chunk = data[a:b].strip()
        if i == len(pieces) - 1:
            chunk, tail_header = _split_tail(chunk, stats, a, len(data))
            if not chunk:
                break
        ev = _decode_one(chunk, stats, a)
        if ev is not None:
            batch.append(ev)
            if len(batch) >= 50_000:
                stats.events += len(batch)
                on_chunk(batch)
                batch = []
    if batch:
        stats.events += len(batch)
        on_chunk(batch)
    if tail_header is not None:
        header = _merge_headers(header, tail_header)
    return Decoded(header, stats)


def _recover_events(
    buf: bytes, base: int, pos: int, on_chunk: Callable[[list[Event]], None], stats: DecodeStats
) -> None:
    """Events of ``buf`` (a run of ``{...}, {...}`` from the event array, without its
    brackets, at ``pos`` in the array that starts at byte ``base`` of the file), one by one
    as :func:`_recover` reads them: repaired where possible, else dropped and counted."""
    batch: list[Event] = []
    for a, b in _event_pieces(buf, 0):
        chunk = buf[a:b].strip().rstrip(b",").rstrip()
        if not chunk:
            continue
        ev = _decode_one(chunk, stats, base + pos + a)
        if ev is not None:
            batch.append(ev)
            if len(batch) >= 50_000:
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
        return chunk, None  # ends exactly with an event: file cut after it
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
    text = prefix.rstrip()
    if text.endswith(b","):
        text = text[:-1]
    try:
        return _HEADER_DECODER.decode(text + b"}")
    except (msgspec.DecodeError, msgspec.ValidationError):
        return Top()


def _merge_headers(a: Top, b: Top) -> Top:
    for f in Top.__struct_fields__:
        if getattr(a, f) is None and getattr(b, f) is not None:
            setattr(a, f, getattr(b, f))
    return a


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
