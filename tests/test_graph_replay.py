"""Graph replays get ops, shapes and costs (traceroof.graph_replay; issue 14 item 1).

The generated traces (fixtures/make_graph_replay.py) run three bf16 ops, eagerly, captured
or replayed; by hand:

* aten::mm [64,128]×[128,256]: 2·64·128·256 = 4,194,304 FLOPs (one GEMM kernel);
* aten::add [64,256]+[64,256], alpha 1: 64·256 = 16,384 FLOPs;
* aten::mm [64,256]×[256,128]: 2·64·256·128 = 4,194,304 FLOPs (GEMM + split-K reduction).

One pass of the three: 4,194,304 + 16,384 + 4,194,304 = 8,404,992 FLOPs. Eager kernels last
20 + 3 + 18 + 2 = 43 µs, replayed ones 15 + 2 + 14 + 1 = 32 µs (make_graph_replay.EAGER_NS,
REPLAY_NS).
"""

from __future__ import annotations

import json

import polars as pl
import pytest
from click.testing import CliRunner
from conftest import FIXTURES, load_json, real
from make_graph_replay import ADD, GEMM1, GEMM2, SPLITK, three_ops
from tracegen import Kernel, TraceBuilder

from traceroof import read_trace
from traceroof.analysis import analyze
from traceroof.cli import cli
from traceroof.graph_replay import ADVICE
from traceroof.report_schema import validate_report

GR = FIXTURES / "graph_replay"
MM1_FLOPS = 2 * 64 * 128 * 256  # 4,194,304
ADD_FLOPS = 64 * 256  # 16,384
MM2_FLOPS = 2 * 64 * 256 * 128  # 4,194,304
PASS_FLOPS = MM1_FLOPS + ADD_FLOPS + MM2_FLOPS  # 8,404,992
EAGER_NS = 20_000 + 3_000 + 18_000 + 2_000  # 43 µs
REPLAY_NS = 15_000 + 2_000 + 14_000 + 1_000  # 32 µs


def _graph_kernels_in_raw(path) -> int:
    """Kernels in the raw JSON whose correlation is a *GraphLaunch call's: the replayed ones."""
    ev = load_json(path)["traceEvents"]
    corr = {e["args"]["correlation"] for e in ev if "GraphLaunch" in str(e.get("name")) and e.get("args")}
    return sum(1 for e in ev if e.get("cat") == "kernel" and e.get("args", {}).get("correlation") in corr)


def _flops_by_step(r) -> dict[int, float]:
    return {s: f for s, f in r.ops.group_by("step").agg(pl.col("flops").sum()).iter_rows() if s is not None}


def test_mm_formula_agrees_with_flop_counter_mode():
    """The oracle the fixture's hand counts stand on: torch's FlopCounterMode counts the two
    mm's as 2·M·K·N."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as fc:
        torch.mm(torch.empty(64, 128, device="meta"), torch.empty(128, 256, device="meta"))
        torch.mm(torch.empty(64, 256, device="meta"), torch.empty(256, 128, device="meta"))
    assert fc.get_total_flops() == MM1_FLOPS + MM2_FLOPS == 8_388_608


def test_capture_window_lends_its_ops_to_each_replay():
    """(i) eager step 1, a capture, steps 2 and 3 one replay each: every replay costs the
    eager pass's FLOPs, once per replay (not split over the two), and the graph says
    'capture_window' with all 4 kernels matched."""
    path = GR / "capture_and_replay.json.gz"
    r = analyze(read_trace(path), "h100")
    assert _graph_kernels_in_raw(path) == 8  # 2 replays × 4 kernels
    assert _flops_by_step(r) == {1: PASS_FLOPS, 2: PASS_FLOPS, 3: PASS_FLOPS}
    rep = r.ops.filter("graph")
    assert rep.height == 8 and rep["cost_source"].to_list() == ["shapes"] * 8
    # the first GEMM alone carries its op's FLOPs in each replay
    assert rep.filter(pl.col("name") == GEMM1)["flops"].to_list() == [MM1_FLOPS, MM1_FLOPS]
    # the second mm is split over its two kernels of the same replay by duration (14 µs : 1 µs)
    gemm2 = rep.filter(pl.col("name") == GEMM2)["flops"].to_list()
    assert gemm2 == pytest.approx([MM2_FLOPS * 14 / 15] * 2)
    per_op = rep.filter(pl.col("name").is_in([GEMM2, SPLITK])).group_by("step").agg(pl.col("flops").sum())
    assert sorted(per_op["flops"].to_list()) == pytest.approx([MM2_FLOPS, MM2_FLOPS])
    # one cost group per replay of each op: 3 ops × 2 replays, negative ids
    ids = rep["external_id"].unique().to_list()
    assert len(ids) == 6 and all(i < 0 for i in ids)
    assert rep.filter(pl.col("name") == ADD)["op"].to_list() == ["aten::add", "aten::add"]
    (g,) = r.coverage.graphs
    assert (g.rank, g.graph, g.launches, g.kernels_per_replay, g.method, g.kernels_matched) == \
        (0, 1, 2, 4, "capture_window", 4)
    assert g.device_time_ns == g.attributed_ns == 2 * REPLAY_NS
    assert r.coverage.costed_share == pytest.approx(1.0)
    assert not any("replayed from CUDA/HIP graphs" in w for w in r.warnings)


def test_replay_only_takes_the_capture_trace_beside_it():
    """(ii) a replay-only trace: coverage 0 without its capture trace, 100 % with the one in
    capture_traces/ beside it, found by itself; the graph names the file."""
    path = GR / "replay_only" / "trace.json.gz"
    without = analyze(read_trace(path), "h100", capture_traces=[])
    assert without.coverage.costed_share == 0.0
    assert [g.method for g in without.coverage.graphs] == ["unattributed"]
    assert any(ADVICE in w for w in without.warnings)
    r = analyze(read_trace(path), "h100")
    (g,) = r.coverage.graphs
    assert g.method == "capture_trace" and g.source.endswith("replay_only/capture_traces/bs_64_rank0.json.gz")
    assert (g.launches, g.kernels_matched, g.attributed_ns) == (2, 4, 2 * REPLAY_NS)
    assert r.coverage.costed_share == pytest.approx(1.0)
    assert _flops_by_step(r) == {1: PASS_FLOPS, 2: PASS_FLOPS}
    # a capture trace comes from another clock: its ops lend shapes, not their threads
    assert r.ops.filter("graph")["op"].to_list() == ["aten::mm", "aten::add", "aten::mm", "aten::mm"] * 2


def test_a_replay_no_capture_fits_stays_unattributed_and_is_said():
    """(iii) a replay of 5 kernels, a capture of 4 launches: no attribution; the note and the
    warning say why and what would fix it; coverage is the eager step's share."""
    r = analyze(read_trace(GR / "count_mismatch.json.gz"), "h100")
    (g,) = r.coverage.graphs
    assert (g.method, g.kernels_per_replay, g.kernels_matched, g.attributed_ns) == ("unattributed", 5, 0, 0)
    assert "no capture of 5 kernel launches (captures hold 4)" in g.note
    rep = r.ops.filter("graph")
    assert rep.height == 5 and rep["flops"].null_count() == 5 and rep["bytes"].null_count() == 5
    (w,) = [w for w in r.warnings if "replayed from CUDA/HIP graphs" in w]
    assert w.startswith("5 kernels") and "--capture-trace" in w
    # eager 43 µs costed of 43 + 33 µs
    assert r.coverage.costed_share == pytest.approx(EAGER_NS / (EAGER_NS + 33_000))


def test_eager_kernel_runs_lend_their_ops():
    """(c) no capture anywhere: the replay's 4 kernel names run exactly as in the eager step,
    so each takes its eager twin's op; the replayed step costs the eager one's FLOPs."""
    r = analyze(read_trace(GR / "eager_match.json.gz"), "h100", capture_traces=[])
    (g,) = r.coverage.graphs
    assert (g.method, g.kernels_matched, g.attributed_ns) == ("eager_match", 4, REPLAY_NS)
    assert _flops_by_step(r) == {1: PASS_FLOPS, 2: PASS_FLOPS}


def _write(tmp_path, b: TraceBuilder):
    p = tmp_path / "t.json.gz"
    b.write(p)
    return analyze(read_trace(p), "h100", capture_traces=[])


def test_two_captures_of_the_same_length_with_other_shapes_are_ambiguous(tmp_path):
    """Two captures of an mm and a relu each (batch 64, then 64 or 32), one replay of the two
    kernels: either capture could be it, nothing tells them apart: unattributed, said 'ambiguous'. With the two
    captures alike, it is attributed."""
    for second, alike in (([[64, 128], [128, 256]], True), ([[32, 128], [128, 256]], False)):
        b = TraceBuilder()
        for dims in ([[64, 128], [128, 256]], second):
            b.begin_capture()
            b.op("aten::mm", dims, ["c10::BFloat16"] * 2, [Kernel(GEMM1, 10_000)])
            b.op("aten::relu", [dims[0]], ["c10::BFloat16"], [Kernel("relu_kernel", 1_000)])
            b.end_capture()
        b.replay(0)
        (g,) = _write(tmp_path, b).coverage.graphs
        if alike:
            assert g.method == "capture_window" and g.kernels_matched == 2
        else:
            assert g.method == "unattributed" and "ambiguous: 2 captures of 2 launches" in g.note


def test_a_capture_whose_eager_kernel_names_differ_is_refused(tmp_path):
    """The capture's ops ran eagerly with other kernel names than the replay's: not that graph."""
    b = TraceBuilder()
    three_ops(b)
    b.begin_capture()
    three_ops(b)
    b.end_capture()
    b.graph_launch([Kernel(n, 1_000) for n in ("gemm_a", "gemm_b", "gemm_c", "gemm_d")])
    (g,) = _write(tmp_path, b).coverage.graphs
    assert g.method == "unattributed" and "captures of 4 launches, but their kernel names differ" in g.note


@pytest.mark.parametrize("parts", [
    ("TraceLens", "tests", "traces", "inference", "vllm_decode_full", "graph_execution.json.gz"),
    ("TraceLens", "tests", "traces", "inference", "sglang_decode", "sglang_Qwen3-8B_decode.json.gz"),
])
def test_real_replays_without_a_capture_claim_nothing_and_say_so(parts):
    """The real decode traces replay one graph each, with no capture and no capture trace:
    nothing attributed, and the warning counts every replayed kernel of the raw JSON and
    gives the fix."""
    path = real(*parts)
    n = _graph_kernels_in_raw(path)
    r = analyze(read_trace(path), "mi300x")
    (g,) = r.coverage.graphs
    assert (g.method, g.launches, g.kernels_per_replay, g.attributed_ns) == ("unattributed", 1, n, 0)
    assert "no capture window in the trace" in g.note
    assert not (r.ops["external_id"] < 0).any()
    (w,) = [w for w in r.warnings if "replayed from CUDA/HIP graphs" in w]
    assert w.startswith(f"{n} kernels") and ADVICE in w


def test_cli_capture_trace_option_and_header_line(tmp_path):
    """--capture-trace PATH attributes from a capture trace kept anywhere; the header says how
    the graph was attributed; a missing PATH is exit 3, one line, no traceback."""
    run = tmp_path / "trace.json.gz"
    run.write_bytes((GR / "replay_only" / "trace.json.gz").read_bytes())
    cap = GR / "replay_only" / "capture_traces" / "bs_64_rank0.json.gz"
    res = CliRunner().invoke(cli, ["analyze", str(run), "--chip", "h100", "--capture-trace", str(cap)])
    assert res.exit_code == 0, res.output
    line = next(x for x in res.output.splitlines() if x.startswith("graph replays"))
    assert "1 graph (1 by capture trace): 100.0 %" in line
    out = CliRunner().invoke(cli, ["analyze", str(run), "--chip", "h100", "--format", "json"])
    d = json.loads(out.stdout)
    validate_report(d)
    assert d["coverage"]["graphs"][0]["method"] == "unattributed"  # nothing beside it in tmp_path
    bad = CliRunner().invoke(cli, ["analyze", str(run), "--chip", "h100", "--capture-trace", str(tmp_path / "no")])
    assert bad.exit_code == 3 and "Traceback" not in bad.output
    assert bad.output.strip().count("\n") == 0 and "no such file or directory" in bad.output


def test_eager_runs_need_four_kernels_three_names_and_whole_ops():
    """graph_match.eager_runs on plain lists: a run of 4 with 3 distinct names is taken; one
    of 5 repeats of one name is not (MIN_DISTINCT); an eager op whose 2 kernels are only half
    inside the run lends to neither."""
    from traceroof.graph_match import Sequence, eager_runs

    eager = Sequence(["a", "b", "c", "d", "d", "d", "d", "d"], [0, 1, 2, 3, 4, 5, 6, 7])
    ones = {i: 1 for i in range(8)}
    m = eager_runs(["x", "a", "b", "c", "d"], eager, ones)
    assert m.lenders == [None, 0, 1, 2, 3] and m.matched == 4
    assert eager_runs(["d"] * 5, eager, ones).matched == 0
    # lender 2 launched kernels "c" and "d" eagerly (2 kernels); the replay has "c" without its "d"
    two = Sequence(["a", "b", "e", "c", "d"], [0, 1, 5, 2, 2])
    m = eager_runs(["a", "b", "e", "c", "x"], two, {0: 1, 1: 1, 5: 1, 2: 2})
    assert m.lenders == [0, 1, 5, None, None] and m.matched == 3


def test_the_step_annotation_picks_the_capture_trace_of_its_batch_size(tmp_path):
    """Two capture traces beside the run, batch 32 and batch 64, both 4 launches: ambiguous,
    unless the annotation around the launch says bs=64: then bs_64's ops (and FLOPs) are
    taken. Batch 64 by hand: 8,404,992 FLOPs per replay (module docstring)."""
    (tmp_path / "capture_traces").mkdir()
    for bs in (32, 64):
        c = TraceBuilder()
        c.begin_capture()
        three_ops(c, batch=bs)
        c.end_capture()
        c.write(tmp_path / "capture_traces" / f"bs_{bs}_rank0.json.gz")
    for label, want in (("step[DECODE bs=64]", "capture_trace"), ("step[DECODE]", "unattributed")):
        run = TraceBuilder()
        run.graphs = [c.graphs[0]]
        run.begin_step(1)
        t0 = run.host_t
        run.replay(0)
        run.user_annotation(label, t0, run.host_t)
        run.end_step()
        run.write(tmp_path / "trace.json.gz")
        r = analyze(read_trace(tmp_path / "trace.json.gz"), "h100")
        (g,) = r.coverage.graphs
        assert g.method == want
        if want == "capture_trace":
            assert g.source.endswith("bs_64_rank0.json.gz") and "batch size 64" in g.note
            assert _flops_by_step(r) == {1: PASS_FLOPS}
        else:
            assert "ambiguous: 2 captures of 4 launches" in g.note
