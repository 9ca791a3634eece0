"""Recovery of a damaged Kineto event array: split at event boundaries, decode event by
event, repair what can be repaired (invalid UTF-8, raw control characters, unescaped quotes
and backslashes in names), drop and count the rest, with byte offsets (BC-01, BC-02, BC-35).

Used by the in-memory decoder (:mod:`.kineto_decode`) when the strict decode fails, and by
the streaming decoder (:mod:`.kineto_stream`) for a damaged piece or a cut end.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

from .kineto_events import (
    BOUNDARY,
    DECODE_ERRORS,
    EVENT_DECODER,
    EVENTS_KEY,
    HEADER_DECODER,
    LEADING_WS,
    Decoded,
    DecodeStats,
    Event,
    OnChunk,
    Top,
    decode_header_prefix,
    merge_headers,
)


def _event_pieces(buf: bytes, start: int, end: int | None = None) -> list[tuple[int, int]]:
    """Byte ranges of the candidate events of ``buf[start:end]``, split at every ``}, {``
    boundary; the last range runs to ``end`` (it may hold the array's closing bracket and
    the header keys after it, or a cut-off event)."""
    end = len(buf) if end is None else end
    prev = LEADING_WS.match(buf, start, end).end()  # type: ignore[union-attr]
    pieces: list[tuple[int, int]] = []
    for m in BOUNDARY.finditer(buf, start, end):
        pieces.append((prev, m.start() + 1))
        prev = m.end() - 1  # the next event's '{'
    pieces.append((prev, end))
    return pieces


def recover(data: bytes, on_chunk: OnChunk, stats: DecodeStats) -> Decoded:
    """Decode a whole Kineto file that is not valid JSON: the header keys before the event
    array (empty when they do not decode), its events one by one (repaired, or dropped and
    counted in ``stats`` with their byte offsets), handed to ``on_chunk`` in batches, and
    the header keys after it.

    Raises:
        ValueError: ``data`` holds no ``"traceEvents": [`` at all.
    """
    m = EVENTS_KEY.search(data)
    if m is None:
        raise ValueError("no 'traceEvents' array found")
    header = decode_header_prefix(data[: m.start()])
    tail_header = recover_region(data, m.end(), 0, on_chunk, stats)
    if tail_header is not None:
        header = merge_headers(header, tail_header)
    return Decoded(header, stats)


def recover_region(
    buf: bytes, start: int, base: int, on_chunk: OnChunk, stats: DecodeStats
) -> Top | None:
    """Recover the events of ``buf[start:]``, the rest of the event array up to the END of
    the file (``buf[0]`` is byte ``base`` of the file), one by one; returns the header decoded
    after the array, if any.

    When the array's end can be told (:func:`find_array_end`: ``}`` ``]`` and a header tail
    that decodes) the tail is not split into events, even when it holds arrays of objects
    (``deviceProperties``). Otherwise the last candidate event is split by
    :func:`_split_tail`, which also notices a file cut mid-event.
    """
    end = find_array_end(buf, start)
    if end is not None:
        close, tail_header = end
        recover_events(buf, start, close, base, on_chunk, stats)
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


def find_array_end(buf: bytes, start: int) -> tuple[int, Top | None] | None:
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
            return close, HEADER_DECODER.decode(b"{" + tail[1:])
        except DECODE_ERRORS:
            continue
    return None


def recover_events(
    buf: bytes, start: int, end: int, base: int, on_chunk: OnChunk, stats: DecodeStats
) -> None:
    """Events of ``buf[start:end]`` (a run of ``{...}, {...}`` from the event array, without
    its brackets; ``buf[0]`` is byte ``base`` of the file), one by one as :func:`recover`
    reads them: repaired where possible, else dropped and counted."""
    pieces = ((buf[a:b].strip().rstrip(b",").rstrip(), base + a) for a, b in _event_pieces(buf, start, end))
    _decode_each(((chunk, at) for chunk, at in pieces if chunk), on_chunk, stats)


#: events handed over at a time by the event-by-event recovery
_RECOVERY_BATCH = 50_000


def _decode_each(
    chunks: Iterable[tuple[bytes, int]], on_chunk: OnChunk, stats: DecodeStats
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
        return EVENT_DECODER.decode(chunk)
    except DECODE_ERRORS:
        pass
    fixed, n_enc = _repair(chunk)
    try:
        ev = EVENT_DECODER.decode(fixed)
    except DECODE_ERRORS:
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
#: the ``name`` key and the opening quote of its value, and the end of that value (its closing
#: quote and the next key); :func:`_fix_name_quotes` pairs the first of the one with the
#: nearest of the other (one regex of both, ``(key)(.*?)(end)``, tried every ``"name"`` of a
#: chunk in turn: a chunk of n bytes holding k names and no end cost O(n k), and the recovery
#: of a damaged 238 KB event array hung on it, found by fuzzing in session 20)
_NAME_KEY = re.compile(rb'"name"\s*:\s*"')
_NAME_END = re.compile(rb'"\s*,\s*"(?:pid|tid|ts|dur|ph|cat|args|id|s|bp)"\s*:')


def _fix_escape(m: re.Match[bytes]) -> bytes:
    body = m.group(1)
    if len(body) == 5 or body in (b"\\", b'"', b"/", b"b", b"f", b"n", b"r", b"t"):
        return m.group(0)
    return b"\\\\" + body  # a lone backslash (Windows path): escape it


def _fix_name_quotes(chunk: bytes) -> bytes:
    """``chunk`` with the unescaped double quotes inside its first ``name`` value escaped (the
    value from the key's opening quote to the nearest closing quote followed by a known key),
    in one pass: the first match of ``(key)(.*?)(end)`` (re.S) in linear time."""
    key = _NAME_KEY.search(chunk)
    if key is None:
        return chunk
    end = _NAME_END.search(chunk, key.end())
    if end is None:
        return chunk
    inner = re.sub(rb'(?<!\\)"', rb'\\"', chunk[key.end():end.start()])
    return chunk[:key.end()] + inner + chunk[end.start():]


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
    chunk = _fix_name_quotes(chunk)
    return chunk, n_enc


def _split_tail(chunk: bytes, stats: DecodeStats, offset: int, size: int) -> tuple[bytes, Top | None]:
    """The last piece: ``{event} ] , "header": ... }`` or a cut-off event."""
    chunk = chunk.rstrip().rstrip(b",").rstrip()
    try:
        EVENT_DECODER.decode(chunk)
        # ends exactly with an event, no closing bracket: the file was cut between two events
        stats.truncated_at = size
        stats.truncated_mid_event = False
        return chunk, None
    except DECODE_ERRORS:
        pass
    idx = len(chunk)
    for _ in range(64):
        idx = chunk.rfind(b"]", 0, idx)
        if idx < 0:
            break
        head = chunk[:idx].rstrip()
        tail = chunk[idx + 1 :].lstrip()
        try:
            EVENT_DECODER.decode(head) if head else None
        except DECODE_ERRORS:
            try:
                EVENT_DECODER.decode(_repair(head)[0])
            except DECODE_ERRORS:
                continue
        header = None
        if tail.startswith(b","):
            try:
                header = HEADER_DECODER.decode(b"{" + tail[1:])
            except DECODE_ERRORS:
                header = None
        return head, header
    # no closing bracket that works: the file was cut inside the last event
    stats.truncated_at = size
    stats.dropped += 1
    if len(stats.dropped_offsets) < 20:
        stats.dropped_offsets.append(offset)
    return b"", None

