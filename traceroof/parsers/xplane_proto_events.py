"""The columnar XEvent decoder: the events of an XLine straight from the bytes, into columns.

Going through Python message objects costs ~1-5 us per event and files have millions of
events, so the common all-varint events are decoded here with numpy (:func:`_fast_chunk`
on the pairs of :func:`~.xplane_proto_tokens.tokenise`); events holding a double, string
or bytes stat (or anything unexpected) go through protobuf, which is the arbiter of what is
valid (:func:`decode_events`).

Before either, the optional C decoder (``_xplane_scan.c``: :data:`NATIVE`) takes the whole
run of events in one call, the GIL released, every field protobuf's way (the last value of a
field, the last member of a oneof); it hands back anything it does not fully understand
(another field, a wire type, a tag or length longer than upb reads, a varint or length out
of bounds, a str_value that is not UTF-8),
which then goes the way above: the same columns either way (``tests/test_xplane_native.py``).
``TRACEROOF_DECODER=python`` leaves it out, as it does the Kineto scanner.
"""

from __future__ import annotations

import os

import numpy as np

from .xplane_proto_messages import XEvent, XLine
from .xplane_proto_tokens import CHUNK_BYTES, pos_buffer, tokenise
from .xplane_proto_wire import WireError, find_break, read_varint

try:  # the optional C decoder (setup.py); without it, numpy and protobuf alone
    from . import _xplane_scan
except ImportError:  # pragma: no cover - not built
    _xplane_scan = None  # type: ignore[assignment]

#: the C event decoder was built and imports
NATIVE: bool = _xplane_scan is not None


def native_active() -> bool:
    """True when the C decoder is used: built, and ``TRACEROOF_DECODER`` is not ``python``."""
    return NATIVE and os.environ.get("TRACEROOF_DECODER", "").strip().lower() != "python"


def _native_columns(d: dict) -> EventColumns:
    """:class:`EventColumns` from the C decoder's dict (the arrays as it laid them out)."""
    i64 = np.int64
    part = {
        "metadata_id": np.frombuffer(d["metadata_id"], i64),
        "offset_ps": np.frombuffer(d["offset_ps"], i64),
        "duration_ps": np.frombuffer(d["duration_ps"], i64),
        "aggregated": np.frombuffer(d["aggregated"], np.uint8).view(np.bool_),
        "stat_event": np.frombuffer(d["stat_event"], i64),
        "stat_mid": np.frombuffer(d["stat_mid"], i64),
        "stat_kind": np.frombuffer(d["stat_kind"], np.uint8),
        "stat_value": np.frombuffer(d["stat_value"], np.uint64),
        "stat_objects": dict(zip(np.frombuffer(d["obj_index"], i64).tolist(), d["objects"])),
    }
    return EventColumns([part])

# Tags (field << 3 | wire type) of the fields the fast decoder understands.
T_EVENT = 0x22  # XLine.events / XEvent.stats (field 4, LEN)
_EVENT_FIELDS = (0x08, 0x10, 0x18, 0x22, 0x28)  # XEvent 1,2,3,4,5
_STAT_FIELDS = (0x08, 0x18, 0x20, 0x38)  # XStat 1, uint64, int64, ref
_LUT_ANY = np.zeros(256, np.bool_)
_LUT_ANY[list(_EVENT_FIELDS + _STAT_FIELDS)] = True
#: (depth, tag) -> the tag is valid there: events at depth 0, event fields at 1, stat fields
#: (no nested messages) at 2. Index ``min(depth, 3) * 256 + tag``.
_LUT_PLACE = np.zeros(4 * 256, np.bool_)
_LUT_PLACE[T_EVENT] = True
_LUT_PLACE[[256 + t for t in _EVENT_FIELDS]] = True
_LUT_PLACE[[512 + t for t in _STAT_FIELDS]] = True
_LUT_OTHER = ~_LUT_ANY

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


def protobuf_event(buf, tag_pos: int, start: int, length: int) -> dict:
    """The columns (:func:`_part_from_messages`) of the one XEvent at
    ``buf[start:start + length]``, parsed by protobuf; its field's tag at ``tag_pos``.
    Raises :class:`WireError` where protobuf cannot parse it (located by
    :func:`~.xplane_proto_wire.find_break` when it can be)."""
    ev = XEvent()
    try:
        ev.ParseFromString(bytes(memoryview(buf)[start : start + length]))
    except Exception as exc:  # protobuf DecodeError: locate it
        err = find_break(buf, start, start + length, "XEvent")
        raise err or WireError(tag_pos, f"undecodable event: {exc}") from None
    return _part_from_messages([ev])


#: Tags valid as XEvent-level (depth 1) varint fields, and as XStat values.
_LUT_EVFIELD = np.zeros(256, np.bool_)
_LUT_EVFIELD[[0x08, 0x10, 0x18, 0x28]] = True
_LUT_STATVAL = np.zeros(256, np.bool_)
_LUT_STATVAL[[0x18, 0x20, 0x38]] = True


def _event_scalars(part: dict, n_ev: int, ev_of, field, values) -> None:
    """Set the event columns of ``part`` from the event-level varint fields (1..5) given as
    the owning event, the field number and the value of each, in file order (``ev_of`` non
    decreasing): one scatter into an ``[event, field]`` table, the last value of a field
    kept. ``aggregated``: the ``data`` oneof's member set last is field 5
    (``num_occurrences``), and then ``offset_ps`` reads 0, as protobuf has it."""
    table = np.zeros((n_ev, 6), np.int64)
    table.reshape(-1)[ev_of.astype(np.int64) * 6 + field] = values
    part["metadata_id"] = table[:, 1]
    part["duration_ps"] = table[:, 3]
    data = np.flatnonzero((field == 2) | (field == 5))  # the oneof's pairs, in file order
    agg = np.zeros(n_ev, np.bool_)
    if len(data):
        ev = ev_of[data]
        last = np.ones(len(data), np.bool_)  # the last oneof pair of its event
        last[:-1] = ev[1:] != ev[:-1]
        agg[ev[last]] = field[data[last]] == 5
    part["aggregated"] = agg
    part["offset_ps"] = np.where(agg, 0, table[:, 2]) if agg.any() else table[:, 2]


def _regular_layout(n_bytes: int, tag8, val, tag_pos, val_end, tail_pos: int):
    """Where the events and stats of a chunk in the common layout are (see
    :func:`_regular_chunk`): ``(n_ev, ev_idx, ev_at, n_len, st, t2, p_end, consumed)``, the
    number of complete events, the pair index of each event (and of each among the LEN
    pairs), the number of LEN pairs, the pair index and value tag of each stat, the pairs
    decoded and the bytes they span; None when the chunk is laid out otherwise."""
    npairs = len(tag8)
    is_len = tag8 == T_EVENT
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
    t2 = None
    if n_st:
        if int(st[-1]) + 2 >= p_end:
            return None
        t1 = tag8[st + 1]
        t2 = tag8[st + 2]
        if not ((t1 == 0x08).all() and _LUT_STATVAL[t2].all()
                and (val_end[st + 2] + 1 == st_close).all()):
            return None
    return n_ev, ev_idx, ev_at, len(len_idx), st, t2, p_end, consumed


def _regular_chunk(n_bytes: int, tag8, val, tag_pos, val_end, tail_pos: int):
    """The common layout, decoded with gathers instead of a depth computation: top-level
    events, one after the other, whose stats are each exactly (metadata_id, one varint value).
    Returns (columns, consumed) or None when the chunk is anything else (the general path
    then decides); when it returns columns they equal the general path's."""
    layout = _regular_layout(n_bytes, tag8, val, tag_pos, val_end, tail_pos)
    if layout is None:
        return None
    n_ev, ev_idx, ev_at, n_len, st, t2, p_end, consumed = layout
    n_st = len(st)
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
        _event_scalars(part, n_ev, ev_of, t_ev >> 3, val[lvl1].view(np.int64))
    if n_st:
        per_event = np.diff(ev_at[: n_ev + 1], append=n_len)[:n_ev] - 1  # stats
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
    (tag, value); nesting depth follows from the lengths. All of it is vectorised: the
    common layout by :func:`_regular_chunk`, any other by :func:`_general_chunk`.

    Returns (columns or None, bytes consumed, why it stopped): ``"ok"``; ``"ok-slow"`` (columns,
    and the next event holds a field this path does not handle, so the caller hands it to
    protobuf without another vectorised attempt that would fail); ``"end"`` (the chunk
    ran out inside the first event); ``"other"`` (the next top-level field is not an event:
    the events run is over); ``"slow"`` (the next event needs the protobuf path: a double,
    string or bytes stat, an unknown field, or anything unexpected -- protobuf is the arbiter
    of what is valid, and locates errors).
    """
    tok = tokenise(a)
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

    regular = _regular_chunk(len(a), tag8, val, tag_pos, val_end, tail_pos)
    part, consumed, why = ((regular[0], regular[1], "ok") if regular is not None else
                           _general_chunk(len(a), tag8, val, tag_pos, val_end, tail_pos, tail_unhandled))
    if part is not None and tail_unhandled and consumed < tail_pos:
        # the run stopped at a field we do not handle inside the next event: that event
        # needs protobuf (a hint only: protobuf decodes any event to the same columns)
        why = "ok-slow"
    return part, consumed, why


def _depths(n_bytes: int, tag8, val, tag_pos, after, tail_pos: int):
    """Nesting depth of every pair: ``(depth, tail_depth, is_len, len_idx, misaligned)``.
    A LEN pair's content starts at the next pair and must end exactly at a pair boundary
    (or at the tail, ``tail_pos``); a byte -> pair-index map finds where (``misaligned``:
    the LEN pairs, among ``len_idx``, whose content ends elsewhere)."""
    npairs = len(tag8)
    is_len = tag8 == T_EVENT
    len_idx = np.flatnonzero(is_len)
    close_at = after[len_idx] + val[len_idx].view(np.int64)
    pos_to_pair = pos_buffer(n_bytes + 1)
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
    return running[:npairs], int(running[npairs]), is_len, len_idx, misaligned


def _general_chunk(n_bytes: int, tag8, val, tag_pos, val_end, tail_pos: int, tail_unhandled: bool):
    """Any layout of all-varint events, through the nesting depth of every pair (see
    :func:`_fast_chunk`, which this finishes; same returns)."""
    npairs = len(tag8)
    after = val_end + 1  # first byte after the pair's value
    depth, tail_depth, is_len, len_idx, misaligned = _depths(n_bytes, tag8, val, tag_pos, after, tail_pos)
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
    return _general_columns(n_ev, depth, tag8, val, is_len, d0), consumed, "ok"


def _general_columns(n_ev: int, depth, tag8, val, is_len, d0) -> dict:
    """The columns of the first ``n_ev`` events from their pairs and the depth of each."""
    d1 = depth == 1
    ev_of = np.cumsum(d0, dtype=np.int32) - 1
    field = tag8 >> 3
    part = _empty_part()
    m = np.greater(d1, is_len)  # event scalars (fields 1..5)
    _event_scalars(part, n_ev, ev_of[m], field[m], val[m].view(np.int64))
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
    return part


#: After this many consecutive events that needed protobuf (or twice as many in all, when
#: they outnumber the vectorised ones), the rest of the line goes through protobuf in one
#: call (lines where most events carry a string stat).
SLOW_RUN_LIMIT = 16
#: ... or after this many, when at most :data:`SMALL_REST_BYTES` of the line are left: there
#: protobuf's objects stay small, and it is faster than vectorised attempts that a protobuf
#: event cuts short every few events (each attempt costs ~0.2 ms of numpy calls whatever
#: its size: the GPU multi-worker trace's host lines, whose events carry string stats, read
#: in 236 ms instead of 360 ms of CPU; docs/performance.md, "Small traces (session 9)")
EARLY_SLOW_RUN = 2
SMALL_REST_BYTES = 1 << 22
_SMALL_CHUNK = 1 << 12


def decode_events(buf, start: int, end: int):
    """Decode the run of ``XLine.events`` fields starting at ``buf[start]`` (a 0x22 tag) and
    ending at the first other field or at ``end``.

    Returns ``(columns, stop, rest)``: the :class:`EventColumns`, the offset where the run
    stopped, and, when the tail of the line was handed to protobuf in one piece, the XLine
    message parsed from ``buf[stop_of_fast_part:end]`` (its non-event fields belong to the
    line), else None. Raises :class:`WireError` (absolute offset) on broken bytes.
    """
    if native_active():
        d = _xplane_scan.events(buf, start, end)
        if d is not None:
            return _native_columns(d), d["stop"], None
    parts: list[dict] = []
    pos = start
    chunk = CHUNK_BYTES
    slow_run = n_slow = n_fast = 0
    mv = memoryview(buf)
    next_slow = False  # the last vectorised run stopped inside the next event (protobuf's)
    while pos < end:
        if buf[pos] != T_EVENT:
            break
        if not next_slow:
            stop = min(end, pos + chunk)
            part, consumed, why = _fast_chunk(np.frombuffer(mv[pos:stop], np.uint8))
            if part is not None:
                parts.append(part)
                pos += consumed
                n_fast += len(part["metadata_id"])
                slow_run = 0
                next_slow = why == "ok-slow"
                # grow while events come in whole chunks; stay small when a protobuf-only
                # event keeps cutting the run short (no re-tokenising of a big chunk per event)
                chunk = min(max(2 * consumed, _SMALL_CHUNK), CHUNK_BYTES)
                continue
            if why == "other":
                break
            if why == "end" and stop < end:
                chunk *= 2  # one event larger than the chunk: widen
                continue
        next_slow = False
        slow_run += 1
        n_slow += 1
        if (slow_run >= SLOW_RUN_LIMIT or (n_slow >= 2 * SLOW_RUN_LIMIT and n_slow > n_fast)
                or (slow_run >= EARLY_SLOW_RUN and end - pos <= SMALL_REST_BYTES)):
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
        parts.append(protobuf_event(buf, pos, p, length))
        pos = p + length
        chunk = _SMALL_CHUNK
    return EventColumns(parts), pos, None
