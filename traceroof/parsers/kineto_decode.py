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
recording byte offsets (:mod:`.kineto_recover`). The streaming decoder is in
:mod:`.kineto_stream`, the exact time conversion in :mod:`.kineto_times`.

With ``native=True`` (what :mod:`.kineto` asks for) each piece is first given to the native
scanner (:mod:`.kineto_native`), which hands over its columns directly; a piece it does not
handle is decoded by msgspec as above, so the tables are the same either way.

``ts``/``dur`` are kept as raw JSON number text and converted to int64 ns exactly by
:func:`~.kineto_times.raw_us_to_ns`, never through float64 (BC-10).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import msgspec

from .kineto_events import (
    BOUNDARY,
    DECODE_ERRORS,
    EVENTS_KEY,
    MAX_EXTENSIONS,
    NO_RAW,
    Decoded,
    DecodeStats,
    Event,
    OnChunk,
    Top,
)
from .kineto_native import Scanner, decode_piece, native_scanner

logger = logging.getLogger(__name__)

_TOP_DECODER = msgspec.json.Decoder(Top)

CHUNK_BYTES = 4 << 20


def decode(
    data: bytes, on_chunk: OnChunk, *, path: str = "<bytes>", native: bool = False
) -> Decoded:
    """Decode Kineto JSON ``data``, handing lists of events to ``on_chunk`` as they decode.

    Args:
        data: the whole (decompressed) file.
        on_chunk: called with each decoded list of :class:`Event`, in file order (or, with
            ``native``, a :class:`~.kineto_native.Columns` for each piece the native scanner
            handles; ``len()`` of either is its number of events).
        path: for messages.
        native: use the native scanner when it is active (:func:`~.kineto_native.active`);
            the pieces it does not handle are decoded by msgspec as without it.

    Returns:
        The header and the decode statistics.

    Raises:
        ValueError: when ``data`` holds no ``traceEvents`` array at all (the caller turns
            it into a ``TraceFormatError`` naming the file).
    """
    stats = DecodeStats()
    try:
        top = _TOP_DECODER.decode(data)
    except DECODE_ERRORS as exc:
        logger.debug("%s: strict decode failed (%s); recovering", path, exc)
        stats.strict = False
        from .kineto_recover import recover  # damaged input only

        return recover(data, on_chunk, stats)
    if not len(top.traceEvents):
        raise ValueError("top-level object has no 'traceEvents' array")
    # a view into ``data``, not a copy: the file is held in memory once
    raw = memoryview(top.traceEvents)
    if raw[:1] != b"[":
        raise ValueError("'traceEvents' is not an array")
    try:
        for events in _chunks(raw, native_scanner(native, path)):
            stats.events += len(events)
            on_chunk(events)
    except _BadPiece as bad:
        # Not valid after all, past the chunks already handed over: the top-level pass does
        # not check what it skips for invalid UTF-8 (BC-02). The rest of the array is read
        # event by event, repairing what it can, as for any damaged file.
        logger.debug("%s: event array invalid from offset %d (%s); recovering", path, bad.pos, bad.__cause__)
        stats.strict = False
        piece = bytes(raw[bad.pos : bad.end])
        from .kineto_recover import recover_events  # damaged input only

        recover_events(piece, 0, len(piece), _array_offset(data, raw) + bad.pos, on_chunk, stats)
    del raw
    top.traceEvents = NO_RAW
    return Decoded(top, stats)


class _BadPiece(Exception):
    """A piece of the event array that does not decode: raw[pos:end] is left to recover."""

    def __init__(self, pos: int, end: int) -> None:
        super().__init__(pos, end)
        self.pos = pos
        self.end = end


def _array_offset(data: bytes, raw: memoryview) -> int:
    """Byte offset of the event array in the file (for messages), 0 if it cannot be told."""
    probe = bytes(raw[:256])
    for m in EVENTS_KEY.finditer(data):
        if data[m.end() - 1 : m.end() - 1 + len(probe)] == probe:
            return m.end() - 1
    return 0


def _chunks(raw: memoryview, scanner: Scanner | None = None) -> Iterator[list[Event]]:
    """Split a valid JSON array of events into ~CHUNK_BYTES pieces and decode each (with
    ``scanner`` first, when given: :func:`~.kineto_native.decode_piece`)."""
    end = len(raw) - 1  # msgspec's Raw is exactly the array's text: it ends with its "]"
    if raw[end:] != b"]":
        end = bytes(raw).rstrip().rfind(b"]")
    body_start = 1
    n = len(raw)
    if n <= CHUNK_BYTES * 1.5:
        try:
            events = decode_piece(scanner, raw)
        except DECODE_ERRORS as exc:
            raise _BadPiece(body_start, end) from exc
        yield events
        return
    pos = body_start
    while pos < end:
        target = pos + CHUNK_BYTES
        extensions = 0
        while True:
            m = BOUNDARY.search(raw, target, end) if target < end else None
            stop = (m.start() + 1) if m else end
            piece = raw[pos:stop]
            # the native scanner reads the items in place; msgspec needs them wrapped
            events = scanner.scan(piece, bare=True) if scanner is not None else None
            if events is not None:
                break
            try:
                events = decode_piece(None, b"[" + piece + b"]")
                break
            except DECODE_ERRORS as exc:
                extensions += 1
                if m is None or extensions > MAX_EXTENSIONS:
                    raise _BadPiece(pos, end) from exc  # bad content, not a cut inside a string
                target = m.end()  # the boundary was inside a string: extend
        yield events
        pos = (m.end() - 1) if m else end

