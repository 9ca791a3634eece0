"""Streaming Kineto ingest (``kineto.read`` / ``read_fileobj``) equals the in-memory path
(``kineto.read_bytes``) on every real trace and on damaged input, in bounded memory."""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest
from conftest import REAL, REPO, kineto, real, write
from test_kineto_cases import _thousand, kernel

from traceroof.errors import TraceFormatError
from traceroof.parsers import kineto as K
from traceroof.parsers.kineto_decode import decode
from traceroof.parsers.kineto_stream import decode_stream

#: every real Kineto trace (the tar's members are compared one by one)
REAL_KINETO = sorted(
    str(p.relative_to(REAL))
    for p in REAL.rglob("*")
    if p.is_file() and p.name.endswith((".json", ".json.gz", ".tar.gz")) and "integration_tests" not in str(p)
)


def assert_same(streamed, in_memory) -> None:
    """Both traces hold the same op and host tables (values and dtypes) and meta."""
    for name in ("ops", "host"):
        a, b = getattr(streamed, name), getattr(in_memory, name)
        assert a.schema == b.schema, name
        assert a.height == b.height, name
        assert a.equals(b), name
    assert dataclasses.asdict(streamed.meta) == dataclasses.asdict(in_memory.meta)


def read_stream(data: bytes, path: str, block: int):
    return K.read_fileobj(io.BytesIO(data), path=path, block_bytes=block)


def test_real_fixture_corpus_is_present():
    # a missing ../shared makes this FAIL (never skip): real() raises on a missing file
    real("kineto", "tb_plugin", "test", "gpu_metrics_input.json")
    assert len(REAL_KINETO) == 29, REAL_KINETO


def _fine_block(size: int) -> int:
    """A block that cuts a file of ``size`` (uncompressed) bytes into at least ~256 pieces
    (4 KiB at least): many cuts per file without thousands of tiny tables per file."""
    return max(4 << 10, size // 256)


@pytest.mark.parametrize("rel", REAL_KINETO)
@pytest.mark.parametrize("block", [64 << 10, "fine"])
def test_streaming_equals_in_memory_on_every_real_trace(rel, block):
    p = real(rel)
    if block == "fine":
        raw = p.read_bytes()
        block = _fine_block(len(gzip.decompress(raw)) if raw[:2] == b"\x1f\x8b" and not rel.endswith(".tar.gz")
                            else len(raw) * 8)
    if rel.endswith(".tar.gz"):
        with tarfile.open(p) as tf:
            members = [m for m in tf.getmembers() if m.isfile() and m.name.endswith((".json", ".json.gz"))]
            assert members
            for m in members:
                data = tf.extractfile(m).read()
                want = K.read_bytes(data, path=m.name)
                got = K.read_fileobj(tf.extractfile(m), path=m.name, block_bytes=block)
                assert_same(got, want)
        return
    want = K.read_bytes(p.read_bytes(), path=str(p))
    assert_same(K.read_fileobj(p.open("rb"), path=str(p), block_bytes=block), want)
    if block == 64 << 10:
        assert_same(K.read(p), want)  # the public entry point, default block size


def test_every_real_trace_was_decoded_in_many_pieces():
    # the comparison above only means something if the small blocks really cut the array
    p = real("TraceLens/tests/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz")
    sizes: list[int] = []
    decode_stream(p.open("rb"), lambda ev: sizes.append(len(ev)), path=str(p), block_bytes=4 << 10)
    assert len(sizes) > 100
    whole: list[int] = []
    decode(gzip.decompress(p.read_bytes()), lambda ev: whole.append(len(ev)))
    assert sum(sizes) == sum(whole)


# --------------------------------------------------------------------------- layouts
def _tail_doc(n: int = 300, indent: int | None = None) -> bytes:
    evs = [kernel(f"k{i}", ts=i * 10, dur=5, corr=i) for i in range(n)]
    doc = {
        "schemaVersion": 1,
        "traceEvents": evs,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "numSms": 132},
                             {"id": 1, "name": "NVIDIA H100 80GB HBM3", "numSms": 132}],
        "distributedInfo": {"rank": 3, "world_size": 8, "backend": "nccl"},
        "traceName": "x",
    }
    return json.dumps(doc, indent=indent).encode()


@pytest.mark.parametrize("indent", [None, 2])
@pytest.mark.parametrize("block", [1 << 10, 8 << 10, 1 << 20])
def test_tail_header_with_arrays_of_objects_after_the_events(indent, block):
    data = _tail_doc(indent=indent)
    mem: list = []
    want = decode(data, mem.extend)
    got_events: list = []
    got = decode_stream(io.BytesIO(data), got_events.extend, block_bytes=block)
    assert got.stats.strict and want.stats.strict
    assert got.header == want.header
    assert [d["numSms"] for d in got.header.deviceProperties] == [132, 132]
    assert got.header.traceName == "x" and got.header.distributedInfo["rank"] == 3
    assert got_events == mem and len(mem) == 300
    t = read_stream(data, "tail.json", block)
    assert_same(t, K.read_bytes(data, path="tail.json"))
    assert len(t.meta.devices) == 2 and t.meta.ranks == [3] and t.meta.world_size == 8


def test_empty_event_array_and_header_keys_on_both_sides():
    data = b'{"schemaVersion": 1, "traceEvents": [ ], "deviceProperties": [{"id": 0}, {"id": 1}]}'
    want = decode(data, lambda ev: None)
    got = decode_stream(io.BytesIO(data), lambda ev: None)
    assert got.header == want.header and got.stats == want.stats
    assert len(got.header.deviceProperties) == 2


def test_boundary_text_inside_a_string_is_not_a_cut():
    # a name holding "}, {" at every possible cut: the strict pieces extend past it
    evs = [kernel("a}, {b" * 5 + str(i), ts=i, dur=1) for i in range(400)]
    data = kineto(evs)
    for block in (1 << 10, 3 << 10):
        assert_same(read_stream(data, "s.json", block), K.read_bytes(data, path="s.json"))
    t = read_stream(data, "s.json", 1 << 10)
    assert t.ops.height == 400 and "not valid JSON" not in " ".join(t.meta.warnings)


def test_progress_reports_compressed_bytes_and_events(tmp_path):
    data = _tail_doc(3000)
    p = write(tmp_path, "t.json.gz", gzip.compress(data))
    calls: list[tuple[int, int]] = []
    with p.open("rb") as fh:
        K.read_fileobj(fh, path=str(p), progress=lambda b, e: calls.append((b, e)), block_bytes=16 << 10)
    assert len(calls) > 5
    assert [c[0] for c in calls] == sorted(c[0] for c in calls)
    assert calls[-1][0] == p.stat().st_size  # compressed bytes: the whole file was read
    assert calls[-1][1] == 3000
    assert max(b for b, _ in calls) < len(data)


# --------------------------------------------------------------------------- damage
def _bc01() -> bytes:
    good = json.dumps(kernel("gemm", ts=10, dur=5))
    bad_quote = '{"ph": "X", "cat": "python_function", "name": "{"device": "cpu", "dtype": "float32"}(12): run", "pid": 1, "tid": 1, "ts": 1, "dur": 2}'
    bad_bslash = '{"ph": "X", "cat": "python_function", "name": "C:\\Users\\u\\a.py(3): f", "pid": 1, "tid": 1, "ts": 3, "dur": 2}'
    many = [json.dumps(kernel(f"k{i}", ts=100 + i, dur=1)) for i in range(500)]
    return ('{"schemaVersion": 1, "traceEvents": [' + ",".join(many[:250] + [good, bad_quote, bad_bslash] + many[250:]) + "]}").encode()


def _bc02() -> bytes:
    k = [json.dumps(kernel(f"k{i}", ts=i, dur=5)).encode() for i in range(600)]
    op = b'{"ph": "X", "cat": "cpu_op", "name": "aten::a\x01b", "pid": 1, "tid": 1, "ts": 1, "dur": 2, "args": {"External id": 3}}'
    py = b'{"ph": "X", "cat": "python_function", "name": "cfg\xffx.py(0): <module>", "pid": 1, "tid": 1, "ts": 2, "dur": 1}'
    return b'{"traceEvents": [' + b",".join(k[:300] + [op, py] + k[300:]) + b"]}"


@pytest.mark.parametrize("make", [_bc01, _bc02])
@pytest.mark.parametrize("block", [1 << 10, 4 << 10, 1 << 20])
def test_damaged_events_are_recovered_as_in_memory(make, block):
    data = make()
    want = K.read_bytes(data, path="bad.json")
    got = read_stream(data, "bad.json", block)
    assert_same(got, want)
    assert got.meta.stats["malformed_events"] >= 2 or got.meta.stats["encoding_repairs"] == 2
    assert any("not valid JSON" in w for w in got.meta.warnings)
    if block < len(data) // 4:  # damage in a middle piece: strict decoding went on after it
        assert got.meta.stats["events"] == want.meta.stats["events"]


def test_damage_in_the_last_piece_before_a_tail_header():
    data = _tail_doc(200).replace(b'"k199"', b'"k\xff1"99"')
    want = K.read_bytes(data, path="t.json")
    for block in (1 << 10, 1 << 20):
        got = read_stream(data, "t.json", block)
        assert_same(got, want)
    assert got.meta.ranks == [3] and len(got.meta.devices) == 2  # the tail was still found
    assert got.meta.stats["repaired_events"] == 1 and got.ops.height == 200


def test_big_file_with_invalid_utf8_matches_the_in_memory_case():
    evs = [kernel(f"k{i}", ts=i * 10, dur=5) for i in range(20_000)]
    data = kineto(evs).replace(b'"k7500"', b'"k\xff7500"')
    want = K.read_bytes(data, path="big.json")
    got = read_stream(data, "big.json", 64 << 10)
    assert_same(got, want)
    assert got.meta.stats["encoding_repairs"] == 1 and got.ops.height == 20_000


def test_cut_at_every_byte_of_the_last_200():
    data = kineto([kernel(f"k{i}", ts=i * 10, dur=5) for i in range(60)], distributedInfo={"rank": 2})
    seen_truncated = seen_clean = 0
    for cut in range(len(data) - 200, len(data) + 1):
        piece = data[:cut]
        want = K.read_bytes(piece, path="cut.json")
        for block in (1 << 10, 1 << 20):
            got = read_stream(piece, "cut.json", block)
            assert_same(got, want), cut
        truncated = any("truncated at byte" in w for w in want.meta.warnings)
        seen_truncated += truncated
        seen_clean += not want.meta.warnings or cut == len(data)
    assert seen_truncated > 100 and seen_clean >= 1  # the loop covered both outcomes


def test_bc35_cut_mid_name_streaming_keeps_complete_events():
    data = _thousand()
    i998 = data.index(b'"name": "k997"')
    cut = data[: i998 + len(b'"name": "k9')]
    t = read_stream(cut, "cut.json", 4 << 10)
    assert t.ops.height == 997
    assert any(f"truncated at byte {len(cut)}" in w for w in t.meta.warnings)
    assert_same(t, K.read_bytes(cut, path="cut.json"))


@pytest.mark.parametrize("frac", [0.3, 0.75])
def test_gzip_cut_mid_stream(tmp_path, frac):
    gz = gzip.compress(_thousand())
    cut = gz[: int(len(gz) * frac)]
    p = write(tmp_path, "cut.json.gz", cut)
    want = K.read_bytes(cut, path=str(p))
    got = K.read(p)
    assert_same(got, want)
    assert 0 < got.ops.height < 1000
    assert any("truncated" in w for w in got.meta.warnings)


def test_gzip_cut_in_its_trailer_keeps_everything(tmp_path):
    gz = gzip.compress(_thousand())
    p = write(tmp_path, "cut.json.gz", gz[:-4])  # the size field of the trailer is gone
    got = K.read(p)
    assert_same(got, K.read_bytes(p.read_bytes(), path=str(p)))
    assert got.ops.height == 1000


def test_multi_member_gzip(tmp_path):
    data = _thousand()
    half = len(data) // 2
    p = write(tmp_path, "m.json.gz", gzip.compress(data[:half]) + gzip.compress(data[half:]))
    assert_same(K.read(p), K.read_bytes(p.read_bytes(), path=str(p)))
    assert K.read(p).ops.height == 1000


@pytest.mark.parametrize(
    "data, where",
    [(b"", "empty file"), (b"   \n", "empty file"), (b"hello world", "JSON object"), (b"[1, 2, 3]", "JSON object"),
     (b'{"foo": 1}', "traceEvents"), (b'{"traceEvents": {"a": 1}}', "traceEvents"),
     (b"\x1f\x8b\x08\x00garbage", "gzip")],
)
def test_not_a_trace_is_the_same_error(tmp_path, data, where):
    p = write(tmp_path, "bad.json", data)
    with pytest.raises(TraceFormatError) as streamed:
        K.read(p)
    with pytest.raises(TraceFormatError) as in_memory:
        K.read_bytes(data, path=str(p))
    assert str(streamed.value) == str(in_memory.value)
    assert where in str(streamed.value) and str(streamed.value).startswith(f"{p}: byte 0")


def test_header_prefix_that_is_not_json_recovers_as_in_memory():
    evs = ",".join(json.dumps(kernel(f"k{i}", ts=i, dur=1)) for i in range(50))
    data = ('{"schemaVersion": 1, "oops": [1, 2,, "traceEvents": [' + evs + "]}").encode()
    want = K.read_bytes(data, path="p.json")
    assert_same(read_stream(data, "p.json", 1 << 10), want)
    assert want.ops.height == 50 and any("not valid JSON" in w for w in want.meta.warnings)


def test_pytorch_18_lowercase_input_dims_is_read():
    evs = [{"ph": "X", "cat": "Operator", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 4,
            "args": {"Input dims": [[2, 3], [3, 4]], "external id": 5}},
           {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 5, "dur": 4,
            "args": {"Input Dims": [[1, 2], [2, 1]], "Input dims": [[9]], "External id": 6}}]
    t = K.read_bytes(kineto(evs), path="v18.json")
    dims = dict(zip(t.host["external_id"].to_list(), t.host["input_dims"].to_list()))
    assert json.loads(dims[5]) == [[2, 3], [3, 4]]
    assert json.loads(dims[6]) == [[1, 2], [2, 1]]  # the modern key wins when both are there


# --------------------------------------------------------------------------- memory
_RSS_SCRIPT = textwrap.dedent(
    """
    import os, resource, sys
    import polars, traceroof.io
    from traceroof.parsers import kineto as K
    def hwm():
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    path, how, small = sys.argv[1], sys.argv[2], sys.argv[3]
    # the modules and thread pools a first read loads lazily: not the file's cost (the native
    # scanner forced: a small file alone would be read by msgspec, kineto.NATIVE_MIN_BYTES)
    os.environ["TRACEROOF_DECODER"] = "native"
    K.read(small)
    del os.environ["TRACEROOF_DECODER"]
    base = hwm()
    if how == "stream":
        t = K.read(path)
    else:
        with open(path, "rb") as fh:
            t = K.read_bytes(fh.read(), path=path)
    print(hwm() - base, t.ops.height, t.host.height)
    """
)


def _big_trace(path: Path, target_bytes: int) -> int:
    """A trace of repeated events (mostly host events the builder drops or keeps compactly:
    python frames, flows, memory instants, a few runtime calls and kernels); returns the
    number of kernels written."""
    block = []
    for i in range(40):
        block.append({"ph": "X", "cat": "python_function", "name": f"model.py({i}): forward", "pid": 1, "tid": 1,
                      "ts": "TS", "dur": 1.5, "args": {"Python parent id": i, "Python id": i + 1}})
        block.append({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1, "tid": 1,
                      "ts": "TS", "args": {"Total Reserved": 1 << 30, "Bytes": 4096, "Device Id": 0}})
    block.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": "TS",
                  "dur": 3.0, "args": {"correlation": "CORR", "External id": 1}})
    block.append({"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": "TS", "dur": 5.0,
                  "args": {"correlation": "CORR", "device": 0, "stream": 7}})
    template = ",\n".join(json.dumps(e, indent=1) for e in block)
    kernels = 0
    with path.open("w") as f:
        f.write('{"schemaVersion": 1, "traceEvents": [\n')
        written = 0
        n = 0
        while written < target_bytes:
            text = template.replace('"TS"', str(1000 + n * 100)).replace('"CORR"', str(n))
            f.write(("" if n == 0 else ",\n") + text)
            written += len(text) + 2
            n += 1
            kernels += 1
        f.write('\n], "traceName": "big"}\n')
    return kernels


def test_streaming_peak_memory_is_well_below_the_file_size(tmp_path):
    p = tmp_path / "big.json"
    kernels = _big_trace(p, 56 << 20)
    size = p.stat().st_size
    small = tmp_path / "small.json"
    _big_trace(small, 64 << 10)
    script = write(tmp_path, "rss.py", _RSS_SCRIPT)

    def growth(how: str) -> int:
        out = subprocess.run([sys.executable, str(script), str(p), how, str(small)], capture_output=True, text=True,
                             cwd=REPO, check=True).stdout.split()
        assert int(out[1]) == kernels  # every kernel was read
        return int(out[0])

    streamed = growth("stream")
    assert streamed < 0.5 * size, (streamed, size)
    # the in-memory path holds the whole file: the same measurement fails the bound there
    assert growth("bytes") > 1.0 * size
