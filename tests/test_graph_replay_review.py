"""Graph-replay attribution: the review's findings (batch sizes, multi-stream graphs, given and
unreadable capture traces, the uncosted reason of a replayed kernel).

The traces are generated (fixtures/make_graph_replay.py): three bf16 ops of ``batch`` rows;
by hand, per replay:

* batch 64: 2·64·128·256 + 64·256 + 2·64·256·128 = 4,194,304 + 16,384 + 4,194,304 = 8,404,992 FLOPs;
* batch 32: 2·32·128·256 + 32·256 + 2·32·256·128 = 2,097,152 + 8,192 + 2,097,152 = 4,202,496 FLOPs.
"""

from __future__ import annotations

import polars as pl
import pytest
from click.testing import CliRunner
from conftest import FIXTURES
from make_graph_replay import (
    ADD,
    BF16,
    GEMM1,
    annotated_replays,
    capture_trace_of,
    three_ops,
)
from tracegen import Kernel, TraceBuilder

from traceroof import read_trace
from traceroof.analysis import analyze
from traceroof.cli import cli
from traceroof.costing_why import why
from traceroof.errors import InputNotFoundError
from traceroof.graph_match import Sequence, kind_clash, leading_batch

GR = FIXTURES / "graph_replay"
FLOPS = {64: 2 * 64 * 128 * 256 + 64 * 256 + 2 * 64 * 256 * 128,  # 8,404,992
         32: 2 * 32 * 128 * 256 + 32 * 256 + 2 * 32 * 256 * 128}  # 4,202,496
MM1_FLOPS = 2 * 64 * 128 * 256  # 4,194,304
ADD_FLOPS = 64 * 256  # 16,384


def _replayed_flops_by_step(r) -> dict[int, float | None]:
    """Per step, the FLOPs of its replayed kernels (None: none of them costed)."""
    g = r.ops.filter("graph").group_by("step").agg(
        pl.when(pl.col("flops").is_not_null().any()).then(pl.col("flops").sum()).alias("f"))
    return dict(g.iter_rows())


def test_batch_32_flops_agree_with_flop_counter_mode():
    """The oracle of the batch-32 count: FlopCounterMode's 2·M·K·N for the two mm's; the add is
    one FLOP per output element (32·256)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as fc:
        torch.mm(torch.empty(32, 128, device="meta"), torch.empty(128, 256, device="meta"))
        torch.mm(torch.empty(32, 256, device="meta"), torch.empty(256, 128, device="meta"))
    assert fc.get_total_flops() + 32 * 256 == FLOPS[32] == 4_202_496


def test_replays_of_two_batch_sizes_each_take_their_capture_trace(tmp_path):
    """(1) bs_32 and bs_64 capture traces beside the run; one replay annotated bs=32, one bs=64,
    of the same kernel names. Each is costed at its own batch size (before: both at bs_32's),
    and each graph's note says which replays it covers."""
    (tmp_path / "capture_traces").mkdir()
    caps = {bs: capture_trace_of(bs) for bs in (32, 64)}
    for bs, c in caps.items():
        c.write(tmp_path / "capture_traces" / f"bs_{bs}_rank0.json.gz")
    run = TraceBuilder()
    run.graphs = [caps[32].graphs[0], caps[64].graphs[0]]
    annotated_replays(run, [(0, "step[DECODE bs=32]"), (1, "step[DECODE bs=64]")]).write(tmp_path / "trace.json.gz")
    r = analyze(read_trace(tmp_path / "trace.json.gz"), "h100")
    assert _replayed_flops_by_step(r) == {1: FLOPS[32], 2: FLOPS[64]}
    g32, g64 = r.coverage.graphs
    assert (g32.method, g32.launches, g64.method, g64.launches) == ("capture_trace", 1, "capture_trace", 1)
    assert g32.source.endswith("bs_32_rank0.json.gz") and g64.source.endswith("bs_64_rank0.json.gz")
    assert g32.note.startswith("its 1 replay annotated batch size 32 (of 2 replays")
    assert g64.note.startswith("its 1 replay annotated batch size 64 (of 2 replays")


@pytest.mark.parametrize("warm_up", [False, True])
def test_a_lone_capture_trace_of_another_batch_size_is_refused(tmp_path, warm_up):
    """(2) only bs_64's capture trace beside a replay annotated bs=32: refused (before: lent,
    costing 8,404,992 FLOPs); the note names both batch sizes. With the capture trace's
    eager warm-up (batch 64), the eager match is refused too."""
    (tmp_path / "capture_traces").mkdir()
    c = capture_trace_of(64, warm_up=warm_up)
    c.write(tmp_path / "capture_traces" / "bs_64_rank0.json.gz")
    run = TraceBuilder()
    run.graphs = [c.graphs[0]]
    annotated_replays(run, [(0, "step[DECODE bs=32]")]).write(tmp_path / "trace.json.gz")
    r = analyze(read_trace(tmp_path / "trace.json.gz"), "h100")
    (g,) = r.coverage.graphs
    assert (g.method, g.kernels_matched, g.attributed_ns) == ("unattributed", 0, 0)
    assert ("says batch size 32, but the capture that fits is of batch size 64 (its file name)") in g.note
    if warm_up:
        assert "the eager ops its kernels match are of batch size 64" in g.note
    assert _replayed_flops_by_step(r) == {1: None}


def test_a_capture_window_of_another_batch_size_is_refused(tmp_path):
    """(1, 2) the trace captures the bs=64 graph; a graph of the same kernel names captured
    before the profiler started is replayed in step 1 (bs=32), the captured one in step 2
    (bs=64). Step 2 takes the window (its ops' leading dimension says 64); step 1 is refused,
    its note naming 32 and 64 (before: both costed at batch 64)."""
    b = TraceBuilder()
    b.begin_capture()
    three_ops(b, batch=64)
    g = b.end_capture()
    b.graphs.append(list(b.graphs[g]))
    annotated_replays(b, [(1, "step[DECODE bs=32]"), (0, "step[DECODE bs=64]")]).write(tmp_path / "t.json.gz")
    r = analyze(read_trace(tmp_path / "t.json.gz"), "h100", capture_traces=[])
    g32, g64 = r.coverage.graphs
    assert (g32.method, g64.method) == ("unattributed", "capture_window")
    assert ("says batch size 32, but the capture that fits is of batch size 64 (its ops' leading dimension)"
            in g32.note)
    assert _replayed_flops_by_step(r) == {1: None, 2: FLOPS[64]}


def test_one_replay_of_another_batch_size_than_the_window_is_refused(tmp_path):
    """(2) one capture window (batch 64), one replay annotated bs=32: the tie-breaker is now a
    check; unannotated, the same replay takes the window."""
    for label, want in (("step[DECODE bs=32]", "unattributed"), ("step[DECODE]", "capture_window")):
        b = TraceBuilder()
        b.begin_capture()
        three_ops(b, batch=64)
        b.end_capture()
        annotated_replays(b, [(0, label)]).write(tmp_path / "t.json.gz")
        (g,) = analyze(read_trace(tmp_path / "t.json.gz"), "h100", capture_traces=[]).coverage.graphs
        assert g.method == want
        assert (want == "unattributed") == ("batch size 64" in (g.note or ""))


def test_batch_sizes_that_cannot_each_be_resolved_are_refused(tmp_path):
    """(1) a capture window whose ops record no shapes (batch size unknown), replays annotated
    bs=32 and bs=64: the window cannot be shown to be either, so both are refused and said;
    with one batch size only, the window is lent (nothing contradicts it)."""
    for labels, want in ((["step[DECODE bs=32]", "step[DECODE bs=64]"], ["unattributed"] * 2),
                         (["step[DECODE bs=32]", "step[DECODE bs=32]"], ["capture_window"])):
        b = TraceBuilder()
        b.begin_capture()
        b.op("aten::mm", [], [], [Kernel(GEMM1, 10_000)])
        b.op("aten::add", [], [], [Kernel(ADD, 1_000)])
        b.end_capture()
        annotated_replays(b, [(0, x) for x in labels]).write(tmp_path / "t.json.gz")
        graphs = analyze(read_trace(tmp_path / "t.json.gz"), "h100", capture_traces=[]).coverage.graphs
        assert [g.method for g in graphs] == want
        if len(want) == 2:
            assert all("no capture that fits is known to be of batch size" in g.note for g in graphs)


def _two_branches(b: TraceBuilder, add_first: bool) -> None:
    """A capture of an mm (stream 7) and an add (stream 8), then its replay; ``add_first``: the
    side-stream add starts on the device before the mm (no dependency between the two)."""
    b.begin_capture()
    b.op("aten::mm", [[64, 128], [128, 256]], [BF16, BF16], [Kernel(GEMM1, 20_000, stream=7)])
    b.op("aten::add", [[64, 256], [64, 256], []], [BF16, BF16, "Scalar"], [Kernel(ADD, 3_000, stream=8)],
         concrete=["", "", "1"])
    b.end_capture()
    b.begin_step(1)
    mm, add = Kernel(GEMM1, 15_000, stream=7), Kernel(ADD, 2_000, stream=8)
    b.graph_launch([add, mm] if add_first else [mm, add])
    b.end_step()


def test_a_multi_stream_replay_whose_kinds_disagree_is_refused(tmp_path):
    """(3) no eager kernel names: the add starting first would take aten::mm (before: the GEMM
    got aten::add's 16,384 FLOPs); refused, the note says why. In launch order, each kernel
    takes its op: GEMM 2·64·128·256, add 64·256."""
    for add_first in (True, False):
        b = TraceBuilder()
        _two_branches(b, add_first)
        b.write(tmp_path / "t.json.gz")
        r = analyze(read_trace(tmp_path / "t.json.gz"), "h100", capture_traces=[])
        (g,) = r.coverage.graphs
        flops = dict(r.ops.filter("graph").select("name", "flops").iter_rows())
        if add_first:
            assert (g.method, g.kernels_matched) == ("unattributed", 0)
            assert "runs on 2 streams" in g.note and "would take aten::mm (matmul)" in g.note
            assert flops == {GEMM1: None, ADD: None}
        else:
            assert (g.method, g.kernels_matched) == ("capture_window", 2)
            assert flops == {GEMM1: MM1_FLOPS, ADD: ADD_FLOPS}


def test_graph_match_leading_batch_and_kind_clash():
    """The pure helpers: a strict majority of leading dimensions, else None; the first
    position with no known name whose two known kinds differ."""
    assert leading_batch([64, 64, 128]) == 64
    assert leading_batch([64, 128]) is None and leading_batch([None]) is None
    seq = Sequence([None, "k", None], [0, 1, 2])
    assert kind_clash(["matmul", "x", "elementwise"], seq, ["matmul", "y", "matmul"]) == 2
    assert kind_clash([None, "x", "elementwise"], seq, ["matmul", "y", None]) is None


def test_a_missing_capture_trace_is_an_error_even_when_a_window_fits(tmp_path):
    """(6) the capture window attributes the graph by itself, yet a given capture trace that
    does not exist is InputNotFoundError (CLI: exit 3, one line naming it; before: exit 0)."""
    path = GR / "capture_and_replay.json.gz"
    missing = str(tmp_path / "nonexistent")
    with pytest.raises(InputNotFoundError, match="nonexistent: no such file or directory"):
        analyze(read_trace(path), "h100", capture_traces=[missing])
    res = CliRunner().invoke(cli, ["analyze", str(path), "--chip", "h100", "--capture-trace", missing])
    assert res.exit_code == 3 and "Traceback" not in res.output
    assert res.output.strip().count("\n") == 0 and "capture trace" in res.output and missing in res.output


def test_unreadable_capture_traces_are_counted(tmp_path):
    """(7) two capture traces beside the run, neither readable: the note counts them (before:
    'no capture trace') and a warning names each."""
    (tmp_path / "capture_traces").mkdir()
    bad = [tmp_path / "capture_traces" / f"bs_{bs}_rank0.json.gz" for bs in (32, 64)]
    for p in bad:
        p.write_bytes(b"not gzip at all")
    run = TraceBuilder()
    run.graphs = [capture_trace_of(64).graphs[0]]
    annotated_replays(run, [(0, "step[DECODE]")]).write(tmp_path / "trace.json.gz")
    r = analyze(read_trace(tmp_path / "trace.json.gz"), "h100")
    (g,) = r.coverage.graphs
    assert g.method == "unattributed" and "2 capture traces found, none could be read" in g.note
    assert "no capture trace;" not in g.note
    assert sum(1 for w in r.warnings for p in bad if w.startswith(f"capture trace {p} not used")) == len(bad)


def test_a_kernel_linked_to_the_replay_op_is_said_to_be_replayed():
    """(8) count_mismatch's replayed kernels are linked to the CUDAGraph::replay cpu_op
    (tracegen models it), attribution fails: the reason is the graph replay (before: 'no cost
    formula for this op'). A kernel the replay stage lent a framework op keeps that op's
    reasons."""
    r = analyze(read_trace(GR / "count_mismatch.json.gz"), "h100")
    fams = [f for f in r.coverage.uncosted_families if f["examples"] == ["CUDAGraph::replay"]]
    assert {f["kind"] for f in fams} == {"matmul", "elementwise"}
    assert {f["why"] for f in fams} == {"replayed by a CUDA/HIP graph, no framework op"}
    assert why("CUDAGraph::replay", "matmul", False, False, graph=True) == "replayed by a CUDA/HIP graph, no framework op"
    assert why("CUDAGraph::replay", "matmul", False, False, graph=False) == "no cost formula for this op"
    assert why("aten::mm", "matmul", False, False, graph=True) == "no shapes recorded"
