"""The generated example: FLOPs, MFU by hand from its known shapes and durations; the CI gate."""

from __future__ import annotations

import json

import make_example as mx
import polars as pl
import pytest
from click.testing import CliRunner
from conftest import FIXTURES

from traceroof import analyze, read_trace
from traceroof.cli import cli
from traceroof.gate import check
from traceroof.report import Report

H100_BF16 = 989.4e12  # NVIDIA H100 SXM dense bf16 (datasheet: 1,979 TFLOP/s with sparsity / 2)


@pytest.fixture(scope="module")
def report(example_trace):
    return analyze(read_trace(example_trace), "h100")


def _hand_model_flops() -> float:
    # Blocks only (the example has no embedding): per layer 4·d² (q,k,v,o) + 3·d·d_ff (SwiGLU)
    d, ff, L, T = mx.D, mx.F, mx.LAYERS, mx.B * mx.S
    n_blocks = L * (4 * d * d + 3 * d * ff)
    assert n_blocks == 102_760_448  # 2·(4·2048² + 3·2048·5632)
    linear = 6 * n_blocks * T  # training: 6N per token (forward 2N + backward 4N)
    # causal attention: 4·d_attn FLOPs per unmasked (q,k) pair per layer, S(S+1)/2 pairs per
    # sequence, ×3 for forward + backward (backward = 2.5× forward for flash: ×3.5 in all)
    pairs = mx.S * (mx.S + 1) // 2
    attn_fwd = 4 * mx.H * mx.DH * pairs * mx.B * L
    return float(linear + 3.5 * attn_fwd)


def _hand_step_times_ns() -> list[int]:
    """Device window of each step, from the generator's own kernel timeline (not the parser):
    from the step's first kernel start to the next step's (the last step: to its last
    kernel end), as docs/accounting.md defines a step on a device."""
    tb = mx.TraceBuilder()
    firsts, last_end = [], 0
    for step in range(mx.STEPS):
        n0 = len(tb.kernels)
        tb.begin_step(step)
        for _ in range(mx.LAYERS):
            mx.layer_forward(tb)
        for _ in range(mx.LAYERS):
            mx.layer_backward(tb)
        tb.end_step()
        ks = tb.kernels[n0:]
        firsts.append(min(k["start_ns"] for k in ks))
        last_end = max(k["start_ns"] + k["dur_ns"] for k in ks)
        tb.idle_host(50_000)
    return [b - a for a, b in zip(firsts, firsts[1:] + [last_end])]


def test_matmul_and_attention_flops_equal_the_generator_oracle(report):
    oracle = json.loads((FIXTURES / "example_h100_decoder.oracle.json").read_text())
    step0 = report.ops.filter(pl.col("step") == 0)
    by_kind = dict(step0.group_by(pl.col("kind").cast(pl.String)).agg(pl.col("flops").sum()).iter_rows())
    assert by_kind["matmul"] == oracle["matmul_flops_per_step"]
    assert by_kind["attention"] == pytest.approx(oracle["attention_flops_per_step"], rel=1e-12)
    assert oracle["matmul_flops_per_step"] + oracle["attention_flops_per_step"] == pytest.approx(_hand_model_flops(), rel=1e-12)


def test_mfu_equals_hand_value(example_trace):
    model_flops = _hand_model_flops()
    walls = _hand_step_times_ns()
    hand = model_flops / (sum(walls) / len(walls) * 1e-9) / H100_BF16
    r = analyze(read_trace(example_trace), "h100", model_flops_per_step=model_flops, model_flops_formula="hand")
    assert r.summary.step_time_ns == pytest.approx(sum(walls) / len(walls), abs=0.5)
    assert r.summary.mfu.value == pytest.approx(hand, rel=1e-9)
    assert 0.3 < r.summary.mfu.value < 0.7  # the generator ran GEMMs at 70 % and attention at 40-50 %
    # MFU per step, too
    assert r.steps["mfu"].to_list() == pytest.approx([model_flops / (w * 1e-9) / H100_BF16 for w in walls], rel=1e-9)


def test_mfu_above_100_percent_is_an_inconsistency_not_a_result(example_trace):
    r = analyze(read_trace(example_trace), "h100", model_flops_per_step=_hand_model_flops() * 3)
    assert r.summary.mfu.value is None
    inc = [i for i in r.inconsistencies if "MFU" in i.what]
    assert inc and inc[0].value > 1.0 and any("peak" in s for s in inc[0].suspects)
    out = CliRunner().invoke(cli, ["analyze", str(example_trace), "-q", "--model-flops-per-step", str(_hand_model_flops() * 3)]).output
    assert "Inconsistencies" in out and "MFU" in out


def test_sparse_peak_is_never_used_bc29(report):
    # BC-29: dense 989 TFLOP/s, not the 1,979 "with sparsity" headline
    assert report.summary.hfu.peak_flops_per_s == H100_BF16
    assert report.summary.hfu.peak_dtype == "bf16"


# ----------------------------------------------------------------------------- gate
@pytest.fixture()
def pair(tmp_path, example_trace):
    """A baseline report and a slower candidate (every kernel 20 % longer, same work)."""
    base = tmp_path / "base.json"
    CliRunner().invoke(cli, ["analyze", str(example_trace), "-o", str(base), "-q"])
    slow_trace = mx.main(str(tmp_path / "slow.json.gz"), slowdown=1.2)
    slow = tmp_path / "slow_report.json"
    CliRunner().invoke(cli, ["analyze", str(slow_trace), "-o", str(slow), "-q"])
    return base, slow


def test_gate_pass_and_fail_on_a_baseline_and_a_slower_candidate(pair):
    base, slow = pair
    ok = CliRunner().invoke(cli, ["gate", str(base), "--baseline", str(base), "--max-drop", "0.01", "--max-step-time-increase", "0.05"])
    assert ok.exit_code == 0, ok.output
    assert "passed" in ok.output
    bad = CliRunner().invoke(cli, ["gate", str(slow), "--baseline", str(base), "--max-drop", "0.02", "--max-step-time-increase", "0.05"])
    assert bad.exit_code == 1
    assert "FAILED" in bad.output and "step time vs baseline" in bad.output and "**FAIL**" in bad.output
    b, s = Report.load(base), Report.load(slow)
    res = check(s, baseline=b, max_drop=0.02, max_step_time_increase=0.05)
    st = [c for c in res.checks if c.metric == "step time vs baseline"][0]
    assert not st.passed and st.value > st.limit
    hfu = [c for c in res.checks if c.metric == "HFU vs baseline"][0]
    # kernels 20 % longer → HFU about 1/1.2 of the baseline's
    assert hfu.value == pytest.approx(b.summary.hfu.value / 1.2, rel=0.02)


def test_gate_writes_github_step_summary(pair, tmp_path, monkeypatch):
    base, slow = pair
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    res = CliRunner().invoke(cli, ["gate", str(slow), "--min-hfu", "0.99"])
    assert res.exit_code == 1
    text = summary.read_text()
    assert text.startswith("earlier step\n") and "traceroof gate" in text and "| HFU |" in text


def test_gate_json_and_usage_errors(pair):
    base, _ = pair
    res = CliRunner().invoke(cli, ["gate", str(base), "--min-hfu", "0.1", "--format", "json"])
    d = json.loads(res.stdout)
    assert d["passed"] is True and d["checks"][0]["metric"] == "HFU"
    res = CliRunner().invoke(cli, ["gate", str(base)])
    assert res.exit_code == 2 and "nothing to check" in res.output
    res = CliRunner().invoke(cli, ["gate", str(base), "--max-drop", "0.1"])
    assert res.exit_code == 2
    res = CliRunner().invoke(cli, ["gate", str(base), "--min-mfu", "0.3"])
    assert res.exit_code == 1 and "unknown" in res.output  # no model FLOPs → MFU unknown fails


def test_gate_names_why_a_metric_is_unknown(tmp_path):
    # Falconsai's one step is partial: no step time or HFU (accounting rule 5); the gate's
    # failure says so instead of a bare "unknown"
    from conftest import real

    from traceroof.analysis import load_report
    from traceroof.gate import check

    r = load_report(real("TraceLens", "tests", "traces", "h100", "Falconsai_nsfw_image_detection__1016002.json.gz"),
                    jobs=1)
    assert r.summary.step.complete_steps == 0
    res = check(r, min_hfu=0.01)
    (c,) = res.checks
    assert not c.passed and "no complete step" in c.detail and "rule 5" in c.detail


def test_mfu_above_hfu_is_warned_and_below_it_is_not():
    trace = read_trace(FIXTURES / "example_h100_decoder.json.gz")
    base = analyze(trace, "h100")
    hfu, flops = base.summary.hfu.value, base.summary.step.flops_per_step
    assert 0 < hfu < 0.6 and base.coverage.costed_share == 1.0  # so 1.5 × HFU stays below 100 %
    # model FLOPs 1.5× what the op table counted: MFU = 1.5 × HFU, a config that does not fit
    over = analyze(trace, "h100", model_flops_per_step=1.5 * flops)
    assert abs(over.summary.mfu.value - 1.5 * hfu) < 1e-9
    (w,) = [x for x in over.warnings if x.startswith("MFU (")]
    assert w.startswith(f"MFU ({1.5 * hfu:.1%}) is above HFU ({hfu:.1%})") and "are unknown for" not in w
    under = analyze(trace, "h100", model_flops_per_step=0.5 * flops)
    assert not [x for x in under.warnings if x.startswith("MFU (")]
