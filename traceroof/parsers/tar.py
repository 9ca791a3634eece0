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
from ..errors import TraceFormatError, path_text
from ..merge import event_count, merge
from .registry import CONTENT, HINT, MAGIC, Head, InputFormat

if TYPE_CHECKING:
    from ..progress import Progress
    from ..trace import Trace


#: a tar header block, bytes (POSIX.1-1988 ustar; GNU tar's differs in the magic's last bytes)
TAR_BLOCK_BYTES = 512


#: a header's numeric fields (mode, uid, gid, size, mtime), byte ranges: octal digits padded
#: with spaces or NULs (POSIX ustar), or GNU's base-256 (first byte 0x80 or 0xff) for uid,
#: gid, size and mtime
_NUMERIC_FIELDS = ((100, 108), (108, 116), (116, 124), (124, 136), (136, 148))
_OCTAL_OR_PAD = frozenset(b"01234567 \0")


def _numeric(field: bytes) -> bool:
    """Whether a header's numeric field holds a number (octal, or GNU base-256)."""
    return field[:1] in (b"\x80", b"\xff") or all(c in _OCTAL_OR_PAD for c in field)


def is_tar_header(data: bytes, *, magic: bool = True) -> bool:
    """Whether ``data`` starts with a tar header: the magic ``ustar`` at byte 257 (POSIX
    ``ustar\\0`` + version ``00``, GNU ``ustar  \\0``), in a whole 512-byte block (a file
    shorter than one header block is no tar), whose numeric fields (mode, uid, gid, size,
    mtime) hold numbers and whose checksum (bytes 148-155, octal) equals the sum of the
    block's bytes with the checksum field taken as spaces (POSIX.1 pax "ustar Interchange Format"; unsigned, or
    signed as some old writers summed). The name field (bytes 0-99) plays no part: a member
    named ``{...}`` or ``\\n...`` is still a tar. ``magic=False``: an old (Unix V7) header,
    which has no magic: the rest of the test alone, and a name that is not empty."""
    if (magic and data[257:262] != b"ustar") or len(data) < TAR_BLOCK_BYTES:
        return False  # (a tar is at least one whole header block: a shorter file is none)
    if not all(_numeric(data[a:b]) for a, b in _NUMERIC_FIELDS):
        return False
    field = data[148:156].replace(b"\0", b" ").strip()
    try:
        want = int(field, 8)
    except ValueError:
        return False
    block = data[:TAR_BLOCK_BYTES]
    unsigned = sum(block[:148]) + 8 * 0x20 + sum(block[156:])
    signed = unsigned - 256 * sum(1 for c in block[:148] + block[156:] if c >= 0x80)
    return want in (unsigned, signed) and (magic or data[:1] not in (b"", b"\0"))


def sniff(head: Head) -> int:
    """:data:`~.registry.MAGIC` for a tar header (:func:`is_tar_header`, in the file or its gzip
    stream): it wins over every content sniff, whatever the member names; :data:`~.registry.CONTENT`
    for an old V7 header (no magic); :data:`~.registry.HINT`
    for a gzip file named ``*.tar.gz``/``*.tgz``."""
    if is_tar_header(head.data):
        return MAGIC
    if is_tar_header(head.data, magic=False):
        return CONTENT  # (a V7 tar: numbers and a checksum, but no magic to rank it above)
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
                name = f"{path_text(p)}!{m.name}"
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
