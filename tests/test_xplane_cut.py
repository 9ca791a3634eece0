"""Cut ``.xplane.pb`` files keep what precedes the cut (issue 19 item 6; Standards: "a damaged
trace keeps what can be read and says what was lost"). docs/xplane.md, "Cut files".

The oracle of each cut is computed from the message layout built here, apart from the
reader: a line's events are serialized last (XLine field 4 after 1-3), so the line holding
the first ``k`` events is a prefix of the whole line, and event ``k`` ends
``len(line with k + 1 events)`` bytes into the line.
"""

from __future__ import annotations

import gzip
import os
import subprocess
import sys

import pytest
from conftest import FIXTURES, REPO, real

from traceroof.errors import TraceFormatError
from traceroof.parsers import xplane
from traceroof.parsers import xplane_proto as xp

N_OPS = 40
TPU = ("xprof", "xprof", "convert", "test_xplanes", "tpu_inference_2.xplane.pb")


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _line(k: int) -> xp.XLine:
    line = xp.XLine(id=3, name="XLA Ops", timestamp_ns=1000)
    for i in range(k):
        line.events.add(metadata_id=1, offset_ps=i * 10_000, duration_ps=5_000)
    return line


def _space() -> tuple[bytes, int, int]:
    """An XSpace of one TPU plane whose metadata precedes its one line of :data:`N_OPS`
    events (protobuf reads a message's fields in any order), and the offset of that line's
    content in the file."""
    meta = xp.XPlane(id=1, name="/device:TPU:0")
    meta.stat_metadata[1].CopyFrom(xp.XStatMetadata(id=1, name="device_type_string"))
    meta.stats.add(metadata_id=1, str_value="TPU v5 lite")
    meta.event_metadata[1].CopyFrom(xp.XEventMetadata(id=1, name="%fusion.1 = bf16[8]{0} fusion()",
                                                      display_name="fusion.1"))
    line = _line(N_OPS).SerializeToString()
    line_field = b"\x1a" + _varint(len(line))  # XPlane field 3 (lines), length-delimited
    content = meta.SerializeToString() + line_field + line
    head = b"\x0a" + _varint(len(content))  # XSpace field 1 (planes)
    return head + content, len(head) + len(content) - len(line), len(head)


def test_the_layout_reads_whole():
    data, _, _ = _space()
    assert xplane.read_bytes(data).ops.height == N_OPS


@pytest.mark.parametrize("k", [0, 1, 7, N_OPS - 1])
@pytest.mark.parametrize("into", [0, 1, 5])  # bytes into event k (0: just after event k - 1)
def test_cut_inside_a_line_keeps_the_events_before_it(k, into):
    data, line_at, plane_at = _space()
    event_end = [line_at + len(_line(j).SerializeToString()) for j in range(N_OPS + 1)]
    cut = event_end[k] + into  # the file ends `into` bytes past the end of the k-th event
    if into == 0 and k == 0:
        cut += 1  # (exactly at the line's header end: one byte into the first event)
    expected = sum(1 for e in event_end[1:] if e <= cut)  # events complete before the cut
    if expected == 0:  # no line and no event complete: nothing usable, one line (exit 4)
        with pytest.raises(TraceFormatError, match=rf"^cut\.xplane\.pb: byte {cut}: an XSpace with a complete line "
                                                   r"of events, found a file that ends inside plane '/device:TPU:0'"):
            xplane.read_bytes(data[:cut], "cut.xplane.pb")
        return
    trace = xplane.read_bytes(data[:cut], "cut.xplane.pb")
    assert trace.ops.height == expected
    assert trace.ops["name"].unique().to_list() == (["fusion.1"] if expected else [])
    (w,) = [w for w in trace.meta.warnings if "trace is truncated" in w]
    assert w.startswith(f"cut.xplane.pb: trace is truncated at byte {cut:,}: the file ends inside plane "
                        f"'/device:TPU:0' at byte 0, which declares {len(data) - plane_at:,} bytes from byte {plane_at}")
    assert "the complete events of the line the cut is in" in w


def test_cut_plane_after_complete_ones_and_the_first_plane_named():
    data = real(*TPU).read_bytes()
    fields = list(xp.iter_fields(memoryview(data), 0, len(data)))
    planes = [(tag, value) for num, _wt, value, tag, _end in fields if num == 1]
    whole = xplane.read_bytes(data)
    # cut 17 bytes into the 2nd plane (its id, 2 bytes, and name, 2 + 13 bytes "/device:TPU:1",
    # complete; read by hand from the file): the 1st plane whole, the 2nd only named
    tag, (start, end) = planes[1]
    t = xplane.read_bytes(data[: start + 17])
    first = xplane.read_bytes(data[:tag])  # the file cut just before the 2nd plane
    assert t.ops.equals(first.ops) and 0 < t.ops.height < whole.ops.height
    assert f"<bytes>: trace is truncated at byte {start + 17:,}: the file ends inside plane '/device:TPU:1' at " \
           f"byte {tag:,}, which declares {end - start:,} bytes from byte {start:,}: kept its 0 complete line(s), " \
           "0 event and 0 stat metadata entries; lost the rest of the plane and every plane after it" in t.meta.warnings


@pytest.mark.parametrize("cut", [1, 2, 3])
def test_cut_before_anything_complete_is_one_line(cut, tmp_path):
    data, _, _ = _space()
    p = tmp_path / "t.xplane.pb"
    p.write_bytes(data[:cut])
    with pytest.raises(TraceFormatError, match=rf"t\.xplane\.pb: byte {cut}: an XSpace with a complete plane, "
                                               r"found a file that ends inside its first plane \(at byte 0"):
        xplane.read(p)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-m", "traceroof.cli", "analyze", str(p)], capture_output=True,
                       env=env, cwd=REPO, timeout=120)
    assert r.returncode == 4 and len(r.stderr.decode().splitlines()) == 1


def test_cut_gzip_reads_what_inflates():
    data = (FIXTURES / "jax_cpu" / "train_step.xplane.pb").read_bytes()
    whole = xplane.read_bytes(data)
    gz = gzip.compress(data)
    t = xplane.read_bytes(gz[:-4])  # the trailer's ISIZE lost: every byte of the XSpace inflates
    assert t.ops.equals(whole.ops)
    assert any("the gzip stream is cut or corrupt" in w for w in t.meta.warnings)
    with pytest.raises(TraceFormatError, match="a gzip stream that decompresses"):
        xplane.read_bytes(gz[:8])


def _first_usable_byte(data: bytes) -> int:
    """The end of the first complete event (or of the first line, when it has none) in file
    order, read from the wire format: a cut before it keeps no line and no event."""
    for num, _wt, (s, e), _t, _end in xp.iter_fields(memoryview(data), 0, len(data)):
        if num != 1:
            continue
        for n, _w, (ls, le), _lt, _le in xp.iter_fields(memoryview(data), s, e):
            if n == 3:  # XPlane.lines
                events = [end for m, *_, end in xp.iter_fields(memoryview(data), ls, le) if m == 4]  # XLine.events
                return events[0] if events else le
    raise AssertionError("no line in the file")


@pytest.mark.parametrize("source", ["loops", "gemm"])
def test_cuts_across_the_file_are_read_and_keep_more_the_later_they_fall(source):
    # every third 64th of the sweep of docs/xplane.md ("Bad and damaged input"; the sweep
    # itself: fuzz/cut_xplane.py), on a generated and a real file:
    # a cut before the first complete event (or line) is one error (nothing usable); every
    # later one is read; a later cut keeps at least the ops of an earlier one; each says
    # where the file ends
    path = FIXTURES / "jax_cpu" / "loops.xplane.pb" if source == "loops" else real(
        "TraceLens", "tests", "traces", "mi300", "jax08_gemm", "tw003.xplane.pb")
    data = path.read_bytes()
    usable = _first_usable_byte(data)
    whole = xplane.read_bytes(data).ops.height
    heights = []
    for k in range(1, 64, 3):
        cut = len(data) * k // 64
        if cut < usable:
            with pytest.raises(TraceFormatError, match="before any plane's first line is complete"):
                xplane.read_bytes(data[:cut], "cut.xplane.pb")
            continue
        t = xplane.read_bytes(data[:cut], "cut.xplane.pb")
        assert any(w.startswith(f"cut.xplane.pb: trace is truncated at byte {cut:,}: ") for w in t.meta.warnings)
        heights.append(t.ops.height)
    assert heights and heights == sorted(heights) and heights[-1] <= whole
