"""The dashboard's pure figure builders and views, on real traces, without a browser.

Oracles are computed here independently of traceroof.web (plain Python loops over the op
table), and the chip numbers are the datasheet values of docs/chips.md.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict

import polars as pl
import pytest
from conftest import real

pytest.importorskip("dash", reason="the web extra (dash, plotly) is not installed")

from traceroof import analyze, read_trace  # noqa: E402
from traceroof.findings import Finding  # noqa: E402
from traceroof.web import figures, views  # noqa: E402

QWEN = "TraceLens/tests/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
CONTROL = "HolisticTraceAnalysis/tests/data/trace_diff/control/control.json.gz"
DLRM = "param/et_replay/tests/inputs/dlrm_kineto.tar.gz"
RESNET = "TraceLens/tests/traces/mi300/ddp_resnet18_no_pool/train_resnet18.json.gz"

H100_PEAKS = {"fp64": 33.5e12, "fp32": 66.9e12, "tf32": 494.7e12, "bf16": 989.4e12, "fp16": 989.4e12,
              "fp8": 1978.9e12, "int8": 1978.9e12}
H100_HBM = 3.35e12


@pytest.fixture(scope="module")
def qwen():
    return analyze(read_trace(real(QWEN)))


@pytest.fixture(scope="module")
def control():
    return analyze(read_trace(real(CONTROL)), "a100")


@pytest.fixture(scope="module")
def dlrm():
    return analyze(read_trace(real(DLRM)), "a100")


@pytest.fixture(scope="module")
def resnet():
    return analyze(read_trace(real(RESNET)))


def traces(fig, role):
    return [t for t in fig.data if (t.meta or {}).get("role") == role]


def oracle_groups(ops: pl.DataFrame, by: str = "op") -> dict[str, dict[str, float]]:
    """Per label: Σflops, Σbytes, Σdur over the ops having both FLOPs and bytes; Σdur of all."""
    out: dict[str, dict[str, float]] = defaultdict(lambda: {"f": 0.0, "b": 0.0, "d": 0.0, "all": 0.0})
    for r in ops.select("name", "op", "kind", "flops", "bytes", "dur_ns").iter_rows(named=True):
        copy = str(r["kind"]) in ("memcpy", "memset")
        label = r["name"] if (by == "kernel" or copy or r["op"] is None) else r["op"]
        g = out[label]
        g["all"] += r["dur_ns"]
        if r["flops"] is not None and r["bytes"] is not None:
            g["f"] += r["flops"]
            g["b"] += r["bytes"]
            g["d"] += r["dur_ns"]
    return dict(out)


# --------------------------------------------------------------------- op groups
def test_op_groups_are_the_report_ranking(qwen):
    g = views.op_groups(qwen.ops)
    assert g["label"].to_list() == qwen.ranking["label"].to_list()
    assert g["gap_ns"].to_list() == qwen.ranking["gap_ns"].to_list()
    # one group per label: the op, or the kernel name where no op is linked (oracle_groups)
    assert g.height == len(oracle_groups(qwen.ops)) == 21
    assert math.isclose(g["share"].sum(), 1.0, rel_tol=1e-12)
    kg = views.op_groups(qwen.ops, "kernel")
    assert set(kg["label"]) == set(qwen.ops["name"])


# --------------------------------------------------------------------- roofline
def test_roofline_has_one_point_per_placeable_op_group(qwen):
    fig = figures.roofline_figure(qwen.ops, qwen.chip)
    pts = traces(fig, "ops")
    oracle = {k: v for k, v in oracle_groups(qwen.ops).items() if v["f"] > 0 and v["b"] > 0 and v["d"] > 0}
    labels = [lab for t in pts for lab in t.customdata]
    assert len(labels) == len(set(labels)) == len(oracle) == 16 == fig.layout.meta["points"]
    assert set(labels) == set(oracle)
    # each point at (Σflops/Σbytes, Σflops/Σtime) of its group
    for t in pts:
        assert t.type == "scattergl"
        for x, y, lab in zip(t.x, t.y, t.customdata):
            o = oracle[lab]
            assert math.isclose(x, o["f"] / o["b"], rel_tol=1e-9)
            assert math.isclose(y, o["f"] / (o["d"] * 1e-9), rel_tol=1e-9)
    # the matmul group: aten::mm, 96 kernels, compute-bound
    mm = next(t for t in pts if t.meta["kind"] == "matmul")
    assert "aten::mm" in mm.customdata
    # the other groups: those that move bytes with no FLOPs go to the bandwidth panel; every
    # Qwen group has bytes since its unlaunched kernels are eager-matched (none without bytes)
    groups = oracle_groups(qwen.ops)
    no_bytes = [k for k, v in groups.items() if v["b"] == 0]
    movers = len(groups) - len(oracle) - len(no_bytes)
    sub = fig.layout.title.subtitle.text
    assert sub.startswith(f"16 op groups plotted; {movers} groups (") and movers == 5
    assert ("groups (" in sub.split("bandwidth panel")[-1]) == bool(no_bytes)


def test_roofs_sit_at_the_chips_peaks_and_the_ridge_at_peak_over_bandwidth(qwen):
    assert qwen.chip.peak_flops_per_s == H100_PEAKS and qwen.chip.hbm_bytes_per_s == H100_HBM
    fig = figures.roofline_figure(qwen.ops, qwen.chip)
    roofs = traces(fig, "roof")
    # one roof per distinct dense peak; dtypes sharing a peak share a roof
    assert sorted(tuple(t.meta["dtypes"]) for t in roofs) == sorted(
        [("fp8", "int8"), ("bf16", "fp16"), ("tf32",), ("fp32",), ("fp64",)])
    for t in roofs:
        peak = H100_PEAKS[t.meta["dtypes"][0]]
        assert t.y[0] == t.y[1] == peak
        assert math.isclose(t.x[0], peak / H100_HBM, rel_tol=1e-12)  # the roof starts at its ridge
    used = {d for t in roofs if t.meta["used"] for d in t.meta["dtypes"]}
    assert used == {"bf16", "fp16", "fp32"}  # Qwen's ops use the bf16 and fp32 peaks
    (ridge,) = traces(fig, "ridge")
    assert math.isclose(sorted(ridge.x)[3], 989.4e12 / 3.35e12, rel_tol=1e-12)  # 295.3 FLOP/byte
    assert math.isclose(figures.ridge_point(989.4e12, 3.35e12), 295.34328358, rel_tol=1e-9)
    (hbm,) = traces(fig, "hbm")
    for x, y in zip(hbm.x, hbm.y):
        assert math.isclose(y, H100_HBM * x, rel_tol=1e-12)
    assert math.isclose(hbm.x[1], 1978.9e12 / 3.35e12, rel_tol=1e-12)  # the slope reaches the top ridge
    assert fig.layout.xaxis.type == fig.layout.yaxis.type == "log"


def test_no_point_sits_above_its_roof(resnet):
    fig = figures.roofline_figure(resnet.ops, resnet.chip)
    W = resnet.chip.hbm_bytes_per_s
    top = max(resnet.chip.peak_flops_per_s.values())
    n = 0
    for t in traces(fig, "ops"):
        for x, y in zip(t.x, t.y):
            assert y <= 1.05 * min(top, W * x)
            n += 1
    assert n == fig.layout.meta["points"] > 5


def test_marker_area_grows_with_time_and_selection_is_ringed(qwen):
    fig = figures.roofline_figure(qwen.ops, qwen.chip, selected="aten::mm")
    g = views.op_groups(qwen.ops)
    t_of = dict(zip(g["label"], g["measured_ns"]))
    pairs = sorted((t_of[lab], s) for t in traces(fig, "ops") for lab, s in zip(t.customdata, t.marker.size))
    assert [s for _, s in pairs] == sorted(s for _, s in pairs)
    (sel,) = traces(fig, "selected")
    assert sel.meta["label"] == "aten::mm" and list(sel.customdata) == ["aten::mm"]
    assert not traces(figures.roofline_figure(qwen.ops, qwen.chip, selected="no such op"), "selected")


def test_roofline_caps_points_and_says_so(qwen):
    fig = figures.roofline_figure(qwen.ops, qwen.chip, max_points=5)
    assert sum(len(t.x) for t in traces(fig, "ops")) == 5
    assert "the 11 smallest of 16 left out" in fig.layout.title.subtitle.text


def test_roofline_without_costs_or_chip_is_explained_not_an_error(control):
    # control's shapes are costed since its PyTorch 1.x links are read: its costs are removed here
    uncosted = control.ops.with_columns(pl.lit(None, dtype=pl.Float64).alias("flops"),
                                        pl.lit(None, dtype=pl.Float64).alias("bytes"))
    fig = figures.roofline_figure(uncosted, control.chip)
    assert fig.layout.meta["points"] == 0 and traces(fig, "roof")
    assert "No op has both FLOPs and bytes" in fig.layout.annotations[-1].text
    empty = figures.roofline_figure(control.ops, None)
    assert "No chip peaks" in empty.layout.annotations[0].text


# --------------------------------------------------------------------- timeline
def test_timeline_draws_one_bar_per_op_of_the_step(qwen):
    step = views.filter_ops(qwen.ops, views.ALL, "6")
    assert step.height == 1198 == qwen.steps["ops"][0]
    fig = figures.timeline_figure(step, findings=qwen.findings)
    bars = traces(fig, "bars")
    assert sum(len(t.x) for t in bars) == sum(t.meta["ops"] for t in bars) == 1198
    assert fig.layout.meta["aggregated"] is False and fig.layout.meta["rows"] == ["host launches", "stream 7"]
    # bar geometry: base = start (ms since origin), length = duration
    want = sorted(zip(step["start_ns"].to_list(), step["dur_ns"].to_list()))
    got = sorted((round(b * 1e6), round(x * 1e6)) for t in bars for b, x in zip(t.base, t.x))
    assert [(s, max(d, 1)) for s, d in want] == got
    (la,) = traces(fig, "launches")
    assert la.meta["launches"] == step["launch_start_ns"].drop_nulls().len() == 1198
    # every finding of step 6 is shaded
    shaded = {(round(s.x0 * 1e6), round(s.x1 * 1e6)) for s in fig.layout.shapes}
    assert {(f.start_ns, f.end_ns) for f in qwen.findings if f.step == 6} <= shaded


def test_timeline_highlights_the_selected_op_group(qwen):
    step = views.filter_ops(qwen.ops, views.ALL, "6")
    fig = figures.timeline_figure(step, selected="aten::mul")
    (sel,) = traces(fig, "selected")
    n_mul = step.filter(pl.col("op") == "aten::mul", ~pl.col("kind").cast(pl.String).is_in(["memcpy", "memset"])).height
    assert sel.meta["ops"] == len(sel.x) == n_mul > 0
    assert set(sel.customdata) == {"aten::mul"}


def test_big_steps_are_merged_and_zooming_in_shows_single_ops(control):
    ops = control.ops
    assert ops.height == 9450
    fig = figures.timeline_figure(ops, max_bars=4000)
    bars = traces(fig, "bars")
    assert fig.layout.meta["aggregated"] is True
    assert sum(t.meta["ops"] for t in bars) == 9450  # every op is in exactly one merged bar
    assert sum(len(t.x) for t in bars) <= 4000
    t0 = int(ops["start_ns"].min()) + 100_000_000
    zoom = figures.timeline_figure(ops, window=(t0, t0 + 2_000_000), max_bars=4000)
    in_window = ops.filter(pl.col("start_ns") < t0 + 2_000_000, pl.col("start_ns") + pl.col("dur_ns") > t0).height
    assert zoom.layout.meta["aggregated"] is False
    assert sum(len(t.x) for t in traces(zoom, "bars")) == in_window > 0
    assert list(zoom.layout.xaxis.range) == [t0 / 1e6, (t0 + 2_000_000) / 1e6]


def test_multi_rank_timeline_has_rows_per_rank_and_findings_on_their_rank(dlrm):
    fig = figures.timeline_figure(dlrm.ops, findings=dlrm.findings)
    rows = fig.layout.meta["rows"]
    assert len({r.split(" · ")[0] for r in rows}) == 8
    assert "rank 3 · stream 84" in rows and "rank 3 · host launches" in rows
    order = list(fig.layout.yaxis.categoryarray)
    f = dlrm.findings[0]
    shape = next(s for s in fig.layout.shapes if round(s.x0 * 1e6) == f.start_ns and round(s.x1 * 1e6) == f.end_ns)
    covered = [r for i, r in enumerate(order) if shape.y0 < i < shape.y1]
    assert covered and all(r.startswith(f"rank {f.rank} ·") for r in covered)


def test_empty_selection_gives_an_empty_figure_not_an_error(qwen):
    fig = figures.timeline_figure(qwen.ops.head(0))
    assert fig.layout.meta["bars"] == 0


# --------------------------------------------------------------------- steps
def test_step_bars_stack_to_the_step_wall_time(control):
    fig = figures.steps_figure(control.steps)
    parts = traces(fig, "breakdown")
    assert [t.meta["column"] for t in parts] == ["compute_bound_ns", "memory_bound_ns", "unknown_bound_ns",
                                                "comm_only_ns", "idle_ns"]
    assert list(parts[0].x) == [f"step {s}" for s in range(1009, 1015)]
    walls = control.steps.sort("start_ns")["wall_ns"].to_list()
    for i, wall in enumerate(walls):
        assert math.isclose(sum(t.y[i] for t in parts), wall / 1e6, rel_tol=1e-12)
    comm_only = [t for t in parts if t.meta["column"] == "comm_only_ns"][0]
    exposed = control.steps.sort("start_ns")["comm_exposed_ns"].to_list()
    for y, e in zip(comm_only.y, exposed):  # copies overlapping NCCL count as memory time here
        assert 0 < y <= e / 1e6


def test_steps_per_rank(dlrm, qwen):
    assert list(traces(figures.steps_figure(dlrm.steps), "breakdown")[0].x) == [f"rank {r} · step 10" for r in range(8)]
    assert list(traces(figures.steps_figure(dlrm.steps, rank="3"), "breakdown")[0].x) == ["step 10"]
    (hfu,) = traces(figures.steps_figure(qwen.steps), "utilization")
    assert math.isclose(hfu.y[0], 100 * qwen.summary.hfu.value, rel_tol=1e-9)  # 16.7 %


# --------------------------------------------------------------------- views
def test_selectors_and_filters(qwen, dlrm):
    assert [o["value"] for o in views.step_options(qwen.ops)] == ["all", "6", "none"]
    assert views.step_options(qwen.ops)[-1]["label"] == "outside steps (509 ops)"
    assert views.filter_ops(qwen.ops, "all", "none").height == 509
    assert [o["value"] for o in views.rank_options(dlrm.ops)] == ["all"] + [str(r) for r in range(8)]
    assert views.filter_ops(dlrm.ops, "3").height == dlrm.ops.filter(pl.col("rank") == 3).height
    mm = views.filter_table_ops(qwen.ops, kinds=["matmul"])
    assert set(mm["kind"].cast(pl.String)) == {"matmul"} and mm.height == 242
    unknown = views.filter_table_ops(qwen.ops, bounds=["unknown"])
    assert unknown.height == qwen.ops.filter(pl.col("expected_ns").is_null()).height
    assert views.filter_table_ops(dlrm.ops, bounds=["unknown"])["expected_ns"].null_count() > 0


def test_table_records_are_in_display_units(qwen):
    g = views.op_groups(qwen.ops)
    recs = views.table_records(g, selected="aten::mm")
    assert len(recs) == g.height == len(oracle_groups(qwen.ops)) and [r["id"] for r in recs] == g["label"].to_list()
    r = next(r for r in recs if r["id"] == "aten::mm")
    row = g.filter(pl.col("label") == "aten::mm").row(0, named=True)
    # 96 linked aten::mm calls + the 43 of the iteration before the recording (eager-matched)
    mm_calls = qwen.ops.filter(pl.col("op") == "aten::mm").select("rank", "external_id").n_unique()
    assert r["sel"] == "★" and r["count"] == mm_calls == 139
    assert math.isclose(r["measured_us"], row["measured_ns"] / 1e3)
    assert math.isclose(r["efficiency_pct"], 100 * row["efficiency"])
    assert sum(1 for r in recs if r["sel"]) == 1
    csv = views.groups_csv(g)
    assert csv.splitlines()[0].startswith("label,kind,count,measured_ns") and len(csv.splitlines()) == g.height + 1


def test_finding_target_and_timeline_window():
    f = Finding("device_idle", "t", "low", 0.0, "", rank=1, step=10, start_ns=3_101_000, end_ns=10_736_000)
    t = views.finding_target(f, {"all", "10"})
    assert t == {"rank": "1", "step": "10", "window": [3_101_000 - 763_500, 10_736_000 + 763_500]}
    assert views.finding_target(dataclasses.replace(f, step=99), {"all", "10"})["step"] == "all"
    tw = views.timeline_window
    assert tw(["focus.data"], {"window": [1, 2]}, None, None, n_ops=10, max_bars=5) == [1, 2]
    assert tw(["step-select.value"], None, None, [1, 2], n_ops=10, max_bars=5) is None
    zoom = {"xaxis.range[0]": 1.5, "xaxis.range[1]": 2.5}
    assert tw(["timeline-graph.relayoutData"], None, zoom, None, n_ops=10, max_bars=5) == [1.5e6, 2.5e6]
    assert tw(["timeline-graph.relayoutData"], None, zoom, None, n_ops=3, max_bars=5) is views.UNCHANGED
    assert tw(["timeline-graph.relayoutData"], None, {"autosize": True}, None, n_ops=10, max_bars=5) is views.UNCHANGED
    assert tw(["timeline-graph.relayoutData"], None, {"xaxis.autorange": True}, [1, 2], n_ops=10, max_bars=5) is None
    assert tw(["selected.data"], None, None, [1, 2], n_ops=10, max_bars=5) == [1, 2]
    assert tw(["tabs.value"], None, None, [1, 2], n_ops=10, max_bars=5) == [1, 2]
    assert views.stored_window({"key": "all|6", "window": [1, 2]}, "all|6") == [1, 2]
    assert views.stored_window({"key": "all|6", "window": [1, 2]}, "0|6") is None


def test_selection_from_clicks():
    pt = {"points": [{"customdata": "aten::mm", "x": 1, "y": 2}]}
    assert views.selection_from_event("roofline-graph", pt, None, None) == "aten::mm"
    assert views.selection_from_event("roofline-graph", {"points": [{"x": 1}]}, None, None) is views.UNCHANGED
    assert views.selection_from_event("ops-table", None, {"row": 0, "row_id": "aten::add"}, None) == "aten::add"
    assert views.selection_from_event("timeline-graph", None, None, pt) == "aten::mm"
    assert views.selection_from_event("clear-selection", pt, None, None) is None


def test_evidence_rows_carry_units():
    rows = dict(views.evidence_rows({"exposed_ns": 9389000.0, "exposed_share": 0.5, "link_bytes_per_s": 3e11,
                                     "steps": [10], "group_size": None, "message_bytes": 4.0e6}))
    assert rows == {"exposed_ns": "9.39 ms", "exposed_share": "50.0 %", "link_bytes_per_s": "300 GB/s",
                    "steps": "10", "group_size": "—", "message_bytes": "4 MB"}


def test_roofline_y_axis_reads_in_flop_per_s_at_every_decade(qwen):
    # one unit style on the axis (not Plotly's mix of "100T" and "10^15"): every power of ten
    # in the visible range, labelled as FLOP/s; the H100's bf16 peak (989 TFLOP/s) is inside it
    fig = figures.roofline_figure(qwen.ops, qwen.chip)
    ax = fig.layout.yaxis
    lo, hi = (10 ** v for v in ax.range)
    assert list(ax.tickvals) == [10.0 ** k for k in range(math.ceil(math.log10(lo)), math.floor(math.log10(hi)) + 1)]
    assert "1 PFLOP/s" in ax.ticktext and all(t.endswith("FLOP/s") for t in ax.ticktext)
