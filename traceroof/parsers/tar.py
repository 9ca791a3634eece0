"""Tar archives (``.tar``, ``.tar.gz``) of per-rank Kineto traces: one input, its members merged.

Every ``*.json``/``*.json.gz`` member is one rank, streamed out of the archive by the Kineto
reader (:func:`traceroof.parsers.kineto.read_fileobj`) and merged by
:func:`traceroof.merge.merge`: in one pass over the archive by one process (:func:`read`),
or shared among several, each reading its share in its own pass (:func:`read_share`;
:func:`traceroof.io.read_trace`, docs/distributed.md).
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
    import tarfile

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


def _kineto_member(m: tarfile.TarInfo) -> bool:
    """Whether the archive's member ``m`` is one of its traces: a regular file named
    ``*.json`` or ``*.json.gz``."""
    return m.isfile() and m.name.endswith((".json", ".json.gz"))


def _archive_error(p: Path, exc: Exception) -> TraceFormatError:
    """The one-line error for a damaged ``.tar`` or its gzip (``exc``: tarfile's, zlib's)."""
    why = " ".join(str(exc).split())  # tarfile lists one line per method it tried: one line
    return TraceFormatError(p, "archive", f"a readable tar archive ({type(exc).__name__}: {why})")


def _archive_errors() -> tuple[type[Exception], ...]:
    """What a damaged archive raises while it is read (tarfile is imported here: only a tar
    input needs it; issue 19: no import the input does not need)."""
    import tarfile

    return (tarfile.TarError, zlib.error, EOFError, gzip.BadGzipFile)


#: what an archive without a trace is told it should be
NO_MEMBER = "a tar holding *.json or *.json.gz Kineto traces"


def compressed(p: Path) -> bool:
    """Whether the archive ``p`` is compressed (``.tar.gz``, ...): it does not start with a
    tar header (:func:`is_tar_header`, with or without the magic).

    Raises:
        OSError: ``p`` cannot be read.
    """
    with open(p, "rb") as fh:
        head = fh.read(TAR_BLOCK_BYTES)
    return not (is_tar_header(head) or is_tar_header(head, magic=False))


def read(p: Path, progress: Progress | None = None) -> Trace:
    """The Kineto members of the archive ``p``, merged (ordered by rank), read in this process
    in one pass over the archive (:func:`read_share` with one share).

    Raises:
        TraceFormatError: not a readable tar, no ``*.json``/``*.json.gz`` member, or a member
            that is not a Kineto trace.
    """
    return merge_members(read_share(p, 0, 1, progress))


def merge_members(read: list[tuple[str, int, Trace]]) -> Trace:
    """The traces of an archive's members (``(member name, place in the archive, trace)``, in
    any order, from one or several :func:`read_share`), merged as the archive's members are
    listed in name order (a tie by their place); per-rank files archived with their merged
    copy: each op once (:mod:`traceroof.duplicates`).

    ``read`` holds one member at least (none: the caller raises :data:`NO_MEMBER`)."""
    ordered = [t for _, _, t in sorted(read, key=lambda r: (r[0], r[1]))]
    copies = find_copies(ordered)
    trace = merge(copies.keep(ordered))
    copies.note(trace.meta)
    return trace


def read_share(p: Path, share: int, shares: int, progress: Progress | None = None) -> list[tuple[str, int, Trace]]:
    """The Kineto members of the archive ``p`` that fall to ``share`` (0-based) of ``shares``,
    read in one pass over the archive: ``[(member name, its place among the archive's Kineto
    members, its trace)]``.

    Each member goes to the share holding the fewest bytes of members so far (the lowest
    share on a tie), decided from the headers in archive order, so the processes that read
    the shares of one archive (:func:`traceroof.io.read_trace`) agree without a word and
    each member is read once. A compressed archive cannot be entered at an offset: each
    share decompresses it from its start, in archive order (seeking back to a member of a
    ``.tar.gz`` decompresses it again from its start: with the members read in name order,
    a 32-rank ``.tar.gz`` written in reverse order took 15.8 s against 6.6 s); an
    uncompressed tar is read at the members' offsets alone. Each member is streamed out by
    the Kineto reader (:func:`traceroof.parsers.kineto.read_fileobj`; its rank:
    ``distributedInfo``, else the name ``ARCHIVE!MEMBER``).

    Raises:
        TraceFormatError: not a readable tar, no Kineto member at all (``shares`` == 1 only: a
            share may hold none), or a member of this share that is not a Kineto trace.
        OSError: the archive cannot be read.
    """
    import tarfile

    from . import kineto

    out: list[tuple[str, int, Trace]] = []
    held = [0] * shares
    place = done_bytes = done_events = 0
    try:
        # (the members in archive order, each read as the archive reaches it: a seek back to a
        # member of a .tar.gz decompresses it again from its start; the random-access mode
        # rather than a stream, ``r|*``, whose Python buffering was 15 % slower on 16 ranks)
        with tarfile.open(p, "r:*") as tf:
            for m in tf:
                if not _kineto_member(m):
                    continue
                to = held.index(min(held))
                held[to] += m.size
                place += 1
                if to != share:
                    continue
                fh = tf.extractfile(m)
                assert fh is not None
                name = f"{path_text(p)}!{m.name}"
                cb = None if progress is None else _offset_cb(progress, done_bytes, done_events)
                # streamed: the member is decompressed and parsed chunk by chunk
                # a plain member's size is its JSON's (the decoder's choice: kineto.NATIVE_MIN_BYTES)
                size = m.size if m.name.endswith(".json") else None
                t = kineto.read_fileobj(fh, path=name, rank=None, progress=cb, json_bytes=size)
                out.append((m.name, place - 1, t))
                done_bytes += m.size
                done_events += event_count(t)
                if progress is not None:
                    progress.update(done_bytes, done_events)
    except _archive_errors() as exc:
        raise _archive_error(p, exc) from exc
    if not place and shares == 1:
        raise TraceFormatError(p, "archive", NO_MEMBER)
    return out


FORMAT = InputFormat(name="tar", read=read, sniff=sniff, describe="a .tar.gz of traces",
                     gzip_describe="a tar of traces")
