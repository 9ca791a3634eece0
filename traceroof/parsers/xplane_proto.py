"""The XSpace protobuf messages (package ``tensorflow.profiler``), defined in code.

No Python package ships the generated ``xplane_pb2`` module (xprof, jax, jaxlib and
tensorboard-plugin-profile all lack it), so the message definitions are written down here
from the wire format of ``xplane.proto`` (upstream: openxla/xla
``xla/tsl/profiler/protobuf/xplane.proto``, Apache-2.0; message/field names, numbers and
types are facts of the format) and loaded into a *private* ``DescriptorPool``. This needs
no ``protoc``, has no protobuf-runtime version check, and never clashes with TensorFlow or
TensorBoard registering ``tensorflow.profiler.XSpace`` in the default pool.

One deliberate deviation: the file is declared ``syntax = "proto2"`` although upstream is
proto3. The wire format is identical (``child_id`` is marked packed, as proto3 would
serialise it), but proto2 ``string`` fields are not UTF-8-validated on parse: a single bad
byte in an event name would otherwise make the whole XSpace unreadable ("String field had
bad UTF-8"). With proto2, upb returns such a value as ``bytes`` instead of ``str``; callers
decode it with ``errors="replace"`` (see :func:`text`).

Usage::

    from traceroof.parsers.xplane_proto import XSpace
    space = XSpace()
    space.ParseFromString(data)
"""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PACKAGE = "tensorflow.profiler"

_F = descriptor_pb2.FieldDescriptorProto
_OPT, _REP = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED

#: message name -> [(field name, number, type, label, message type name or None, oneof index)]
#: (types: ``_F.TYPE_*``). Oneofs are declared per message in ``_ONEOFS``.
_MESSAGES: dict[str, list[tuple[str, int, int, int, str | None, int | None]]] = {
    "XSpace": [
        ("planes", 1, _F.TYPE_MESSAGE, _REP, "XPlane", None),
        ("errors", 2, _F.TYPE_STRING, _REP, None, None),
        ("warnings", 3, _F.TYPE_STRING, _REP, None, None),
        ("hostnames", 4, _F.TYPE_STRING, _REP, None, None),
    ],
    "XPlane": [
        ("id", 1, _F.TYPE_INT64, _OPT, None, None),
        ("name", 2, _F.TYPE_STRING, _OPT, None, None),
        ("lines", 3, _F.TYPE_MESSAGE, _REP, "XLine", None),
        ("event_metadata", 4, _F.TYPE_MESSAGE, _REP, "XPlane.EventMetadataEntry", None),
        ("stat_metadata", 5, _F.TYPE_MESSAGE, _REP, "XPlane.StatMetadataEntry", None),
        ("stats", 6, _F.TYPE_MESSAGE, _REP, "XStat", None),
    ],
    "XLine": [
        ("id", 1, _F.TYPE_INT64, _OPT, None, None),
        ("display_id", 10, _F.TYPE_INT64, _OPT, None, None),
        ("name", 2, _F.TYPE_STRING, _OPT, None, None),
        ("display_name", 11, _F.TYPE_STRING, _OPT, None, None),
        ("timestamp_ns", 3, _F.TYPE_INT64, _OPT, None, None),
        ("duration_ps", 9, _F.TYPE_INT64, _OPT, None, None),
        ("events", 4, _F.TYPE_MESSAGE, _REP, "XEvent", None),
    ],
    "XEvent": [
        ("metadata_id", 1, _F.TYPE_INT64, _OPT, None, None),
        ("offset_ps", 2, _F.TYPE_INT64, _OPT, None, 0),
        ("num_occurrences", 5, _F.TYPE_INT64, _OPT, None, 0),
        ("duration_ps", 3, _F.TYPE_INT64, _OPT, None, None),
        ("stats", 4, _F.TYPE_MESSAGE, _REP, "XStat", None),
    ],
    "XStat": [
        ("metadata_id", 1, _F.TYPE_INT64, _OPT, None, None),
        ("double_value", 2, _F.TYPE_DOUBLE, _OPT, None, 0),
        ("uint64_value", 3, _F.TYPE_UINT64, _OPT, None, 0),
        ("int64_value", 4, _F.TYPE_INT64, _OPT, None, 0),
        ("str_value", 5, _F.TYPE_STRING, _OPT, None, 0),
        ("bytes_value", 6, _F.TYPE_BYTES, _OPT, None, 0),
        ("ref_value", 7, _F.TYPE_UINT64, _OPT, None, 0),
    ],
    "XEventMetadata": [
        ("id", 1, _F.TYPE_INT64, _OPT, None, None),
        ("name", 2, _F.TYPE_STRING, _OPT, None, None),
        ("display_name", 4, _F.TYPE_STRING, _OPT, None, None),
        ("metadata", 3, _F.TYPE_BYTES, _OPT, None, None),
        ("stats", 5, _F.TYPE_MESSAGE, _REP, "XStat", None),
        ("child_id", 6, _F.TYPE_INT64, _REP, None, None),
    ],
    "XStatMetadata": [
        ("id", 1, _F.TYPE_INT64, _OPT, None, None),
        ("name", 2, _F.TYPE_STRING, _OPT, None, None),
        ("description", 3, _F.TYPE_STRING, _OPT, None, None),
    ],
}
_ONEOFS = {"XEvent": ["data"], "XStat": ["value"]}
#: map<int64, V> fields of XPlane: nested entry type name -> value type
_MAP_ENTRIES = {"EventMetadataEntry": "XEventMetadata", "StatMetadataEntry": "XStatMetadata"}

#: Wire schema for the walker in ``xplane.py``: message -> {field number: nested message or None}.
WIRE_SCHEMA: dict[str, dict[int, str | None]] = {
    name: {number: type_name for (_n, number, _t, _l, type_name, _o) in fields}
    for name, fields in _MESSAGES.items()
}
WIRE_SCHEMA["XPlane.EventMetadataEntry"] = {1: None, 2: "XEventMetadata"}
WIRE_SCHEMA["XPlane.StatMetadataEntry"] = {1: None, 2: "XStatMetadata"}


def _file_descriptor() -> descriptor_pb2.FileDescriptorProto:
    fdp = descriptor_pb2.FileDescriptorProto(
        name="traceroof/xplane.proto", package=PACKAGE, syntax="proto2"
    )
    for msg_name, fields in _MESSAGES.items():
        msg = fdp.message_type.add(name=msg_name)
        for oneof in _ONEOFS.get(msg_name, []):
            msg.oneof_decl.add(name=oneof)
        for fname, number, ftype, label, type_name, oneof_index in fields:
            f = msg.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                f.type_name = f".{PACKAGE}.{type_name}"
            if oneof_index is not None:
                f.oneof_index = oneof_index
            if label == _REP and ftype not in (_F.TYPE_MESSAGE, _F.TYPE_STRING, _F.TYPE_BYTES):
                f.options.packed = True
        if msg_name == "XPlane":
            for entry_name, value_type in _MAP_ENTRIES.items():
                entry = msg.nested_type.add(name=entry_name)
                entry.options.map_entry = True
                entry.field.add(name="key", number=1, type=_F.TYPE_INT64, label=_OPT)
                entry.field.add(
                    name="value",
                    number=2,
                    type=_F.TYPE_MESSAGE,
                    label=_OPT,
                    type_name=f".{PACKAGE}.{value_type}",
                )
    return fdp


POOL = descriptor_pool.DescriptorPool()
POOL.Add(_file_descriptor())


def _cls(name: str):
    return message_factory.GetMessageClass(POOL.FindMessageTypeByName(f"{PACKAGE}.{name}"))


XSpace = _cls("XSpace")
XPlane = _cls("XPlane")
XLine = _cls("XLine")
XEvent = _cls("XEvent")
XStat = _cls("XStat")
XEventMetadata = _cls("XEventMetadata")
XStatMetadata = _cls("XStatMetadata")


def text(value: str | bytes) -> str:
    """A proto2 ``string`` field as ``str``: bytes that are not valid UTF-8 are decoded with
    U+FFFD replacement characters (upb returns them as ``bytes``)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value


__all__ = [
    "POOL",
    "WIRE_SCHEMA",
    "XEvent",
    "XEventMetadata",
    "XLine",
    "XPlane",
    "XSpace",
    "XStat",
    "XStatMetadata",
    "text",
]


# ---------------------------------------------------------------------------------------
# Wire format: a structural walker (for error offsets) and a columnar event decoder.
#
# Protobuf's own error ("Wire format was corrupt") has no byte offset, and going through
# Python message objects costs ~1-5 us per event. Files have millions of events, so the
# events of a line are decoded here straight from the bytes with numpy, into columns.
# ---------------------------------------------------------------------------------------

import threading  # noqa: E402

import numpy as np  # noqa: E402

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5


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


def iter_fields(buf, start: int, end: int):
    """Yield ``(field_number, wire_type, value, tag_offset, field_end)`` for each field in
    ``buf[start:end]``; ``value`` is an int for varint/fixed fields and a ``(begin, end)``
    byte range for length-delimited ones. Raises :class:`WireError` where the bytes break."""
    pos = start
    while pos < end:
        tag_pos = pos
        tag, pos = read_varint(buf, pos, end)
        field, wt = tag >> 3, tag & 7
        if field == 0:
            raise WireError(tag_pos, f"field number 0 (tag byte 0x{buf[tag_pos]:02x})")
        if wt == _VARINT:
            value, pos = read_varint(buf, pos, end)
        elif wt == _LEN:
            len_pos = pos
            n, pos = read_varint(buf, pos, end)
            if n > end - pos:
                raise WireError(
                    len_pos,
                    f"field {field} (tag at byte {tag_pos}) declares a length of {n} bytes "
                    f"but only {end - pos} remain in its message (which ends at byte {end})",
                )
            value = (pos, pos + n)
            pos += n
        elif wt == _I64:
            if pos + 8 > end:
                raise WireError(tag_pos, f"fixed64 field {field} runs past the end")
            value = int.from_bytes(bytes(buf[pos : pos + 8]), "little")
            pos += 8
        elif wt == _I32:
            if pos + 4 > end:
                raise WireError(tag_pos, f"fixed32 field {field} runs past the end")
            value = int.from_bytes(bytes(buf[pos : pos + 4]), "little")
            pos += 4
        else:
            raise WireError(tag_pos, f"invalid wire type {wt} (tag byte 0x{buf[tag_pos]:02x})")
        yield field, wt, value, tag_pos, pos


def find_break(buf, start: int, end: int, message: str = "XSpace") -> WireError | None:
    """Walk ``buf[start:end]`` as ``message`` (descending into the nested XSpace messages)
    and return the first :class:`WireError`, or None when the structure is sound.
    String fields are not UTF-8-checked (see the module docstring)."""
    schema = WIRE_SCHEMA.get(message, {})
    try:
        for field, wt, value, tag_pos, _end in iter_fields(buf, start, end):
            nested = schema.get(field)
            if nested and wt == _LEN:
                err = find_break(buf, value[0], value[1], nested)
                if err is not None:
                    return err
            elif nested and wt != _LEN:
                return WireError(tag_pos, f"{message} field {field} should be a message, "
                                          f"found wire type {wt}")
    except WireError as err:
        return err
    return None


# Tags (field << 3 | wire type) of the fields the fast decoder understands.
_T_EVENT = 0x22  # XLine.events / XEvent.stats (field 4, LEN)
_EVENT_FIELDS = (0x08, 0x10, 0x18, 0x22, 0x28)  # XEvent 1,2,3,4,5
_STAT_FIELDS = (0x08, 0x18, 0x20, 0x38)  # XStat 1, uint64, int64, ref
_LUT_ANY = np.zeros(256, np.bool_)
_LUT_ANY[list(_EVENT_FIELDS + _STAT_FIELDS)] = True
#: (depth, tag) -> the tag is valid there: events at depth 0, event fields at 1, stat fields
#: (no nested messages) at 2. Index ``min(depth, 3) * 256 + tag``.
_LUT_PLACE = np.zeros(4 * 256, np.bool_)
_LUT_PLACE[_T_EVENT] = True
_LUT_PLACE[[256 + t for t in _EVENT_FIELDS]] = True
_LUT_PLACE[[512 + t for t in _STAT_FIELDS]] = True
_LUT_OTHER = ~_LUT_ANY
_LOCAL = threading.local()

#: XStat value kinds, by field number of the ``value`` oneof.
STAT_DOUBLE, STAT_UINT64, STAT_INT64, STAT_STR, STAT_BYTES, STAT_REF = 2, 3, 4, 5, 6, 7


class EventColumns:
    """The events of one XLine, as columns (numpy arrays, one entry per event).

    ``metadata_id``, ``offset_ps``, ``duration_ps`` (int64); ``aggregated`` (bool: the event
    carries ``num_occurrences`` instead of ``offset_ps``). Stats are stored long-form, one
    entry per stat: ``stat_event`` (event index), ``stat_mid`` (XStatMetadata id),
    ``stat_kind`` (``STAT_*``), ``stat_value`` (uint64: the integer value, the ref id, or the
    IEEE bits of a double); string and bytes values live in ``stat_objects`` keyed by the stat
    entry index.
    """

    __slots__ = (
        "metadata_id", "offset_ps", "duration_ps", "aggregated",
        "stat_event", "stat_mid", "stat_kind", "stat_value", "stat_objects",
    )

    def __init__(self, parts: list[dict]) -> None:
        def cat(key, dtype):
            arrays = [p[key] for p in parts if len(p[key])]
            return np.concatenate(arrays).astype(dtype, copy=False) if arrays else np.zeros(0, dtype)

        base = np.cumsum([0] + [len(p["metadata_id"]) for p in parts])
        for p, b in zip(parts, base):
            p["stat_event"] = p["stat_event"] + b
        sbase = np.cumsum([0] + [len(p["stat_mid"]) for p in parts])
        self.stat_objects: dict[int, str | bytes] = {}
        for p, b in zip(parts, sbase):
            for k, v in p.get("stat_objects", {}).items():
                self.stat_objects[int(k + b)] = v
        self.metadata_id = cat("metadata_id", np.int64)
        self.offset_ps = cat("offset_ps", np.int64)
        self.duration_ps = cat("duration_ps", np.int64)
        self.aggregated = cat("aggregated", np.bool_)
        self.stat_event = cat("stat_event", np.int64)
        self.stat_mid = cat("stat_mid", np.int64)
        self.stat_kind = cat("stat_kind", np.uint8)
        self.stat_value = cat("stat_value", np.uint64)

    def __len__(self) -> int:
        return len(self.metadata_id)

    def stat(self, mid: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Entries of stat ``mid``: (event index, kind, value, stat entry index)."""
        rows = np.flatnonzero(self.stat_mid == mid)
        return self.stat_event[rows], self.stat_kind[rows], self.stat_value[rows], rows


def _empty_part() -> dict:
    return {
        "metadata_id": np.zeros(0, np.int64), "offset_ps": np.zeros(0, np.int64),
        "duration_ps": np.zeros(0, np.int64), "aggregated": np.zeros(0, np.bool_),
        "stat_event": np.zeros(0, np.int64), "stat_mid": np.zeros(0, np.int64),
        "stat_kind": np.zeros(0, np.uint8), "stat_value": np.zeros(0, np.uint64),
    }


def _part_from_messages(events) -> dict:
    """Columns for XEvent messages decoded by protobuf: the path for doubles, strings, bytes
    and unknown fields, which the vectorised decoder leaves to protobuf."""
    mid_l, off_l, dur_l, agg_l = [], [], [], []
    s_ev, s_mid, s_kind, s_val, objects = [], [], [], [], {}
    kinds = {"uint64_value": STAT_UINT64, "int64_value": STAT_INT64, "ref_value": STAT_REF}
    for k, ev in enumerate(events):
        mid_l.append(ev.metadata_id)
        off_l.append(ev.offset_ps)
        dur_l.append(ev.duration_ps)
        agg_l.append(ev.WhichOneof("data") == "num_occurrences")
        for s in ev.stats:
            which = s.WhichOneof("value")
            s_ev.append(k)
            s_mid.append(s.metadata_id)
            if which is None:
                s_kind.append(0)
                s_val.append(0)
            elif which == "double_value":
                s_kind.append(STAT_DOUBLE)
                s_val.append(int(np.float64(s.double_value).view(np.uint64)))
            elif which in ("str_value", "bytes_value"):
                s_kind.append(STAT_STR if which == "str_value" else STAT_BYTES)
                s_val.append(0)
                objects[len(s_mid) - 1] = getattr(s, which)
            else:
                s_kind.append(kinds[which])
                s_val.append(getattr(s, which) & 0xFFFFFFFFFFFFFFFF)
    return {
        "metadata_id": np.array(mid_l, np.int64),
        "offset_ps": np.array(off_l, np.int64),
        "duration_ps": np.array(dur_l, np.int64),
        "aggregated": np.array(agg_l, np.bool_),
        "stat_event": np.array(s_ev, np.int64),
        "stat_mid": np.array(s_mid, np.int64),
        "stat_kind": np.array(s_kind, np.uint8),
        "stat_value": np.array(s_val, np.uint64),
        "stat_objects": objects,
    }


#: Bytes decoded per vectorised chunk: small enough to keep temporaries in cache-friendly,
#: reused allocations (peak memory stays a small multiple of the chunk, not of the file).
CHUNK_BYTES = 1 << 18


def _pos_buffer(n: int) -> np.ndarray:
    """A per-thread int32 byte -> pair-index map of at least ``n`` entries, all -1 (callers
    reset what they set): allocated once, not per chunk."""
    buf = getattr(_LOCAL, "pos", None)
    if buf is None or len(buf) < n:
        buf = np.full(max(n, CHUNK_BYTES + 1), -1, np.int32)
        _LOCAL.pos = buf
    return buf


#: Tags valid as XEvent-level (depth 1) varint fields, and as XStat values.
_LUT_EVFIELD = np.zeros(256, np.bool_)
_LUT_EVFIELD[[0x08, 0x10, 0x18, 0x28]] = True
_LUT_STATVAL = np.zeros(256, np.bool_)
_LUT_STATVAL[[0x18, 0x20, 0x38]] = True


_VARINT_MASK = np.array([(1 << (8 * (k + 1))) - 1 for k in range(8)], np.uint64)
_U = np.uint64
_SWAR = ((_U(0x7F007F007F007F00), _U(0x007F007F007F007F), _U(1)),
         (_U(0x3FFF00003FFF0000), _U(0x00003FFF00003FFF), _U(2)),
         (_U(0x0FFFFFFF00000000), _U(0x000000000FFFFFFF), _U(4)))


def _multi_byte(a: np.ndarray, v: np.ndarray, val_start: np.ndarray, extra: np.ndarray,
                multi: np.ndarray) -> None:
    """Decode the varints of ``v[multi]`` that are longer than one byte, in place. Up to 8
    bytes: an unaligned 8-byte little-endian read and a branch-free compaction of the 7-bit
    groups (SWAR); longer ones (and those too near the end of ``a``), a byte at a time."""
    starts = val_start[multi]
    ext = extra[multi]
    n_ok = int(np.searchsorted(starts, len(a) - 8, "right"))  # 8 bytes readable from there
    long = np.flatnonzero(ext[:n_ok] >= 8)
    slow = multi[n_ok:]
    if len(long):
        slow = np.concatenate([multi[long], slow])
        keep = np.ones(n_ok, np.bool_)
        keep[long] = False
        multi, starts, ext = multi[:n_ok][keep], starts[:n_ok][keep], ext[:n_ok][keep]
    else:
        multi, starts, ext = multi[:n_ok], starts[:n_ok], ext[:n_ok]
    if len(slow):
        v[slow] &= _U(0x7F)
        k = 1
        while len(slow):
            v[slow] |= (a[val_start[slow] + k] & 0x7F).astype(np.uint64) << _U(7 * k)
            k += 1
            slow = slow[extra[slow] >= k]
    if not len(multi):
        return
    win = np.ndarray(shape=(len(a) - 7,), dtype="<u8", buffer=a, strides=(1,))
    x = win[starts]  # (np.take would first copy all of ``win``)
    x &= _VARINT_MASK[ext]
    x &= _U(0x7F7F7F7F7F7F7F7F)
    t = np.empty_like(x)
    for hi, lo, shift in _SWAR:  # 8 x 7 bits -> 4 x 14 -> 2 x 28 -> 56 bits, in place
        np.bitwise_and(x, hi, out=t)
        t >>= shift
        x &= lo
        x |= t
    v[multi] = x


class _Workspace:
    """Per-thread scratch arrays for :func:`_tokenise`, reused from chunk to chunk: fresh
    megabyte-sized temporaries per chunk cost more in page faults (the allocator hands the
    memory back to the OS between chunks) than the arithmetic on them."""

    def __init__(self, n: int) -> None:
        self.n = n
        m = n // 2 + 1
        self.mask = np.empty(n, np.bool_)
        self.tag_pos = np.empty(m, np.int64)
        self.val_start = np.empty(m, np.int64)
        self.extra = np.empty(m, np.int64)
        self.v = np.empty(m, np.uint64)
        self.u8 = np.empty(m, np.uint8)
        self.tag8 = np.empty(m, np.uint8)
        self.cmp = np.empty(m, np.bool_)


def _workspace(n: int) -> _Workspace:
    w = getattr(_LOCAL, "work", None)
    if w is None or w.n < n:
        w = _LOCAL.work = _Workspace(max(n, CHUNK_BYTES))
    return w


def _tokenise(a: np.ndarray):
    """Split a chunk into (tag, varint value) pairs: ``tag8`` (uint8; 255 for a tag longer
    than one byte, which no field we handle has), ``val`` (uint64), ``tag_pos`` and
    ``val_end`` (byte offsets of the tag and of the value's last byte), or None when the chunk
    holds no complete pair. The arrays are views of this thread's scratch space: valid until
    the next call (callers copy what they keep)."""
    n = len(a)
    w = _workspace(n)
    ends = np.flatnonzero(np.less(a, 0x80, out=w.mask[:n]))
    npairs = len(ends) // 2
    if npairs == 0:
        return None
    tag_end = ends[0 : 2 * npairs : 2]
    val_end = ends[1 : 2 * npairs : 2]
    tag_pos = w.tag_pos[:npairs]
    tag_pos[0] = 0
    np.add(val_end[:-1], 1, out=tag_pos[1:])
    tag8 = np.take(a, tag_pos, out=w.tag8[:npairs])
    cmp = np.not_equal(tag_pos, tag_end, out=w.cmp[:npairs])
    if cmp.any():
        tag8[np.flatnonzero(cmp)] = 255
    val_start = np.add(tag_end, 1, out=w.val_start[:npairs])
    v = w.v[:npairs]
    v[...] = np.take(a, val_start, out=w.u8[:npairs])
    extra = np.subtract(val_end, val_start, out=w.extra[:npairs])  # extra bytes (0: one)
    multi = np.flatnonzero(extra)
    if len(multi):
        _multi_byte(a, v, val_start, extra, multi)
    return tag8, v, tag_pos, val_end


def _regular_chunk(n_bytes: int, tag8, val, tag_pos, val_end, tail_pos: int):
    """The common layout, decoded with gathers instead of a depth computation: top-level
    events, one after the other, whose stats are each exactly (metadata_id, one varint value).
    Returns (columns, consumed) or None when the chunk is anything else (the general path
    then decides); when it returns columns they equal the general path's."""
    npairs = len(tag8)
    is_len = tag8 == _T_EVENT
    len_idx = np.flatnonzero(is_len)
    lv = val[len_idx]
    if len(len_idx) == 0 or len_idx[0] != 0 or (lv > np.uint64(n_bytes)).any():
        return None
    close = val_end[len_idx] + 1 + lv.view(np.int64)
    # a LEN pair is an event when no earlier LEN pair's range covers it (stats hold no
    # LEN pairs: checked below through their exact (mid, value) shape)
    prev = np.empty(len(close), np.int64)
    prev[0] = -1
    np.maximum.accumulate(close[:-1], out=prev[1:])
    is_ev = tag_pos[len_idx] >= prev
    ev_at = np.flatnonzero(is_ev)  # events among the LEN pairs
    ev_idx = len_idx[ev_at]
    ev_close = close[ev_at]
    if len(ev_idx) > 1 and (tag_pos[ev_idx[1:]] != ev_close[:-1]).any():
        return None  # not one event after the other (a top-level field in between)
    n_ev = int(np.searchsorted(ev_close, tail_pos, "right"))
    if n_ev == 0:
        return None
    consumed = int(ev_close[n_ev - 1])
    if n_ev < len(ev_idx):
        p_end = int(ev_idx[n_ev])
    else:
        p_end = int(np.searchsorted(tag_pos, consumed))
        if p_end < npairs:
            if tag_pos[p_end] != consumed:
                return None
        elif consumed != tail_pos:
            return None
    st = len_idx[~is_ev]
    st_close = close[~is_ev]
    n_st = int(np.searchsorted(st, p_end))
    st, st_close = st[:n_st], st_close[:n_st]
    if n_st:
        if int(st[-1]) + 2 >= p_end:
            return None
        t1 = tag8[st + 1]
        t2 = tag8[st + 2]
        if not ((t1 == 0x08).all() and _LUT_STATVAL[t2].all()
                and (val_end[st + 2] + 1 == st_close).all()):
            return None
    tag8, val = tag8[:p_end], val[:p_end]
    part = _empty_part()
    ev = ev_idx[:n_ev]
    if (p_end - n_ev - 3 * n_st == 3 * n_ev and int(ev[-1]) + 3 < p_end
            and (tag8[ev + 1] == 0x08).all() and (tag8[ev + 2] == 0x10).all()
            and (tag8[ev + 3] == 0x18).all()):
        # the usual event: metadata_id, offset_ps, duration_ps, then the stats
        part["metadata_id"] = val[ev + 1].view(np.int64)
        part["offset_ps"] = val[ev + 2].view(np.int64)
        part["duration_ps"] = val[ev + 3].view(np.int64)
        part["aggregated"] = np.zeros(n_ev, np.bool_)
    else:
        lvl1 = np.ones(p_end, np.bool_)
        lvl1[ev] = False
        if n_st:
            lvl1[st] = False
            lvl1[st + 1] = False
            lvl1[st + 2] = False
        t_ev = tag8[lvl1]
        if not _LUT_EVFIELD[t_ev].all():
            return None
        ev_start = np.zeros(p_end, np.int32)
        ev_start[ev] = 1
        ev_of = np.cumsum(ev_start, dtype=np.int32)[lvl1] - 1
        field = t_ev >> 3
        table = np.zeros((n_ev, 6), np.int64)
        table.reshape(-1)[ev_of.astype(np.int64) * 6 + field] = val[lvl1].view(np.int64)
        part["metadata_id"] = table[:, 1]
        part["offset_ps"] = table[:, 2]
        part["duration_ps"] = table[:, 3]
        part["aggregated"] = table[:, 5] != 0
        f5 = field == 5
        if f5.any() and (table[:, 5] == 0).any():  # num_occurrences = 0 is set too
            agg = np.zeros(n_ev, np.bool_)
            agg[ev_of[f5]] = True
            part["aggregated"] = agg
    if n_st:
        per_event = np.diff(ev_at[: n_ev + 1], append=len(len_idx))[:n_ev] - 1  # stats
        part["stat_event"] = np.repeat(np.arange(n_ev, dtype=np.int64), per_event)[:n_st]
        part["stat_mid"] = val[st + 1].view(np.int64)
        part["stat_kind"] = t2 >> 3
        part["stat_value"] = val[st + 2]
    return part, consumed


def _fast_chunk(a: np.ndarray) -> tuple[dict | None, int, str]:
    """Decode the leading run of complete, all-varint events in ``a``: a chunk of an events
    region that starts at an event tag (0x22).

    Every field of such events is a tag followed by one varint (lengths of nested messages
    included), so the bytes split into varints at the bytes < 0x80 and the varints pair up as
    (tag, value); nesting depth follows from the lengths. All of it is vectorised.

    Returns (columns or None, bytes consumed, why it stopped): ``"ok"``; ``"end"`` (the chunk
    ran out inside the first event); ``"other"`` (the next top-level field is not an event:
    the events run is over); ``"slow"`` (the next event needs the protobuf path: a double,
    string or bytes stat, an unknown field, or anything unexpected -- protobuf is the arbiter
    of what is valid, and locates errors).
    """
    tok = _tokenise(a)
    if tok is None:
        return None, 0, "end"
    tag8, val, tag_pos, val_end = tok
    npairs = len(tag8)

    # A non-varint field (double, string, bytes, fixed32) breaks the tokenisation after it:
    # cut at the first tag we do not handle. Everything before it is tokenised correctly.
    unhandled = _LUT_OTHER[tag8]
    if unhandled.any():
        cut = int(unhandled.argmax())
        tail_pos, tail_unhandled = int(tag_pos[cut]), True
        tag8, val, tag_pos, val_end = tag8[:cut], val[:cut], tag_pos[:cut], val_end[:cut]
        npairs = cut
    else:
        tail_pos, tail_unhandled = int(val_end[-1]) + 1, False
    if npairs == 0:
        return None, 0, ("other" if tail_unhandled else "end")

    got = _regular_chunk(len(a), tag8, val, tag_pos, val_end, tail_pos)
    if got is not None:
        return got[0], got[1], "ok"
    after = val_end + 1  # first byte after the pair's value

    # Nesting depth of every pair. A LEN pair's content starts at the next pair and must end
    # exactly at a pair boundary (or at the tail); a byte -> pair-index map finds where.
    is_len = tag8 == _T_EVENT
    len_idx = np.flatnonzero(is_len)
    close_at = after[len_idx] + val[len_idx].view(np.int64)
    pos_to_pair = _pos_buffer(len(a) + 1)
    pos_to_pair[tag_pos] = np.arange(npairs, dtype=np.int32)
    pos_to_pair[tail_pos] = npairs
    inside = close_at <= tail_pos
    close_idx = np.full(len(len_idx), npairs + 1, np.int32)  # beyond the tokenised part
    close_idx[inside] = pos_to_pair[close_at[inside]]
    pos_to_pair[tag_pos] = -1
    pos_to_pair[tail_pos] = -1
    misaligned = close_idx == -1
    close_idx[misaligned] = npairs + 1
    delta = np.zeros(npairs + 2, np.int32)
    delta[len_idx + 1] = 1
    delta -= np.bincount(close_idx, minlength=npairs + 2).astype(np.int32)
    running = np.cumsum(delta, dtype=np.int32)
    depth = running[:npairs]
    tail_depth = int(running[npairs])
    d0 = depth == 0

    stop = np.flatnonzero(np.greater(d0, is_len))  # top level, not an event
    if len(stop):  # a top-level field that is not an event (e.g. XLine.id after the events)
        limit, reason = int(tag_pos[stop[0]]), "other"
    elif tail_unhandled:
        limit, reason = tail_pos, ("other" if tail_depth == 0 else "slow")
    else:
        limit, reason = tail_pos, "end"
    top_idx = np.flatnonzero(d0 & is_len)
    top_idx = top_idx[tag_pos[top_idx] < limit]
    ev_end = after[top_idx] + val[top_idx].view(np.int64)
    n_ev = int(np.searchsorted(ev_end, limit, "right"))  # complete events form a prefix
    if n_ev > 1:  # consecutive events, each starting where the previous ended
        gaps = np.flatnonzero(tag_pos[top_idx[1:n_ev]] != ev_end[: n_ev - 1])
        if len(gaps):
            n_ev = int(gaps[0]) + 1
    if n_ev == 0:
        return None, 0, (reason if reason != "other" or len(top_idx) == 0 else "slow")

    def prefix(n_events: int) -> int:  # pairs up to the end of the first n events
        return int(top_idx[n_events]) if n_events < len(top_idx) else (
            int(stop[0]) if len(stop) else npairs)

    npair = prefix(n_ev)
    # anomalies: deeper than XStat, a field in the wrong message, a length that does not end
    # on a field boundary. Decode only the events before the first one; protobuf gets it.
    code = np.clip(depth[:npair], 0, 3).astype(np.uint16) * 256 + tag8[:npair]
    bad = ~_LUT_PLACE[code]
    mis = len_idx[misaligned]
    bad[mis[mis < npair]] = True
    if bad.any():
        first_bad = int(np.flatnonzero(bad)[0])
        n_ev = int(np.count_nonzero(d0[: first_bad + 1])) - 1
        if n_ev <= 0:
            return None, 0, "slow"
        npair = prefix(n_ev)
    consumed = int(ev_end[n_ev - 1])
    depth, tag8, val, is_len, d0 = (x[:npair] for x in (depth, tag8, val, is_len, d0))
    d1 = depth == 1
    ev_of = np.cumsum(d0, dtype=np.int32) - 1
    field = tag8 >> 3
    part = _empty_part()
    # event scalars: one scatter into an [event, field] table (fields 1..5)
    m = np.greater(d1, is_len)
    table = np.zeros((n_ev, 6), np.int64)
    table.reshape(-1)[ev_of[m].astype(np.int64) * 6 + field[m]] = val[m].view(np.int64)
    part["metadata_id"] = table[:, 1]
    part["offset_ps"] = table[:, 2]
    part["duration_ps"] = table[:, 3]
    part["aggregated"] = table[:, 5] != 0
    if (table[:, 5] == 0).any() and (m & (field == 5)).any():  # num_occurrences = 0 is set too
        agg = np.zeros(n_ev, np.bool_)
        agg[ev_of[m & (field == 5)]] = True
        part["aggregated"] = agg
    is_stat = d1 & is_len
    n_stats = int(np.count_nonzero(is_stat))
    if n_stats:
        st_of = np.cumsum(is_stat, dtype=np.int32) - 1
        part["stat_event"] = ev_of[is_stat].astype(np.int64)
        d2 = depth == 2
        mid = np.zeros(n_stats, np.int64)
        mm = d2 & (field == 1)
        mid[st_of[mm]] = val[mm].view(np.int64)
        kind = np.zeros(n_stats, np.uint8)
        value = np.zeros(n_stats, np.uint64)
        mm = d2 & (field != 1)
        kind[st_of[mm]] = field[mm]
        value[st_of[mm]] = val[mm]
        part["stat_mid"], part["stat_kind"], part["stat_value"] = mid, kind, value
    return part, consumed, "ok"


#: After this many consecutive events that needed protobuf (or twice as many in all, when
#: they outnumber the vectorised ones), the rest of the line goes through protobuf in one
#: call (lines where most events carry a string stat).
SLOW_RUN_LIMIT = 16
_SMALL_CHUNK = 1 << 12


def decode_events(buf, start: int, end: int):
    """Decode the run of ``XLine.events`` fields starting at ``buf[start]`` (a 0x22 tag) and
    ending at the first other field or at ``end``.

    Returns ``(columns, stop, rest)``: the :class:`EventColumns`, the offset where the run
    stopped, and, when the tail of the line was handed to protobuf in one piece, the XLine
    message parsed from ``buf[stop_of_fast_part:end]`` (its non-event fields belong to the
    line), else None. Raises :class:`WireError` (absolute offset) on broken bytes.
    """
    parts: list[dict] = []
    pos = start
    chunk = CHUNK_BYTES
    slow_run = n_slow = n_fast = 0
    mv = memoryview(buf)
    while pos < end:
        if buf[pos] != _T_EVENT:
            break
        stop = min(end, pos + chunk)
        part, consumed, why = _fast_chunk(np.frombuffer(mv[pos:stop], np.uint8))
        if part is not None:
            parts.append(part)
            pos += consumed
            n_fast += len(part["metadata_id"])
            slow_run = 0
            # grow while events come in whole chunks; stay small when a protobuf-only event
            # keeps cutting the run short (no re-tokenising of a big chunk per event)
            chunk = min(max(2 * consumed, _SMALL_CHUNK), CHUNK_BYTES)
            continue
        if why == "other":
            break
        if why == "end" and stop < end:
            chunk *= 2  # one event larger than the chunk: widen
            continue
        slow_run += 1
        n_slow += 1
        if slow_run >= SLOW_RUN_LIMIT or (n_slow >= 2 * SLOW_RUN_LIMIT and n_slow > n_fast):
            rest = XLine()
            try:
                rest.ParseFromString(bytes(mv[pos:end]))
            except Exception as exc:
                err = find_break(buf, pos, end, "XLine")
                raise err or WireError(pos, f"undecodable events: {exc}") from None
            parts.append(_part_from_messages(rest.events))
            return EventColumns(parts), end, rest
        # one event through protobuf, then back to the vectorised path with a small chunk
        _tag, p = read_varint(buf, pos, end)
        length, p = read_varint(buf, p, end)
        if length > end - p:
            raise WireError(pos, f"event declares {length} bytes but only {end - p} remain")
        ev = XEvent()
        try:
            ev.ParseFromString(bytes(mv[p : p + length]))
        except Exception as exc:  # protobuf DecodeError: locate it
            err = find_break(buf, p, p + length, "XEvent")
            raise err or WireError(pos, f"undecodable event: {exc}") from None
        parts.append(_part_from_messages([ev]))
        pos = p + length
        chunk = _SMALL_CHUNK
    return EventColumns(parts), pos, None


# ---------------------------------------------------------------------------------------
# Space / plane / line scanning: protobuf for the (small) metadata, the columnar decoder for
# the (large) events. Nothing is copied: events are decoded from the caller's buffer.
# ---------------------------------------------------------------------------------------


class LineScan:
    """One XLine: header fields and (when decoded) its events as :class:`EventColumns`."""

    __slots__ = ("id", "display_id", "name", "display_name", "timestamp_ns", "duration_ps",
                 "events", "offset")

    def __init__(self, offset: int) -> None:
        self.offset = offset  # byte offset of the line's content in the file
        self.id = self.display_id = self.timestamp_ns = self.duration_ps = 0
        self.name = self.display_name = ""
        self.events: EventColumns | None = None


class PlaneScan:
    """One XPlane: ``meta`` is an XPlane message holding id, name, event/stat metadata and
    plane stats (no lines); ``line_ranges`` the byte ranges of its lines, decoded on demand
    with :meth:`line`."""

    def __init__(self, buf, offset: int, meta, line_ranges: list[tuple[int, int]]) -> None:
        self.buf = buf
        self.offset = offset
        self.meta = meta
        self.line_ranges = line_ranges

    @property
    def name(self) -> str:
        return text(self.meta.name)

    def line(self, i: int, want=None) -> LineScan:
        """Decode line ``i``. ``want(name) -> bool`` (optional) skips the events of lines
        whose name it rejects (``events`` stays None). Raises :class:`WireError`."""
        start, end = self.line_ranges[i]
        return scan_line(self.buf, start, end, want)


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def scan_line(buf, start: int, end: int, want=None) -> LineScan:
    """Decode one XLine from ``buf[start:end]`` (see :class:`PlaneScan.line`)."""
    line = LineScan(start)
    parts: list[EventColumns] = []
    pos = start
    while pos < end:
        tag_pos = pos
        if buf[pos] == _T_EVENT:
            if want is not None and not want(line.name):
                return line
            cols, pos, rest = decode_events(buf, pos, end)
            parts.append(cols)
            if rest is not None:  # protobuf took the tail of the line: its fields are ours
                line.duration_ps = rest.duration_ps or line.duration_ps
                line.display_id = rest.display_id or line.display_id
                line.display_name = text(rest.display_name) or line.display_name
                if rest.HasField("name"):
                    line.name = text(rest.name)
            continue
        tag, pos = read_varint(buf, pos, end)
        field, wt = tag >> 3, tag & 7
        if wt == _VARINT:
            value, pos = read_varint(buf, pos, end)
            value = _signed(value)
            if field == 1:
                line.id = value
            elif field == 3:
                line.timestamp_ns = value
            elif field == 9:
                line.duration_ps = value
            elif field == 10:
                line.display_id = value
        elif wt == _LEN:
            n, pos = read_varint(buf, pos, end)
            if n > end - pos:
                raise WireError(tag_pos, f"XLine field {field} declares {n} bytes, "
                                         f"{end - pos} remain")
            if field in (2, 11):
                raw = bytes(buf[pos : pos + n])
                try:
                    s = raw.decode("utf-8")
                except UnicodeDecodeError:
                    s = raw.decode("utf-8", errors="replace")
                if field == 2:
                    line.name = s
                else:
                    line.display_name = s
            pos += n
        elif wt == _I64:
            pos += 8
        elif wt == _I32:
            pos += 4
        else:
            raise WireError(tag_pos, f"invalid wire type {wt} in XLine")
        if pos > end:
            raise WireError(tag_pos, "XLine field runs past the end of the line")
    if want is not None and not want(line.name):
        return line
    if len(parts) == 1:
        line.events = parts[0]
    else:
        line.events = _concat_columns(parts)
    return line


def _concat_columns(parts: list[EventColumns]) -> EventColumns:
    dicts = []
    for p in parts:
        d = {k: getattr(p, k) for k in ("metadata_id", "offset_ps", "duration_ps", "aggregated",
                                        "stat_mid", "stat_kind", "stat_value")}
        d["stat_event"] = p.stat_event.copy()
        d["stat_objects"] = p.stat_objects
        dicts.append(d)
    return EventColumns(dicts)


class SpaceScan:
    """An XSpace, scanned: ``planes`` (:class:`PlaneScan`), ``hostnames``, ``errors``,
    ``warnings``, and ``damage``: :class:`WireError` s for parts that could not be read
    (a truncated tail, a corrupt plane), each of which lost the data it names."""

    def __init__(self) -> None:
        self.planes: list[PlaneScan] = []
        self.hostnames: list[str] = []
        self.errors: list[str] = []
        self.warnings: list[str] = []
        self.damage: list[WireError] = []
        self.unknown_fields = 0


def _decode_str(buf, a: int, b: int) -> str:
    return bytes(buf[a:b]).decode("utf-8", errors="replace")


def scan_plane(buf, start: int, end: int) -> PlaneScan:
    """Scan one XPlane (content ``buf[start:end]``). Raises :class:`WireError`."""
    meta_fields = []
    line_ranges = []
    for field, wt, value, tag_pos, field_end in iter_fields(buf, start, end):
        if field == 3 and wt == _LEN:
            line_ranges.append(value)
        else:
            meta_fields.append(bytes(buf[tag_pos:field_end]))
    meta = XPlane()
    joined = b"".join(meta_fields)
    try:
        meta.ParseFromString(joined)
    except Exception:
        err = find_break(joined, 0, len(joined), "XPlane")
        raise WireError(start, "plane metadata does not decode"
                               + (f" ({err.reason})" if err else "")) from None
    return PlaneScan(buf, start, meta, line_ranges)


def scan_space(buf) -> SpaceScan:
    """Scan an XSpace: planes (metadata decoded, lines on demand), hostnames, errors,
    warnings. A break in the wire format stops the scan there; what came before is kept and
    the break is recorded in ``damage``. Raises nothing for broken bytes: callers decide
    (``not space.planes and space.damage`` means nothing was readable)."""
    space = SpaceScan()
    end = len(buf)
    try:
        for field, wt, value, tag_pos, _end in iter_fields(buf, 0, end):
            if wt != _LEN:
                space.unknown_fields += 1
                continue
            a, b = value
            if field == 1:
                try:
                    space.planes.append(scan_plane(buf, a, b))
                except WireError as err:
                    space.damage.append(WireError(err.offset, f"plane at byte {tag_pos} "
                                                              f"skipped: {err.reason}"))
            elif field == 2:
                space.errors.append(_decode_str(buf, a, b))
            elif field == 3:
                space.warnings.append(_decode_str(buf, a, b))
            elif field == 4:
                space.hostnames.append(_decode_str(buf, a, b))
            else:
                space.unknown_fields += 1
    except WireError as err:
        space.damage.append(err)
    return space
