"""A structured mutator for protobuf bytes (``.xplane.pb``): field-aware edits that keep the
rest of the message readable, so that the readers get past the first byte.

The message is walked with the wire format (:func:`parse`, lazily, only down the path that is
edited); an edit is made to one field somewhere in the tree and the lengths of the enclosing
messages are rewritten (:func:`mutate`). Edits: a varint set to 0, 1, a small id, a huge value
or 2^64-1 (stat-metadata and event-metadata references out of range, negative offsets and
durations as varints); a field dropped, repeated, or moved; a length-delimited field's content
cut, byte-flipped, replaced by a message nested in itself hundreds of times (recursion); a wire
type changed. Deterministic with the ``random.Random`` passed in; pure Python.
"""

from __future__ import annotations

import random

from traceroof.parsers.protowire import I32, I64, LEN, VARINT
from traceroof.parsers.xplane_proto_wire import WireError, read_varint


def _varint(buf: bytes, i: int, end: int) -> tuple[int, int] | None:
    """The reader's own varint (:func:`~traceroof.parsers.xplane_proto_wire.read_varint`),
    None where it breaks the wire format (past ``end``, over 10 bytes)."""
    try:
        return read_varint(buf, i, end)
    except WireError:
        return None


def enc_varint(v: int) -> bytes:
    """``v`` (taken mod 2^64) as a base-128 varint."""
    v &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def parse(buf: bytes) -> list[tuple[int, int, object]] | None:
    """The fields of ``buf`` as ``(number, wire type, value)`` (an int, or bytes for a
    length-delimited or fixed field), or None when ``buf`` is not a whole message."""
    out: list[tuple[int, int, object]] = []
    i, end = 0, len(buf)
    while i < end:
        t = _varint(buf, i, end)
        if t is None:
            return None
        key, i = t
        num, wt = key >> 3, key & 7
        if num == 0:
            return None
        if wt == VARINT:
            t = _varint(buf, i, end)
            if t is None:
                return None
            out.append((num, wt, t[0]))
            i = t[1]
        elif wt == LEN:
            t = _varint(buf, i, end)
            if t is None or t[1] + t[0] > end:
                return None
            out.append((num, wt, buf[t[1]:t[1] + t[0]]))
            i = t[1] + t[0]
        elif wt in (I64, I32):
            n = 8 if wt == I64 else 4
            if i + n > end:
                return None
            out.append((num, wt, buf[i:i + n]))
            i += n
        else:
            return None
    return out


def build(fields: list[tuple[int, int, object]]) -> bytes:
    """The bytes of ``fields`` (as :func:`parse` returns them)."""
    out = bytearray()
    for num, wt, val in fields:
        out += enc_varint((num << 3) | wt)
        if wt == VARINT:
            out += enc_varint(int(val))  # type: ignore[arg-type]
        elif wt == LEN:
            out += enc_varint(len(val)) + val  # type: ignore[arg-type]
        else:
            out += val  # type: ignore[operator]
    return bytes(out)


ODD_VARINTS = (0, 1, 2, 3, 7, 255, 1000, 2 ** 31 - 1, 2 ** 31, 2 ** 32, 2 ** 53 + 1, 2 ** 63 - 1, 2 ** 63,
               2 ** 64 - 1, 2 ** 64 - 1000)


def _edit_leaf(rng: random.Random, fields: list, i: int) -> None:
    num, wt, val = fields[i]
    r = rng.randrange(10)
    if r == 0:
        del fields[i]
    elif r == 1:
        fields.insert(rng.randrange(len(fields) + 1), fields[i])
    elif r == 2:
        fields.append(fields.pop(i))
    elif r == 3:  # another wire type for the same field number
        nwt = rng.choice([w for w in (VARINT, I64, LEN, I32) if w != wt])
        nval: object = rng.choice(ODD_VARINTS) if nwt == VARINT else (
            bytes(8 if nwt == I64 else 4) if nwt != LEN else b"\x08\x01")
        fields[i] = (num, nwt, nval)
    elif wt == VARINT:
        fields[i] = (num, wt, rng.choice(ODD_VARINTS + (int(val) + 1, int(val) * 1000, (-int(val)) & (2 ** 64 - 1))))  # type: ignore[arg-type]
    elif wt == LEN:
        b = bytearray(val)  # type: ignore[arg-type]
        if r == 4:
            del b[rng.randrange(len(b) + 1):]
        elif r == 5 and b:
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        elif r == 6:  # the field holding a message nested in itself, deep (recursion)
            inner = bytes(b[:64])
            for _ in range(rng.choice((10, 100, 1000))):
                inner = enc_varint((num << 3) | LEN) + enc_varint(len(inner)) + inner
            b = bytearray(inner)
        elif r == 7:
            b = bytearray(rng.choice((b"", b"\xff\xfe", b"\x00" * 16, "é".encode() * 3, b"%fusion.1 = f32[")))
        else:
            b += bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        fields[i] = (num, wt, bytes(b))
    else:
        fields[i] = (num, wt, bytes(rng.randrange(256) for _ in range(len(val))))  # type: ignore[arg-type]


def mutate(rng: random.Random, data: bytes, *, max_depth: int = 6) -> bytes:
    """``data`` with one field edited somewhere down to ``max_depth`` messages deep, the
    enclosing lengths rewritten. Falls back to a byte edit when ``data`` does not parse."""
    fields = parse(data)
    if not fields:
        return _byte_edit(rng, data)
    path: list[tuple[list, int]] = []
    cur = fields
    for _ in range(rng.randint(0, max_depth)):
        subs = [j for j, (_, wt, v) in enumerate(cur) if wt == LEN and v]
        if not subs:
            break
        j = rng.choice(subs)
        inner = parse(cur[j][2])  # type: ignore[arg-type]
        if not inner:
            break
        path.append((cur, j))
        cur = inner
    _edit_leaf(rng, cur, rng.randrange(len(cur)))
    for parent, j in reversed(path):
        num, wt, _ = parent[j]
        parent[j] = (num, wt, build(cur))
        cur = parent
    return build(cur)


def _byte_edit(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    if not b:
        return bytes([rng.randrange(256) for _ in range(rng.randint(1, 16))])
    i = rng.randrange(len(b))
    r = rng.randrange(3)
    if r == 0:
        del b[i:]
    elif r == 1:
        b[i] = rng.randrange(256)
    else:
        b[i:i] = enc_varint(rng.choice(ODD_VARINTS))
    return bytes(b)


def mutate_many(rng: random.Random, data: bytes) -> bytes:
    """1–3 :func:`mutate` edits, and sometimes a cut or a raw byte edit on top."""
    for _ in range(rng.randint(1, 3)):
        data = mutate(rng, data)
    if rng.random() < 0.15:
        data = _byte_edit(rng, data)
    return data


__all__ = ["parse", "build", "mutate", "mutate_many", "enc_varint"]
