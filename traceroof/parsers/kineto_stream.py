"""Streaming Kineto JSON decoding: a plain or gzip stream, block by block (:func:`decode_stream`).

Holds a few blocks of JSON at once; the result equals the in-memory
:func:`~.kineto_decode.decode` of the whole content (see :func:`decode_stream`). Blocks are
read (and inflated) by a read-ahead thread (:class:`~.kineto_blocks.ReadAhead`), and on the
native path pieces are scanned by a worker thread and this one (:meth:`_Stream.events`);
both give way to one thread when the machine's cores are taken (:meth:`_Stream._result`).
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from .kineto_blocks import Buffer, ReadAhead, Source, mapped
from .kineto_blocks import enabled as read_ahead_enabled
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
    closing_bracket,
    decode_header_prefix,
    decode_prefix_strict,
    merge_headers,
)
from .kineto_native import Scanner, decode_piece, native_scanner
from .text_head import drop_lead, encoding_problem, other_encoding

logger = logging.getLogger(__name__)

#: decompressed bytes per piece when streaming: the decoded events of a piece take ~2.7x its
#: size, so the transient memory is ~10x this (2 MiB: faster, over test_streaming's bound)
STREAM_BLOCK_BYTES = 1 << 20

#: a file whose layout the streaming decoder cannot follow (no ``"traceEvents": [`` key, or an
#: invalid header before it) is decoded in memory when it is at most this big
STREAM_FALLBACK_BYTES = 64 << 20

#: ``}`` ``]`` ``, "`` or ``}``: the event array may end here (kineto_recover.find_array_end)
_ARRAY_END_OPEN = re.compile(rb'\}\s*\]\s*(?:,\s*"|\})')
#: ``TRACEROOF_SCAN_AHEAD=0`` scans every piece in the reading thread (no worker: comparisons)
ENV_SCAN_AHEAD = "TRACEROOF_SCAN_AHEAD"
#: :meth:`_Stream._slow_piece`'s "the array is done" and :meth:`_Stream._take`'s "go on" markers
_END, _GO_ON = object(), object()
#: the threads are given up for the rest of a file when fewer than MIN_CORES cores were used
#: since the first job, measured every CHECK_JOBS jobs (_Stream._result)
CHECK_JOBS = 8
MIN_CORES = 1.15
#: pieces the worker thread scans in one job (on a copy of their bytes, ~this many blocks)
WORKER_PIECES = 2
#: while the worker's job runs, this thread (which also hands every piece on: numpy column
#: building, about a quarter of the cost of a scan) scans at most this many pieces after it
#: (2, not 1: with one it waited ~0.3 s on the worker over 1 GB; both constants and the two
#: tried alternatives: docs/performance.md, "The 1 GB read: the two scanning threads balanced")
OWN_PIECES_MAX = 2


@dataclass
class _Piece:
    """One piece of the event array, by stream offsets: ``[start, stop)``; ``next``: where
    the piece after it starts (its boundary's ``{``), None when the stream ended first."""

    start: int
    stop: int
    next: int | None
    scanner: Scanner | None = None
    raw: Any = None  # Scanner.scan_raw's result


@dataclass
class _Job:
    """The worker's scan of ``pieces``: ``future`` gives their results, stopping after the
    first not handled."""

    pieces: list[_Piece]
    future: Future
    #: the pieces' bytes (from the first's start to the last's stop): in ``_Stream._copy``,
    #: or of the mapped file (``Buffer.stable``)
    data: memoryview


def _scan_pieces(scanner: Scanner, data: memoryview, spans: list[tuple[int, int]]) -> list[Any]:
    """The worker's job: ``scanner.scan_raw`` of each span of ``data`` in turn, up to the
    first not handled (None)."""
    out = []
    for a, b in spans:
        out.append(scanner.scan_raw(data[a:b], True))
        if out[-1] is None:
            break
    return out


class StreamFormatError(ValueError):
    """The stream is not a Kineto JSON document: ``where`` (``byte N``) and what was
    ``expected`` there, for the caller's ``TraceFormatError``."""

    def __init__(self, where: str, expected: str) -> None:
        super().__init__(f"{where}: expected {expected}")
        self.where = where
        self.expected = expected


class _Stream:
    """One streaming decode: see :func:`decode_stream`."""

    def __init__(
        self, fh: Any, on_chunk: OnChunk, path: str, block: int,
        progress: Callable[[int, int], None] | None, native: bool = False,
    ) -> None:
        self.native = native
        self.scanner: Scanner | None = native_scanner(native, path)
        #: a plain file mapped (kineto_blocks.mapped); else the blocks, read (and inflated)
        #: by a thread ahead of the decoding (kineto_blocks.ReadAhead)
        buf = mapped(fh, block, path)
        if buf is None:
            src = Source(fh, block)
            self.src: Any = ReadAhead(src) if read_ahead_enabled() else src
            buf = Buffer(self.src)
        else:
            self.src = buf.src
            logger.debug("%s: a plain file: mapped (mmap), not read", path)
        self.buf = buf
        self.block = self.src.block
        self.stats = DecodeStats()
        self.path = path
        self._on_chunk = on_chunk
        self._progress = progress
        #: the thread that scans the next piece natively (started at the first one)
        self._worker: ThreadPoolExecutor | None = None
        self._ahead = os.environ.get(ENV_SCAN_AHEAD, "").strip() != "0"
        #: the scanner of the pieces this thread scans (made at the first one)
        self._helper: Scanner | None = None
        #: the bytes of the worker's pieces (kept from job to job)
        self._copy = bytearray(0)
        self._jobs = 0  # the worker's jobs so far
        self._since = (0.0, 0.0)  # wall and process CPU s at the first job

    def close(self) -> None:
        """Wait for a scan still running (an exception left it behind), stop the worker and
        the read-ahead thread."""
        if self._worker is not None:
            self._worker.shutdown(wait=True)
            self._worker = None
        if isinstance(self.src, ReadAhead):
            self.src.close()
        self.buf.close()

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
        """The checks :func:`~traceroof.parsers.kineto.read_bytes` makes on the first bytes; a
        UTF-8 BOM and leading white space are dropped (:func:`.text_head.drop_lead`)."""
        buf = self.buf
        buf.fill(4096)
        if not len(buf) and self.src.gzip_problem:
            raise StreamFormatError("byte 0", f"a readable gzip stream ({self.src.gzip_problem})")
        encoding = other_encoding(buf.view())  # first, on the bytes as they are (before white space is dropped)
        if encoding is not None:
            raise StreamFormatError(f"byte {buf.base}", encoding_problem(encoding))
        problem = drop_lead(buf)
        self._origin = buf.base  # the header starts here (buf.base == _origin: nothing taken yet)
        first = bytes(buf.view()[:1])
        if problem or not first:
            raise StreamFormatError(f"byte {buf.base if problem else 0}", problem or "a Kineto JSON trace, found an empty file")
        if first != b"{":
            raise StreamFormatError(f"byte {buf.base}", "a JSON object with a 'traceEvents' array (Kineto / torch.profiler trace)")

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
        prefix_ok = key is not None and buf.base == self._origin and decode_prefix_strict(bytes(buf.view()[: key.start()])) is not None
        if not prefix_ok and buf.base == self._origin:
            # no events key, or a header that is not valid JSON: a small file is decoded in
            # memory, which gives exactly the in-memory outcome (its error, its recovery)
            if buf.fill_all(STREAM_FALLBACK_BYTES + 1) and len(buf) <= STREAM_FALLBACK_BYTES:
                data = b" " * self._origin + buf.take(len(buf))  # (the BOM and white space dropped: offsets kept)
                return decode(data, self.emit, path=self.path, native=self.native)
        if key is None:
            raise ValueError("no 'traceEvents' array found")
        header = decode_prefix_strict(bytes(buf.view()[: key.start()])) if buf.base == self._origin else None
        if header is None:
            logger.debug("%s: the header before the events is not valid JSON; recovering", self.path)
            self.stats.strict = False
            header = decode_header_prefix(bytes(buf.view()[: key.start()])) if buf.base == self._origin else Top()
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

        Native path, in rounds: a worker thread scans the next :data:`WORKER_PIECES` pieces
        (a copy of their bytes, the GIL released); while it is not done, this thread scans
        the pieces after them (at most :data:`OWN_PIECES_MAX`) with a helper scanner
        (:class:`~.kineto_native.Scanner` ``into=``); then the next job starts and this
        thread hands the round's pieces on in file order. Pieces are cut where the one-thread
        loop cuts them; a piece not handled is decoded from the front as that loop does, the
        scans after it discarded (their strings leave the dictionaries): the result is that of
        one thread (``TRACEROOF_SCAN_AHEAD=0``).
        """
        buf = self.buf
        job: _Job | None = None
        while True:
            if job is None:
                if not self._skip_ws():
                    return self._recover_rest()  # cut right after '[' or a ','
                if buf.view()[:1] == b"]":  # an empty array, or a ',' before it (recovered)
                    buf.fill_all()
                    return self._tail(buf.data[1:])
                job = self._submit(buf.base)
                if job is None:  # one piece in this thread
                    m, stop = self._find_piece(self.block)
                    # the native scanner reads the items in place; msgspec needs them wrapped
                    events = self.scanner.scan(buf.view()[:stop], bare=True) if self.scanner else None
                    done = self._take(m, stop, events)
                    if done is not _GO_ON:
                        return done
                    continue
            pieces = list(job.pieces)
            while self._worker_busy(job) and len(pieces) - len(job.pieces) < OWN_PIECES_MAX:
                # the worker is still scanning: scan the piece after its job here meanwhile
                if pieces[-1].next is None or (pieces[-1].scanner is self._helper and pieces[-1].raw is None):
                    break
                pieces.append(self._own_piece(pieces[-1].next))
            for p, raw in zip(job.pieces, self._result(job)):
                p.raw = raw
            k = self._settle(pieces)
            owner = self.scanner
            assert owner is not None
            if k == len(pieces) and pieces[-1].next is not None:
                # every piece scanned: their bytes are no longer needed; the next job starts
                # before these are handed on
                buf.drop(pieces[-1].next - buf.base)  # type: ignore[operator]
                job = self._submit(pieces[-1].next)  # type: ignore[arg-type]
                for p in pieces:
                    self.strict(owner.columns(p.raw))  # type: ignore[arg-type]
                    p.raw = None
                continue
            self.buf.unshift(job.data)  # the job's bytes, back
            job = None
            for p in pieces[:k]:
                events = owner.columns(p.raw)
                p.raw = None
                if p.next is None:
                    return self._take(None, p.stop - buf.base, events)
                buf.drop(p.next - buf.base)
                self.strict(events)  # type: ignore[arg-type]
                del events
            # pieces[k], not handled: from the front, as in one thread
            stop = pieces[k].stop - buf.base
            m = BOUNDARY.match(buf.view(), stop - 1) if pieces[k].next is not None else None
            done = self._take(m, stop, None)
            if done is not _GO_ON:
                return done

    def _settle(self, pieces: list[_Piece]) -> int:
        """The round's scans in file order: the index ``k`` of the first piece not handled
        (``len(pieces)`` when none); the scans after it discarded, the owner's before it
        adopted and then the helper's absorbed (recoded to the owner's dictionary), so that
        ``owner.columns`` converts each of ``pieces[:k]``."""
        k = next((i for i, p in enumerate(pieces) if p.raw is None), len(pieces))
        for p in pieces[k + 1 :]:
            if p.raw is not None:
                p.scanner.discard(p.raw)  # type: ignore[union-attr]
                p.raw = None
        owner = self.scanner
        assert owner is not None
        helped = []
        for p in pieces[:k]:  # the worker's pieces come first, then the helper's
            if p.scanner is owner:
                owner.adopt(p.raw)
            else:
                helped.append(p.raw)
        if helped:
            owner.absorb(self._helper, helped)  # type: ignore[arg-type]
        return k

    def _result(self, job: _Job) -> list[Any]:
        """The worker's results for ``job``. Every :data:`CHECK_JOBS` jobs, the cores this
        process used since the first job are measured (process CPU time over wall time):
        under :data:`MIN_CORES`, the machine's cores are taken by other processes and the
        threads only add their hand-overs (each waits for the scheduler; 1 GB at load 10:
        15.7 s against 9.4 s in one thread), so the rest of the file is read in this thread
        alone (logged at debug)."""
        out = job.future.result()
        self._jobs += 1
        now, cpu = time.perf_counter(), time.process_time()  # CPU: every thread's
        if self._jobs == 1:
            self._since = (now, cpu)
        elif self._ahead and self._jobs % CHECK_JOBS == 1 and now > self._since[0]:
            cores = (cpu - self._since[1]) / (now - self._since[0])
            if cores < MIN_CORES:
                logger.debug("%s: %.2f cores used over %d jobs: one thread from here", self.path, cores, self._jobs)
                self._ahead = False
                if isinstance(self.src, ReadAhead):
                    self.src.stop()
        return out

    @staticmethod
    def _worker_busy(job: _Job) -> bool:
        """The worker is still scanning ``job`` (the tests force either answer)."""
        return not job.future.done()

    def _take(self, m: Any, stop: int, events: Any) -> Any:
        """Piece ``buf[:stop]`` (boundary ``m``) with its native ``events`` (None: not
        handled, or no scanner): hands them on and drops the piece; returns ``_GO_ON``, or
        what :meth:`events` returns when the array or the stream ended here."""
        buf = self.buf
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
        self.strict(events)
        return _GO_ON

    def _find_piece(self, target: int, start: int = 0) -> tuple[Any, int]:
        """The first event boundary at or after ``target`` (reading on until there is one,
        or the stream ends: then None) and where the piece (from ``start``) before it
        stops; offsets in ``buf``."""
        buf = self.buf
        while True:
            m = BOUNDARY.search(buf.view(), target) if target < len(buf) else None
            if m is None and not self.src.eof:
                # no event boundary yet: a block past the target first; then (one long
                # event) geometrically more, so that an event of n bytes costs O(n) copies
                # and searches, not O(n^2 / block)
                want = target + self.block
                buf.fill(want if len(buf) < want else start + 2 * (len(buf) - start))
                continue
            return m, (m.start() + 1) if m else len(buf)

    def _piece(self, start: int) -> _Piece:
        """The piece from stream offset ``start`` (an event's ``{``), cut as the one-thread
        loop cuts it."""
        base = self.buf.base
        m, stop = self._find_piece(start - base + self.block, start - base)
        return _Piece(start, base + stop, None if m is None else base + m.end() - 1)

    def _submit(self, start: int) -> _Job | None:
        """Start the worker's scan of the :data:`WORKER_PIECES` pieces from stream offset
        ``start`` (fewer at the stream's end), on a copy of their bytes; None when there is
        no scanner or ``TRACEROOF_SCAN_AHEAD=0``."""
        if self.scanner is None or not self._ahead:
            self.buf.unpin()  # no worker job from here on (none is running when this is called)
            return None
        pieces = [self._piece(start)]
        while len(pieces) < WORKER_PIECES and pieces[-1].next is not None:
            pieces.append(self._piece(pieces[-1].next))
        n = pieces[-1].stop - start
        assert start == self.buf.base
        if self.buf.stable:  # a mapped file: the worker reads the bytes where they are
            copy = self.buf.view()[:n]
        else:
            if len(self._copy) < n:
                self._copy = bytearray(n + (n >> 2))
            copy = memoryview(self._copy)[:n]
            copy[:] = self.buf.view()[:n]
        self.buf.pin()  # a mapped file's pages of the job stay mapped until the next job
        self.buf.drop(n)  # held once: the copy (put back if a piece is not handled)
        spans = [(p.start - start, p.stop - start) for p in pieces]
        if self._worker is None:
            self._worker = ThreadPoolExecutor(1, thread_name_prefix="traceroof-scan")
        for p in pieces:
            p.scanner = self.scanner
        return _Job(pieces, self._worker.submit(_scan_pieces, self.scanner, copy, spans), copy)

    def _own_piece(self, start: int) -> _Piece:
        """The piece from ``start``, scanned here (in place) by the helper scanner."""
        if self._helper is None:
            self._helper = Scanner(helper=True)
        p = self._piece(start)
        at = start - self.buf.base
        p.scanner = self._helper
        p.raw = self._helper.scan_raw(self.buf.view()[at : p.stop - self.buf.base], True)
        return p

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
                end = closing_bracket(piece, exc, self.scanner)
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
        from .kineto_recover import recover_events  # damaged input only
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
        from .kineto_recover import recover_region  # damaged input only
        return recover_region(region, 0, base, self.emit, self.stats)


def decode_stream(
    fh: Any,
    on_chunk: OnChunk,
    *,
    path: str = "<stream>",
    block_bytes: int = STREAM_BLOCK_BYTES,
    progress: Callable[[int, int], None] | None = None,
    native: bool = False,
) -> Decoded:
    """Decode a Kineto JSON stream block by block, holding a few blocks of JSON at once (one
    thread reads ``fh`` ahead, another scans natively: see the module docstring).

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
        fh: a binary file object (``read(n)``): a plain file (mapped from its position,
            not read: :func:`~.kineto_blocks.mapped`), a gzip stream (by its magic bytes;
            inflated, member after member), a tar member. Read from the read-ahead thread
            (``TRACEROOF_READ_AHEAD=0``: this one), never from two at once nor after this returns.
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

