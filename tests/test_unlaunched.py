"""Kernels with no launch in the trace (queued before the host recording began) are lent the
ops of the identical kernel sequence the trace links (``traceroof.unlaunched``)."""

from __future__ import annotations

import gzip
import json

import polars as pl
from conftest import real
from tracegen import Kernel, TraceBuilder

from traceroof import analyze, read_trace

BF = ["c10::BFloat16", "c10::BFloat16"]


def _iteration(b: TraceBuilder) -> None:
    # FLOPs by hand: mm 2·64·128·256 = 4,194,304; add 64·256 = 16,384; mm 2·64·256·128 = 4,194,304;
    # relu 64·128 = 8,192: 8,413,184 per iteration
    b.op("aten::mm", [[64, 128], [128, 256]], BF, [Kernel("sm90_gemm_a", 20_000)])
    b.op("aten::add", [[64, 256], [64, 256]], BF, [Kernel("vectorized_add", 3_000)])
    b.op("aten::mm", [[64, 256], [256, 128]], BF, [Kernel("sm90_gemm_b", 18_000)])
    b.op("aten::relu", [[64, 128]], ["c10::BFloat16"], [Kernel("vectorized_relu", 2_000)])


def _trace(tmp_path, tail_kernels: int = 4):
    """Two iterations; the first one's host side (ops and launches) cut out, as when the
    profiler opened while the device still ran it. ``tail_kernels``: how many of its kernels
    are kept (the last ones)."""
    b = TraceBuilder()
    _iteration(b)
    b.begin_step(1)
    _iteration(b)
    b.end_step()
    doc = b.to_json()
    first = {k["ext"] for k in b.kernels[:4]}
    # iteration 0's kernels in order; the first 4 - tail_kernels are not in the file at all
    gone = {k["ext"] for k in b.kernels[:4 - tail_kernels]}
    evs = []
    for e in doc["traceEvents"]:
        a = e.get("args") or {}
        if e.get("cat") in ("cpu_op", "cuda_runtime") and a.get("External id") in first:
            continue  # the host side of iteration 0 is not in the file
        if e.get("cat") == "kernel" and a.get("External id") in first:
            if a["External id"] in gone:
                continue
            a.pop("External id")
        evs.append(e)
    doc["traceEvents"] = evs
    p = tmp_path / "unlaunched.json"
    p.write_text(json.dumps(doc))
    return p


def test_unlaunched_iteration_costs_what_its_linked_twin_costs(tmp_path):
    r = analyze(read_trace(_trace(tmp_path)), "h100")
    u = r.coverage.unlaunched
    assert (u.kernels, u.kernels_matched, u.method) == (4, 4, "eager_match")
    ops = r.ops
    before = ops.filter(pl.col("step").is_null() & (pl.col("external_id") < 0))
    assert before.height == 4
    assert before["flops"].sum() == 8_413_184  # the hand count above, the same as the linked iteration's
    assert ops.filter(pl.col("step") == 1)["flops"].sum() == 8_413_184
    assert r.coverage.costed_share == 1.0
    assert u.attributed_ns == u.device_time_ns == (20 + 3 + 18 + 2) * 1000
    assert any("were given the framework ops and shapes of the identical kernel sequence" in w for w in r.warnings)
    # the parser's warning ("... they have no framework op or shapes") is replaced, its count kept
    assert not any("no matching correlation" in w for w in r.warnings)
    assert any(w.startswith("4 device ops (") and "have no host launch" in w for w in r.warnings)


def test_a_run_too_short_to_match_stays_unknown(tmp_path):
    # only the last 3 kernels of iteration 0 were recorded: below graph_match.MIN_RUN (4)
    r = analyze(read_trace(_trace(tmp_path, tail_kernels=3)), "h100")
    u = r.coverage.unlaunched
    assert (u.kernels, u.kernels_matched, u.method) == (3, 0, "unattributed")
    fams = {(f["kind"], f["why"]): f["device_time_ns"] for f in r.coverage.uncosted_families}
    why = "no launch in the trace, so no framework op"
    assert fams == {("elementwise", why): (3 + 2) * 1000, ("matmul", why): 18 * 1000}
    assert any("have no host launch in the trace window (no matching correlation)" in w for w in r.warnings)


def test_qwen_h100_kernels_queued_before_the_recording_are_matched():
    path = real("TraceLens/tests/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz")
    doc = json.load(gzip.open(path))
    corr = {e["args"]["correlation"] for e in doc["traceEvents"] if e.get("cat") in ("cuda_runtime", "cuda_driver")}
    # the oracle from the raw JSON: kernels whose correlation has no runtime or driver call
    no_launch = [e for e in doc["traceEvents"] if e.get("cat") == "kernel" and e["args"]["correlation"] not in corr]
    assert len(no_launch) == 436
    r = analyze(read_trace(path), "h100")
    u = r.coverage.unlaunched
    assert u.kernels == 436 and u.device_time_ns == round(sum(e["dur"] for e in no_launch) * 1000)
    assert u.kernels_matched == 436
    assert r.coverage.costed_share > 0.99  # 70.0 % before the eager match
