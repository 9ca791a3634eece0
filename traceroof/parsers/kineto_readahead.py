"""Reading a Kineto stream's blocks in a thread, ahead of the decoder (:class:`ReadAhead`).

The streaming decoder (:mod:`.kineto_stream`) takes decompressed blocks one at a time from a
source (``_Source``: a plain file or a gzip stream inflated with :mod:`zlib`). Reading and
inflating release the GIL (file reads, ``zlib.decompress``), so a thread that does them while
the decoder works takes that time off the decoder's path: ~1.2 s of inflating on the 1 GB
``.json.gz`` of ``docs/performance.md``. At most ``depth`` blocks wait (``depth`` x 1 MiB of
memory); the blocks come out in the order the source gave them, and the source's end, its
gzip problem and an exception it raised come out where they happened (an exception is
raised by the :meth:`ReadAhead.read` that reaches it).
"""

from __future__ import annotations

import os
import queue
import threading
from typing import Any

#: ``TRACEROOF_READ_AHEAD=0`` reads every block in the decoding thread (comparisons,
#: benchmarks; the result is the same either way)
ENV_READ_AHEAD = "TRACEROOF_READ_AHEAD"

#: blocks read ahead at most (each at most the stream's block size, 1 MiB by default)
DEPTH = 4


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
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="traceroof-read", daemon=True)
            self._thread.start()
        item = self._q.get()
        if isinstance(item, BaseException):
            self.eof = True
            raise item
        if not item:
            self.eof = True
        return item

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                b = self.src.read()
                self._q.put(b)
                if not b:
                    return
        except BaseException as exc:  # handed to the reader, raised where it happened
            self._q.put(exc)

    def close(self) -> None:
        """Stop the thread (after the block it is reading) and drop the blocks not read."""
        self._stop.set()
        if self._thread is None:
            return
        while self._thread.is_alive():
            try:
                self._q.get(timeout=0.05)  # make room for a blocked put
            except queue.Empty:
                pass
        self._thread.join()
        self._thread = None
