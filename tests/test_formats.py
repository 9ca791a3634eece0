"""The format registry: every built-in format sniffed from content, the Perfetto rejection,
the unchanged messages for non-traces, and a toy format registered from this file alone."""

from __future__ import annotations

import gzip
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner
from conftest import FIXTURES, REPO, real

import traceroof
from traceroof.cli import cli
from traceroof.errors import TraceFormatError
from traceroof.io import detect_format, read_trace, resolve_inputs
from traceroof.parsers import registry
from traceroof.schema import HOST_SCHEMA, OP_SCHEMA, conform, empty
from traceroof.trace import Trace, TraceMeta

TPU = ("xprof", "xprof", "convert", "test_xplanes", "tpu_inference_2.xplane.pb")
MANGLED = ("xprof", "xprof", "convert", "test_xplanes", "tpu_inference_2.xplane.pb.HEAD-bfd424c-utf8-mangled")
QWEN = ("TraceLens", "tests", "traces", "h100", "Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz")
JAX_CPU = FIXTURES / "jax_cpu" / "train_step.xplane.pb"


# --- the sniff table: each built-in format from its files' content ----------------------------


@pytest.mark.parametrize("parts, fmt", [
    (QWEN, "kineto"),  # .json.gz
    (("kineto", "tb_plugin", "test", "gpu_metrics_input.json"), "kineto"),  # plain .json
    (("HolisticTraceAnalysis", "tests", "data", "large_integer_trace",
      "rank-70.Mar_25_20_48_12.2861.pt.trace.json.gz"), "kineto"),
    (TPU, "xplane"),
    (("TraceLens", "tests", "traces", "mi300", "jax08_gemm", "tw003.xplane.pb"), "xplane"),
    (("profiler", "demo", "plugins", "profile", "GPU-multi-worker", "34.83.195.179_6003.xplane.pb"), "xplane"),
    (MANGLED, "xplane"),  # no xplane suffix, damaged: still routed to the XSpace reader
    (("param", "et_replay", "tests", "inputs", "dlrm_kineto.tar.gz"), "tar"),
], ids=lambda x: x if isinstance(x, str) else x[-1])
def test_real_files_are_sniffed(parts, fmt):
    assert detect_format(real(*parts)) == fmt


def test_sniff_reads_content_not_the_name(tmp_path):
    """Each format is found with a name that says nothing (or says something else)."""
    cases = {
        "kineto": (real(*QWEN), "trace.bin"),
        "xplane": (JAX_CPU, "x.pb"),
        "tar": (real("param", "et_replay", "tests", "inputs", "dlrm_kineto.tar.gz"), "archive"),
    }
    for fmt, (src, name) in cases.items():
        dst = tmp_path / name
        shutil.copyfile(src, dst)
        assert detect_format(dst) == fmt, name
    # a gzip of an XSpace with no suffix: its structure inside the gzip stream
    gz = tmp_path / "blob"
    gz.write_bytes(gzip.compress(JAX_CPU.read_bytes()))
    assert detect_format(gz) == "xplane"
    # XSpace structure outranks a Kineto name
    wrong = tmp_path / "trace.json"
    shutil.copyfile(JAX_CPU, wrong)
    assert detect_format(wrong) == "xplane"


def test_xspace_sniffed_by_structure():
    data = real(*TPU).read_bytes()
    head = registry.Head(Path("x"), data[:4096], False, data[:4096], len(data))
    assert registry.get("xplane").sniff(head) == registry.CONTENT
    assert registry.get("perfetto").sniff(head) == 0
    # the first byte alone (0x0a) is only a hint: a damaged XSpace is read to say where it breaks
    bad = real(*MANGLED).read_bytes()[:4096]
    head = registry.Head(Path("x"), bad, False, bad, 1365940)
    assert registry.get("xplane").sniff(head) == registry.HINT


def test_real_xplane_without_suffix_is_read(tmp_path):
    dst = tmp_path / "x.pb"
    shutil.copyfile(real(*TPU), dst)
    t = read_trace(dst)
    direct = read_trace(real(*TPU))
    assert t.meta.format == "xplane"
    assert t.ops.height == direct.ops.height > 0
    assert t.ops.drop("host").equals(direct.ops.drop("host"))


def test_directories_one_input_or_a_folder_of_files(tmp_path):
    from traceroof.ingest import write_cache

    assert registry.unit_format(FIXTURES / "jax_cpu").name == "xplane"  # a jax profile dir
    cache = write_cache(read_trace(FIXTURES / "example_h100_decoder.json.gz"), tmp_path / "c")
    assert registry.unit_format(cache).name == "cache"
    assert resolve_inputs(cache) == [str(cache)]
    run = tmp_path / "run"
    run.mkdir()
    for r in (1, 0):
        shutil.copyfile(FIXTURES / "example_h100_decoder.json.gz", run / f"rank-{r}.json.gz")
    shutil.copytree(cache, run / "cache")  # a cache inside the folder is not a trace of it
    assert registry.unit_format(run) is None
    assert resolve_inputs(run) == [str(run / "rank-0.json.gz"), str(run / "rank-1.json.gz")]
    (tmp_path / "none").mkdir()
    with pytest.raises(FileNotFoundError, match=r"directory holds no \*\.json, \*\.json\.gz or \*\.xplane\.pb trace"):
        resolve_inputs(tmp_path / "none")


# --- Perfetto: recognised, rejected with one line ---------------------------------------------


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(num: int, wire: int, payload: bytes | int) -> bytes:
    tag = _varint(num << 3 | wire)
    if wire == 0:
        return tag + _varint(int(payload))
    return tag + _varint(len(payload)) + payload


def perfetto_trace() -> bytes:
    """A Perfetto ``Trace`` of two TracePackets, by hand (trace_packet.proto / track_event.proto):
    timestamp=8, trusted_packet_sequence_id=10, track_event=11 {type=9 (SLICE_BEGIN/END), name=23}."""
    packets = b""
    for ts, kind in ((1000, 1), (2500, 2)):
        event = _field(9, 0, kind) + _field(23, 2, b"aten::mm")
        packet = _field(8, 0, ts) + _field(10, 0, 1) + _field(11, 2, event)
        packets += _field(1, 2, packet)
    return packets


def test_perfetto_trace_is_rejected(tmp_path):
    p = tmp_path / "trace.pftrace"
    p.write_bytes(perfetto_trace())
    assert p.read_bytes()[:1] == b"\x0a"  # the byte that once made it an XSpace
    assert detect_format(p) == "perfetto"
    with pytest.raises(TraceFormatError) as ei:
        read_trace(p)
    assert str(ei.value) == (
        f"{p}: byte 0: a Perfetto protobuf trace (.pftrace): not supported; traceroof reads Kineto "
        "JSON (torch.profiler export_chrome_trace) and XSpace (*.xplane.pb, jax/TensorFlow) traces")
    res = CliRunner().invoke(cli, ["analyze", str(p)])
    assert res.exit_code == 4
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert lines == [f"traceroof: error: {ei.value}"]
    # the same named like an XSpace, or gzipped: still Perfetto
    named = tmp_path / "x.xplane.pb"
    named.write_bytes(perfetto_trace())
    assert detect_format(named) == "perfetto"
    gz = tmp_path / "trace.pftrace.gz"
    gz.write_bytes(gzip.compress(perfetto_trace()))
    assert detect_format(gz) == "perfetto"


# --- what is no trace keeps its message ---------------------------------------------------------


def test_not_a_trace_messages_are_unchanged(tmp_path):
    empty_file = tmp_path / "e.json"
    empty_file.write_bytes(b"")
    with pytest.raises(TraceFormatError) as ei:
        detect_format(empty_file)
    assert str(ei.value) == f"{empty_file}: byte 0: a trace, found an empty file"
    zipped = tmp_path / "t.zip"
    zipped.write_bytes(b"PK\x03\x04\x14\x00\x00\x00\x08\x00" + b"\x00" * 40)
    with pytest.raises(TraceFormatError) as ei:
        detect_format(zipped)
    assert str(ei.value) == (f"{zipped}: byte 0: not a trace: expected a Kineto JSON trace (.json/.json.gz), an XSpace "
                             "(.xplane.pb) or a .tar.gz of traces")
    gz = tmp_path / "t.gz"
    gz.write_bytes(gzip.compress(b"PK\x03\x04 not a trace"))
    with pytest.raises(TraceFormatError) as ei:
        detect_format(gz)
    assert str(ei.value) == f"{gz}: byte 0: not a trace: expected gzip of a Kineto JSON trace or of a tar of traces"
    # an empty file named as an XSpace goes to its reader, which says so
    ex = tmp_path / "empty.xplane.pb"
    ex.write_bytes(b"")
    with pytest.raises(TraceFormatError, match=r"empty\.xplane\.pb: byte 0: empty file"):
        read_trace(ex)


def test_sniffing_imports_no_decoder():
    code = ("import sys; from traceroof.io import detect_format; "
            f"print(detect_format({str(JAX_CPU)!r}), detect_format({str(FIXTURES / 'example_h100_decoder.json.gz')!r}), "
            "[m for m in ('msgspec', 'google.protobuf', 'numpy', 'traceroof.parsers.kineto') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.split() == ["xplane", "kineto", "[]"]


# --- a toy format, from this file alone ----------------------------------------------------------

TOY_HEADER = b"name,start_us,dur_us,flops,bytes"
TOY_CSV = """name,start_us,dur_us,flops,bytes
sm90_xmma_gemm_bf16bf16_bf16f32,0,120,1.0e11,1.0e8
vectorized_elementwise_kernel,130,15,1.0e7,6.0e7
sm90_xmma_gemm_bf16bf16_bf16f32,150,100,1.0e11,1.0e8
ncclDevKernel_AllReduce_Sum_bf16_RING_LL,260,40,,
"""


def toy_sniff(head: registry.Head) -> int:
    return registry.CONTENT if head.data.startswith(TOY_HEADER) else 0


def toy_read(path: Path, progress=None) -> Trace:
    """One kernel per CSV line (``name,start_us,dur_us,flops,bytes``) on device 0, stream 7."""
    df = pl.read_csv(path, schema_overrides={"flops": pl.Float64, "bytes": pl.Float64})
    ops = df.select(
        pl.col("name"),
        (pl.col("start_us") * 1000).cast(pl.Int64).alias("start_ns"),
        (pl.col("dur_us") * 1000).cast(pl.Int64).alias("dur_ns"),
        pl.col("flops"), pl.col("bytes"),
        pl.when(pl.col("flops").is_not_null()).then(pl.lit("trace")).otherwise(pl.lit("unknown")).alias("cost_source"),
        pl.when(pl.col("name").str.contains("gemm")).then(pl.lit("bf16")).alias("dtype"),
        pl.lit(0, pl.Int32).alias("rank"), pl.lit(0, pl.Int32).alias("device"),
        pl.lit(7, pl.Int64).alias("stream"), pl.lit("other").alias("kind"), pl.lit(False).alias("graph"),
    )
    meta = TraceMeta(format="toycsv", sources=[str(path)], ranks=[0])
    return Trace(ops=conform(ops, OP_SCHEMA), host=empty(HOST_SCHEMA), meta=meta)


TOY = registry.InputFormat(
    name="toycsv", read=toy_read, sniff=toy_sniff, folder_suffixes=(".toy.csv",), dir_names=("*.toy.csv",),
    describe="a toy CSV of kernels (.toy.csv)", facts=registry.FormatFacts(default_group_by="kernel"))


@pytest.fixture
def toy_format():
    registry.register(TOY)
    try:
        yield TOY
    finally:
        registry.unregister(TOY.name)


def test_toy_format_read_and_analyzed(tmp_path, toy_format):
    p = tmp_path / "kernels.toy.csv"
    p.write_text(TOY_CSV)
    assert detect_format(p) == "toycsv"
    trace = traceroof.read_trace(p)
    assert trace.meta.format == "toycsv"
    assert trace.ops["dur_ns"].to_list() == [120_000, 15_000, 100_000, 40_000]
    assert registry.facts_for("toycsv").default_group_by == "kernel"
    report = traceroof.analyze(trace, chip="h100")
    assert report.trace.format == "toycsv"
    assert report.trace.device_ops == 4
    assert report.trace.device_time_ns == 275_000
    rows = {r["label"]: r for r in report.ranking.iter_rows(named=True)}
    assert set(rows) == {"sm90_xmma_gemm_bf16bf16_bf16f32", "vectorized_elementwise_kernel",
                         "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"}  # grouped by kernel, as its facts say
    gemm = rows["sm90_xmma_gemm_bf16bf16_bf16f32"]
    assert gemm["count"] == 2 and gemm["measured_ns"] == 220_000 and gemm["kind"] == "matmul"
    assert gemm["flops"] == 2e11
    assert 0 < gemm["expected_ns"] < gemm["measured_ns"]  # 2e11 FLOP at the H100 bf16 roof: ~200 µs
    assert report.ranking["label"][0] == "sm90_xmma_gemm_bf16bf16_bf16f32"  # the largest gap first
    # a folder of toy files expands through the format's folder suffix; the unknown-file message names it
    run = tmp_path / "run"
    run.mkdir()
    (run / "a.toy.csv").write_text(TOY_CSV)
    assert resolve_inputs(run) == [str(run / "a.toy.csv")]
    other = tmp_path / "other.txt"
    other.write_text("hello")
    with pytest.raises(TraceFormatError, match=r"or a toy CSV of kernels \(\.toy\.csv\)$"):
        detect_format(other)


def test_toy_format_is_gone_after_unregister(tmp_path):
    p = tmp_path / "kernels.toy.csv"
    p.write_text(TOY_CSV)
    assert "toycsv" not in [f.name for f in registry.formats()]
    with pytest.raises(TraceFormatError):
        detect_format(p)
    with pytest.raises(ValueError, match="already registered"):
        registry.register(registry.get("kineto"))


def test_builtin_facts_are_declared_by_their_formats():
    assert [f.name for f in registry.formats()][:6] == ["cache", "jax_trace_json", "kineto", "xplane", "perfetto", "tar"]
    kineto, xplane = registry.facts_for("kineto"), registry.facts_for("xplane")
    assert kineto.default_group_by == "op" and not kineto.chip_from_properties
    assert "record_shapes=True" in kineto.shapes_hint
    assert xplane.default_group_by == "kernel" and xplane.chip_from_properties and xplane.shapes_hint is None
    assert registry.facts_for("no-such-format") == registry.FormatFacts()


@pytest.mark.parametrize("module, absent", [
    ("traceroof.merge", ["traceroof.io", "traceroof.cache", "traceroof.parsers"]),
    ("traceroof.parallel", ["traceroof.io", "traceroof.cache", "polars"]),
    ("traceroof.step_markers", ["traceroof.parsers", "traceroof.io"]),
    ("traceroof.cache", ["traceroof.io", "traceroof.ingest", "traceroof.parsers"]),
    ("traceroof.io", ["traceroof.cache", "traceroof.ingest", "traceroof.parsers.kineto",
                      "traceroof.parsers.xplane"]),
    ("traceroof.steps", ["traceroof.parsers"]),
])
def test_the_door_has_no_loop(module, absent):
    """Merge/parallel helpers below io and cache; the cache reader does not import io (nor the
    writer, ingest, above both); io loads no format module until it reads."""
    code = f"import sys, {module}; print([m for m in {absent!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]"
