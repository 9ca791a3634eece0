"""Streaming Kineto JSON decoding: a plain or gzip stream, block by block (:func:`decode_stream`).

Holds about two blocks of JSON at once; the result equals the in-memory
:func:`~.kineto_decode.decode` of the whole content (see :func:`decode_stream`).
"""

from __future__ import annotations

import logging
import os
import re
import zlib
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from .kineto_decode import decode
from .kineto_events import (
    BOUNDARY,
    DECODE_ERRORS,
    EVENTS_KEY,
    HEADER_DECODER,
    LEADING_WS,
    MAX_EXTENSIONS,
    Decoded,
    DecodeStats,
    Event,
    OnChunk,
    Top,
    decode_header_prefix,
    decode_prefix_strict,
    merge_headers,
)
from .kineto_native import Scanner, decode_piece, native_scanner
from .kineto_readahead import ReadAhead
from .kineto_readahead import enabled as read_ahead_enabled
from .kineto_recover import recover_events, recover_region

logger = logging.getLogger(__name__)

#: decompressed bytes per piece when streaming: the decoded events of a piece take ~2.7x its
#: size, so the transient memory is ~10x this; 1 MiB is as fast as 4 MiB on big traces
STREAM_BLOCK_BYTES = 1 << 20

#: a file whose layout the streaming decoder cannot follow (no ``"traceEvents": [`` key, or a
#: header before it that is not valid JSON) is decoded in memory when it is at most this big
STREAM_FALLBACK_BYTES = 64 << 20

_GZIP_MAGIC = b"\x1f\x8b"
_TRAILING = re.compile(r"trailing characters \(byte (\d+)\)")
#: what follows the ``]`` that closes the event array: ``, "key"`` or the closing ``}``
_AFTER_CLOSE = re.compile(rb'\]\s*(?:,\s*"|\})')
#: ``}`` ``]`` ``, "`` or ``}``: the event array may end here (see
#: :func:`~.kineto_recover.find_array_end`)
_ARRAY_END_OPEN = re.compile(rb'\}\s*\]\s*(?:,\s*"|\})')
#: ``TRACEROOF_SCAN_AHEAD=0`` scans every piece in the reading thread (no worker thread:
#: comparisons and benchmarks; the result is the same either way)
ENV_SCAN_AHEAD = "TRACEROOF_SCAN_AHEAD"
#: :meth:`_Stream._slow_piece`'s "the array is done" marker
_END = object()


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
                if z.eof:
                    # the member ended: what follows it is unused_data. CPython's zlib also
                    # leaves the same bytes in unconsumed_tail when the member ended in a call
                    # after an output-limited one; feeding that tail to the finished member
                    # returned b"" forever (a fuzz hang), so eof is tested first
                    rest = z.unused_data or self._raw(1 << 16)
                    if rest[:2] != _GZIP_MAGIC:
                        return self._out(b"")
                    self._z = zlib.decompressobj(16 + zlib.MAX_WBITS)  # the next member
                    data = rest
                    continue
                elif z.unconsumed_tail:
                    data = z.unconsumed_tail
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
    """The not yet decoded bytes of the stream: ``data[0]`` is byte ``base`` of the stream.

    The bytes live in one ``bytearray`` that is kept from block to block (``_ba[_off:_end]``
    are the live ones): a block is copied in behind them, and the live bytes are moved to
    its front in place when it fills up, so the decoder does not allocate (and page-fault
    in) fresh memory for every piece. :meth:`view` is the live bytes without a copy (it
    must not outlive the call it is passed to); :attr:`data` is a copy, for the rare paths
    (header, tail, recovery).
    """

    def __init__(self, src: Any) -> None:
        self.src = src  # a _Source or a ReadAhead of one
        self._ba = bytearray(0)
        self._off = 0
        self._end = 0
        self.base = 0

    def __len__(self) -> int:
        return self._end - self._off

    @property
    def data(self) -> bytes:
        """A copy of the live bytes."""
        return bytes(memoryview(self._ba)[self._off : self._end])

    def view(self) -> memoryview:
        """The live bytes, without a copy."""
        return memoryview(self._ba)[self._off : self._end]

    def _append(self, b: bytes) -> None:
        live = self._end - self._off
        if self._end + len(b) > len(self._ba):
            if live + len(b) <= len(self._ba) and self._off >= len(self._ba) // 4:
                mv = memoryview(self._ba)
                mv[0:live] = mv[self._off : self._end]  # memmove in place
                del mv
            else:  # too small: a new one, twice as big as needed
                grown = bytearray(max(2 * (live + len(b)), 1 << 16))
                grown[0:live] = memoryview(self._ba)[self._off : self._end]
                self._ba = grown
            self._off, self._end = 0, live
        self._ba[self._end : self._end + len(b)] = b
        self._end += len(b)

    def fill(self, n: int) -> bool:
        """Read until the buffer holds at least ``n`` bytes; False when the stream ended first."""
        while len(self) < n:
            b = self.src.read()
            if not b:
                break
            self._append(b)
        return len(self) >= n

    def fill_all(self, cap: int | None = None) -> bool:
        """Read to the end of the stream, or until the buffer holds ``cap`` bytes; True when
        the end was reached."""
        while not self.src.eof:
            if cap is not None and len(self) >= cap:
                return False
            self.fill(len(self) + (16 << 20))
        return True

    def drop(self, n: int) -> None:
        """Remove the first ``n`` bytes (:meth:`take` without making a copy of them)."""
        n = min(n, len(self))
        self._off += n
        self.base += n

    def take(self, n: int) -> bytes:
        """Remove and return the first ``n`` bytes."""
        n = min(n, len(self))
        out = bytes(memoryview(self._ba)[self._off : self._off + n])
        self.drop(n)
        return out


class _Stream:
    """One streaming decode: see :func:`decode_stream`."""

    def __init__(
        self, fh: Any, on_chunk: OnChunk, path: str, block: int,
        progress: Callable[[int, int], None] | None, native: bool = False,
    ) -> None:
        self.native = native
        self.scanner: Scanner | None = native_scanner(native, path)
        src = _Source(fh, block)
        #: the blocks, read (and inflated) by a thread ahead of the decoding (kineto_readahead)
        self.src: Any = ReadAhead(src) if read_ahead_enabled() else src
        self.buf = _Buffer(self.src)
        self.block = self.src.block
        self.stats = DecodeStats()
        self.path = path
        self._on_chunk = on_chunk
        self._progress = progress
        #: the thread that scans the next piece natively (started at the first one)
        self._worker: ThreadPoolExecutor | None = None
        self._ahead = os.environ.get(ENV_SCAN_AHEAD, "").strip() != "0"

    def close(self) -> None:
        """Wait for a scan still running (an exception left it behind), stop the worker and
        the read-ahead thread."""
        if self._worker is not None:
            self._worker.shutdown(wait=True)
            self._worker = None
        if isinstance(self.src, ReadAhead):
            self.src.close()

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
        if not len(buf) and self.src.gzip_problem:
            raise StreamFormatError("byte 0", f"a readable gzip stream ({self.src.gzip_problem})")
        while LEADING_WS.match(buf.view()).end() == len(buf) and buf.fill(len(buf) + self.block):
            pass  # more than a block of leading whitespace (rare)
        lead = LEADING_WS.match(buf.view()).end()  # type: ignore[union-attr]
        first = bytes(buf.view()[lead : lead + 1])
        if not first:
            raise StreamFormatError("byte 0", "a Kineto JSON trace, found an empty file")
        if first != b"{":
            head = bytes(buf.view()[:4096])
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
            key = EVENTS_KEY.search(buf.view(), max(scanned - 64, 0))
            if key is not None:
                break
            scanned = len(buf)
            if scanned > STREAM_FALLBACK_BYTES:
                buf.take(max(scanned - 64, 0))  # a huge prefix: scan on, keep nothing
                scanned = len(buf)
            if not buf.fill(len(buf) + self.block):
                break
        prefix_ok = key is not None and buf.base == 0 and decode_prefix_strict(bytes(buf.view()[: key.start()])) is not None
        if not prefix_ok and buf.base == 0:
            # no events key, or a header that is not valid JSON: a small file is decoded in
            # memory, which gives exactly the in-memory outcome (its error, its recovery)
            if buf.fill_all(STREAM_FALLBACK_BYTES + 1) and len(buf) <= STREAM_FALLBACK_BYTES:
                data = buf.take(len(buf))
                return decode(data, self.emit, path=self.path, native=self.native)
        if key is None:
            raise ValueError("no 'traceEvents' array found")
        header = decode_prefix_strict(bytes(buf.view()[: key.start()])) if buf.base == 0 else None
        if header is None:
            logger.debug("%s: the header before the events is not valid JSON; recovering", self.path)
            self.stats.strict = False
            header = decode_header_prefix(bytes(buf.view()[: key.start()])) if buf.base == 0 else Top()
        buf.take(key.end())
        tail = self.events()
        if tail is not None:
            header = merge_headers(header, tail)
        if self.src.gzip_problem:
            logger.debug("%s: %s at byte %d", self.path, self.src.gzip_problem, self.src.raw_read)
        return Decoded(header, self.stats)

    # ------------------------------------------------------------------ events
    def events(self) -> Top | None:
        """Decode the event array from ``buf`` (just after its ``[``) to its end; returns the
        header decoded after the array (None when there is none or it is broken).

        Native path: while piece k's events are handed on (the caller's column building,
        in Python), piece k+1 is already being scanned in a worker thread (the GIL is
        released during the C scan, :meth:`_scan_ahead`); the scans still run one at a
        time, in file order, on the one dictionary, so the result is the same as scanning
        piece after piece."""
        buf = self.buf
        ahead = None
        while True:
            if ahead is None:
                if not self._skip_ws():
                    return self._recover_rest()  # cut right after '[' or a ','
                if buf.view()[:1] == b"]":  # an empty array, or a ',' before it (recovered)
                    buf.fill_all()
                    return self._tail(buf.data[1:])
                m, stop = self._find_piece(self.block)
                # the native scanner reads the items in place; msgspec needs them wrapped
                events = self.scanner.scan(buf.view()[:stop], bare=True) if self.scanner else None
            else:
                m, stop, scanning = ahead
                ahead = None
                events = self.scanner.columns(scanning.result())  # type: ignore[union-attr]
            if events is None:
                m, events = self._slow_piece(m, stop)
                if m is _END:
                    return events
            if m is None:
                self.strict(events)
                # the stream ended right after a complete event (no ']'): a cut file, read
                # the way the in-memory recovery reads it (cut between two events)
                self.stats.strict = False
                self.stats.truncated_at = buf.base + len(buf)
                self.stats.truncated_mid_event = False
                return None
            buf.drop(m.end() - 1)
            ahead = self._scan_ahead()
            self.strict(events)
            del events

    def _find_piece(self, target: int) -> tuple[Any, int]:
        """The first event boundary at or after ``target`` (reading on until there is one,
        or the stream ends: then None) and where the piece before it stops."""
        buf = self.buf
        while True:
            m = BOUNDARY.search(buf.view(), target) if target < len(buf) else None
            if m is None and not self.src.eof:
                # no event boundary yet (one long event): read geometrically more, so that
                # an event of n bytes costs O(n) copies and searches, not O(n^2 / block)
                buf.fill(max(2 * len(buf), target + self.block))
                continue
            return m, (m.start() + 1) if m else len(buf)

    def _scan_ahead(self) -> tuple[Any, int, Future] | None:
        """Start the native scan of the next piece in the worker thread (what the head of
        :meth:`events`' loop does, without its fallbacks): ``(boundary, stop, future)``,
        or None (no scanner, the stream's end, the array's ``]``: the loop's head takes
        those). ``buf`` must not change until the future is done; only the events
        already scanned are handed on meanwhile."""
        if self.scanner is None or not self._ahead or not self._skip_ws() or self.buf.view()[:1] == b"]":
            return None
        m, stop = self._find_piece(self.block)
        if self._worker is None:
            self._worker = ThreadPoolExecutor(1, thread_name_prefix="traceroof-scan")
        return m, stop, self._worker.submit(self.scanner.scan_raw, self.buf.view()[:stop], True)

    def _slow_piece(self, m: Any, stop: int) -> tuple[Any, Any]:
        """``buf[:stop]``, which the native scanner did not take (or there is none): msgspec,
        extended past a boundary that lies inside a string, the array's end found in it,
        or recovered event by event. Returns ``(boundary, events)`` to go on with, or
        ``(_END, header tail)`` when the array ended or the rest was recovered."""
        buf = self.buf
        extensions = 0
        scanned = True  # buf[:stop] was just scanned natively
        while True:
            if not scanned and self.scanner is not None:
                events = self.scanner.scan(buf.view()[:stop], bare=True)
                if events is not None:
                    return m, events
            scanned = False
            piece = b"".join((b"[", buf.view()[:stop], b"]"))
            try:
                return m, decode_piece(None, piece)
            except DECODE_ERRORS as exc:
                end = _closing_bracket(piece, exc, self.scanner)
                if end is not None:
                    # the array ends in this piece: the rest of the stream is the tail
                    del piece
                    buf.drop(end[0])
                    self.strict(end[1])
                    buf.fill_all()
                    return _END, self._tail(buf.data[1:])
                extensions += 1
                if m is None or extensions > MAX_EXTENSIONS:
                    logger.debug("%s: events invalid at byte %d (%s); recovering", self.path, buf.base, exc)
                    self.stats.strict = False
                    return _END, self._recover_piece(stop if m is not None else None)
            del piece
            m, stop = self._find_piece(m.end())  # the boundary was inside a string: extend

    def _skip_ws(self) -> bool:
        """Drop leading whitespace (and a stray ``,`` left by a recovered piece); False when
        the stream ends first."""
        buf = self.buf
        while True:
            buf.fill(1)
            n = LEADING_WS.match(buf.view()).end()  # type: ignore[union-attr]
            if n < len(buf):
                buf.drop(n)
                return True
            buf.drop(n)
            if not buf.fill(1):
                return False

    def _tail(self, tail: bytes) -> Top | None:
        """The header keys after the event array (``tail`` follows its ``]``)."""
        t = tail.strip()
        if t == b"}":
            return None
        if t.startswith(b","):
            try:
                return HEADER_DECODER.decode(b"{" + t[1:])
            except DECODE_ERRORS:
                pass
        self.stats.strict = False  # a cut or broken tail: unreadable, as in memory
        return None

    def _recover_piece(self, stop: int | None) -> Top | None:
        """Recover ``buf.data[:stop]`` (a run of events that does not decode) event by event,
        then go on strictly after it; ``stop`` None: the piece runs to the end of the stream."""
        buf = self.buf
        if stop is not None and _ARRAY_END_OPEN.search(buf.view(), 0, stop) is not None:
            # the array may end in the damaged piece: with the rest of the stream (when it
            # is small, as a header tail is) the end can be told
            if buf.fill_all(len(buf) + STREAM_FALLBACK_BYTES):
                stop = None
        if stop is None:
            return self._recover_rest()
        base = buf.base
        piece = buf.take(stop)
        recover_events(piece, 0, len(piece), base, self.emit, self.stats)
        del piece
        buf.drop(LEADING_WS.match(buf.view()).end())  # type: ignore[union-attr]
        if buf.view()[:1] == b",":
            buf.drop(1)
        return self.events()

    def _recover_rest(self) -> Top | None:
        """Recover everything left in the stream (bounded by a block or two, or by
        STREAM_FALLBACK_BYTES when a damaged piece may hold the array's end)."""
        buf = self.buf
        buf.fill_all()
        base = buf.base
        region = buf.take(len(buf))
        self.stats.strict = False
        return recover_region(region, 0, base, self.emit, self.stats)


def _closing_bracket(wrapped: bytes, exc: Exception, scanner: Scanner | None = None) -> tuple[int, list[Event]] | None:
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
        events = decode_piece(scanner, memoryview(wrapped)[: close + 1])
    except DECODE_ERRORS:
        return None
    return close - 1, events


def decode_stream(
    fh: Any,
    on_chunk: OnChunk,
    *,
    path: str = "<stream>",
    block_bytes: int = STREAM_BLOCK_BYTES,
    progress: Callable[[int, int], None] | None = None,
    native: bool = False,
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
    is recovered event by event (the array's end found by
    :func:`~.kineto_recover.find_array_end` when it lies in the piece); a stream cut
    mid-event keeps every complete event and records ``truncated_at``. A header prefix that is not valid JSON, or no events key, in a stream
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
        native: hand :class:`~.kineto_native.Columns` for the pieces the native scanner
            handles (when it is active), as :func:`~.kineto_decode.decode` does.

    Returns:
        The header and the decode statistics.

    Raises:
        StreamFormatError: not a Kineto document at all (empty, not a JSON object, not a
            readable gzip stream): where, and what was expected there.
        ValueError: the stream holds no ``traceEvents`` array (the caller names the file).
        OSError: reading ``fh`` failed.
    """
    stream = _Stream(fh, on_chunk, path, block_bytes, progress, native)
    try:
        return stream.run()
    finally:
        stream.close()

