"""Where a text trace's first byte is: past a UTF-8 byte-order mark and leading white space.

JSON editors and Windows tools write a UTF-8 byte-order mark (``EF BB BF``) before the text;
pretty printers and concatenation tools write more than a few KiB of white space before the
first ``{``. Both are skipped by every reader of JSON traces (the format sniff, the streamed
and the in-memory Kineto reads), the white space up to :data:`MAX_LEADING_WS_BYTES`. A
UTF-16 or UTF-32 text (by its byte-order mark, or by the zero bytes of its first ASCII
characters) is not read: :func:`other_encoding` names it for a one-line error, and every
reader asks it first, on the bytes as they are, before any sniff or white space is dropped.

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


#: the encodings told without a byte-order mark, Python codec → name (UTF-32 first: a UTF-32
#: LE text's first four bytes also look like UTF-16 LE's)
_NO_BOM = (("utf-32-be", "UTF-32 BE"), ("utf-32-le", "UTF-32 LE"), ("utf-16-be", "UTF-16 BE"),
           ("utf-16-le", "UTF-16 LE"))

#: JSON white space and what may follow a text's first ``{`` or ``[`` (RFC 8259 sections 2-7):
#: a name, a value, the closing bracket
_JSON_WS = " \t\n\r"
_AFTER_OPEN = _JSON_WS + '"{}[]-0123456789tfn'

#: bytes of a head looked at to tell an encoding (leading white space included)
_ENCODING_WINDOW_BYTES = 4096


def other_encoding(data: bytes | memoryview) -> str | None:
    """The encoding of a JSON text in UTF-16 or UTF-32 (``"UTF-16 LE"``, ...), told from its
    first bytes, as they are (before any white space is dropped); None for anything else
    (UTF-8 text, binary formats).

    Told by its byte-order mark, or without one by the zero bytes of its first characters,
    which in JSON are ASCII (RFC 4627 section 3's pattern: ``00 00 00 xx`` UTF-32 BE,
    ``00 xx 00 xx`` UTF-16 BE, ``xx 00 00 00`` UTF-32 LE, ``xx 00 xx 00`` UTF-16 LE), and
    only when the first :data:`_ENCODING_WINDOW_BYTES` bytes decode, in that encoding, to
    JSON white space then ``{`` or ``[`` then (when there) white space or what may open a
    member or a value: so a protobuf or a tar whose bytes hold such zeros is not taken for
    text. RFC 8259 section 8.1: JSON between systems is UTF-8. Looks at the bytes only."""
    head = bytes(data[:_ENCODING_WINDOW_BYTES])
    if len(head) < 2 or (head[0] not in (0, 0xFE, 0xFF) and head[1] != 0):
        return None  # (the fast exit of every UTF-8 text: its first byte is not zero, its second neither)
    for mark, name in _OTHER_BOMS:
        if head.startswith(mark):
            return name
    for codec, name in _NO_BOM:
        unit = 4 if "32" in codec else 2
        text = head[: len(head) // unit * unit].decode(codec, errors="replace")
        body = text.lstrip(_JSON_WS)
        if body[:1] in ("{", "[") and (len(body) == 1 or body[1] in _AFTER_OPEN):
            return name
    return None


def encoding_problem(encoding: str) -> str:
    """The "expected" part of the one-line error for a text in ``encoding`` (``"UTF-16 LE"``:
    iconv's name ``UTF-16LE`` given, so a text without a byte-order mark converts right too)."""
    return (f"a UTF-8 JSON trace, found text encoded as {encoding}; convert it first "
            f"(iconv -f {encoding.replace(' ', '')} -t UTF-8 IN > OUT)")


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
