"""The step's speed of light (traceroof.speed_of_light, docs/speed-of-light.md): the per
device-step terms on hand-built tables, and end to end on a generated trace with a
hand-computed roofline, in every output format."""

from __future__ import annotations

import json

import polars as pl
import pytest
from tracegen import Kernel, TraceBuilder

from traceroof import read_trace
from traceroof.analysis import analyze
from traceroof.render import render
from traceroof.report import Report
from traceroof.report_schema import validate_report
from traceroof.speed_of_light import device_steps

OP_COLS = ("rank", "step", "device", "bucket", "kind", "start_ns", "dur_ns", "expected_ns")


def _ops(rows):
    return pl.DataFrame(rows, schema={"rank": pl.Int32, "step": pl.Int32, "device": pl.Int32, "bucket": pl.String,
                                      "kind": pl.String, "start_ns": pl.Int64, "dur_ns": pl.Int64,
                                      "expected_ns": pl.Float64}, orient="row")


def _dev(rows):
    return pl.DataFrame(rows, schema={"rank": pl.Int32, "step": pl.Int32, "device": pl.Int32, "wall_ns": pl.Int64,
                                      "busy_ns": pl.Int64}, orient="row")


def _steps(rows):
    return pl.DataFrame(rows, schema={"rank": pl.Int32, "step": pl.Int32, "wall_ns": pl.Int64,
                                      "partial": pl.Boolean}, orient="row")


#: one device-step, wall 1000 ns, busy union [0, 900) = 900 ns:
#: matmul [0, 400) roof 300; elementwise [400, 600) roof 100; a collective [100, 300) roof 150
#: beside the matmul (overlapped: O); a collective [600, 900) roof 200 alone (E)
BASIC = [
    (0, 1, 0, "step", "matmul", 0, 400, 300.0),
    (0, 1, 0, "step", "elementwise", 400, 200, 100.0),
    (0, 1, 0, "step", "collective", 100, 200, 150.0),
    (0, 1, 0, "step", "collective", 600, 300, 200.0),
]


def test_overlapped_collective_hides_behind_compute():
    ds = device_steps(_ops(BASIC), _dev([(0, 1, 0, 1000, 900)]), _steps([(0, 1, 1000, False)]))
    r = ds.table.row(0, named=True)
    # C = 300 + 100 = 400, O = 150, E = 200: light = C + E + max(0, O − C) = 600
    assert (r["compute_ns"], r["comm_overlapped_ns"], r["comm_alone_ns"]) == (400, 150, 200)
    assert r["sol_raw_ns"] == 600 and r["sol_ns"] == 600
    # the identity: 1000 − 600 = idle 100 + (busy 900 − Σdur 1100) + gaps (100 + 100 + 50 + 100) + min(O, C) 150
    assert r["idle_ns"] == 100 and r["ops_dur_ns"] == 1100
    assert (r["gap_matmul_ns"], r["gap_elementwise_ns"], r["gap_collective_ns"]) == (100, 100, 150)


def test_overlapped_comm_beyond_compute_costs_the_rest():
    # the overlapped collective's roof (700) is more than the compute (400): 300 of it shows
    rows = [(*BASIC[0][:7], 300.0), BASIC[1], (*BASIC[2][:7], 700.0), BASIC[3]]
    r = device_steps(_ops(rows), _dev([(0, 1, 0, 1000, 900)]), _steps([(0, 1, 1000, False)])).table.row(0, named=True)
    assert r["sol_raw_ns"] == 400 + 200 + (700 - 400)  # 900


def test_light_never_above_the_measured_step():
    # a matmul measured at 100 ns whose roof says 500 (above its roof): light held at the wall
    rows = [(0, 1, 0, "step", "matmul", 0, 100, 500.0)]
    r = device_steps(_ops(rows), _dev([(0, 1, 0, 100, 100)]), _steps([(0, 1, 100, False)])).table.row(0, named=True)
    assert r["sol_raw_ns"] == 500 and r["sol_ns"] == 100 and r["gap_matmul_ns"] == -400


def test_uncosted_op_counts_at_measured_and_partial_steps_are_left_out():
    rows = [(0, 1, 0, "step", "other", 0, 250, None), (0, 1, 0, "step", "matmul", 250, 100, 40.0),
            (0, 2, 0, "step", "matmul", 1000, 100, 40.0)]
    ds = device_steps(_ops(rows), _dev([(0, 1, 0, 400, 350), (0, 2, 0, 100, 100)]),
                      _steps([(0, 1, 400, False), (0, 2, 100, True)]))
    assert ds.table.height == 1  # step 2 is partial
    r = ds.table.row(0, named=True)
    assert r["uncosted_ns"] == 250 and r["sol_ns"] == 250 + 40 and r["gap_other_ns"] == 0


def test_ops_outside_the_step_bucket_are_not_counted():
    rows = [*BASIC, (0, 1, 0, "graph_capture", "matmul", 950, 10, 1.0)]
    r = device_steps(_ops(rows), _dev([(0, 1, 0, 1000, 900)]), _steps([(0, 1, 1000, False)])).table.row(0, named=True)
    assert r["ops_dur_ns"] == 1100 and r["sol_ns"] == 600


# --------------------------------------------------------------------------- end to end

BF16 = ["c10::BFloat16", "c10::BFloat16"]
#: aten::mm [4096, 4096] @ [4096, 4096] bf16: 2·4096³ = 137 438 953 472 FLOPs at the H100's
#: dense bf16 989.4 TFLOP/s = 138 911.4 ns; its bytes 3·4096²·2 = 100 663 296 at 3.35 TB/s =
#: 30 049 ns: compute-bound, roof 138 911 ns (rounded to whole ns)
MM_ROOF_NS = round(2 * 4096**3 / 989.4e12 * 1e9)


@pytest.fixture(scope="module")
def mm_report(tmp_path_factory):
    tb = TraceBuilder(queue_ns=0)
    for n in range(3):
        tb.begin_step(n)
        tb.op("aten::mm", [[4096, 4096], [4096, 4096]], BF16, [Kernel("sm90_gemm_bf16", 300_000)])
        tb.end_step(sync=True)
    path = tb.write(tmp_path_factory.mktemp("sol") / "mm.json.gz")
    return analyze(read_trace(path), "h100")


def test_end_to_end_speed_of_light(mm_report):
    s = mm_report.speed_of_light
    assert MM_ROOF_NS == 138_911
    walls = mm_report.steps.filter(~pl.col("partial"))["wall_ns"].to_list()
    assert s.device_steps == len(walls) == 3
    assert s.measured_total_ns == sum(walls)
    assert s.speed_of_light_total_ns == 3 * MM_ROOF_NS  # one mm per step, nothing else
    assert s.speed_of_light_ns == pytest.approx(MM_ROOF_NS)
    assert s.fraction == pytest.approx(MM_ROOF_NS / (sum(walls) / 3))
    assert [p.speed_of_light_ns for p in s.per_step] == [MM_ROOF_NS] * 3


def test_headline_in_every_format(mm_report):
    s = mm_report.speed_of_light
    pct = f"{s.fraction:.0%}".replace("%", " %")
    for fmt in ("table", "markdown"):
        text = render(mm_report, fmt)
        assert "speed of light" in text and "139 µs" in text and f"{pct} of light" in text, fmt
    d = json.loads(render(mm_report, "json"))
    assert d["speed_of_light"]["speed_of_light_total_ns"] == 3 * MM_ROOF_NS
    validate_report(d)
    back = Report.from_dict(d)
    assert back.speed_of_light == s


def test_model_floor_beside_it(tmp_path):
    tb = TraceBuilder(queue_ns=0)
    tb.begin_step(0)
    tb.op("aten::mm", [[4096, 4096], [4096, 4096]], BF16, [Kernel("sm90_gemm_bf16", 300_000)])
    tb.end_step(sync=True)
    trace = read_trace(tb.write(tmp_path / "one.json.gz"))
    # 1e11 model FLOPs on 1 device at 989.4 TFLOP/s: 101 071 ns, under the 138 911 ns light
    r = analyze(trace, "h100", model_flops_per_step=1e11, n_devices=1)
    s = r.speed_of_light
    assert s.model_floor_ns == pytest.approx(1e11 / 989.4e12 * 1e9)
    assert s.model_floor_ns <= s.speed_of_light_ns <= s.measured_ns and s.model_floor_note is None
    # 1e12: 1 010 714 ns, above the light (more model FLOPs than the trace ran): said why
    big = analyze(read_trace(tmp_path / "one.json.gz"), "h100", model_flops_per_step=1e12, n_devices=1)
    assert big.speed_of_light.model_floor_ns > big.speed_of_light.speed_of_light_ns
    assert "more than the trace ran" in big.speed_of_light.model_floor_note
    assert "model floor" in render(big, "table")


def test_overlap_query_equals_a_pairwise_check_on_random_groups():
    """The one-query overlap test (``steps._overlapped``) against the definition
    checked pair by pair: a collective is overlapped when some non-collective op of its own
    (rank, step, device) starts before it ends and ends after it starts (both strict).
    Random groups with touching intervals, equal starts and a null device key."""
    import random

    from traceroof.steps import _overlapped

    rng = random.Random(19)
    rows = []
    for _ in range(400):
        start = rng.randrange(0, 200, 5)  # coarse grid: ties and touching ends are common
        rows.append((rng.randrange(3), rng.randrange(4), rng.choice([0, 1, None]),
                     rng.choice(["collective", "matmul", "elementwise"]), start, rng.randrange(0, 30, 5)))
    t = pl.DataFrame(rows, schema={"rank": pl.Int32, "step": pl.Int32, "device": pl.Int32, "kind": pl.String,
                                   "start_ns": pl.Int64, "dur_ns": pl.Int64}, orient="row")
    want = [r[3] == "collective" and any(q[:3] == r[:3] and q[3] != "collective" and q[4] < r[4] + r[5]
                                         and q[4] + q[5] > r[4] for q in rows) for r in rows]
    got = _overlapped(t, ["rank", "step", "device"]).to_list()
    assert sum(want) > 20 and sum(not w for r, w in zip(rows, want) if r[3] == "collective") > 20  # both cases
    assert got == want


def test_no_complete_step_gives_the_empty_table_the_terms_give():
    """Without a complete device-step ``device_steps`` returns without a query; its empty
    table is the one the full computation gives for no device-step (same columns, dtypes)."""
    from polars.testing import assert_frame_equal

    from traceroof import speed_of_light as sol
    from traceroof.steps import step_terms

    ds = device_steps(_ops(BASIC), _dev([(0, 1, 0, 1000, 900)]), _steps([(0, 1, 1000, True)]))  # partial
    assert ds.kinds == () and ds.table.height == 0
    full = sol._finish(step_terms(_ops(BASIC), _dev([])), ["rank", "step", "device"])
    assert full.kinds == ()
    assert_frame_equal(ds.table, full.table)
    assert ds.table.columns[:5] == ["rank", "step", "device", "wall_ns", "busy_ns"] and "sol_ns" in ds.table.columns
