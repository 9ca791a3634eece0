"""Tar archives (``.tar``, ``.tar.gz``) of per-rank Kineto traces: one input, its members merged.

Every ``*.json``/``*.json.gz`` member is one rank, streamed out of the archive by the Kineto
reader (:func:`traceroof.parsers.kineto.read_fileobj`) and merged by
:func:`traceroof.merge.merge`.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ..duplicates import find_copies
from ..errors import TraceFormatError
from ..merge import event_count, merge
from .registry import CONTENT, HINT, Head, InputFormat

if TYPE_CHECKING:
    from ..progress import Progress
    from ..trace import Trace


def sniff(head: Head) -> int:
    """:data:`~.registry.CONTENT` for a POSIX tar header (``ustar`` at byte 257, in the file or
    its gzip stream); :data:`~.registry.HINT` for a gzip file named ``*.tar.gz``/``*.tgz``."""
    if len(head.data) > 262 and head.data[257:262] == b"ustar":
        return CONTENT
    return HINT if head.gzip and head.name.endswith((".tar.gz", ".tgz")) else 0


def _offset_cb(progress: Progress, bytes0: int, events0: int) -> Callable[[int, int], None]:
    """A per-member progress callback that adds the members already read."""

    def cb(bytes_read: int, events: int) -> None:
        progress.update(bytes0 + bytes_read, events0 + events)

    return cb


def read(p: Path, progress: Progress | None = None) -> Trace:
    """The Kineto members of the archive ``p``, merged (ordered by rank).

    Raises:
        TraceFormatError: not a readable tar, no ``*.json``/``*.json.gz`` member, or a member
            that is not a Kineto trace.
    """
    import tarfile  # here: only a tar input needs it (issue 19: no import the input does not need)

    from . import kineto

    traces = []
    done_bytes = done_events = 0
    try:
        with tarfile.open(p, "r:*") as tf:
            members = [m for m in tf.getmembers() if m.isfile() and m.name.endswith((".json", ".json.gz"))]
            if not members:
                raise TraceFormatError(p, "archive", "a tar holding *.json or *.json.gz Kineto traces")
            for m in sorted(members, key=lambda m: m.name):
                fh = tf.extractfile(m)
                assert fh is not None
                name = f"{p}!{m.name}"
                cb = None if progress is None else _offset_cb(progress, done_bytes, done_events)
                # streamed: the member is decompressed and parsed chunk by chunk
                # a plain member's size is its JSON's (the decoder's choice: kineto.NATIVE_MIN_BYTES)
                size = m.size if m.name.endswith(".json") else None
                t = kineto.read_fileobj(fh, path=name, rank=None, progress=cb, json_bytes=size)
                traces.append(t)
                done_bytes += m.size
                done_events += event_count(t)
                if progress is not None:
                    progress.update(done_bytes, done_events)
    except (tarfile.TarError, zlib.error, EOFError, gzip.BadGzipFile) as exc:  # a damaged .tar or its gzip
        why = " ".join(str(exc).split())  # tarfile lists one line per method it tried: one line
        raise TraceFormatError(p, "archive", f"a readable tar archive ({type(exc).__name__}: {why})") from exc
    # per-rank files archived with their merged copy: each op once (traceroof.duplicates)
    copies = find_copies(traces)
    trace = merge(copies.keep(traces))
    copies.note(trace.meta)
    return trace


FORMAT = InputFormat(name="tar", read=read, sniff=sniff, describe="a .tar.gz of traces",
                     gzip_describe="a tar of traces")
