"""A trace read from a stream that can be read only once: stdin (``-``) or a FIFO (named pipe).

``ssh host cat trace.json.gz | traceroof analyze -``: the format is sniffed from the stream's
first bytes (:func:`.registry.head_of`: gzip or plain, past a UTF-8 byte-order mark and
white space), then those bytes are handed back in front of the rest. A Kineto trace is
streamed from the pipe as a file is (block by block, a ``.gz`` inflated as it comes; memory
bounded by the tables, never the whole JSON); any other format (an ``.xplane.pb``, a tar of
traces) is first copied to a temporary file (in ``$TMPDIR``), read from there and removed:
those readers need a file they can seek in. Messages and ``meta.sources`` name the stream
(``<stdin>`` or the FIFO's path), never the temporary file.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from ..errors import (
    InputNotFoundError,
    TraceFormatError,
    TraceroofError,
    UsageError,
    path_text,
)
from . import registry

if TYPE_CHECKING:
    from ..progress import Progress
    from ..trace import Trace

#: the command-line name of stdin
STDIN = "-"
#: how stdin is named in messages and ``meta.sources``
STDIN_NAME = "<stdin>"


class _Replay:
    """A binary stream whose first bytes, read once to sniff it, are read again: ``read(n)``
    records what it returns until :meth:`rewind`, which hands those bytes out first."""

    def __init__(self, fh: BinaryIO) -> None:
        self._fh = fh
        self._kept: list[bytes] | None = []
        self._again = b""
        self.raw_read = 0

    def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes (all with ``n < 0``): the replayed ones first, then the stream's."""
        if self._again:
            k = len(self._again) if n < 0 else n
            out, self._again = self._again[:k], self._again[k:]
            if n < 0:
                out += self._fh.read()
            return out
        b = self._fh.read(n) or b""
        self.raw_read += len(b)
        if self._kept is not None:
            self._kept.append(b)
        return b

    def rewind(self) -> None:
        """Hand the bytes read so far out again, then go on with the stream; stop recording."""
        self._again = b"".join(self._kept or [])
        self._kept = None


def read_stream(fh: BinaryIO, name: str, progress: Progress | None = None) -> Trace:
    """The trace on the binary stream ``fh`` (read to its end, not closed), named ``name``.

    Raises:
        TraceFormatError: not a trace (sniffed as :func:`.registry.detect` does a file's:
            UTF-16/32 text named), or nothing recoverable in it; the message names ``name``.
        MixedInputsError: a tar whose members are not one job (different devices, or
            overlapping ranks; :func:`traceroof.merge.check_mergeable`), named as ``name``.
        OSError: reading the stream, or writing the temporary copy, failed.
    """
    src = _Replay(fh)
    head = registry.head_of(Path(name), src.read(registry.HEAD_BYTES), src.read, None)
    fmt = registry.detect_head(head)
    src.rewind()
    if fmt.name == "kineto":
        from . import kineto

        update = None if progress is None else progress.update
        return kineto.read_fileobj(src, path=name, progress=update, json_bytes=None)  # type: ignore[arg-type]
    return _read_spooled(src, name, fmt, progress)


def _read_spooled(src: Any, name: str, fmt: registry.InputFormat, progress: Progress | None) -> Trace:
    """Copy the stream to a temporary file (:func:`_spool`) and read it with ``fmt``; messages
    and ``meta.sources`` name ``name``, not the copy."""
    with _spool(src, name) as tmp:
        try:
            trace = fmt.read(tmp, progress)
        except TraceFormatError as exc:
            raise TraceFormatError(exc.path.replace(str(tmp), name), exc.where,
                                   exc.expected.replace(str(tmp), name)) from exc
        except TraceroofError as exc:  # (MixedInputsError of a tar's members, ...): the stream named
            exc.args = tuple(a.replace(str(tmp), name) if isinstance(a, str) else a for a in exc.args)
            raise
        trace.meta.sources = [s.replace(str(tmp), name) for s in trace.meta.sources]
        trace.meta.warnings = [w.replace(str(tmp), name) for w in trace.meta.warnings]
        if trace.meta.format == "xplane":
            _host_named(trace, tmp, name)
        return trace


def _host_named(trace: Trace, tmp: Path, name: str) -> None:
    """An XSpace without ``hostnames`` is named by its file (:func:`.xplane.file_stem`): the
    host of a spooled one is the stream's (``stdin``, or the FIFO's file stem), not the copy's."""
    from .xplane import file_stem

    copy, stream = file_stem(tmp), file_stem(Path("stdin" if name == STDIN_NAME else name))
    if copy == stream:
        return
    import polars as pl

    for table in ("ops", "host"):
        df = getattr(trace, table)
        if "host" in df.columns and df.schema["host"] == pl.String:
            setattr(trace, table, df.with_columns(pl.col("host").replace(copy, stream)))


#: where an open file can be opened again by its descriptor, the unlinked spool file
#: included (Linux procfs); None elsewhere
PROC_FD: str | None = "/proc/self/fd" if os.path.isdir("/proc/self/fd") else None


@contextlib.contextmanager
def _spool(src: Any, name: str) -> Iterator[Path]:
    """The path of a temporary copy of the stream ``src`` (in ``$TMPDIR``), removed however
    the read ends.

    Where :data:`PROC_FD` exists, the copy is a file without a name (``tempfile.TemporaryFile``:
    ``O_TMPFILE``, or unlinked as soon as it is made) read through ``/proc/self/fd/N``: the
    kernel frees it when the process ends, whatever ends it (SIGTERM, SIGHUP, SIGKILL, the
    out-of-memory killer), from any thread, and no signal handler of the program is touched:
    nothing is ever left in ``$TMPDIR``. Elsewhere, a folder ``traceroof-stream-*`` holds the
    copy, and while it exists a SIGTERM or SIGHUP (in the main thread, when the program left
    them at their default) raises ``SystemExit(128 + signal)``, so the folder is removed on
    the way out; the handlers are restored after. There the exit waits for a read of the
    stream that is blocked to return (its next block, or its end: Python runs a handler in
    the main thread only), and a SIGKILL leaves the folder: why ``/proc`` is preferred.
    """
    import shutil  # here: only a spooled stream needs them (issue 19: no import the input does not need)
    import tempfile

    if PROC_FD is not None:
        with tempfile.TemporaryFile(prefix="traceroof-stream-") as out:
            shutil.copyfileobj(src, out, 1 << 20)
            out.flush()
            yield Path(PROC_FD, str(out.fileno()))
        return
    with _exit_on_signals(), tempfile.TemporaryDirectory(prefix="traceroof-stream-") as d:
        tmp = Path(d) / (Path(name).name if name != STDIN_NAME else "stdin")
        with open(tmp, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
        yield tmp


@contextlib.contextmanager
def _exit_on_signals() -> Iterator[None]:
    """While in it, SIGTERM and SIGHUP (where they exist, at their default handler, in the
    main thread) raise ``SystemExit(128 + signal)`` (the shell's status for a death by that
    signal) so that ``finally`` blocks and context managers run; restored after."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def leave(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    saved = {}
    for sig in (getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n)):
        if signal.getsignal(sig) is signal.SIG_DFL:
            saved[sig] = signal.signal(sig, leave)
    try:
        yield
    finally:
        for sig, old in saved.items():
            signal.signal(sig, old)


#: the stdin stream this process has read (:func:`read_stdin`): a stream is read once
_read_already: object | None = None


def check_read_once(*inputs: tuple[str, Sequence[str | None] | str | None]) -> None:
    """Refuse ``-`` (stdin) given more than once among a command's inputs (``diff - -``,
    ``analyze - --capture-trace -``, ``gate - --baseline -``): stdin can be read only once.
    ``inputs``: ``(what, value)`` pairs, ``what`` naming the argument or option in the
    message, ``value`` one input, several, or None.

    Raises:
        UsageError: ``-`` is given more than once (one line naming where).
    """
    where = []
    for what, value in inputs:
        values = [value] if value is None or isinstance(value, str) else list(value)
        where += [what] * sum(1 for v in values if v == STDIN)
    if len(where) > 1:
        raise UsageError(f"'{STDIN}' (stdin) is given {len(where)} times ({', '.join(where)}): stdin can be read "
                         "once in a command; save the trace to a file to name it twice")


def read_stdin(progress: Progress | None = None) -> Trace:
    """The trace piped into this process's stdin (``traceroof analyze -``), read once: stdin
    cannot be read again (it is at its end).

    Raises:
        InputNotFoundError: stdin is a terminal (nothing is piped in) or closed.
        UsageError: this process has read stdin already (:func:`check_read_once` tells a
            command line so before reading anything).
        TraceFormatError: as :func:`read_stream`.
        MixedInputsError: a tar piped in whose members are not one job (as
            :func:`read_stream`).
        OSError: reading stdin, or writing the temporary copy, failed.
    """
    global _read_already
    stdin = sys.stdin
    if stdin is None or stdin.closed:
        raise InputNotFoundError(f"{STDIN}: stdin is closed: pipe a trace into it (cat trace.json.gz | traceroof analyze -)")
    if stdin.isatty():
        raise InputNotFoundError(f"{STDIN}: stdin is a terminal, not a trace: pipe one into it "
                                 "(cat trace.json.gz | traceroof analyze -)")
    if _read_already is stdin.buffer:
        raise UsageError(f"'{STDIN}' (stdin) was read already: stdin can be read once in a process; "
                         "save the trace to a file to read it twice")
    _read_already = stdin.buffer
    return read_stream(stdin.buffer, STDIN_NAME, progress)


def read_fifo(path: Path, progress: Progress | None = None) -> Trace:
    """The trace written into the FIFO ``path`` (opening it waits for a writer, as ``cat``
    does).

    Raises:
        TraceFormatError, MixedInputsError: as :func:`read_stream`.
        OSError: it cannot be opened or read.
    """
    with open(path, "rb") as fh:
        return read_stream(fh, path_text(path), progress)


__all__ = ["STDIN", "STDIN_NAME", "check_read_once", "read_stream", "read_stdin", "read_fifo"]
