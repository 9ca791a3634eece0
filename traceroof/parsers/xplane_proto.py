"""The XSpace reader (package ``tensorflow.profiler``): scan an ``.xplane.pb`` buffer into
planes, lines and event columns, without copying it.

Protobuf parses the (small) metadata; the (large) event runs are decoded into columns by
:mod:`.xplane_proto_events`. The pieces, each importable on its own:

* :mod:`.xplane_proto_messages`: the XSpace messages defined in code, in a private
  descriptor pool (``XSpace``, ``XPlane``, ..., ``text``);
* :mod:`.xplane_proto_wire`: the wire format (``WireError``, ``read_varint``,
  ``iter_fields``, ``find_break``);
* :mod:`.xplane_proto_tokens` / :mod:`.xplane_proto_events`: the vectorised event decoder
  (``EventColumns``, ``decode_events``, the ``STAT_*`` value kinds).

This module re-exports their public names, so ``from . import xplane_proto as xp`` is the
one import a reader needs.

Usage::

    from traceroof.parsers.xplane_proto import XSpace, scan_space
    space = XSpace()
    space.ParseFromString(data)      # protobuf, whole messages
    scan = scan_space(data)          # or: planes, lines on demand, events as columns
"""

from __future__ import annotations

from .xplane_proto_events import (
    SLOW_RUN_LIMIT,
    STAT_BYTES,
    STAT_DOUBLE,
    STAT_INT64,
    STAT_REF,
    STAT_STR,
    STAT_UINT64,
    T_EVENT,
    EventColumns,
    decode_events,
    protobuf_event,
)
from .xplane_proto_messages import (
    POOL,
    WIRE_SCHEMA,
    XEvent,
    XEventMetadata,
    XLine,
    XPlane,
    XSpace,
    XStat,
    XStatMetadata,
    text,
)
from .xplane_proto_wire import (
    I32,
    I64,
    LEN,
    VARINT,
    Cut,
    WireError,
    find_break,
    iter_fields,
    read_varint,
)

__all__ = [
    "Cut", "POOL", "SLOW_RUN_LIMIT", "STAT_BYTES", "STAT_DOUBLE", "STAT_INT64", "STAT_REF", "STAT_STR",
    "STAT_UINT64", "WIRE_SCHEMA", "EventColumns", "LineScan", "PlaneScan", "SpaceScan",
    "WireError", "XEvent", "XEventMetadata", "XLine", "XPlane", "XSpace", "XStat",
    "XStatMetadata", "decode_events", "find_break", "iter_fields", "read_varint", "scan_line",
    "scan_plane", "scan_space", "text",
]


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
        #: where the file ends inside this plane (:func:`scan_space` of a cut file), else None
        self.cut: Cut | None = None
        #: the last of ``line_ranges`` is a line cut by the end (its complete events kept)
        self.cut_line = False

    @property
    def name(self) -> str:
        """The plane's name (``/device:GPU:0``, ``/host:CPU``), invalid UTF-8 replaced."""
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
        if buf[pos] == T_EVENT:
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
        if wt == VARINT:
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
        elif wt == LEN:
            n, pos = read_varint(buf, pos, end)
            if n > end - pos:
                raise WireError(tag_pos, f"XLine field {field} declares {n} bytes, "
                                         f"{end - pos} remain")
            if field == 4:  # an event under a tag written over-long (not 0x22): protobuf's
                if want is not None and not want(line.name):
                    return line
                parts.append(EventColumns([protobuf_event(buf, tag_pos, pos, n)]))
            elif field in (2, 11):
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
        elif wt == I64:
            pos += 8
        elif wt == I32:
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
        #: where the file ends inside a field of the XSpace (a cut file), else None
        self.cut: Cut | None = None


def _decode_str(buf, a: int, b: int) -> str:
    return bytes(buf[a:b]).decode("utf-8", errors="replace")


def scan_plane(buf, start: int, end: int, cut: bool = False) -> PlaneScan:
    """Scan one XPlane (content ``buf[start:end]``). ``cut``: the file ends inside it
    (``end`` is the buffer's end): its complete fields are kept, and of a line cut by the end
    its complete events (:attr:`PlaneScan.cut`, :attr:`PlaneScan.cut_line`). Raises
    :class:`WireError`."""
    meta_fields = []
    line_ranges = []
    cuts: list[Cut] | None = [] if cut else None
    for field, wt, value, tag_pos, field_end in iter_fields(buf, start, end, cuts):
        if field == 3 and wt == LEN:
            line_ranges.append(value)
        else:
            meta_fields.append(bytes(buf[tag_pos:field_end]))
    cut_line = False
    if cuts and cuts[0].field == 3 and cuts[0].wire_type == LEN:
        kept = _complete_prefix(buf, cuts[0].start, _LINE_EVENTS)
        if kept > cuts[0].start:  # (a cut line is kept only with a complete event)
            line_ranges.append((cuts[0].start, kept))
            cut_line = True
    meta = XPlane()
    joined = b"".join(meta_fields)
    try:
        meta.ParseFromString(joined)
    except Exception:
        err = find_break(joined, 0, len(joined), "XPlane")
        raise WireError(start, "plane metadata does not decode"
                               + (f" ({err.reason})" if err else "")) from None
    plane = PlaneScan(buf, start, meta, line_ranges)
    plane.cut = cuts[0] if cuts else None
    plane.cut_line = cut_line
    return plane


#: XLine's field ``events`` (xplane.proto)
_LINE_EVENTS = 4


def _complete_prefix(buf, start: int, needs: int | None = None) -> int:
    """The end of the complete fields of a message from ``start`` that the end of ``buf``
    cuts (``start`` when none is complete, when none of them is field ``needs``, or when its
    bytes break before the cut)."""
    last, seen = start, needs is None
    try:
        for num, *_, field_end in iter_fields(buf, start, len(buf), []):
            last, seen = field_end, seen or num == needs
    except WireError:
        return start
    return last if seen else start


def _overlong(cut: Cut, end: int) -> WireError:
    """The break of a length-delimited field that declares more bytes than the buffer holds,
    as :func:`iter_fields` words it (at the offset of its length)."""
    tag = cut.field << 3 | cut.wire_type
    at = cut.tag_pos + (tag.bit_length() + 6) // 7  # the length follows the tag's varint
    return WireError(at, f"field {cut.field} (tag at byte {cut.tag_pos}) declares a length of {cut.declared} bytes "
                         f"but only {end - cut.start} remain in its message (which ends at byte {end})")


def scan_space(buf) -> SpaceScan:
    """Scan an XSpace: planes (metadata decoded, lines on demand), hostnames, errors,
    warnings. A break in the wire format stops the scan there; what came before is kept and
    the break is recorded in ``damage``. A file that ends inside a field (cut short, or
    still being written; a length declaring more bytes than the file holds reads the same)
    keeps the fields before it, and of a plane cut there its complete fields, lines and
    events (:func:`scan_plane` ``cut``): ``cut`` says where. When the bytes of that plane
    break before the end, its length was damaged, not cut: it is left out, the length's
    break recorded in ``damage``. Raises nothing for broken bytes:
    callers decide (``not space.planes and space.damage`` means nothing was readable)."""
    space = SpaceScan()
    end = len(buf)
    cuts: list[Cut] = []
    try:
        for field, wt, value, tag_pos, _end in iter_fields(buf, 0, end, cuts):
            if wt != LEN:
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
    if cuts:
        space.cut = cuts[0]
        if cuts[0].field == 1 and cuts[0].wire_type == LEN:  # the file ends inside a plane: its head is kept
            try:
                plane = scan_plane(buf, cuts[0].start, end, cut=True)
                plane.cut = plane.cut or cuts[0]  # (the cut may fall between two of its fields)
                if plane.line_ranges or plane.meta.ByteSize():  # (nothing complete in it: nothing kept)
                    space.planes.append(plane)
            except WireError:  # its bytes break before the end: not a cut but a damaged length
                space.cut = None
                space.damage.append(_overlong(cuts[0], end))
    return space
