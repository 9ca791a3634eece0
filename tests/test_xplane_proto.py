"""The XSpace message definitions and the columnar event decoder (traceroof.parsers.xplane_proto).

The vectorised decoder must give exactly what protobuf gives, event by event and stat by
stat, on every real file and on hand-made edge cases (strings, doubles, negative and >2**63
values, unknown fields, aggregated events, events straddling chunk boundaries).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import require_xplane_native
from google.protobuf import descriptor_pool

from traceroof.parsers import xplane_proto as xp
from traceroof.parsers import xplane_proto_events as xpe
from traceroof.parsers import xplane_proto_messages as xpm

REAL = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "real"
OWN = Path(__file__).resolve().parents[1] / "fixtures" / "jax_cpu" / "train_step.xplane.pb"
REAL_XPLANES = sorted(REAL.rglob("*.xplane.pb"))


@pytest.fixture(autouse=True)
def _python_decoder(request, monkeypatch):
    """The numpy / protobuf decoder, the subject of this module's tests, unless a test takes
    the ``decoder`` parameter (then both: the C decoder must give what protobuf gives too)."""
    if "decoder" not in request.fixturenames:
        monkeypatch.setenv("TRACEROOF_DECODER", "python")


@pytest.fixture(params=["python", "native"])
def decoder(request, monkeypatch):
    if request.param == "native":
        require_xplane_native()
        monkeypatch.delenv("TRACEROOF_DECODER", raising=False)
    else:
        monkeypatch.setenv("TRACEROOF_DECODER", "python")
    return request.param


def _kind_name(k: int) -> str | None:
    return {0: None, 2: "double_value", 3: "uint64_value", 4: "int64_value", 5: "str_value",
            6: "bytes_value", 7: "ref_value"}[k]


def _decoded(cols: xp.EventColumns) -> list[tuple]:
    """(event, stat mid, value kind, value) for every stat, from the decoder's columns."""
    out = []
    for j in range(len(cols.stat_mid)):
        k = int(cols.stat_kind[j])
        raw = int(cols.stat_value[j])
        if k == 2:
            v = float(np.uint64(raw).view(np.float64))
        elif k == 4:
            v = raw - (1 << 64) if raw >= 1 << 63 else raw
        elif k in (5, 6):
            v = cols.stat_objects[j]
        elif k == 0:
            v = None
        else:
            v = raw
        out.append((int(cols.stat_event[j]), int(cols.stat_mid[j]), _kind_name(k), v))
    return out


def _expected(line) -> list[tuple]:
    out = []
    for k, e in enumerate(line.events):
        for s in e.stats:
            w = s.WhichOneof("value")
            out.append((k, s.metadata_id, w, getattr(s, w) if w else None))
    return out


def _assert_line_equal(cols: xp.EventColumns, ref_line) -> None:
    n = len(ref_line.events)
    assert len(cols) == n
    assert cols.metadata_id.tolist() == [e.metadata_id for e in ref_line.events]
    assert cols.offset_ps.tolist() == [e.offset_ps for e in ref_line.events]
    assert cols.duration_ps.tolist() == [e.duration_ps for e in ref_line.events]
    assert cols.aggregated.tolist() == [e.WhichOneof("data") == "num_occurrences"
                                        for e in ref_line.events]
    assert _decoded(cols) == _expected(ref_line)


def test_real_fixtures_present():
    assert len(REAL_XPLANES) >= 6, f"real xplane fixtures missing under {REAL}"
    assert OWN.exists(), "run fixtures/make_jax_profile.py"


@pytest.mark.parametrize("path", REAL_XPLANES + [OWN], ids=lambda p: "/".join(p.parts[-3:]))
def test_decoder_matches_protobuf_on_real_files(path, decoder):
    data = path.read_bytes()
    space = xp.scan_space(data)
    ref = xp.XSpace()
    ref.ParseFromString(data)
    assert not space.damage
    assert [p.name for p in space.planes] == [xp.text(p.name) for p in ref.planes]
    assert space.hostnames == [xp.text(h) for h in ref.hostnames]
    n_events = 0
    for plane, ref_plane in zip(space.planes, ref.planes):
        assert len(plane.line_ranges) == len(ref_plane.lines)
        assert dict(plane.meta.event_metadata) == dict(ref_plane.event_metadata)
        for i, ref_line in enumerate(ref_plane.lines):
            line = plane.line(i)
            assert (line.id, line.display_id, line.name, line.timestamp_ns, line.duration_ps) == (
                ref_line.id, ref_line.display_id, xp.text(ref_line.name),
                ref_line.timestamp_ns, ref_line.duration_ps)
            _assert_line_equal(line.events, ref_line)
            n_events += len(ref_line.events)
    assert n_events > 0


def _edge_line() -> xp.XLine:
    """A line mixing every stat kind, extreme values and aggregated events."""
    line = xp.XLine(id=-7, display_id=3, name="Stream #7(Kernel)", display_name="s7",
                    timestamp_ns=123456789, duration_ps=99)
    values = [
        ("int64_value", -1), ("int64_value", -(1 << 63)), ("uint64_value", (1 << 64) - 1),
        ("uint64_value", 1 << 63), ("ref_value", (1 << 64) - 2), ("int64_value", 0),
        ("double_value", -2.5), ("str_value", "héllo"), ("bytes_value", b"\x00\xff\x80"),
        ("ref_value", 5), ("uint64_value", 300),
    ]
    for i in range(200):
        e = line.events.add(metadata_id=i % 5 - 1, duration_ps=(i * 7919) % 100000)
        if i % 17 == 3:
            e.num_occurrences = i
        else:
            e.offset_ps = -5 if i == 0 else i * 1_000_003
        for j in range(i % 4):
            kind, v = values[(i + j) % len(values)]
            if i % 50 == 7 and kind in ("str_value", "double_value", "bytes_value"):
                kind, v = "uint64_value", 1
            s = e.stats.add(metadata_id=j + 1)
            setattr(s, kind, v)
        if i % 23 == 5:
            e.stats.add(metadata_id=9)  # a stat with no value
    return line


def _line_bytes(line: xp.XLine) -> bytes:
    return line.SerializeToString()


@pytest.mark.parametrize("chunk", [1 << 18, 64, 23])
def test_decoder_edge_cases(monkeypatch, chunk, decoder):
    monkeypatch.setattr(xpe, "CHUNK_BYTES", chunk)
    monkeypatch.setattr(xpe, "_SMALL_CHUNK", max(8, chunk // 4))
    line = _edge_line()
    data = _line_bytes(line)
    got = xp.scan_line(data, 0, len(data))
    assert (got.id, got.display_id, got.name, got.display_name, got.timestamp_ns,
            got.duration_ps) == (-7, 3, "Stream #7(Kernel)", "s7", 123456789, 99)
    _assert_line_equal(got.events, line)


def test_decoder_unknown_fields_and_non_canonical_order(decoder):
    """An event with a field this schema does not know (as a newer writer might add) and line
    fields written after the events: protobuf semantics, nothing lost."""
    ev = xp.XEvent(metadata_id=3, offset_ps=10, duration_ps=20)
    ev.stats.add(metadata_id=1, ref_value=4)
    raw_ev = ev.SerializeToString() + b"\x30\x05"  # unknown field 6 (varint 5)
    plain = xp.XEvent(metadata_id=4, offset_ps=30, duration_ps=5).SerializeToString()

    def field(tag: int, payload: bytes) -> bytes:
        return bytes([tag, len(payload)]) + payload

    data = (field(0x22, plain) + field(0x22, raw_ev) + field(0x22, plain) + b"\x08\x05"
            + field(0x12, b"late name") + field(0x22, plain))
    got = xp.scan_line(data, 0, len(data))
    assert got.id == 5 and got.name == "late name"
    assert got.events.metadata_id.tolist() == [4, 3, 4, 4]
    assert got.events.offset_ps.tolist() == [30, 10, 30, 30]
    assert _decoded(got.events) == [(1, 1, "ref_value", 4)]


def test_decoder_keeps_the_oneof_member_set_last(decoder):
    """An event whose bytes set ``num_occurrences`` then ``offset_ps`` (a merge of two
    messages writes that) is not aggregated and keeps its offset; the other order is
    aggregated, ``offset_ps`` 0: protobuf's oneof rule, in both decoders, whether or not the
    event has stats (the numpy decoder's regular and general layouts)."""
    def ev(**f) -> bytes:
        return xp.XEvent(**f).SerializeToString()

    stat = b"\x22\x04\x08\x01\x18\x02"  # a stat: metadata_id 1, uint64 2
    bodies = [ev(num_occurrences=3) + ev(offset_ps=7), ev(offset_ps=7) + ev(num_occurrences=4),
              ev(num_occurrences=3) + ev(offset_ps=9) + stat, ev(offset_ps=5, duration_ps=2) + stat,
              ev(offset_ps=1) + ev(num_occurrences=0) + stat]
    data = b"".join(bytes([0x22, len(b)]) + b for b in bodies)
    ref = xp.XLine()
    ref.ParseFromString(data)
    got = xp.scan_line(data, 0, len(data))
    _assert_line_equal(got.events, ref)
    assert got.events.aggregated.tolist() == [False, True, False, False, True]
    assert got.events.offset_ps.tolist() == [7, 0, 9, 5, 0]


def test_an_event_under_an_over_long_tag_is_kept(decoder):
    """``a2 00`` is tag 0x22 (field 4, LEN) in two bytes: protobuf reads the event after it;
    so does the line's decoder (it was dropped), and a broken one under it is a WireError."""
    data = bytes.fromhex("2206080510071809a20006080510071809")
    ref = xp.XLine()
    ref.ParseFromString(data)
    got = xp.scan_line(data, 0, len(data))
    assert len(ref.events) == 2
    _assert_line_equal(got.events, ref)
    with pytest.raises(xp.WireError):
        bad = bytes.fromhex("a2000608051007ff")  # its last varint cut
        xp.scan_line(bad, 0, len(bad))


def _string_line(n: int):
    line = xp.XLine(id=1, name="python")
    for i in range(n):
        e = line.events.add(metadata_id=1, offset_ps=i, duration_ps=1)
        e.stats.add(metadata_id=2, str_value=f"s{i}")
    return line


@pytest.mark.parametrize("small_rest_bytes", [0, 1 << 22])
def test_bulk_slow_path_for_string_heavy_lines(monkeypatch, small_rest_bytes):
    """Consecutive protobuf-only events: after SLOW_RUN_LIMIT of them (a large line's rest),
    after EARLY_SLOW_RUN (a rest of at most SMALL_REST_BYTES, here the whole 1.2 kB line),
    the rest of the line goes to protobuf in one call; the columns are the same."""
    monkeypatch.setattr(xpe, "SMALL_REST_BYTES", small_rest_bytes)
    line = _string_line(100)
    data = line.SerializeToString()
    calls = []
    real = xpe._part_from_messages
    monkeypatch.setattr(xpe, "_part_from_messages", lambda evs: calls.append(len(evs)) or real(evs))
    got = xp.scan_line(data, 0, len(data))
    _assert_line_equal(got.events, line)
    singles = (xpe.SLOW_RUN_LIMIT if small_rest_bytes == 0 else xpe.EARLY_SLOW_RUN) - 1
    assert calls == [1] * singles + [100 - singles]  # the rest in one protobuf call


def test_protobuf_event_after_a_vectorised_run_is_not_tried_vectorised(monkeypatch):
    """A vectorised run that stops at a string stat inside the next event hands that event to
    protobuf directly ("ok-slow"): one vectorised attempt per run, not a second one that
    would fail on the same event; the columns equal protobuf's."""
    line = xp.XLine(id=1, name="mixed")
    for i in range(40):  # 9 all-varint events, then one with a string stat, four times
        e = line.events.add(metadata_id=1, offset_ps=10 * i, duration_ps=3)
        if i % 10 == 9:
            e.stats.add(metadata_id=2, str_value=f"s{i}")
        else:
            e.stats.add(metadata_id=3, uint64_value=i)
    data = line.SerializeToString()
    whys = []
    real = xpe._fast_chunk
    monkeypatch.setattr(xpe, "_fast_chunk", lambda a: (lambda r: whys.append(r[2]) or r)(real(a)))
    got = xp.scan_line(data, 0, len(data))
    _assert_line_equal(got.events, line)
    assert whys == ["ok-slow"] * 4  # 4 runs of 9; the 4 string events never tried vectorised


def test_invalid_utf8_in_names_is_kept():
    """proto2 strings: a name that is not UTF-8 parses (upb hands it over as bytes) instead of
    failing the whole file, and text() shows it with U+FFFD."""
    parsed = xp.XEventMetadata()
    parsed.ParseFromString(b"\x08\x01\x12\x05kern\xff")
    assert parsed.id == 1
    assert xp.text(parsed.name) == "kern\ufffd"


def test_private_pool_leaves_default_pool_alone():
    with pytest.raises(KeyError):
        descriptor_pool.Default().FindMessageTypeByName("tensorflow.profiler.XSpace")
    assert xp.XSpace.DESCRIPTOR.file.pool is xp.POOL
    # TensorFlow/TensorBoard can still register the same names in the default pool
    fdp = xpm._file_descriptor()
    fdp.name = "tensorflow/tsl/profiler/protobuf/xplane.proto"
    other = descriptor_pool.DescriptorPool()
    other.Add(fdp)
    assert other.FindMessageTypeByName("tensorflow.profiler.XSpace").full_name == \
        "tensorflow.profiler.XSpace"


def test_wire_format_facts():
    """Field numbers and packing as upstream xplane.proto serialises them."""
    m = xp.XEventMetadata(id=1, name="a", child_id=[1, 2, 3])
    assert m.SerializeToString() == b"\x08\x01\x12\x01a\x32\x03\x01\x02\x03"  # packed 6
    s = xp.XStat(metadata_id=2, ref_value=7)
    assert s.SerializeToString() == b"\x08\x02\x38\x07"
    e = xp.XEvent(metadata_id=1, offset_ps=2, duration_ps=3)
    assert e.SerializeToString() == b"\x08\x01\x10\x02\x18\x03"
    line = xp.XLine(id=1, timestamp_ns=5, duration_ps=6, display_id=7, display_name="d")
    assert line.SerializeToString() == b"\x08\x01\x18\x05\x48\x06\x50\x07\x5a\x01d"


def test_find_break_offsets():
    good = xp.XSpace(hostnames=["h"])
    good.planes.add(name="/host:CPU").lines.add(name="t").events.add(metadata_id=1)
    data = good.SerializeToString()
    assert xp.find_break(data, 0, len(data)) is None
    cut = data[:10]  # inside the plane
    err = xp.find_break(cut, 0, len(cut))
    assert err is not None and err.offset == 1  # the plane's length at byte 1 overruns
    assert "declares a length of 20 bytes but only 8 remain" in err.reason
    cut = data[:-2]  # inside the last hostname
    err = xp.find_break(cut, 0, len(cut))
    assert err is not None and err.offset == len(data) - 2
    bad = data[:2] + b"\x0f" + data[3:]  # wire type 7 inside the plane
    err = xp.find_break(bad, 0, len(bad))
    assert err is not None and err.offset == 2 and "wire type 7" in err.reason


def test_the_pool_is_loaded_from_the_same_descriptor_protobuf_builds():
    """The pool is loaded from hand-encoded bytes (no descriptor_pb2 import on the read path);
    the oracle is the same file built with protobuf's own descriptor_pb2 classes: equal as a
    message and byte for byte."""
    from google.protobuf import descriptor_pb2

    oracle = xpm._file_descriptor()
    assert descriptor_pb2.FileDescriptorProto.FromString(xpm._file_descriptor_bytes()) == oracle
    assert xpm._file_descriptor_bytes() == oracle.SerializeToString()
    assert [m.name for m in oracle.message_type] == list(xpm._MESSAGES)
