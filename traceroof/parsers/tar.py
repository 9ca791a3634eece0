"""Tar archives (``.tar``, ``.tar.gz``) of per-rank Kineto traces: one input, its members merged.

Every ``*.json``/``*.json.gz`` member is one rank, streamed out of the archive by the Kineto
reader (:func:`traceroof.parsers.kineto.read_fileobj`) and merged by
:func:`traceroof.merge.merge`: in one pass over the archive by one process (:func:`read`),
or shared among several, each reading its share in its own pass (:func:`read_share`;
:func:`traceroof.io.read_trace`, docs/distributed.md). A cut or damaged archive keeps what
can be read of it and says, in one warning, where it ends and what was lost.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

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
    # (tarfile lists one line per method it tried: one line)
    return TraceFormatError(p, "archive", f"a readable tar archive ({_why(exc)})")


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
    in one pass over the archive (:func:`read_share` with one share). A cut or damaged
    archive keeps what can be read of it, and says in a warning what was lost.

    Raises:
        TraceFormatError: not a readable tar, no ``*.json``/``*.json.gz`` member (nothing
            readable before the damage included), or a member that is not a Kineto trace.
    """
    members, notes = read_share(p, 0, 1, progress)
    return merge_members(members, notes)


def merge_members(read: list[tuple[str, int, Trace]], notes: Sequence[str] = ()) -> Trace:
    """The traces of an archive's members (``(member name, place in the archive, trace)``, in
    any order, from one or several :func:`read_share`), merged as the archive's members are
    listed in name order (a tie by their place); per-rank files archived with their merged
    copy: each op once (:mod:`traceroof.duplicates`). ``notes``: what the shares said of a
    cut or damaged archive, each a warning of the merged trace.

    ``read`` holds one member at least (none: the caller raises :data:`NO_MEMBER`)."""
    ordered = [t for _, _, t in sorted(read, key=lambda r: (r[0], r[1]))]
    copies = find_copies(ordered)
    trace = merge(copies.keep(ordered))
    copies.note(trace.meta)
    for note in notes:
        trace.meta.warn(note)
    return trace


Share = tuple[list[tuple[str, int, "Trace"]], list[str]]


def read_share(p: Path, share: int, shares: int, progress: Progress | None = None) -> Share:
    """The Kineto members of the archive ``p`` that fall to ``share`` (0-based) of ``shares``,
    read in one pass over the archive: ``([(member name, its place among the archive's Kineto
    members, its trace)], notes)``, the notes saying what this share found lost in a cut or
    damaged archive (below).

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

    A cut or damaged archive keeps what can be read: the members before the fault whole, the
    member it cuts as far as its bytes go (the Kineto reader recovers a cut trace event by
    event), and one note saying where the archive ends or is damaged. The note comes from
    one share, the same whatever the number of shares: the owner of the member read at the
    fault (of a member that is no trace: share 0); share 0 checks a compressed archive's end.

    Raises:
        TraceFormatError: not a readable tar (its first header included), no Kineto member at
            all (``shares`` == 1 only: a share may hold none), or a member of this share that
            is not a Kineto trace.
        OSError: the archive cannot be read.
    """
    import tarfile

    out: list[tuple[str, int, Trace]] = []
    notes: list[str] = []
    held = [0] * shares
    place = 0
    done = [0, 0]  # the bytes and events of this share's members read so far (progress)
    errors = _archive_errors()
    archive = path_text(p)
    last: tuple[str, int] | None = None  # the last member seen, and its share
    try:
        # (the members in archive order, each read as the archive reaches it: a seek back to a
        # member of a .tar.gz decompresses it again from its start; the random-access mode
        # rather than a stream, ``r|*``, whose Python buffering was 15 % slower on 16 ranks)
        with tarfile.open(p, "r:*") as tf:
            stream = tf.fileobj = _LastRead(tf.fileobj)
            while True:
                try:
                    m = tf.next()
                    fault = None if m is not None else _end_fault(stream.last, tf.offset)
                except errors as exc:
                    m, fault = None, f"ends or is damaged ({_why(exc)})"
                if m is None:
                    notes += _end_notes(stream, tf.offset, fault, last, share, archive, errors)
                    break
                if not _kineto_member(m):
                    last = (m.name, 0)
                    continue
                to = held.index(min(held))
                held[to] += m.size
                place += 1
                last = (m.name, to)
                if to != share:
                    continue
                t, note = _read_member(tf, stream, m, archive, errors, progress, done)
                if t is not None:
                    out.append((m.name, place - 1, t))
                if note is not None:
                    notes.append(note)
                    break
    except errors as exc:
        raise _archive_error(p, exc) from exc
    if shares == 1 and (not place or (not out and notes)):
        raise nothing_read(p, notes)
    return out, notes


def nothing_read(p: Path | str, notes: Sequence[str]) -> TraceFormatError:
    """The error for the archive ``p`` of which no trace was read: the first of the shares'
    ``notes`` when it is cut or damaged (without its leading ``ARCHIVE:``), else
    :data:`NO_MEMBER`."""
    if notes:
        return TraceFormatError(p, "archive", f"a readable tar archive ({notes[0].split(': ', 1)[1]})")
    return TraceFormatError(p, "archive", NO_MEMBER)


def _end_notes(stream: _LastRead, offset: int, fault: str | None, last: tuple[str, int] | None, share: int,
               archive: str, errors: tuple[type[Exception], ...]) -> list[str]:
    """Where tarfile's listing ended (at tar byte ``offset``; ``fault``: what :func:`_end_fault`
    or the exception said, None at the end-of-archive marker, past which the archive is read
    on: :func:`_after_marker`), the notes this ``share`` gives: a fault by the share of the
    ``last`` member seen (``(name, share)``), a compressed stream's check by share 0."""
    end = None
    if fault is None:
        fault, end = _after_marker(stream, offset, archive, errors)
    if fault is not None and last is not None and last[1] == share:
        return [f"{archive}: the archive {fault} after member {last[0]}: the members after it, if any, are lost"]
    return [end] if end is not None and share == 0 else []


def _read_member(tf: tarfile.TarFile, stream: _LastRead, m: tarfile.TarInfo, archive: str,
                 errors: tuple[type[Exception], ...], progress: Progress | None,
                 done: list[int]) -> tuple[Trace | None, str | None]:
    """The trace of the archive's member ``m`` (None: the archive is cut before anything of
    it could be read), and the note when the archive ends or is damaged inside it (None: it
    read whole). ``done``: the bytes and events read before it, counted on.

    Raises:
        TraceFormatError: the member, read whole, is not a Kineto trace.
    """
    from . import kineto

    # (a GNU sparse member, its holes filled by tarfile: a fault in it fails the read)
    fh = tf.extractfile(m) if m.issparse() else _Member(stream, m, errors)
    cb = None if progress is None else _offset_cb(progress, done[0], done[1])
    # streamed: the member is decompressed and parsed chunk by chunk; a plain member's size
    # is its JSON's (the decoder's choice: kineto.NATIVE_MIN_BYTES)
    size = m.size if m.name.endswith(".json") else None
    try:
        t = kineto.read_fileobj(fh, path=f"{archive}!{m.name}", rank=None, progress=cb, json_bytes=size)
    except TraceFormatError:
        if getattr(fh, "fault", None) is None:
            raise
        t = None
    fault = getattr(fh, "fault", None)
    if t is not None:
        done[0] += m.size
        done[1] += event_count(t)
        if progress is not None:
            progress.update(done[0], done[1])
    if fault is None:
        return t, None
    kept = "that rank is what could be read of it" if t is not None else "nothing of it could be read"
    return t, (f"{archive}: the archive ends or is damaged inside member {m.name} ({_why(fault)}), after "
               f"{fh.bytes_read:,} of its {m.size:,} bytes: {kept}, and the members after it, if any, are lost")


class _LastRead:
    """The archive's (decompressed) stream as tarfile reads it, keeping the bytes of its last
    read: where tarfile's iteration ends, the block it read for a header, which says whether
    it met the end-of-archive marker, the end of the file, or a damaged header (tarfile ends
    its iteration on each alike). Everything else is the stream's own (tarfile's plain file,
    or its gzip stream: the registry sniffs no other compression)."""

    def __init__(self, fileobj: BinaryIO) -> None:
        self._f = fileobj
        self.last = b""
        #: one read of the file or one inflate at a time (a raw file has no read1: its read is one)
        self.read1 = getattr(fileobj, "read1", fileobj.read)

    def read(self, n: int = -1) -> bytes:
        b = self._f.read(n)
        self.last = b
        return b

    def __getattr__(self, name: str) -> object:
        return getattr(self._f, name)


class _Member:
    """A member's bytes, read straight from the archive's stream (not through
    ``tarfile.extractfile``, whose reads drop what they got when the archive ends inside
    them): a read stops, instead of raising, where the archive is cut or damaged (``fault``),
    so the member keeps every byte before it (``bytes_read``)."""

    def __init__(self, stream: _LastRead, m: tarfile.TarInfo, errors: tuple[type[Exception], ...]) -> None:
        self._s, self._errors = stream, errors
        self._at, self._left = m.offset_data, m.size
        self.fault: Exception | None = None
        self.bytes_read = 0

    def read(self, n: int = -1) -> bytes:
        if self.fault is not None or self._left <= 0:
            return b""
        want = self._left if n < 0 else min(n, self._left)
        parts: list[bytes] = []
        try:
            if self._s.tell() != self._at:
                self._s.seek(self._at)
            while want:
                # (read1: one read of the file or one inflate at a time, so that a fault
                # loses none of the bytes read before it)
                b = self._s.read1(want)
                if not b:
                    self.fault = EOFError("the archive ends before the member does")
                    break
                parts.append(b)
                want -= len(b)
        except self._errors as exc:
            self.fault = exc
        out = parts[0] if len(parts) == 1 else b"".join(parts)
        self._at += len(out)
        self._left -= len(out)
        self.bytes_read += len(out)
        return out


def _end_fault(block: bytes, offset: int) -> str | None:
    """Why tarfile's iteration ended on ``block``, the bytes it read for a header at tar byte
    ``offset``: None at the end-of-archive marker (a block of zeros, POSIX.1 ustar), else
    what is wrong, as a phrase (``the archive …``)."""
    if not block:
        return "ends without its end-of-archive marker (it is probably cut there)"
    if len(block) < TAR_BLOCK_BYTES:
        return f"is cut inside the header at tar byte {offset:,}"
    if block.count(0) == TAR_BLOCK_BYTES:
        return None
    return f"is damaged at tar byte {offset:,} (not a tar header)"


def _after_marker(stream: _LastRead, offset: int, archive: str,
                  errors: tuple[type[Exception], ...]) -> tuple[str | None, str | None]:
    """What follows the block of zeros at tar byte ``offset`` where tarfile ended its listing,
    read on to the end of the archive (the record's padding, a few KB, in an archive that
    ends there): ``(fault, note)``. ``fault`` (a phrase, as :func:`_end_fault`'s) when a
    byte that is not zero follows: the block was a zeroed header, archives were joined end
    to end, or bytes appended, and what follows is not read (tarfile reads one archive). ``note``
    when a compressed stream fails its own check at its end (gzip's CRC-32 and length, its
    last 8 bytes: RFC 1952), or ends in bytes that are not gzip data."""
    at = stream.tell()
    try:
        while True:
            b = stream.read(1 << 16)
            if not b:
                return None, None
            lead = len(b) - len(b.lstrip(b"\0"))
            if lead < len(b):
                return (f"has a block of zeros at tar byte {offset:,} (read as its end) and more data at tar "
                        f"byte {at + lead:,} (a zeroed header, archives joined end to end, or bytes appended)"), None
            at += len(b)
    except errors as exc:
        if isinstance(exc, gzip.BadGzipFile) and str(exc).startswith("Not a gzipped file"):
            return None, (f"{archive}: the archive's compressed stream is followed by bytes that are not gzip "
                          "data (left unread)")
        return None, (f"{archive}: the archive's compressed stream fails its check at its end ({_why(exc)}): "
                      "the members read may hold damaged bytes")


def _why(exc: Exception) -> str:
    """``exc`` in one line: its type and message."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


FORMAT = InputFormat(name="tar", read=read, sniff=sniff, describe="a .tar.gz of traces",
                     gzip_describe="a tar of traces")
