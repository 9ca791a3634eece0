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

Usage (the names are also importable from :mod:`.xplane_proto`, the XSpace reader)::

    from traceroof.parsers.xplane_proto_messages import XSpace
    space = XSpace()
    space.ParseFromString(data)
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from google.protobuf import descriptor_pool, message_factory

PACKAGE = "tensorflow.profiler"

#: ``FieldDescriptorProto``'s type and label numbers (google/protobuf/descriptor.proto, fixed by
#: the format), written down so that ``descriptor_pb2`` (~12 ms to import) is not needed
_F = SimpleNamespace(TYPE_DOUBLE=1, TYPE_INT64=3, TYPE_UINT64=4, TYPE_STRING=9, TYPE_MESSAGE=11,
                     TYPE_BYTES=12, LABEL_OPTIONAL=1, LABEL_REPEATED=3)
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


def _file_descriptor() -> Any:
    """The file's ``descriptor_pb2.FileDescriptorProto``, built with protobuf's own classes
    (imported here: the pool is loaded from :func:`_file_descriptor_bytes`, which gives the
    same message; tests/test_xplane_proto.py checks they are equal)."""
    from google.protobuf import descriptor_pb2

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


def _varint(v: int) -> bytes:
    out = bytearray()
    while True:
        b, v = v & 0x7F, v >> 7
        out.append(b | 0x80 if v else b)
        if not v:
            return bytes(out)


def _key(number: int, value: int | str | bytes) -> bytes:
    """One field of a message: a varint for an int, length-delimited for text and bytes."""
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    raw = value.encode() if isinstance(value, str) else value
    return _varint(number << 3 | 2) + _varint(len(raw)) + raw


def _field_bytes(name: str, number: int, ftype: int, label: int, type_name: str | None,
                 oneof_index: int | None) -> bytes:
    # FieldDescriptorProto: name 1, number 3, label 4, type 5, type_name 6, options 8
    # (FieldOptions.packed 2), oneof_index 9, in field-number order as protobuf writes them
    out = _key(1, name) + _key(3, number) + _key(4, label) + _key(5, ftype)
    if type_name:
        out += _key(6, f".{PACKAGE}.{type_name}")
    if label == _REP and ftype not in (_F.TYPE_MESSAGE, _F.TYPE_STRING, _F.TYPE_BYTES):
        out += _key(8, _key(2, 1))
    if oneof_index is not None:
        out += _key(9, oneof_index)
    return out


def _file_descriptor_bytes() -> bytes:
    """:func:`_file_descriptor` serialised, written with a few lines of wire encoding instead
    of protobuf's ``descriptor_pb2`` classes (issue 19: an XPlane read imports what it needs)."""
    # DescriptorProto: name 1, field 2, nested_type 3, options 7 (MessageOptions.map_entry 7),
    # oneof_decl 8 (OneofDescriptorProto.name 1); FileDescriptorProto: name 1, package 2,
    # message_type 4, syntax 12
    out = _key(1, "traceroof/xplane.proto") + _key(2, PACKAGE)
    for msg_name, fields in _MESSAGES.items():
        msg = _key(1, msg_name) + b"".join(_key(2, _field_bytes(*f)) for f in fields)
        if msg_name == "XPlane":
            for entry_name, value_type in _MAP_ENTRIES.items():
                entry = (_key(1, entry_name) + _key(2, _field_bytes("key", 1, _F.TYPE_INT64, _OPT, None, None))
                         + _key(2, _field_bytes("value", 2, _F.TYPE_MESSAGE, _OPT, value_type, None))
                         + _key(7, _key(7, 1)))
                msg += _key(3, entry)
        msg += b"".join(_key(8, _key(1, o)) for o in _ONEOFS.get(msg_name, []))
        out += _key(4, msg)
    return out + _key(12, "proto2")


POOL = descriptor_pool.DescriptorPool()
POOL.AddSerializedFile(_file_descriptor_bytes())


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

