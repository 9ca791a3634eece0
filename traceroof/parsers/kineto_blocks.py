"""The blocks of a Kineto JSON stream: read and inflated (:class:`Source`), read ahead in a
thread (:class:`ReadAhead`), and the not yet decoded bytes (:class:`Buffer`), for
:mod:`.kineto_stream`.

Reading ahead: reading and inflating release the GIL (file reads, ``zlib.decompress``), so a
thread that does them while the decoder works takes that time off the decoder's path (~1.2 s
of inflating on the 1 GB ``.json.gz`` of ``docs/performance.md``). At most ``depth`` blocks
wait (``depth`` x 1 MiB of memory); the blocks come out in the order the source gave them,
and the source's end, its gzip problem and an exception it raised come out where they
happened (an exception is raised by the :meth:`ReadAhead.read` that reaches it).

Mapping (:func:`mapped`): a plain regular file is not read at all but mapped (``mmap``): the
decoder scans the page cache's pages in place, with neither the ``read`` copy nor the copy
into the :class:`Buffer` (~0.6 s of CPU on the 1 GB trace of ``docs/performance.md``, "The
1 GB read (session 9)"), and the pages behind the decoder are unmapped as it goes, so the
resident memory stays a few MiB of the file.
"""

from __future__ import annotations

import io
import mmap
import os
import queue
import stat
import threading
from typing import Any

from .gzip_stream import GZIP_MAGIC, GzipInflater

#: ``TRACEROOF_READ_AHEAD=0`` reads every block in the decoding thread (comparisons,
#: benchmarks; the result is the same either way)
ENV_READ_AHEAD = "TRACEROOF_READ_AHEAD"

#: ``TRACEROOF_MMAP=0`` reads a plain file block by block instead of mapping it
#: (comparisons, benchmarks; the result is the same either way)
ENV_MMAP = "TRACEROOF_MMAP"

#: a mapped file's pages behind the decoder are unmapped (``MADV_DONTNEED``) once this many
#: bytes are behind it, keeping the last :data:`MAP_LAG_BYTES`, and never those from the
#: start of the scanning threads' job on (:meth:`MappedBuffer.pin`: a job may be longer than
#: the lag; before session 14 the pages of a job over 4 MiB were unmapped while a thread read
#: them, mapped again by its reads and then never released: 0.5 GB of the 1 GB file resident)
MAP_RELEASE_BYTES = 4 << 20
MAP_LAG_BYTES = 4 << 20

#: blocks read ahead at most (each at most the stream's block size, 1 MiB by default)
DEPTH = 2


def enabled() -> bool:
    """False when ``TRACEROOF_READ_AHEAD=0``."""
    return os.environ.get(ENV_READ_AHEAD, "").strip() != "0"


class ReadAhead:
    """``src``'s blocks, read by a thread ahead of the caller (started at the first read).

    ``src`` has ``read() -> bytes`` (``b""`` at the end, after which it is not called
    again), and the attributes ``block``, ``raw_read`` (bytes read from the file so far),
    ``size`` and ``gzip_problem``, which this object passes on (``raw_read`` runs ahead of
    the blocks handed out by at most ``depth`` blocks). :meth:`close` must be called (the
    thread stops after the block it is reading).
    """

    def __init__(self, src: Any, depth: int = DEPTH) -> None:
        self.src = src
        self.block: int = src.block
        self.eof = False
        self._q: queue.Queue[Any] = queue.Queue(max(int(depth), 1))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: the block the thread had read when it was stopped (handed out after the queue)
        self._spill: list[Any] = []

    @property
    def raw_read(self) -> int:
        """Bytes read from the file object so far (compressed bytes for a gzip stream)."""
        return self.src.raw_read

    @property
    def size(self) -> int:
        """Decompressed bytes read so far (by the thread: ahead of those handed out)."""
        return self.src.size

    @property
    def gzip_problem(self) -> str | None:
        """Why a gzip stream ended early (set before its last, empty block is handed out)."""
        return self.src.gzip_problem

    def read(self) -> bytes:
        """The next block (at most ``block`` bytes); ``b""`` at the end.

        Raises:
            OSError (or whatever the source raised): where the source raised it.
        """
        if self.eof:
            return b""
        if self._thread is None and not self._stop.is_set():
            self._thread = threading.Thread(target=self._run, name="traceroof-read", daemon=True)
            self._thread.start()
        if self._stop.is_set() and self._thread is None:  # stopped: the rest, then direct reads
            try:
                item = self._q.get_nowait()
            except queue.Empty:
                item = self._spill.pop() if self._spill else self.src.read()
        else:
            item = self._q.get()
        if isinstance(item, BaseException):
            self.eof = True
            raise item
        if not item:
            self.eof = True
        return item

    def _run(self) -> None:
        try:
            while True:
                b = self.src.read()
                if not self._put(b) or not b:
                    return
        except BaseException as exc:  # handed to the reader, raised where it happened
            self._put(exc)

    def _put(self, item: Any) -> bool:
        """Queue ``item``; False (the item kept in ``_spill``) when stopped meanwhile."""
        while True:
            if self._stop.is_set():
                self._spill.append(item)
                return False
            try:
                self._q.put(item, timeout=0.02)
                return True
            except queue.Full:
                continue

    def stop(self) -> None:
        """Read in the caller's thread from now on: the thread stops after the block it is
        reading; the blocks it read are still handed out first, in order."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def close(self) -> None:
        """Stop the thread (after the block it is reading)."""
        self.stop()


class _Counts:
    """What :mod:`.kineto_stream` reads of a block source (:class:`Source`,
    :class:`MappedSource`): ``block`` (bytes per block, at least 1 KiB: both sources cut the
    stream at the same places), ``raw_read``, ``size``, ``eof``, ``gzip``, ``gzip_problem``."""

    def __init__(self, block: int) -> None:
        self.block = max(int(block), 1 << 10)
        self.raw_read = 0
        self.size = 0
        self.eof = False
        self.gzip = False
        self.gzip_problem: str | None = None


class Source(_Counts):
    """Decompressed blocks read from a binary file object, plain or gzip (sniffed by magic).

    ``raw_read`` counts the bytes read from the file object (compressed bytes for a gzip
    stream), ``size`` the decompressed bytes handed out. A gzip stream that ends early (a
    cut ``.gz``) or turns corrupt just ends there: everything inflated so far is kept and
    ``gzip_problem`` says why. Trailing bytes after the last gzip member are ignored.
    """

    def __init__(self, fh: Any, block: int) -> None:
        super().__init__(block)
        self.fh = fh
        self._gz: GzipInflater | None = None
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
            if head[:2] != GZIP_MAGIC:
                return self._out(head)
            self.gzip = True
            self._gz = GzipInflater(self._raw, head, piece=max(self.block // 4, 1 << 16))
        if self._gz is None:
            return self._out(self._raw(self.block))
        out = self._gz.read(self.block)
        self.gzip_problem = self._gz.problem
        return self._out(out)

    def _out(self, b: bytes) -> bytes:
        if not b:
            self.eof = True
        self.size += len(b)
        return b


class Buffer:
    """The not yet decoded bytes of the stream: ``data[0]`` is byte ``base`` of the stream.

    The bytes live in one ``bytearray`` that is kept from block to block (``_ba[_off:_end]``
    are the live ones): a block is copied in behind them, and the live bytes are moved to
    its front in place when it fills up, so the decoder does not allocate (and page-fault
    in) fresh memory for every piece. :meth:`view` is the live bytes without a copy (it
    must not outlive the call it is passed to); :attr:`data` is a copy, for the rare paths
    (header, tail, recovery).
    """

    #: a :meth:`view` may be changed by a later :meth:`fill` (:class:`MappedBuffer`: never)
    stable = False

    def __init__(self, src: Any) -> None:
        self.src = src  # a Source or a ReadAhead of one
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

    def pin(self) -> None:
        """The bytes from the start on are read by a scanning thread until the next pin
        (:class:`MappedBuffer`: never released before then); nothing to do here, where the
        threads read a copy."""

    def unpin(self) -> None:
        """No scanning thread reads the bytes any more (:meth:`pin`'s hold is over)."""

    def unshift(self, b: Any) -> None:
        """Put back in front the bytes just before ``base`` (dropped earlier: the caller
        kept them)."""
        n = len(b)
        live = self._end - self._off
        if n <= self._off:
            self._ba[self._off - n : self._off] = b
            self._off -= n
        else:
            grown = bytearray(max(2 * (live + n), 1 << 16))
            grown[0:n] = b
            grown[n : n + live] = memoryview(self._ba)[self._off : self._end]
            self._ba, self._off, self._end = grown, 0, n + live
        self.base -= n

    def take(self, n: int) -> bytes:
        """Remove and return the first ``n`` bytes."""
        n = min(n, len(self))
        out = bytes(memoryview(self._ba)[self._off : self._off + n])
        self.drop(n)
        return out

    def close(self) -> None:
        """Nothing to release (:class:`MappedBuffer` unmaps its file)."""


class MappedSource(_Counts):
    """A plain regular file's bytes from ``start`` on, mapped (:func:`mapped`): the
    attributes of :class:`Source` (``block``, ``eof``, ``raw_read``, ``size``, ``gzip``,
    ``gzip_problem``) for :mod:`.kineto_stream`, with the reads done by
    :meth:`MappedBuffer.fill` (block by block, where :class:`Source` would end each read,
    so the decoder sees the same buffer lengths either way)."""

    def __init__(self, mm: mmap.mmap, start: int, block: int, guard_slot: int | None = None) -> None:
        super().__init__(block)
        self.mm = mm
        self.start = start
        #: the native SIGBUS guard's slot over ``mm`` (:func:`mapped`), None once closed
        self.guard_slot = guard_slot


def mapped(fh: Any, block: int, path: str = "") -> MappedBuffer | None:
    """The rest of ``fh`` (from its position) as a :class:`MappedBuffer`, when ``fh`` is a
    plain file object (``open(path, "rb")``: an ``io.BufferedReader`` of an ``io.FileIO``, or
    the ``FileIO``) of a regular file that does not start with the gzip magic there; None
    otherwise (a pipe, a tar member, a gzip file, an empty rest, ``TRACEROOF_MMAP=0``, a
    system without ``madvise(MADV_DONTNEED)``, or the mapping failed): then the blocks are
    read. Never raises.

    The mapping is of the file's size when called: bytes appended later are not seen (the
    trace reads as cut there). A file made shorter while it is mapped (a profiler rewriting
    the same path) loses pages the decoder may still read; the kernel signals that read
    (SIGBUS), which Python cannot catch. So a file is mapped only where the native scanner's
    guard is (``_kineto_scan.guard_map``): a fault inside the mapping then ends the process
    with one line, ``traceroof: error: PATH: byte N: the file became shorter while it was
    being read ... or its storage failed ...``, and exit code 4 (an unreadable trace), not a
    crash; without the extension, or with every guard slot taken, the file is read block by
    block.
    """
    if os.environ.get(ENV_MMAP, "").strip() == "0" or not hasattr(mmap, "MADV_DONTNEED"):
        return None  # (no MADV_DONTNEED, e.g. Windows: the pages behind could not be let go)
    if not (isinstance(fh, io.FileIO) or (type(fh) is io.BufferedReader and isinstance(fh.raw, io.FileIO))):
        return None
    try:
        fd = fh.fileno()
        st = os.fstat(fd)
        start = fh.tell()
        if not stat.S_ISREG(st.st_mode) or st.st_size <= start:
            return None
        mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError, OverflowError):
        return None
    if mm[start : start + 2] == GZIP_MAGIC:
        mm.close()
        return None
    slot = _guard(mm, path or getattr(fh, "name", "") or "the trace")
    if slot is None:
        mm.close()
        return None
    try:  # the kernel reads ahead of a cold file's pages (a hint: refused, it is left out)
        mm.madvise(mmap.MADV_SEQUENTIAL)
    except (AttributeError, OSError, ValueError):
        pass
    return MappedBuffer(MappedSource(mm, start, block, slot))


def _guard(mm: mmap.mmap, path: Any) -> int | None:
    """The native scanner's SIGBUS guard over ``mm`` (:func:`mapped`): its slot, or None when
    there is no guard (the extension missing, every slot taken)."""
    try:
        from . import _kineto_scan
    except ImportError:
        return None
    head = f"traceroof: error: {path}: byte "
    tail = (": the file became shorter while it was being read (a profiler writing it again?)"
            " or its storage failed; read it once it is written (TRACEROOF_MMAP=0 reads without"
            " mapping)\n")
    try:
        return _kineto_scan.guard_map(mm, head, tail)
    except (AttributeError, TypeError, ValueError, BufferError):  # (an older build: no guard)
        return None


class MappedBuffer(Buffer):
    """:class:`Buffer` over a mapped file (:func:`mapped`): ``_off`` and ``_end`` are file
    offsets into the mapping; :meth:`view` is the mapped bytes themselves, which never
    change, so a view stays valid after :meth:`drop` (the scan worker reads its pieces there,
    no copy); :meth:`unshift` only moves the start back. :meth:`close` unmaps the file."""

    #: the bytes of a view stay valid after drop (see the class docstring)
    stable = True

    def __init__(self, src: MappedSource) -> None:
        super().__init__(src)
        self._mv = memoryview(src.mm)
        self._off = self._end = self._released = src.start
        self._released -= src.start % mmap.PAGESIZE
        self._pinned: int | None = None  # pin(): pages from this file offset on are kept

    @property
    def data(self) -> bytes:
        """A copy of the live bytes."""
        return bytes(self._mv[self._off : self._end])

    def view(self) -> memoryview:
        """The live bytes, in the mapping (valid until :meth:`close`)."""
        return self._mv[self._off : self._end]

    def fill(self, n: int) -> bool:
        """Take in blocks of the mapping until the buffer holds at least ``n`` bytes; False
        when the file ended first."""
        src = self.src
        while len(self) < n:
            if self._end >= len(src.mm):
                src.eof = True  # as Source: set by the read that finds nothing more
                break
            self._end = min(len(src.mm), self._end + src.block)
            src.raw_read = src.size = self._end - src.start
        return len(self) >= n

    def drop(self, n: int) -> None:
        """Remove the first ``n`` bytes; every :data:`MAP_RELEASE_BYTES`, the pages more than
        :data:`MAP_LAG_BYTES` behind are unmapped, up to the last :meth:`pin` at most."""
        n = min(n, len(self))
        self._off += n
        self.base += n
        if self._off - self._released > MAP_RELEASE_BYTES + MAP_LAG_BYTES:
            to = self._off - MAP_LAG_BYTES
            if self._pinned is not None:
                to = min(to, self._pinned)
            to = to // mmap.PAGESIZE * mmap.PAGESIZE
            if to <= self._released:
                return
            try:  # the pages stay in the page cache: a later read of them maps them again
                self.src.mm.madvise(mmap.MADV_DONTNEED, self._released, to - self._released)
            except (OSError, ValueError):
                pass
            self._released = to

    def pin(self) -> None:
        """The pages from the start on are read by a scanning thread (its job's pieces, in
        place) until the next pin: :meth:`drop` releases none of them before then."""
        self._pinned = self._off

    def unpin(self) -> None:
        """No scanning thread reads the pages any more: :meth:`drop` releases them again as
        it goes (a pin never followed by another held every page after it mapped: the 1 GB
        read peaked at 1.2 GB instead of 0.36 GB once the threads were given up under load)."""
        self._pinned = None

    def unshift(self, b: Any) -> None:
        """Move the start back over the ``len(b)`` bytes before it (dropped earlier: ``b``
        is a view of them)."""
        self._off -= len(b)
        self.base -= len(b)

    def take(self, n: int) -> bytes:
        """Remove and return (a copy of) the first ``n`` bytes."""
        n = min(n, len(self))
        out = bytes(self._mv[self._off : self._off + n])
        self.drop(n)
        return out

    def close(self) -> None:
        """Unmap the file; when a view of it is still held somewhere (an exception's
        traceback), the mapping goes with the last one instead."""
        try:
            self._mv.release()
            self.src.mm.close()
        except BufferError:
            return  # (the mapping stays, so its guard stays too)
        slot = getattr(self.src, "guard_slot", None)
        if slot is not None:
            from . import _kineto_scan

            _kineto_scan.unguard_map(slot)
            self.src.guard_slot = None
