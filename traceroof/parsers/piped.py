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

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from ..errors import InputNotFoundError, TraceFormatError, TraceroofError
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
        TraceFormatError: not a trace (sniffed as :func:`.registry.detect` does a file's), or
            nothing recoverable in it; the message names ``name``.
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
    """Copy the stream to a temporary file named as ``name`` and read it with ``fmt``."""
    import shutil  # here: only a spooled stream needs them (issue 19: no import the input does not need)
    import tempfile

    with tempfile.TemporaryDirectory(prefix="traceroof-stream-") as d:
        base = Path(name).name if name != STDIN_NAME else "stdin"
        tmp = Path(d) / base
        with open(tmp, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
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
        return trace


def read_stdin(progress: Progress | None = None) -> Trace:
    """The trace piped into this process's stdin (``traceroof analyze -``).

    Raises:
        InputNotFoundError: stdin is a terminal (nothing is piped in) or closed.
        TraceFormatError: as :func:`read_stream`.
    """
    stdin = sys.stdin
    if stdin is None or stdin.closed:
        raise InputNotFoundError(f"{STDIN}: stdin is closed: pipe a trace into it (cat trace.json.gz | traceroof analyze -)")
    if stdin.isatty():
        raise InputNotFoundError(f"{STDIN}: stdin is a terminal, not a trace: pipe one into it "
                                 "(cat trace.json.gz | traceroof analyze -)")
    return read_stream(stdin.buffer, STDIN_NAME, progress)


def read_fifo(path: Path, progress: Progress | None = None) -> Trace:
    """The trace written into the FIFO ``path`` (opening it waits for a writer, as ``cat``
    does).

    Raises:
        TraceFormatError: as :func:`read_stream`.
        OSError: it cannot be opened or read.
    """
    with open(path, "rb") as fh:
        return read_stream(fh, str(path), progress)


__all__ = ["STDIN", "STDIN_NAME", "read_stream", "read_stdin", "read_fifo"]
