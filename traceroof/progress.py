"""Progress on stderr for reads that take more than a second.

The library never prints on its own: every reader takes ``progress=None``. The CLI passes a
:class:`Progress` (unless ``-q``), which

- shows nothing during the first second (``delay``), so a fast read prints nothing at all;
- then, on a TTY, keeps one line up to date (``\\r``-rewritten, at most 5 times a second);
- off a TTY (CI logs), prints a plain line at most every 5 s;
- ends, if it showed anything or the read took more than ``delay``, with one summary line::

      traceroof: read 16 files, 412.3 MB, 2,345,678 events in 3.1 s (756,670 events/s)

The clock is injectable (``clock=``), so tests drive it without sleeping.

Protocol the readers use (all counts are cumulative totals; bytes are on-disk bytes):
``start(files=, bytes=)`` once, ``update(bytes_read, events)`` while a file is being read
(totals *within that file*; the Kineto parser calls it after each chunk), ``file_done(path,
bytes, events)`` when a file is finished, and ``close(ok=True)`` at the end.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

__all__ = ["Progress"]

#: the default clock (seconds, monotonic); a module attribute so tests can replace it for the CLI
_now: Callable[[], float] = time.monotonic


def _mb(n: int) -> str:
    """Bytes in kB, MB or GB (decimal units)."""
    if n < 1e6:
        return f"{n / 1e3:,.1f} kB"
    if n < 1e9:
        return f"{n / 1e6:,.1f} MB"
    return f"{n / 1e9:,.2f} GB"


class Progress:
    """A throttled progress line on a stream (stderr by default). See the module docstring.

    Args:
        stream: where to write (default ``sys.stderr`` at construction time).
        clock: seconds, monotonic (default: the module's ``_now``, :func:`time.monotonic`);
            inject a fake in tests.
        delay: seconds before anything is shown (default 1.0).
        tty: force TTY (rewriting line) or plain-line mode; default: ``stream.isatty()``.
        tty_interval: seconds between rewrites on a TTY (default 0.2).
        plain_interval: seconds between plain lines off a TTY (default 5.0).
        prefix: text before every line (default ``"traceroof: "``).
    """

    def __init__(self, stream: TextIO | None = None, *, clock: Callable[[], float] | None = None,
                 delay: float = 1.0, tty: bool | None = None, tty_interval: float = 0.2,
                 plain_interval: float = 5.0, prefix: str = "traceroof: ") -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.clock = clock if clock is not None else _now
        self.delay = delay
        if tty is None:
            isatty = getattr(self.stream, "isatty", None)
            tty = bool(isatty()) if callable(isatty) else False
        self.tty = tty
        self.interval = tty_interval if tty else plain_interval
        self.prefix = prefix
        self.t0 = self.clock()
        self.files_total: int | None = None
        self.bytes_total: int | None = None
        self.files_done = 0
        self.bytes_done = 0  # on-disk bytes of finished files
        self.events_done = 0  # events of finished files
        self._cur_bytes = 0  # within the file being read
        self._cur_events = 0
        self._last_shown: float | None = None
        self._line_len = 0  # length of the live TTY line, 0 when none is on screen
        self.shown = False  # anything written yet
        self.closed = False

    # -- the protocol ------------------------------------------------------------------------

    def start(self, *, files: int | None = None, bytes: int | None = None) -> None:  # noqa: A002
        """Announce the totals: ``files`` to read and their ``bytes`` on disk (either may be None)."""
        self.files_total = files
        self.bytes_total = bytes
        self._tick()

    def update(self, bytes_read: int, events: int) -> None:
        """Progress inside the file being read: its bytes read and events so far (totals)."""
        self._cur_bytes = int(bytes_read)
        self._cur_events = int(events)
        self._tick()

    __call__ = update  # usable directly as the Kineto parser's ``progress=`` callback

    def file_done(self, path: object, bytes: int, events: int) -> None:  # noqa: A002
        """One file finished: its on-disk ``bytes`` and the ``events`` it held."""
        self.files_done += 1
        self.bytes_done += int(bytes)
        self.events_done += int(events)
        self._cur_bytes = self._cur_events = 0
        self._tick()

    def close(self, ok: bool = True) -> None:
        """Finish: the summary line when the read took more than ``delay`` (and ``ok``)."""
        if self.closed:
            return
        self.closed = True
        elapsed = self.clock() - self.t0
        if ok and (self.shown or elapsed >= self.delay):
            self._write(self._summary(elapsed), final=True)
        elif self._line_len:
            self.stream.write("\n")
            self.stream.flush()
            self._line_len = 0

    # -- rendering ---------------------------------------------------------------------------

    @property
    def events(self) -> int:
        """Events so far: finished files plus the file being read."""
        return self.events_done + self._cur_events

    def _tick(self) -> None:
        if self.closed:
            return
        now = self.clock()
        elapsed = now - self.t0
        if elapsed < self.delay:
            return
        if self._last_shown is not None and now - self._last_shown < self.interval:
            return
        self._last_shown = now
        self._write(self._status(elapsed), final=False)

    def _status(self, elapsed: float) -> str:
        parts = []
        if self.files_total is not None and self.files_total > 1:
            parts.append(f"{self.files_done}/{self.files_total} files")
        done = self.bytes_done + self._cur_bytes
        parts.append(_mb(done) + (f" of {_mb(self.bytes_total)}" if self.bytes_total else ""))
        ev = self.events
        parts.append(f"{ev:,} events")
        if elapsed > 0:
            parts.append(f"{ev / elapsed:,.0f} events/s")
        return "reading " + ", ".join(parts)

    def _summary(self, elapsed: float) -> str:
        n = self.files_done
        files = f"{n} file{'s' if n != 1 else ''}, " if n != 1 else ""
        rate = self.events_done / elapsed if elapsed > 0 else 0.0
        return (f"read {files}{_mb(self.bytes_done)}, {self.events_done:,} events "
                f"in {elapsed:.1f} s ({rate:,.0f} events/s)")

    def _write(self, text: str, *, final: bool) -> None:
        line = self.prefix + text
        if self.tty:
            pad = " " * max(self._line_len - len(line), 0)
            self.stream.write("\r" + line + pad + ("\n" if final else ""))
            self._line_len = 0 if final else len(line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
        self.shown = True
