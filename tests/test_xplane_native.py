"""The C XPlane event decoder (``traceroof/parsers/_xplane_scan.c``) against protobuf.

Protobuf is the oracle: whatever the C decoder returns for a run of ``XLine.events`` must be
what protobuf parses from the same bytes (the last value of a repeated scalar field, the last
member of a oneof, every stat kind, extreme values); what it does not fully understand it
hands back (None), and the numpy / protobuf path reads those bytes as before. On every
XPlane the project has (the real fixtures and its own), every line and the tables read
from the file are the same with and without it.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
from conftest import REAL, require_xplane_native

from traceroof.parsers import xplane_proto as xp
from traceroof.parsers import xplane_proto_events as xpe
from traceroof.parsers import xplane_proto_messages as xpm

require_xplane_native()
from traceroof.parsers import _xplane_scan  # noqa: E402 - after the build check

OWN = sorted((Path(__file__).resolve().parents[1] / "fixtures").rglob("*.xplane.pb"))
XPLANES = sorted(REAL.rglob("*.xplane.pb")) + OWN
COLUMNS = ("metadata_id", "offset_ps", "duration_ps", "aggregated", "stat_event", "stat_mid",
           "stat_kind", "stat_value")


def _protobuf_columns(data: bytes) -> xpe.EventColumns:
    """The columns of the events protobuf parses from ``data`` (an XLine's bytes)."""
    line = xpm.XLine()
    line.ParseFromString(data)
    return xpe.EventColumns([xpe._part_from_messages(line.events)])


def _assert_same(got: xpe.EventColumns, want: xpe.EventColumns) -> None:
    for k in COLUMNS:
        a, b = getattr(got, k), getattr(want, k)
        assert a.dtype == b.dtype, k
        assert np.array_equal(a, b), (k, a[:8], b[:8])
    assert got.stat_objects == want.stat_objects


def _native(data: bytes, start: int = 0) -> tuple[xpe.EventColumns, int] | None:
    d = _xplane_scan.events(data, start, len(data))
    return None if d is None else (xpe._native_columns(d), d["stop"])


def test_the_fixtures_are_there():
    assert len(XPLANES) >= 10, XPLANES


@pytest.mark.parametrize("path", XPLANES, ids=lambda p: "/".join(p.parts[-2:]))
def test_every_line_as_the_python_decoder_reads_it(path, monkeypatch):
    data = path.read_bytes()
    space = xp.scan_space(data)
    n = 0
    for plane in space.planes:
        for i in range(len(plane.line_ranges)):
            monkeypatch.delenv("TRACEROOF_DECODER", raising=False)
            got = plane.line(i)
            monkeypatch.setenv("TRACEROOF_DECODER", "python")
            want = plane.line(i)
            assert (got.name, got.id, got.display_name, got.timestamp_ns, got.duration_ps) == (
                want.name, want.id, want.display_name, want.timestamp_ns, want.duration_ps)
            if want.events is not None:
                _assert_same(got.events, want.events)
                n += len(want.events)
    assert n > 0


@pytest.mark.parametrize("name", ["xprof/xprof/convert/test_xplanes/tpu_inference_2.xplane.pb",
                                  "profiler/demo/plugins/profile/GPU-multi-worker/34.83.195.179_6003.xplane.pb",
                                  "TraceLens/tests/traces/mi300/jax08_attention/tw003.xplane.pb"])
def test_the_tables_read_from_a_file_are_the_same(name, monkeypatch):
    from traceroof.io import read_trace

    monkeypatch.delenv("TRACEROOF_DECODER", raising=False)
    native = read_trace(REAL / name)
    monkeypatch.setenv("TRACEROOF_DECODER", "python")
    python = read_trace(REAL / name)
    assert native.ops.height > 0
    assert native.ops.equals(python.ops, null_equal=True)
    assert native.host.equals(python.host, null_equal=True)
    assert native.meta.warnings == python.meta.warnings


def _event(**fields) -> bytes:
    ev = xpm.XEvent()
    for k, v in fields.items():
        setattr(ev, k, v)
    return ev.SerializeToString()


def _stat(**fields) -> bytes:
    return xpm.XStat(**fields).SerializeToString()


def _len(tag: int, payload: bytes) -> bytes:
    out, n = bytearray([tag]), len(payload)
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out) + payload


def test_protobuf_rules_last_value_and_oneof_order():
    """Fields repeated inside one event (as a merge of two serialised messages writes them):
    the last scalar wins, the oneof member set last wins (offset_ps after num_occurrences: not
    aggregated; num_occurrences after offset_ps: aggregated, offset_ps reads 0)."""
    events = [
        _event(num_occurrences=3) + _event(offset_ps=7, duration_ps=1),
        _event(offset_ps=7) + _event(num_occurrences=4),
        _event(metadata_id=1, duration_ps=5) + _event(metadata_id=2, duration_ps=6),
        _event(num_occurrences=0),  # set to 0: still the oneof's member
        b"",  # an empty event
    ]
    data = b"".join(_len(0x22, e) for e in events)
    got, stop = _native(data)
    assert stop == len(data)
    want = _protobuf_columns(data)
    _assert_same(got, want)
    assert got.aggregated.tolist() == [False, True, False, True, False]
    assert got.offset_ps.tolist() == [7, 0, 0, 0, 0]
    assert got.metadata_id.tolist()[2] == 2 and got.duration_ps.tolist()[2] == 6


def test_every_stat_kind_and_extreme_values():
    stats = [
        _stat(metadata_id=1, int64_value=-1), _stat(metadata_id=2, int64_value=-(1 << 63)),
        _stat(metadata_id=3, uint64_value=(1 << 64) - 1), _stat(metadata_id=4, ref_value=(1 << 64) - 2),
        _stat(metadata_id=5, double_value=-2.5), _stat(metadata_id=6, str_value="héllo ✓"),
        _stat(metadata_id=7, bytes_value=b"\x00\xff\x80"), _stat(metadata_id=8),  # no value
        _stat(metadata_id=9, str_value="x") + _stat(int64_value=5),  # oneof: int64 set last
        _stat(metadata_id=-3, double_value=float("nan")), _stat(str_value=""),
    ]
    ev = _event(metadata_id=-9, offset_ps=-(1 << 62), duration_ps=(1 << 63) - 1)
    data = _len(0x22, ev + b"".join(_len(0x22, s) for s in stats)) + _len(0x22, _event(metadata_id=4))
    got, stop = _native(data)
    assert stop == len(data)
    _assert_same(got, _protobuf_columns(data))
    assert got.stat_kind.tolist() == [4, 4, 3, 7, 2, 5, 6, 0, 4, 2, 5]
    assert got.stat_objects == {5: "héllo ✓", 6: b"\x00\xff\x80", 10: ""}
    assert float(got.stat_value[4:5].view(np.float64)[0]) == -2.5  # the IEEE bits
    assert got.stat_event.tolist() == [0] * 11


def test_the_run_stops_at_the_first_other_field():
    ev = _len(0x22, _event(metadata_id=1, offset_ps=2))
    data = b"\x08\x05" + ev + ev + b"\x12\x03abc" + ev
    got, stop = _native(data, 2)
    assert stop == 2 + 2 * len(ev) and len(got) == 2
    line = xp.scan_line(data, 0, len(data))  # the line: both runs, the name between
    assert line.name == "abc" and line.id == 5 and len(line.events) == 3


@pytest.mark.parametrize("data", [
    _len(0x22, _event(metadata_id=1) + b"\x30\x05"),          # an unknown field (6)
    _len(0x22, b"\x0a\x01x"),                                 # metadata_id with a LEN wire type
    _len(0x22, _len(0x22, b"\x2a\x02\xc3\x28")),              # a str_value that is not UTF-8
    _len(0x22, _len(0x22, b"\x11\x00\x00")),                  # a double cut short
    b"\x22\x05\x08\x01",                                      # an event longer than the bytes
    _len(0x22, b"\x08" + b"\xff" * 10 + b"\x01"),             # a varint of 11 bytes
    _len(0x22, b"\x08" + b"\xff" * 9 + b"\x02"),              # a varint beyond 64 bits
    _len(0x22, b"\x0b\x0c"),                                  # a group (wire types 3, 4)
    # tags and length prefixes longer than upb reads them (5 bytes): protobuf rejects these
    bytes.fromhex("22808080808000"),                          # an event's length in 6 bytes
    bytes.fromhex("2280808080808080808000"),                  # ... in 10 bytes
    bytes.fromhex("220788808080800005"),                      # an XEvent tag in 6 bytes
    bytes.fromhex("2209220788808080800005"),                  # an XStat tag in 6 bytes
    bytes.fromhex("220722808080808000"),                      # a stat's length in 6 bytes
    _len(0x22, b"\x88\x80\x80\x80\x10\x05"),                 # a 5-byte tag above UINT32_MAX
])
def test_what_it_does_not_understand_it_hands_back(data, monkeypatch):
    assert _xplane_scan.events(data, 0, len(data)) is None

    def line():  # the line's decoder: its columns, or the error it raises
        try:
            return xp.scan_line(data, 0, len(data)).events
        except xp.WireError as err:
            return str(err)

    got = line()
    monkeypatch.setenv("TRACEROOF_DECODER", "python")
    want = line()  # as without the C decoder
    if isinstance(want, str):
        assert got == want
    else:
        _assert_same(got, want)


def test_buffers_and_bounds():
    ev = _len(0x22, _event(metadata_id=3, offset_ps=1))
    for buf in (ev, bytearray(ev), memoryview(ev)):
        got, stop = _native(bytes(buf))
        assert _xplane_scan.events(buf, 0, len(ev))["n"] == 1 and stop == len(ev)
    assert _xplane_scan.events(ev, 1, 1)["n"] == 0  # an empty range: no event
    for start, end in ((-1, 2), (0, len(ev) + 1), (3, 2)):
        with pytest.raises(ValueError):
            _xplane_scan.events(ev, start, end)


def _event_runs() -> list[bytes]:
    """The first run of events of every line of three real files (bytes of that run only)."""
    runs = []
    for name in ("xprof/xprof/convert/test_xplanes/tpu_inference_2.xplane.pb",
                 "profiler/demo/plugins/profile/GPU-multi-worker/34.83.195.179_6003.xplane.pb",
                 "TraceLens/tests/traces/mi300/jax08_gemm/tw003.xplane.pb"):
        data = (REAL / name).read_bytes()
        for plane in xp.scan_space(data).planes:
            for s, e in plane.line_ranges:
                line, i = data[s:e], data[s:e].find(b"\x22")
                while i >= 0:
                    d = _xplane_scan.events(line, i, len(line))
                    if d is not None and d["n"]:
                        runs.append(line[i:d["stop"]])
                        break
                    i = line.find(b"\x22", i + 1)
    return runs


def test_mutated_runs_agree_with_protobuf():
    """2,000 seeded mutations (bytes replaced, cut, inserted, high bits flipped) of real event
    runs: whenever the C decoder returns columns, protobuf parses those bytes without error to
    the same columns. (20,000 of them found none that differs, nor one that protobuf rejects.)"""
    rng = random.Random(19)
    runs = _event_runs()
    assert len(runs) > 50
    taken = 0
    for _ in range(2000):
        src = rng.choice(runs)
        a = rng.randrange(len(src))
        buf = bytearray(src[max(0, a - rng.randrange(2, 600)): a + rng.randrange(2, 600)])
        for _ in range(rng.randrange(0, 4)):
            if not buf:
                break
            k, op = rng.randrange(len(buf)), rng.random()
            if op < 0.5:
                buf[k] = rng.randrange(256)
            elif op < 0.7:
                del buf[k:k + rng.randrange(1, 8)]
            elif op < 0.9:
                buf[k:k] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 6)))
            else:
                buf[k] ^= 0x80
        j = buf.find(b"\x22")
        if j < 0:
            continue
        data = bytes(buf[j:])
        got = _native(data)
        if got is None:
            continue
        taken += 1
        _assert_same(got[0], _protobuf_columns(data[:got[1]]))
    assert taken > 200, taken
