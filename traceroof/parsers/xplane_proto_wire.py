"""The protobuf wire format: varints, a field iterator and a structural walker that locates
where bytes break the XSpace structure (protobuf's own error, "Wire format was corrupt",
has no byte offset)."""

from __future__ import annotations

from typing import NamedTuple

from .protowire import I32, I64, LEN, VARINT
from .xplane_proto_messages import WIRE_SCHEMA


class WireError(ValueError):
    """The bytes break the protobuf wire format at ``offset`` (absolute, in the buffer)."""

    def __init__(self, offset: int, reason: str) -> None:
        self.offset = offset
        self.reason = reason
        super().__init__(f"byte {offset}: {reason}")


def read_varint(buf, pos: int, end: int) -> tuple[int, int]:
    """Decode one base-128 varint at ``pos``; returns (value, position after it)."""
    result = shift = 0
    start = pos
    while True:
        if pos >= end:
            raise WireError(start, "varint runs past the end of its message")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise WireError(start, "varint longer than 10 bytes")


class Cut(NamedTuple):
    """Where a buffer ends inside a field (the file was cut there): the field's number (0
    when its tag is cut), wire type (-1 when its tag is cut), the offsets of its tag and of
    its payload, and the length it declares (a length-delimited field; None otherwise)."""

    field: int
    wire_type: int
    tag_pos: int
    start: int
    declared: int | None


def iter_fields(buf, start: int, end: int, cuts: list[Cut] | None = None):
    """Yield ``(field_number, wire_type, value, tag_offset, field_end)`` for each field in
    ``buf[start:end]``; ``value`` is an int for varint/fixed fields and a ``(begin, end)``
    byte range for length-delimited ones. Raises :class:`WireError` where the bytes break.

    ``cuts``: when given and ``end`` is the end of ``buf``, a field that runs past it (the
    file was cut inside it) ends the walk quietly and its :class:`Cut` is appended there,
    so that the fields before it can be kept; a field running past the end of a message
    inside the buffer is still a break (:class:`WireError`)."""
    at_cut = cuts is not None and end == len(buf)
    pos = start
    while pos < end:
        tag_pos = pos
        field = 0
        wt = -1
        try:
            tag, pos = read_varint(buf, pos, end)
            field, wt = tag >> 3, tag & 7
            if field == 0:
                raise WireError(tag_pos, f"field number 0 (tag byte 0x{buf[tag_pos]:02x})")
            if wt == VARINT:
                value, pos = read_varint(buf, pos, end)
            elif wt == LEN:
                len_pos = pos
                n, pos = read_varint(buf, pos, end)
                if n > end - pos:
                    if at_cut:
                        cuts.append(Cut(field, wt, tag_pos, pos, n))  # type: ignore[union-attr]
                        return
                    raise WireError(
                        len_pos,
                        f"field {field} (tag at byte {tag_pos}) declares a length of {n} bytes "
                        f"but only {end - pos} remain in its message (which ends at byte {end})",
                    )
                value = (pos, pos + n)
                pos += n
            elif wt == I64:
                if pos + 8 > end:
                    raise WireError(tag_pos, f"fixed64 field {field} runs past the end")
                value = int.from_bytes(bytes(buf[pos : pos + 8]), "little")
                pos += 8
            elif wt == I32:
                if pos + 4 > end:
                    raise WireError(tag_pos, f"fixed32 field {field} runs past the end")
                value = int.from_bytes(bytes(buf[pos : pos + 4]), "little")
                pos += 4
            else:
                raise WireError(tag_pos, f"invalid wire type {wt} (tag byte 0x{buf[tag_pos]:02x})")
        except WireError as err:
            if at_cut and "past the end" in err.reason:  # a varint or fixed field cut by the end
                cuts.append(Cut(field, wt, tag_pos, pos, None))  # type: ignore[union-attr]
                return
            raise
        yield field, wt, value, tag_pos, pos


def find_break(buf, start: int, end: int, message: str = "XSpace") -> WireError | None:
    """Walk ``buf[start:end]`` as ``message`` (descending into the nested XSpace messages)
    and return the first :class:`WireError`, or None when the structure is sound.
    String fields are not UTF-8-checked (see the module docstring)."""
    schema = WIRE_SCHEMA.get(message, {})
    try:
        for field, wt, value, tag_pos, _end in iter_fields(buf, start, end):
            nested = schema.get(field)
            if nested and wt == LEN:
                err = find_break(buf, value[0], value[1], nested)
                if err is not None:
                    return err
            elif nested and wt != LEN:
                return WireError(tag_pos, f"{message} field {field} should be a message, "
                                          f"found wire type {wt}")
    except WireError as err:
        return err
    return None
