"""Every real Kineto trace in ../shared/fixtures/real: a report or one clear error line."""

from __future__ import annotations

import gzip
import json
import tarfile
from decimal import Decimal

import polars as pl
import pytest
from click.testing import CliRunner
from conftest import REAL, real

from traceroof.cli import cli
from traceroof.io import read_trace

KINETO = sorted(
    str(p.relative_to(REAL))
    for p in REAL.rglob("*")
    if p.is_file() and p.name.endswith((".json", ".json.gz", ".tar.gz")) and "integration_tests" not in str(p)
)

#: traces whose device cannot be identified from the trace itself: exit 5 with a clear line
NEEDS_CHIP = {
    "HolisticTraceAnalysis/tests/data/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz": "AMD Radeon Graphics",
    "HolisticTraceAnalysis/tests/data/large_integer_trace/rank-70.Mar_25_20_48_12.2861.pt.trace.json.gz": "names no device",
    "HolisticTraceAnalysis/tests/data/mtia_inference_trace/mtia_inference_rank_0.json.gz": "ARTEMIS",
    "HolisticTraceAnalysis/tests/data/trace_file_list/inference_rank_1.json.gz": "names no device",
    "HolisticTraceAnalysis/tests/data/trace_filter/sampled_rank-0.json.gz": "names no device",
    "HolisticTraceAnalysis/tests/data/trace_filter/sampled_rank-1.json.gz": "names no device",
    "HolisticTraceAnalysis/tests/data/with_gpu_user_annotation/step_based_trace_2543932.json.gz": "Quadro GP100",
    "TraceLens/tests/traces/inference/vllm_decode_full/graph_execution.json.gz": "no name",
    "kineto/tb_plugin/samples/resnet50_num_workers_0/worker0.pt.trace.json.gz": "names no device",
}

CPU_ONLY = {
    "HolisticTraceAnalysis/tests/data/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
    "HolisticTraceAnalysis/tests/data/cupti_profiler/benchmark_result_924719_1679055439_trace.json.gz",
    "HolisticTraceAnalysis/tests/data/distributed_info_unavailable/distributed_info_not_found.json.gz",
}


def test_fixture_corpus_is_present():
    assert len(KINETO) == 29, KINETO  # 28 Kineto files + the dlrm tar.gz


@pytest.mark.parametrize("rel", KINETO)
def test_every_real_kineto_trace_gives_a_report_or_one_clear_error(rel):
    path = str(real(rel))
    res = CliRunner().invoke(cli, ["analyze", path, "--top", "5", "-q"])
    err = res.stderr if hasattr(res, "stderr") else res.output
    assert "Traceback" not in res.output + (err or "")
    if rel in NEEDS_CHIP:
        assert res.exit_code == 5, res.output
        lines = [x for x in (err or res.output).splitlines() if x.strip()]
        assert len(lines) == 1 and lines[0].startswith("traceroof: error:")
        assert NEEDS_CHIP[rel] in lines[0] and "--chip" in lines[0]
        return
    assert res.exit_code == 0, (res.output, err)
    if rel in CPU_ONLY:
        assert "no device ops" in res.output
    else:
        assert "Top " in res.output and "chip" in res.output


def test_needs_chip_trace_works_with_chip():
    res = CliRunner().invoke(cli, ["analyze", str(real("TraceLens/tests/traces/inference/vllm_decode_full/graph_execution.json.gz")),
                                   "--chip", "mi300x", "--format", "json", "-q"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["chip"]["key"] == "mi300x" and d["chip"]["reason"] == "--chip mi300x"


def _raw_stream_totals(events: list[dict]) -> dict[tuple[int, int], int]:
    """Independent oracle: per (device, stream) kernel time in ns, with Decimal arithmetic."""
    out: dict[tuple[int, int], int] = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "Kernel"):
            a = e.get("args", {})
            key = (int(a.get("device", e.get("pid"))), int(a.get("stream", str(e.get("tid")).split()[-1])))
            out[key] = out.get(key, 0) + int(Decimal(str(e["dur"])) * 1000)
    return out


@pytest.mark.parametrize(
    "rel",
    [
        "TraceLens/tests/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
        "TraceLens/tests/traces/b200/eager_trace.json.gz",
        "HolisticTraceAnalysis/tests/data/nccl_parser_config/nccl_data.json.gz",
        "HolisticTraceAnalysis/tests/data/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
        "kineto/tb_plugin/samples/resnet50_num_workers_0/worker0.pt.trace.json.gz",
    ],
)
def test_per_stream_kernel_time_equals_raw_json_sum_exactly(rel):
    p = real(rel)
    raw = json.loads(gzip.decompress(p.read_bytes()), parse_float=Decimal)
    want = _raw_stream_totals(raw["traceEvents"])
    t = read_trace(p)
    got_df = (
        t.ops.filter(~pl.col("kind").cast(pl.String).is_in(["memcpy", "memset"]))
        .group_by("device", "stream")
        .agg(pl.col("dur_ns").sum())
    )
    got = {(d, s): int(v) for d, s, v in got_df.iter_rows()}
    assert got == want
    assert sum(want.values()) > 0


def test_dlrm_tar_has_eight_ranks_each_with_nccl_collectives():
    p = real("param/et_replay/tests/inputs/dlrm_kineto.tar.gz")
    t = read_trace(p, jobs=1)
    assert t.meta.ranks == list(range(8))
    per_rank = t.ops.filter(pl.col("kind").cast(pl.String) == "collective").group_by("rank").len().sort("rank")
    # MANIFEST: 5 SendRecv + 3 AllReduce NCCL kernels per rank
    assert per_rank["len"].to_list() == [8] * 8
    # each member parses alone to the same rows as inside the merged trace
    with tarfile.open(p) as tf:
        m = sorted((m for m in tf.getmembers() if m.name.endswith(".json")), key=lambda m: m.name)[3]
        data = tf.extractfile(m).read()
    from traceroof.parsers import kineto

    alone = kineto.read_bytes(data, path="w3")
    r = alone.meta.ranks[0]
    assert alone.ops.height == t.ops.filter(pl.col("rank") == r).height


def test_cpu_only_trace_says_no_device_ops():
    t = read_trace(real("HolisticTraceAnalysis/tests/data/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"))
    assert t.ops.height == 0 and t.host.height > 1000
    assert t.meta.ranks == [34] and t.meta.world_size == 300
    assert any("CPU-only" in w for w in t.meta.warnings)


def test_legacy_pytorch_18_trace_links_kernels_through_lowercase_external_id():
    t = read_trace(real("kineto/tb_plugin/samples/resnet50_num_workers_0/worker0.pt.trace.json.gz"))
    k = t.ops.filter(pl.col("kind").cast(pl.String) != "memcpy")
    assert k["op"].is_not_null().sum() > 0.9 * k.height
    assert set(k["stream"].unique().to_list()) >= {7}
    # PyTorch 1.8 wrote ProfilerStep#5..#10 as Operator events (MANIFEST: 6 ProfilerSteps)
    assert sorted(x for x in t.ops["step"].unique().to_list() if x is not None) == list(range(5, 11))


@pytest.mark.parametrize(
    "rel",
    [
        "TraceLens/tests/traces/h100/gaunernst_bert-small-uncased__1016001.json.gz",
        "TraceLens/tests/traces/h100/Falconsai_nsfw_image_detection__1016002.json.gz",
        "TraceLens/tests/traces/mi300/ddp_resnet18_no_pool/train_resnet18.json.gz",
        "TraceLens/tests/traces/perf_model/normalization/normalization_layer_test.json.gz",
    ],
)
def test_cost_coverage_from_shapes_at_least_90_percent(rel):
    from traceroof import analyze

    r = analyze(read_trace(real(rel)))
    # share of all device time whose FLOPs and bytes come from the op's recorded shapes
    assert r.coverage.shapes_share >= 0.90, r.coverage


def test_qwen_linked_kernels_costed_and_unlinked_share_reported():
    from traceroof import analyze

    t = read_trace(real("TraceLens/tests/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"))
    r = analyze(t)
    assert r.coverage.linked_costed_share >= 0.95
    # the rest of its kernels have no launch in the window: 509 device ops, reported
    assert t.meta.stats["unlinked_device_ops"] == 509
    assert any("509 device ops" in w and "no host launch" in w for w in r.warnings)
