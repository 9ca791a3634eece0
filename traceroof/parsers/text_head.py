"""Where a text trace's first byte is: past a UTF-8 byte-order mark and leading white space.

JSON editors and Windows tools write a UTF-8 byte-order mark (``EF BB BF``) before the text;
pretty printers and concatenation tools write more than a few KiB of white space before the
first ``{``. Both are skipped by every reader of JSON traces (the format sniff, the streamed
and the in-memory Kineto reads), the white space up to :data:`MAX_LEADING_WS_BYTES`. A
UTF-16 or UTF-32 text (by its byte-order mark, or by the zero bytes beside an ASCII ``{``)
is not read: :func:`other_encoding` names it for a one-line error.

No traceroof imports: the registry, the stream decoder and the door share it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

#: the UTF-8 byte-order mark (U+FEFF encoded in UTF-8; RFC 8259 section 8.1: a JSON parser
#: "MAY ignore the presence of a byte order mark rather than treating it as an error")
UTF8_BOM = b"\xef\xbb\xbf"

#: leading white space skipped to find the first byte of a text trace (bytes after the BOM);
#: more is "not a trace", so an endless stream of white space (``yes ' ' |``) ends
MAX_LEADING_WS_BYTES = 64 << 20

#: bytes read at a time while skipping white space
_STEP_BYTES = 1 << 20

#: JSON's white space (RFC 8259 section 2: space, tab, line feed, carriage return)
_WS = re.compile(rb"[ \t\n\r]*")

#: byte-order marks of the encodings that are not read (longest first: the UTF-32 LE mark
#: starts with the UTF-16 LE one)
_OTHER_BOMS = ((b"\x00\x00\xfe\xff", "UTF-32 BE"), (b"\xff\xfe\x00\x00", "UTF-32 LE"),
               (b"\xfe\xff", "UTF-16 BE"), (b"\xff\xfe", "UTF-16 LE"))


def bom_bytes(data: bytes | memoryview) -> int:
    """3 when ``data`` starts with the UTF-8 byte-order mark, else 0."""
    return len(UTF8_BOM) if bytes(data[:3]) == UTF8_BOM else 0


def other_encoding(data: bytes | memoryview) -> str | None:
    """The encoding of a text in UTF-16 or UTF-32 (``"UTF-16 LE"``, ...), told by its
    byte-order mark or, without one, by the zero bytes around a leading ASCII ``{`` or ``[``
    (RFC 8259 section 8.1: JSON between systems is UTF-8; RFC 4627 section 3's pattern of
    zeros among the first four bytes); None otherwise."""
    head = bytes(data[:4])
    for mark, name in _OTHER_BOMS:
        if head.startswith(mark):
            return name
    if len(head) == 4:
        if head[0] in b"{[" and head[1:4] == b"\x00\x00\x00":
            return "UTF-32 LE"
        if head[:3] == b"\x00\x00\x00" and head[3] in b"{[":
            return "UTF-32 BE"
    if len(head) >= 2:
        if head[0] in b"{[" and head[1] == 0:
            return "UTF-16 LE"
        if head[0] == 0 and head[1] in b"{[":
            return "UTF-16 BE"
    return None


def encoding_problem(encoding: str) -> str:
    """The "expected" part of the one-line error for a text in ``encoding``."""
    base = encoding.split()[0]
    return (f"a UTF-8 JSON trace, found text encoded as {encoding}; convert it first "
            f"(iconv -f {base} -t UTF-8 IN > OUT)")


def only_ws_problem() -> str:
    """The "expected" part of the one-line error for more leading white space than
    :data:`MAX_LEADING_WS_BYTES`."""
    return f"a trace, found only white space in the first {MAX_LEADING_WS_BYTES:,} bytes"


def skip_to_text(first: bytes, more: Callable[[int], bytes], window: int) -> tuple[bytes, int, bool]:
    """The ``window`` bytes of a text from its first byte that is not a UTF-8 BOM or white
    space, the offset of that byte, and whether white space ran past
    :data:`MAX_LEADING_WS_BYTES` (then the window is empty).

    Args:
        first: the text's first bytes, already read.
        more: ``more(n)`` reads up to ``n`` more bytes (``b""`` at the end).
        window: bytes wanted from the first byte of text on.

    Reads nothing more when ``first`` holds a byte of text (the window is then what
    ``first`` holds of it).
    """
    bom = skipped = bom_bytes(first)
    buf = first[skipped:]
    fresh = False  # buf holds bytes read by more(): the window is topped up
    while True:
        lead = _WS.match(buf).end()
        skipped += lead
        if skipped - bom > MAX_LEADING_WS_BYTES:
            return b"", skipped, True
        if lead < len(buf):
            buf = buf[lead:]
            break
        buf, fresh = more(_STEP_BYTES), True
        if not buf:
            return b"", skipped, False
    while fresh and len(buf) < window:
        got = more(window - len(buf))
        if not got:
            break
        buf += got
    return buf[:window], skipped, False


def drop_lead(buf: Any) -> str | None:
    """Drop a UTF-8 byte-order mark and leading white space from the front of ``buf`` (a
    :class:`~.kineto_blocks.Buffer`: ``fill(n)``, ``view()``, ``drop(n)``, ``len``, ``base``),
    reading on while it holds only white space. Returns None, or the problem (the "expected"
    part of a one-line error) when the white space runs past :data:`MAX_LEADING_WS_BYTES`:
    the buffer then holds at most a block of it (memory stays bounded either way)."""
    buf.fill(len(UTF8_BOM))
    buf.drop(bom_bytes(buf.view()))
    while True:
        buf.drop(_WS.match(buf.view()).end())
        if len(buf):
            return None
        if buf.base > MAX_LEADING_WS_BYTES + len(UTF8_BOM):  # (base: from the stream's start, BOM included)
            return only_ws_problem()
        if not buf.fill(1):
            return None


__all__ = ["UTF8_BOM", "MAX_LEADING_WS_BYTES", "bom_bytes", "other_encoding", "encoding_problem", "skip_to_text",
           "drop_lead", "only_ws_problem"]
