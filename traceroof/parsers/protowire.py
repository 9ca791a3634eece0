"""A few lines of the protobuf wire format, for sniffing: walk the fields of the first bytes
of a file without importing protobuf (which only the reader of a protobuf format loads).

Wire types: 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32 (3/4, groups, are invalid
here). Source: https://protobuf.dev/programming-guides/encoding/.
"""

from __future__ import annotations

from collections.abc import Iterator

VARINT, I64, LEN, I32 = 0, 1, 2, 5


def varint(buf: bytes, i: int) -> tuple[int, int] | None:
    """The varint at ``buf[i]``: (value, index after it), or None when it is cut off by the
    end of ``buf`` or longer than 10 bytes."""
    value = shift = 0
    for j in range(i, min(i + 10, len(buf))):
        b = buf[j]
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, j + 1
        shift += 7
    return None


def fields(buf: bytes, start: int = 0, end: int | None = None) -> Iterator[tuple[int, int, int, int]]:
    """``(field number, wire type, payload start, payload end)`` of each field of the message
    in ``buf[start:end]``, in order. It stops quietly where ``buf`` is cut off (a field whose
    payload runs past the end of ``buf`` is the last one yielded: its end is past ``len(buf)``).

    Raises:
        ValueError: the bytes are not a protobuf message (a bad wire type, field number 0, a
            length past ``end``).
    """
    end = len(buf) if end is None else end
    i = start
    while i < min(end, len(buf)):
        tag = varint(buf, i)
        if tag is None:
            return
        key, i = tag
        num, wt = key >> 3, key & 7
        if num == 0 or wt not in (VARINT, I64, LEN, I32):
            raise ValueError(f"invalid tag {key} (field {num}, wire type {wt})")
        if wt == VARINT:
            got = varint(buf, i)
            if got is None:
                return
            p0, p1 = i, got[1]
        elif wt == LEN:
            got = varint(buf, i)
            if got is None:
                return
            p0 = got[1]
            p1 = p0 + got[0]
        else:
            p0, p1 = i, i + (8 if wt == I64 else 4)
        if end < len(buf) and p1 > end:
            raise ValueError(f"field {num} runs past the end of its message")
        yield num, wt, p0, p1
        if p1 > len(buf):
            return
        i = p1


def first_message(buf: bytes, total: int | None = None) -> tuple[int, int] | None:
    """The first field of ``buf`` when it is field 1, length-delimited (a repeated message
    field, as an ``XSpace``'s planes or a Perfetto ``Trace``'s packets): (payload start,
    payload end), else None. ``total`` (the whole file's size), when known,
    bounds the declared length."""
    try:
        for num, wt, p0, p1 in fields(buf):
            if num != 1 or wt != LEN or (total is not None and p1 > total):
                return None
            return p0, p1
    except ValueError:
        return None
    return None


def message_fields(buf: bytes, p0: int, p1: int) -> list[tuple[int, int, int, int]] | None:
    """The fields of the message at ``buf[p0:p1]`` visible in ``buf`` (None when they are not
    valid wire format)."""
    try:
        return list(fields(buf, p0, max(p1, p0) if p1 <= len(buf) else len(buf)))
    except ValueError:
        return None


__all__ = ["varint", "fields", "first_message", "message_fields", "VARINT", "I64", "LEN", "I32"]
