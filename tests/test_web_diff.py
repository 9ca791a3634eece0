"""The dashboard's speed-of-light waterfall and the diff view (``serve A --compare B``): the
figures' numbers against the report and the diff, then in headless chromium (screenshots to
test-artifacts/ and, for the issue note, /tmp/u-overview.png and /tmp/u-diff.png)."""

from __future__ import annotations

import shutil

import pytest
from conftest import REAL

pytest.importorskip("dash", reason="the web extra (dash, plotly) is not installed")

from test_web_app import start_serve, stop  # noqa: E402
from test_web_browser import ARTIFACTS, wait_graph  # noqa: E402

from traceroof.analysis import load_report  # noqa: E402
from traceroof.diff import compare  # noqa: E402
from traceroof.web import diff_view, light_view  # noqa: E402
from traceroof.web.app import create_app  # noqa: E402

HTA = REAL / "HolisticTraceAnalysis" / "tests" / "data" / "trace_diff"
CONTROL, TEST = HTA / "control" / "control.json.gz", HTA / "test" / "test.json.gz"


@pytest.fixture(scope="module")
def pair():
    return load_report(CONTROL, "a100", jobs=1), load_report(TEST, "a100", jobs=1)


def test_waterfall_figure_steps_down_to_the_speed_of_light(pair):
    a, _ = pair
    s = a.speed_of_light
    fig = light_view.waterfall_figure(a)
    t = fig.data[0]
    assert t.meta["role"] == "waterfall"
    assert t.measure[0] == "absolute" and t.measure[-1] == "total"
    # the steps down add up to speed of light − measured (ns; float sums of the per-step terms)
    assert t.meta["down_ns"] == pytest.approx(s.speed_of_light_ns - s.measured_ns, abs=1e-3)
    # every term is a bar, except the findings past the top 12, summed in one that says how many
    n_found = sum(1 for x in s.waterfall if x.source == "finding")
    assert len(t.x) == 2 + len(s.waterfall) - max(n_found - light_view.TOP_FINDINGS, 0) + (n_found > 12)
    assert f"{n_found - 12} more findings" in t.x


def test_diff_view_figures(pair):
    a, b = pair
    d = compare(a, b)
    w = diff_view.waterfall_figure(d).data[0]
    assert w.meta["delta_ns"] == pytest.approx(d.delta_ns, abs=1e-3)
    assert w.y[0] * 1e6 == pytest.approx(d.a.measured_ns) and w.y[-1] * 1e6 == pytest.approx(d.b.measured_ns)
    roles = [(t.meta or {}).get("role") for t in diff_view.roofline_figure(a, b).data]
    assert "ops" in roles and "ops-b" in roles  # A's and B's op groups in one chart
    assert len(diff_view.table_rows(d)) == len(d.ops)
    moved = diff_view.moved_figure(d).data[0]
    assert moved.meta["ops"] == min(diff_view.TOP, len(d.ops))
    assert moved.y[-1] == "CompiledFunctionBackward"  # the largest move, drawn on top


def test_overview_is_on_the_dashboard(pair):
    a, _ = pair
    html = create_app(a, str(CONTROL)).server.test_client().get("/_dash-layout").get_data(as_text=True)
    assert "waterfall-graph" in html and "light-overview" in html


@pytest.mark.browser
def test_browser_overview_and_compare_view(pair, page):
    a, b = pair
    d = compare(a, b)
    ARTIFACTS.mkdir(exist_ok=True)

    def overview(page):
        page.goto(url)
        page.locator("#light-overview summary").click()  # folded at first: the roofline stays on screen
        g = wait_graph(page, "waterfall-graph")
        page.wait_for_timeout(500)
        box = page.locator("#waterfall-graph").bounding_box()
        assert box["width"] > 1000 and box["height"] > 400  # sized when unfolded
        assert g["data"][0]["meta"]["role"] == "waterfall"
        assert "of light" in page.locator("#light-overview summary").inner_text()
        page.locator("#light-overview").screenshot(path=str(ARTIFACTS / "dashboard-light.png"))

    def compare_view(page):
        page.goto(url)
        w = wait_graph(page, "diff-waterfall-graph")
        assert w["data"][0]["meta"]["delta_ns"] == pytest.approx(d.delta_ns, abs=1e-3)
        r = wait_graph(page, "compare-roofline-graph")
        assert {"ops", "ops-b"} <= {(t["meta"] or {}).get("role") for t in r["data"]}
        wait_graph(page, "moved-graph")
        page.wait_for_selector("#compare-table td[data-dash-column='op']")
        assert page.locator("#compare-table td[data-dash-column='op']").first.inner_text() == d.ops[0].label
        assert "step 77.4 ms → 124 ms" in page.locator("#diff-headline").inner_text()
        page.screenshot(path=str(ARTIFACTS / "dashboard-diff.png"), full_page=True)

    proc, url = start_serve(str(CONTROL), "--chip", "a100")
    try:
        overview(page)
        assert page.errors == []
    finally:
        stop(proc)
    shutil.copy(ARTIFACTS / "dashboard-light.png", "/tmp/u-overview.png")
    proc, url = start_serve(str(CONTROL), "--chip", "a100", "--compare", str(TEST))
    try:
        compare_view(page)
        assert page.errors == []
    finally:
        stop(proc)
    shutil.copy(ARTIFACTS / "dashboard-diff.png", "/tmp/u-diff.png")
