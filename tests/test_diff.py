"""``traceroof diff A B`` (traceroof.diff, docs/diff.md): both waterfalls add up to the step-time
change, on a generated pair whose change is known by construction and on HTA's trace_diff
control → test pair (the Must-show); the CLI's formats and exit codes; gate --baseline prints
the diff's top lines when it fails."""

from __future__ import annotations

import gzip
import json

import polars as pl
import pytest
from click.testing import CliRunner
from conftest import REAL
from tracegen import Kernel, TraceBuilder

from traceroof import read_trace
from traceroof.analysis import analyze, load_report
from traceroof.cli import cli
from traceroof.diff import compare, terms_sum_ns
from traceroof.errors import UsageError

BF16 = ["c10::BFloat16", "c10::BFloat16"]
HTA = REAL / "HolisticTraceAnalysis" / "tests" / "data" / "trace_diff"
CONTROL, TEST = HTA / "control" / "control.json.gz", HTA / "test" / "test.json.gz"


def _trace(path, mm_ns, extra=None):
    tb = TraceBuilder(queue_ns=0)
    for n in range(3):
        tb.begin_step(n)
        tb.op("aten::mm", [[2048, 2048], [2048, 2048]], BF16, [Kernel("sm90_gemm_bf16", mm_ns)])
        tb.op("aten::add", [[2048, 2048], [2048, 2048]], BF16, [Kernel("vectorized_elementwise_add", 50_000)])
        if extra:
            tb.op("aten::mul", [[2048, 2048], [2048, 2048]], BF16, [Kernel("vectorized_elementwise_mul", extra)])
        tb.end_step(sync=True)
    return tb.write(path)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("diff")
    a = analyze(read_trace(_trace(d / "a.json.gz", 300_000)), "h100")
    b = analyze(read_trace(_trace(d / "b.json.gz", 200_000, extra=30_000)), "h100")
    return a, b, d


def _mean_wall(r):
    return r.steps.filter(~pl.col("partial"))["wall_ns"].mean()


def test_generated_pair_adds_up_and_names_the_change(pair):
    a, b, _ = pair
    d = compare(a, b)
    # the step time change, independently: the steps tables' mean walls
    assert d.delta_ns == pytest.approx(_mean_wall(b) - _mean_wall(a), abs=1e-6)
    assert terms_sum_ns(d.by_op) == pytest.approx(d.delta_ns, abs=1e-6)
    assert terms_sum_ns(d.by_cause) == pytest.approx(d.delta_ns, abs=1e-6)
    ops = {o.label: o for o in d.ops}
    # by construction: each step's mm kernel 300 µs → 200 µs, a 30 µs mul appeared, add unchanged
    assert ops["aten::mm"].delta_ns == -100_000 and ops["aten::mm"].status == "changed"
    assert ops["aten::mul"].status == "appeared" and ops["aten::mul"].delta_ns == 30_000
    assert ops["aten::add"].delta_ns == 0
    # the mm's roofline time did not change (same shapes): its change is all gap
    assert ops["aten::mm"].expected_a_ns == ops["aten::mm"].expected_b_ns
    assert ops["aten::mm"].gap_b_ns - ops["aten::mm"].gap_a_ns == -100_000
    # 2·2048³ FLOPs per mm, one per step
    assert ops["aten::mm"].flops_a == ops["aten::mm"].flops_b == 2 * 2048**3
    assert d.changed == []


def test_hta_trace_diff_must_show():
    a, b = load_report(CONTROL, "a100", jobs=1), load_report(TEST, "a100", jobs=1)
    d = compare(a, b, name_a="control", name_b="test")
    assert d.delta_ns == pytest.approx(_mean_wall(b) - _mean_wall(a), abs=1e-3)  # 77.4 → 124.2 ms
    assert d.delta_ns > 40e6
    assert terms_sum_ns(d.by_op) == pytest.approx(d.delta_ns, abs=1e-3)
    assert terms_sum_ns(d.by_cause) == pytest.approx(d.delta_ns, abs=1e-3)
    # the change it names: torch.compile's CompiledFunction ops appeared, aten::bmm went away.
    # Oracle: the raw JSON's cpu_op events of those names in each file
    def count(path, name):
        ev = json.loads(gzip.open(path).read())["traceEvents"]
        return sum(1 for e in ev if e.get("cat") == "cpu_op" and e.get("name") == name)

    ops = {o.label: o for o in d.ops}
    assert count(CONTROL, "CompiledFunctionBackward") == 0 < count(TEST, "CompiledFunctionBackward")
    assert ops["CompiledFunctionBackward"].status == "appeared"
    assert count(CONTROL, "aten::bmm") > 0 == count(TEST, "aten::bmm")
    assert ops["aten::bmm"].status == "went away"
    top = [t.term for t in d.by_op[:3]]
    assert "CompiledFunctionBackward" in top and "CompiledFunction" in top
    assert any(f.status == "went away" and f.kind == "device_idle" for f in d.findings)
    assert "devices: NVIDIA A100-PG509-200 → Tesla V100-SXM2-16GB" in d.changed


def _run(*args):
    return CliRunner().invoke(cli, list(args))


def test_cli_formats_and_exit_codes(pair, tmp_path):
    a, b, d = pair
    pa, pb = str(d / "a.json.gz"), str(d / "b.json.gz")
    res = _run("diff", pa, pb, "--chip", "h100", "--format", "json", "-q")
    assert res.exit_code == 0, res.output
    j = json.loads(res.stdout)
    assert sum(t["delta_ns"] for t in j["by_op"]) == pytest.approx(j["delta_ns"], abs=1e-6)
    md = _run("diff", pa, pb, "--chip", "h100", "--format", "markdown", "-q").output
    assert md.startswith("### traceroof diff") and "| aten::mm | changed |" in md
    assert "aten::mul" in _run("diff", pa, pb, "--chip", "h100", "-q").output
    # B is faster (the mm lost 100 µs, a 30 µs mul appeared): B → A is the slower direction
    slow = _run("diff", pb, pa, "--chip", "h100", "--max-step-time-increase", "0.01", "-q")
    assert slow.exit_code == 1 and "step time +" in slow.output
    assert _run("diff", pa, pb, "--chip", "h100", "--max-step-time-increase", "0.01", "-q").exit_code == 0
    missing = _run("diff", pa, str(tmp_path / "nope.json.gz"), "--chip", "h100", "-q")
    assert missing.exit_code == 3 and "Traceback" not in missing.output and "nope.json.gz" in missing.output


def test_saved_report_without_ops_is_refused(pair, tmp_path):
    a, b, _ = pair
    bare = tmp_path / "bare.json"
    a.save(bare, include_ops=False)
    with pytest.raises(UsageError, match="op table"):
        compare(load_report(bare), b)
    res = _run("diff", str(bare), str(bare), "-q")
    assert res.exit_code == 2 and "op table" in res.output
    # a chip given with a saved report would be ignored: refused
    res = _run("diff", str(bare), str(bare), "--chip", "h100", "-q")
    assert res.exit_code == 2 and "--chip needs a trace" in res.output


def test_gate_baseline_failure_prints_the_diff(pair, tmp_path):
    a, b, _ = pair
    a.save(tmp_path / "a.json")
    b.save(tmp_path / "b.json")
    # b is faster: as the baseline, a (slower) fails the step-time check
    res = _run("gate", str(tmp_path / "a.json"), "--baseline", str(tmp_path / "b.json"), "--max-step-time-increase",
               "0.01", "-q")
    assert res.exit_code == 1
    assert "What changed against the baseline" in res.output and "aten::mm: +100 µs" in res.output
    ok = _run("gate", str(tmp_path / "b.json"), "--baseline", str(tmp_path / "a.json"), "--max-step-time-increase",
              "0.01", "-q")
    assert ok.exit_code == 0 and "What changed" not in ok.output
