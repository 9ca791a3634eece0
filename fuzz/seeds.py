"""The seed inputs the mutators start from, loaded once per process.

Kineto: the small real traces of ``../shared/fixtures/real`` (each under 2 MB of JSON) and
one generated with ``fixtures/tracegen.py``. XPlane: the small real ``.xplane.pb`` files, the
generated jax CPU profile and a tiny generated XSpace. Saved reports and caches are written
once per process from the generated trace. A missing real fixture is an error (never a
silently smaller corpus).
"""

from __future__ import annotations

import functools
import gzip
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
REAL = REPO.parent / "shared" / "fixtures" / "real"
FIXTURES = REPO / "fixtures"

#: real Kineto traces small enough to mutate quickly (relative to REAL)
KINETO_REAL = (
    "HolisticTraceAnalysis/tests/data/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "HolisticTraceAnalysis/tests/data/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz",
    "HolisticTraceAnalysis/tests/data/critical_path/cuda_event_sync_multi_stream/event_sync_trace.json.gz",
    "HolisticTraceAnalysis/tests/data/cupti_profiler/benchmark_result_924719_1679055439_trace.json.gz",
    "HolisticTraceAnalysis/tests/data/large_integer_trace/rank-70.Mar_25_20_48_12.2861.pt.trace.json.gz",
    "HolisticTraceAnalysis/tests/data/trace_file_list/inference_rank_1.json.gz",
    "HolisticTraceAnalysis/tests/data/triton_example/triton_example.json.gz",
    "HolisticTraceAnalysis/tests/data/with_gpu_user_annotation/step_based_trace_2543932.json.gz",
    "TraceLens/tests/traces/h100/gaunernst_bert-small-uncased__1016001.json.gz",
    "TraceLens/tests/traces/inference/sglang_decode/sglang_Qwen3-8B_decode.json.gz",
    "TraceLens/tests/traces/inference/vllm_decode_full/graph_execution.json.gz",
    "TraceLens/tests/traces/torch_compile_triton/trace.json.gz",
    "kineto/tb_plugin/test/gpu_metrics_input.json",
)

#: real XSpace files (relative to REAL), the smaller ones
XPLANE_REAL = (
    "TraceLens/tests/traces/mi300/jax08_gemm/tw003.xplane.pb",
    "TraceLens/tests/test_data_jax_te_fused_attn_categorization/934987a2fc2f.xplane.pb",
)


def _real(rel: str) -> Path:
    p = REAL / rel
    if not p.exists():
        raise FileNotFoundError(f"fuzz seed missing: {p} (../shared/fixtures/real must be beside the checkout)")
    return p


def _load_json(p: Path) -> Any:
    data = p.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return json.loads(data)


def generated_kineto() -> dict[str, Any]:
    """A small generated Kineto trace (two steps of a matmul, an add, a copy) as a dict."""
    if str(FIXTURES) not in sys.path:
        sys.path.insert(0, str(FIXTURES))
    from tracegen import Kernel, TraceBuilder

    b = TraceBuilder(rank=0, world_size=2)
    for step in range(2):
        b.begin_step(step)
        b.op("aten::mm", [[64, 128], [128, 256]], ["c10::BFloat16"] * 2,
             [Kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", 9_000)])
        b.op("aten::add", [[64, 256], [64, 256]], ["c10::BFloat16"] * 2,
             [Kernel("void at::native::vectorized_elementwise_kernel<4>", 2_000)])
        b.memcpy("HtoD", 1 << 20, 40_000)
        b.end_step()
    return b.to_json()


@functools.lru_cache(maxsize=None)
def kineto_docs() -> tuple[dict[str, Any], ...]:
    """Every Kineto seed, as a parsed JSON document (real traces first)."""
    return tuple(_load_json(_real(r)) for r in KINETO_REAL) + (generated_kineto(),)


def tiny_xspace() -> bytes:
    """A generated XSpace: one TPU plane (stat and event metadata, plane stats referencing
    stat metadata, one XLA Ops line of 8 events), one GPU plane with a stream line, and a
    host plane."""
    from traceroof.parsers import xplane_proto as xp

    space = xp.XSpace(hostnames=["fuzzhost"])
    plane = space.planes.add(id=1, name="/device:TPU:0")
    for k, name in enumerate(("flops", "bytes_accessed", "hlo_category", "device_type_string",
                              "long_name", "hlo_op", "program_id"), start=1):
        plane.stat_metadata[k].CopyFrom(xp.XStatMetadata(id=k, name=name))
    plane.stats.add(metadata_id=4, str_value="TPU v5 lite")
    md = plane.event_metadata[1]
    md.CopyFrom(xp.XEventMetadata(id=1, name="fusion.1", display_name="fusion.1"))
    md.stats.add(metadata_id=1, uint64_value=2 * 128 * 256 * 64)
    md.stats.add(metadata_id=2, uint64_value=4096)
    md.stats.add(metadata_id=3, str_value="convolution fusion")
    md.stats.add(metadata_id=5, str_value="%fusion.1 = bf16[128,256]{1,0} fusion(bf16[128,64]{1,0} %p)")
    line = plane.lines.add(id=3, name="XLA Ops", timestamp_ns=1000)
    for i in range(8):
        ev = line.events.add(metadata_id=1, offset_ps=i * 10_000, duration_ps=5_000)
        ev.stats.add(metadata_id=7, int64_value=42)
        ev.stats.add(metadata_id=6, ref_value=3)
    steps = plane.lines.add(id=4, name="Steps", timestamp_ns=1000)
    steps.events.add(metadata_id=1, offset_ps=0, duration_ps=80_000)
    gpu = space.planes.add(id=2, name="/device:GPU:0")
    gpu.event_metadata[1].CopyFrom(xp.XEventMetadata(id=1, name="sm90_gemm_kernel"))
    gl = gpu.lines.add(id=7, name="Stream #7", timestamp_ns=100)
    gl.events.add(metadata_id=1, offset_ps=1500, duration_ps=2500)
    host = space.planes.add(id=3, name="/host:CPU")
    host.event_metadata[1].CopyFrom(xp.XEventMetadata(id=1, name="ExecuteOnDevice"))
    hl = host.lines.add(id=1, name="python", timestamp_ns=50)
    hl.events.add(metadata_id=1, offset_ps=0, duration_ps=9_000)
    return space.SerializeToString()


@functools.lru_cache(maxsize=None)
def xplane_seeds() -> tuple[bytes, ...]:
    """Every XSpace seed's bytes (the tiny generated one first)."""
    return (tiny_xspace(), (FIXTURES / "jax_cpu" / "loops.xplane.pb").read_bytes()) + tuple(
        _real(r).read_bytes() for r in XPLANE_REAL)


@functools.lru_cache(maxsize=None)
def workdir() -> Path:
    """A temporary folder for this process's inputs (removed at exit by the runner)."""
    return Path(tempfile.mkdtemp(prefix="traceroof-fuzz-"))


@functools.lru_cache(maxsize=None)
def saved_report() -> dict[str, Any]:
    """A report of the generated trace, saved with its op table, as a JSON document."""
    from traceroof.analysis import analyze
    from traceroof.parsers import kineto

    trace = kineto.read_bytes(json.dumps(generated_kineto()).encode(), path="seed.json")
    f = workdir() / "seed-report.json"
    analyze(trace, "h100").save(f)
    return json.loads(f.read_text())


@functools.lru_cache(maxsize=None)
def cache_dir(layout: int = 1) -> Path:
    """A cache of the generated trace: ``layout`` 1, a single cache (``write_cache``); 2, a
    dataset of two rank files (``ingest_file`` each, then ``finalize``)."""
    from traceroof.ingest import finalize, ingest_file, write_cache
    from traceroof.parsers import kineto

    doc = generated_kineto()
    out = workdir() / f"seed-cache{layout}"
    if layout == 1:
        write_cache(kineto.read_bytes(json.dumps(doc).encode(), path="seed.json"), out)
        return out
    for r in (0, 1):
        f = workdir() / f"rank{r}.json"
        f.write_text(json.dumps({**doc, "distributedInfo": {"rank": r, "world_size": 2}}))
        ingest_file(f, out)
    finalize(out)
    return out
