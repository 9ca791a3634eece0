"""Matching ops across frameworks and chips by what they compute (traceroof.op_match,
docs/diff.md): a generated pair whose op names and fusion boundaries differ, and the H100
TraceLens traces against the same traces on another chip (the MI300X roofline)."""

from __future__ import annotations

import pytest
from conftest import FIXTURES, REAL
from tracegen import Kernel, TraceBuilder

from traceroof import read_trace
from traceroof.analysis import analyze, load_report
from traceroof.diff import compare
from traceroof.op_match import match
from traceroof.render.diff import render as render_diff

BF16 = ["c10::BFloat16", "c10::BFloat16"]
H100 = sorted((REAL / "TraceLens" / "tests" / "traces" / "h100").glob("*.json.gz"))


def _pair(tmp_path):
    """A: aten::linear x[1024, 512] · W[2048, 512]ᵀ, then mul and add on [1024, 2048] (two
    kernels). B: the same matmul as aten::mm x[1024, 512] · W[512, 2048], and one fused
    elementwise kernel over [2048, 2048] (another framework's fusion boundary)."""
    out = []
    for side in ("a", "b"):
        tb = TraceBuilder(queue_ns=0)
        for n in range(2):
            tb.begin_step(n)
            if side == "a":
                tb.op("aten::linear", [[1024, 512], [2048, 512]], BF16, [Kernel("sm90_gemm_bf16", 50_000)])
                tb.op("aten::mul", [[1024, 2048], [1024, 2048]], BF16, [Kernel("vectorized_elementwise_mul", 20_000)])
                tb.op("aten::add", [[1024, 2048], [1024, 2048]], BF16, [Kernel("vectorized_elementwise_add", 20_000)])
            else:
                tb.op("aten::mm", [[1024, 512], [512, 2048]], BF16, [Kernel("sm90_gemm_bf16", 40_000)])
                tb.op("aten::add", [[2048, 2048], [2048, 2048]], BF16, [Kernel("fused_mul_add", 25_000)])
            tb.end_step(sync=True)
        out.append(analyze(read_trace(tb.write(tmp_path / f"{side}.json.gz")), "h100"))
    return out


def test_names_and_fusions_differ_the_work_matches(tmp_path):
    a, b = _pair(tmp_path)
    m = match(a, b)
    mm = [r for r in m.signatures if r.kind == "matmul"]
    # one signature: 2·1024·2048·512 = 2 147 483 648 FLOPs, under two names
    assert len(mm) == 1 and mm[0].flops_per_op == 2 * 1024 * 2048 * 512
    assert (mm[0].labels_a, mm[0].labels_b, mm[0].matched) == (["aten::linear"], ["aten::mm"], 1.0)
    assert (mm[0].measured_a_ns, mm[0].measured_b_ns) == (50_000, 40_000)
    # elementwise: A's 2 × 1024·2048 FLOPs against B's 2048·2048 ·1: 4 194 304 each, as a group
    (g,) = m.groups
    assert g.kind == "elementwise" and g.matched and g.flops_a == g.flops_b == 2 * 1024 * 2048
    assert m.coverage_a == m.coverage_b == 1.0
    # the name-based diff sees different ops; the text shows both
    d = compare(a, b)
    assert {o.status for o in d.ops if o.label in ("aten::linear", "aten::mm")} == {"appeared", "went away"}
    text = render_diff(d, "markdown")
    assert "| aten::linear | aten::mm |" in text and "matched as a group" in text


def test_no_cost_no_match(tmp_path):
    a, b = _pair(tmp_path)
    m = match(a, a)
    assert m.coverage_a == 1.0 and m.uncosted_a_ns == 0
    assert all(r.matched == r.count_a == r.count_b for r in m.signatures)


@pytest.mark.parametrize("path", H100, ids=lambda p: p.name[:30])
def test_h100_traces_on_another_chip(path):
    a, b = load_report(path, "h100", jobs=1), load_report(path, "mi300x", jobs=1)
    m = match(a, b)
    # the FLOPs, independently: the op table's costed FLOPs in the step bucket, per device-step
    ops = a.ops.filter(a.ops["bucket"] == "step")
    n = ops.select("rank", "step", "device").unique().height
    assert m.flops_a == pytest.approx(float(ops["flops"].sum()) / n, rel=1e-9)
    assert m.coverage_a >= 0.95 and m.coverage_b >= 0.95
    assert m.matched_flops_b == pytest.approx(m.matched_flops_a, rel=0.01)
    # same kernels, another roof: the matmuls' share of roof differs by the bf16 peaks' ratio
    # at most (MI300X dense bf16 1307.4 TFLOP/s vs H100 989.4: a compute-bound op's roof time
    # shrinks by 989.4 / 1307.4)
    big = max((r for r in m.signatures if r.kind == "matmul"), key=lambda r: r.measured_a_ns)
    assert big.measured_a_ns == big.measured_b_ns
    assert big.expected_b_ns < big.expected_a_ns


def test_diff_without_a_complete_step_still_compares_the_ops():
    # bert-small's one ProfilerStep is cut off (partial): no step time, no waterfall, but the
    # ops of that step compared; the same trace on the MI300X roofline: nothing moved
    path = next(p for p in H100 if p.name.startswith("gaunernst_bert-small"))
    a, b = load_report(path, "h100", jobs=1), load_report(path, "mi300x", jobs=1)
    assert a.speed_of_light is None and a.steps["partial"].all()
    d = compare(a, b)
    assert d.delta_ns is None and d.by_op == [] and d.by_cause == [] and not d.a.complete
    assert all(o.delta_ns == 0 and o.status == "changed" for o in d.ops)
    # the op count per step, independently: the op table's step-bucket ops
    assert sum(o.count_a for o in d.ops) == a.ops.filter(a.ops["bucket"] == "step").height
    assert "chip: NVIDIA H100 SXM5 80GB → AMD Instinct MI300X" in d.changed
    text = render_diff(d, "table")
    assert "no step-time change: no complete step in A and B" in text


def test_pytorch_twin_of_the_jax_model(tmp_path):
    """fixtures/torch_twin.py (the jax_cpu model's aten ops, generated from its definition)
    against the real jax CPU profile of it: XLA names (dot.24, ynn_fusion.53) and aten names,
    XLA's own per-op FLOPs and bytes against the Kineto formulas."""
    import torch_twin

    a = load_report(FIXTURES / "jax_cpu" / "train_step.xplane.pb", FIXTURES / "jax_cpu" / "cpu_chip.toml", jobs=1)
    b = load_report(torch_twin.write(tmp_path / "twin.json.gz"), "h100", jobs=1)
    m = match(a, b)
    mm = [r for r in m.signatures if r.kind == "matmul"]
    # per step, by hand: per layer forward qkv 2·64·64·192 = 1 572 864, Q·Kᵀ and P·V 2·8·32·32·16
    # = 262 144 each, wo 2·64·64·64 = 524 288, w1 and w2 2·64·64·256 = 2 097 152 each: 6 815 744;
    # backward twice that; 2 layers: 3 · 2 · 6 815 744 = 40 894 464 FLOPs, on both sides
    assert sum(r.flops_per_op * r.count_a for r in mm) == pytest.approx(40_894_464)
    assert sum(r.flops_per_op * r.count_b for r in mm) == pytest.approx(40_894_464)
    assert all(r.count_a == r.count_b == r.matched for r in mm)  # every matmul matched one to one
    assert {lab.split(".")[0] for r in mm for lab in r.labels_a} <= {"dot", "dot_general", "ynn_fusion"}
    assert {lab for r in mm for lab in r.labels_b} == {"aten::mm", "aten::bmm"}
    assert m.coverage_b >= 0.95
    # XLA's elementwise fusions count more FLOPs than the aten formulas of the ops they fuse
    # (2.05 vs 0.41 MFLOP per step left over): not matched, and listed; that is A's shortfall
    ew = next(g for g in m.groups if g.kind == "elementwise")
    assert not ew.matched and ew.flops_a > ew.flops_b
    assert m.coverage_a == pytest.approx(m.matched_flops_a / m.flops_a)
    assert m.flops_a - m.matched_flops_a == pytest.approx(sum(g.flops_a for g in m.groups if not g.matched))
