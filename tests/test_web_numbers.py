"""The dashboard's numbers (issue 17, item 8): every number with its unit and a sensible
precision, one unit per table column or axis, no scientific notation, decade ticks in one
notation, no peak dtype where no peak was used, and the memory movers on the roofline view.

Oracles: hand arithmetic in comments, the generated 92 s trace's own constants
(``fixtures/make_long_trace.py``: what it wrote, not what traceroof read), and sums over the
real Qwen trace's op table computed here with plain loops.
"""

from __future__ import annotations

import math
from collections import defaultdict

import polars as pl
import pytest
from conftest import real

pytest.importorskip("dash", reason="the web extra (dash, plotly) is not installed")

import make_long_trace  # noqa: E402

from traceroof import analyze, read_trace  # noqa: E402
from traceroof.web import bandwidth, figures, layout, numbers, views  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:\\s*The dash_table.DataTable will be removed:DeprecationWarning")

QWEN = "TraceLens/tests/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
TPU = "xprof/xprof/convert/test_xplanes/tpu_inference_2.xplane.pb"


@pytest.fixture(scope="module")
def long(tmp_path_factory):
    path = tmp_path_factory.mktemp("long") / "long_h100.json.gz"
    built = make_long_trace.build(path)
    return analyze(read_trace(path)), built


@pytest.fixture(scope="module")
def qwen():
    return analyze(read_trace(real(QWEN)))


def traces(fig, role):
    return [t for t in fig.data if (t.meta or {}).get("role") == role]


# --------------------------------------------------------------------- formatting
def test_plain_decimals_never_use_an_exponent():
    assert numbers.plain(77_770_000.0) == "77,770,000"   # Python's .4g: '7.777e+07'
    assert numbers.plain(0.0001234) == "0.000123"        # 3 significant digits
    assert numbers.plain(1234.56, 4) == "1,235"
    assert numbers.plain(999.96) == "1,000"              # rounds up across a decade
    assert numbers.plain(-12.5) == "-12.5" and numbers.plain(0.0) == "0"
    assert numbers.plain(None) == numbers.plain(float("nan")) == "—"


def test_the_unit_switches_at_ten_thousand_of_the_smaller_one():
    assert numbers.time_unit(9_999_999).name == "µs"      # 9,999.999 µs
    assert numbers.time_unit(10_000_000).name == "ms"     # 10 ms
    assert numbers.time_unit(9_999_999_999).name == "ms"  # 9,999.99 ms
    assert numbers.time_unit(92e9).name == "s"
    assert numbers.time_unit(None).name == "µs"
    # a window's decimals show its length: 7.635 ms long -> 2 decimals of ms
    assert numbers.window_text(3_101_000, 10_736_000) == "3.10–10.74 ms"
    # 100 µs at 91 s: 0.0001 s -> 6 decimals
    assert numbers.window_text(91_234_500_000, 91_234_600_000) == "91.234500–91.234600 s"


def test_log_ticks_sit_at_every_decade_in_one_notation():
    t = numbers.log_ticks(0.03, 4000)
    assert t["tickvals"] == [0.1, 1.0, 10.0, 100.0, 1000.0]
    assert t["ticktext"] == ["0.1", "1", "10", "100", "1,000"]


# --------------------------------------------------------------------- a 92 s trace
def test_a_92_s_trace_reads_in_seconds_in_the_table(long):
    report, built = long
    g = views.op_groups(report.ops)
    unit = views.table_unit(g)
    assert unit.name == "s"  # the largest group: 2 GEMMs × 40 s = 80 s
    recs = {r["id"]: r for r in views.table_records(g, unit=unit)}
    mm = recs["aten::mm"]
    assert mm["total_s"] == pytest.approx(built["steps"] * built["gemm_ns"] / 1e9) == pytest.approx(80.0)
    copy = recs["Memcpy HtoD (Pinned -> Device)"]
    assert copy["measured_s"] == pytest.approx(12.0)  # 2 × 6 s
    cols = views.table_columns(unit)
    assert ("total_s", "total (s)", "time") in cols and ("gap_s", "gap (s)", "time") in cols
    # every id the records carry is a column, and every number column has a format
    assert set(mm) - {"id"} == {c for c, _, _ in cols}
    # d3 specifiers: ~r (significant digits, plain decimals), d, f: never e or g
    assert all(f[-1] in "rdf" for f in views.TABLE_FORMATS.values())
    # total device time from what the builder wrote: 2 × (40 s + 6 s) = 92 s
    total_ns = sum(k["dur_ns"] for k in built["kernels"])
    assert total_ns == 92_000_000_000
    line = views.table_summary(g, report.ops)
    assert "4 ops" in line and "92 s of device time" in line and "ms" not in line


def test_the_table_unit_follows_the_data(qwen):
    # Qwen's largest group (aten::mul) is 6.75 ms: below 10 ms, so the columns stay in µs
    g = views.op_groups(qwen.ops)
    biggest = max(float(g[c].abs().max()) for c in ("total_ns", "measured_ns", "expected_ns", "gap_ns"))
    assert biggest < 10_000_000 and views.table_unit(g).name == "µs"
    r = next(r for r in views.table_records(g) if r["id"] == "aten::mm")
    row = g.filter(pl.col("label") == "aten::mm").row(0, named=True)
    assert math.isclose(r["gap_us"], row["gap_ns"] / 1e3)


def test_the_ops_tab_columns_carry_the_unit_and_plain_formats(long):
    report, _ = long
    tab = layout.ops_tab(report, {"table_unit": numbers.SECONDS})
    table = next(c for c in _walk(tab) if getattr(c, "id", None) == "ops-table")
    by_id = {c["id"]: c for c in table.columns}
    assert by_id["measured_s"]["name"] == "measured (s)"
    assert by_id["measured_s"]["format"] == {"specifier": ",.4~r"}
    assert by_id["efficiency_pct"]["format"] == {"specifier": ",.3~r"}  # 0.00278 %, not 0.0


def test_the_timeline_of_a_92_s_trace_is_in_seconds_without_si_suffixes(long):
    report, built = long
    fig = figures.timeline_figure(report.ops)
    assert fig.layout.xaxis.title.text == "time since trace start (s)"
    assert fig.layout.xaxis.exponentformat == "none" and fig.layout.meta["x_unit"] == "s"
    # each bar's base and length is the op's start and duration in s
    starts = sorted(b for t in traces(fig, "bars") for b in t.base)
    lengths = sorted(x for t in traces(fig, "bars") for x in t.x)
    assert lengths == pytest.approx(sorted([6.0, 6.0, 40.0, 40.0]))
    assert starts == pytest.approx(sorted(k["start_ns"] / 1e9 for k in built["kernels"]))
    # a zoom's range comes back in s: 10 s to 20 s is 1e10 to 2e10 ns
    zoom = {"xaxis.range[0]": 10, "xaxis.range[1]": 20}
    assert views.timeline_window(["timeline-graph.relayoutData"], None, zoom, None, n_ops=10, max_bars=5,
                                 unit_ns=views.timeline_unit(report.ops).ns) == [1e10, 2e10]


def test_the_steps_figure_picks_its_unit(long):
    report, _ = long
    fig = figures.steps_figure(report.steps)
    assert fig.layout.yaxis.title.text == "time (s)" and fig.layout.yaxis.exponentformat == "none"
    # each step's stacked parts add up to its wall time, in s (46 s a step)
    parts = [t for t in traces(fig, "breakdown")]
    per_step = [sum(t.y[i] for t in parts) for i in range(len(parts[0].y))]
    walls = [w / 1e9 for w in report.steps["wall_ns"].to_list()]
    assert per_step == pytest.approx(walls) and walls == pytest.approx([46.0, 46.0], rel=1e-6)


# --------------------------------------------------------------------- peak dtype
def test_no_peak_dtype_where_no_peak_was_used(qwen, long):
    # a copy has no FLOPs: no peak was used, whatever dtype the op table carries
    report, _ = long
    g = views.op_groups(report.ops)
    assert report.ops.filter(pl.col("kind") == "memcpy")["peak_dtype"].to_list() == ["fp32", "fp32"]
    assert g.filter(pl.col("label") == "Memcpy HtoD (Pinned -> Device)")["peak_dtype"].to_list() == [None]
    assert g.filter(pl.col("label") == "aten::mm")["peak_dtype"].to_list() == ["bf16"]
    # Qwen: the groups with a peak dtype are exactly those with an op of FLOPs > 0 and a peak
    with_peak = {r["op"] if r["op"] is not None and str(r["kind"]) not in ("memcpy", "memset") else r["name"]
                 for r in qwen.ops.iter_rows(named=True)
                 if (r["flops"] or 0) > 0 and r["peak_flops_per_s"] is not None}
    gq = views.op_groups(qwen.ops)
    assert set(gq.filter(pl.col("peak_dtype").is_not_null())["label"].to_list()) == with_peak


def test_a_tpu_with_no_fp32_peak_shows_no_fp32_peak_dtype():
    r = analyze(read_trace(real(TPU)))
    assert "fp32" not in r.chip.peak_flops_per_s
    # the op table says fp32 for every op but no op got a peak (the chip has none for it)
    assert set(r.ops["peak_dtype"].to_list()) == {"fp32"} and r.ops["peak_flops_per_s"].null_count() == r.ops.height
    g = views.op_groups(r.ops)
    assert g.height > 0 and g["peak_dtype"].null_count() == g.height


# --------------------------------------------------------------------- memory movers
def mover_oracle(ops: pl.DataFrame) -> tuple[dict[str, float], float]:
    """Per label, the achieved bandwidth (B/s) of its ops with bytes > 0 and FLOPs zero or
    unknown, for the groups with no op having both FLOPs > 0 and bytes > 0 (the roofline's
    points); and those groups' share of the device time. Plain loops over the op table."""
    mover, placed, share = defaultdict(lambda: [0.0, 0.0]), set(), defaultdict(float)
    for r in ops.iter_rows(named=True):
        label = r["op"] if r["op"] is not None and str(r["kind"]) not in ("memcpy", "memset") else r["name"]
        share[label] += r["dur_ns"]
        if (r["flops"] or 0) > 0 and (r["bytes"] or 0) > 0 and r["dur_ns"] > 0:
            placed.add(label)
        if (r["bytes"] or 0) > 0 and not (r["flops"] or 0):
            mover[label][0] += r["bytes"]
            mover[label][1] += r["dur_ns"]
    oracle = {k: v[0] / (v[1] * 1e-9) for k, v in mover.items() if k not in placed and v[1] > 0}
    return oracle, sum(share[k] for k in oracle) / sum(share.values())


def test_memory_movers_get_the_bandwidth_panel(qwen):
    oracle, moved_share = mover_oracle(qwen.ops)
    fig = bandwidth.bandwidth_figure(qwen.ops, qwen.chip)
    pts = {lab: x for t in traces(fig, "movers") for lab, x in zip(t.customdata, t.x)}
    assert pts.keys() == oracle.keys() and len(pts) == 5 == fig.layout.meta["points"]
    for lab, bw in oracle.items():
        assert math.isclose(pts[lab], bw, rel_tol=1e-9)
    assert math.isclose(fig.layout.meta["share"], moved_share, rel_tol=1e-9)
    # the HBM line at the H100's 3.35 TB/s, and the axis in B/s at every decade
    (line,) = fig.layout.shapes
    assert line.x0 == line.x1 == fig.layout.meta["hbm_bytes_per_s"] == 3.35e12 and (line.y0, line.y1) == (0, 1)
    assert all(t.endswith("B/s") for t in fig.layout.xaxis.ticktext)
    # the roofline's note points there, with the same count
    note = figures.roofline_figure(qwen.ops, qwen.chip).layout.title.subtitle.text
    assert "; 5 groups (" in note and "move bytes with no FLOPs: on the bandwidth panel below" in note


def test_the_bandwidth_panel_of_the_long_trace(long):
    report, built = long
    fig = bandwidth.bandwidth_figure(report.ops, report.chip, selected="Memcpy HtoD (Pinned -> Device)")
    (pts,) = traces(fig, "movers")
    # 2 × 64e9 B over 2 × 6 s = 10.67 GB/s
    assert pts.x[0] == pytest.approx(built["copy_bytes"] / (built["copy_ns"] / 1e9))
    assert "10.67 GB/s" in pts.text[0] and "0.3 % of HBM" in pts.text[0]  # 10.67e9 / 3.35e12 = 0.32 %
    assert traces(fig, "selected")[0].meta["label"] == "Memcpy HtoD (Pinned -> Device)"
    # a selection with no movers says so instead of an empty chart
    only_mm = report.ops.filter(pl.col("kind") == "matmul")
    empty = bandwidth.bandwidth_figure(only_mm, report.chip)
    assert empty.layout.meta["points"] == 0 and "No op moves bytes" in empty.layout.annotations[0].text


def test_a_bandwidth_click_selects_its_group():
    pt = {"points": [{"customdata": "Memcpy DtoD (Device -> Device)", "x": 1e11, "y": "memcpy"}]}
    assert views.selection_from_event("bandwidth-graph", None, None, None, pt) == "Memcpy DtoD (Device -> Device)"


def test_roofline_x_ticks_are_plain_decades(qwen):
    ax = figures.roofline_figure(qwen.ops, qwen.chip).layout.xaxis
    lo, hi = (10 ** v for v in ax.range)
    assert list(ax.tickvals) == [10.0 ** k for k in range(math.ceil(math.log10(lo)), math.floor(math.log10(hi)) + 1)]
    assert all("e" not in t and "^" not in t for t in ax.ticktext)


def _walk(c):
    yield c
    kids = getattr(c, "children", None)
    if kids is None:
        return
    for k in kids if isinstance(kids, (list, tuple)) else [kids]:
        if hasattr(k, "to_plotly_json"):
            yield from _walk(k)


def test_a_saved_ranking_without_ops_reads_in_the_same_unit(long, tmp_path):
    from traceroof.report import Report

    report, built = long
    p = tmp_path / "no_ops.json"
    report.save(p, include_ops=False)
    saved = Report.load(p)
    assert saved.ops is None
    table = next(c for c in _walk(layout.tabs(saved)) if getattr(c, "id", None) == "ranking-table")
    names = {c["id"]: c["name"] for c in table.columns}
    assert names["measured_s"] == "measured (s)" and "measured_ns" not in names
    mm = next(r for r in table.data if r["label"] == "aten::mm")
    assert mm["measured_s"] == pytest.approx(built["steps"] * built["gemm_ns"] / 1e9)  # 2 × 40 s
    assert all(c["format"]["specifier"][-1] in "rdf" for c in table.columns if "format" in c)
