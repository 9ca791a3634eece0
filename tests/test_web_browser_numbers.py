"""The dashboard's numbers as chromium draws them (issue 17, item 8), on the generated 92 s
trace (``fixtures/make_long_trace.py``) and the real Qwen H100 trace: what a reader sees in
the table cells and on the axes, not what the figure objects hold.

Marked ``browser`` (see tests/test_web_browser.py: Debian's chromium via Playwright; skipped
locally without it, failing in CI). A screenshot of each page goes to ``test-artifacts/``.
"""

from __future__ import annotations

import re

import pytest
from conftest import real

pytest.importorskip("dash", reason="the web extra (dash, plotly) is not installed")

import make_long_trace  # noqa: E402
import test_web_browser as twb  # noqa: E402
from test_web_app import start_serve, stop  # noqa: E402
from test_web_browser import QWEN, open_dashboard, open_tab, role, shot, wait_graph  # noqa: E402
from test_web_numbers import mover_oracle  # noqa: E402

browser = twb.browser  # the session's chromium and a fresh page per test (tests/test_web_browser.py)
page = twb.page

pytestmark = [pytest.mark.browser,
              pytest.mark.filterwarnings("ignore:\\s*The dash_table.DataTable will be removed:DeprecationWarning")]

#: a number in scientific notation as d3 or Python writes it: 7.777e+7, 1e-5
SCI = re.compile(r"\d[eE][+-]?\d")
TICKS_JS = ("(id) => Array.from(document.querySelectorAll('#' + id + ' .xtick text, #' + id + ' .ytick text'))"
            ".map(t => t.textContent)")
AXIS_TITLES_JS = ("(id) => Array.from(document.querySelectorAll('#' + id + ' .g-xtitle, #' + id + ' .g-ytitle'))"
                  ".map(t => t.textContent)")


@pytest.fixture(scope="module")
def long_server(tmp_path_factory):
    path = tmp_path_factory.mktemp("long") / "long_h100.json.gz"
    built = make_long_trace.build(path)
    proc, url = start_serve(str(path))
    yield url, built
    stop(proc)


def test_a_92_s_trace_reads_in_seconds_in_every_tab(page, long_server):
    url, built = long_server
    open_dashboard(page, url)
    bw = wait_graph(page, "bandwidth-graph")
    # the copy group (bytes, no FLOPs) is on the bandwidth panel, the GEMM on the roofline
    assert [lab for t in role(bw, "movers") for lab in t["customdata"]] == ["Memcpy HtoD (Pinned -> Device)"]
    ticks = page.evaluate(TICKS_JS, "roofline-graph") + page.evaluate(TICKS_JS, "bandwidth-graph")
    assert ticks and not [t for t in ticks if SCI.search(t) or "^" in t]
    assert "10 GB/s" in page.evaluate(TICKS_JS, "bandwidth-graph")  # 10.67 GB/s sits above it
    page.wait_for_timeout(300)
    page.screenshot(path="/tmp/s-dashboard.png", full_page=True)
    shot(page, "long-roofline")

    open_tab(page, "Ops")
    page.wait_for_selector("#ops-table td[data-dash-column='label']")
    headers = page.locator("#ops-table th").all_inner_texts()
    assert any(h.strip().startswith("total (s)") for h in headers), headers
    cells = page.locator("#ops-table td").all_inner_texts()
    assert cells and not [c for c in cells if SCI.search(c)]
    # aten::mm: 2 × 40 s; its roofline time 2 × 2·8192³ / 989.4e12 s = 0.002223 s (4 significant digits)
    mm_total = page.locator("#ops-table td[data-dash-column='total_s']").first.inner_text()
    assert mm_total == "80"
    assert page.locator("#ops-table td[data-dash-column='expected_s']").first.inner_text() == "0.002223"
    summary = page.locator("#ops-summary").inner_text()
    assert "92 s of device time" in summary  # 2 × (40 + 6) s
    shot(page, "long-ops")

    open_tab(page, "Timeline")
    wait_graph(page, "timeline-graph")
    assert "time since trace start (s)" in page.evaluate(AXIS_TITLES_JS, "timeline-graph")
    xt = page.evaluate("() => Array.from(document.querySelectorAll('#timeline-graph .xtick text'))"
                       ".map(t => t.textContent)")
    # plain seconds (0, 20, 40 ...): no '20k', no exponent
    assert xt and all(re.fullmatch(r"[\d,.]+", t) for t in xt), xt
    assert max(float(t.replace(",", "")) for t in xt) <= 100  # 92 s, not 92,000 ms
    shot(page, "long-timeline")

    open_tab(page, "Steps")
    wait_graph(page, "steps-graph")
    assert "time (s)" in page.evaluate(AXIS_TITLES_JS, "steps-graph")
    assert page.errors == []


def test_qwen_roofline_has_the_bandwidth_panel(page):
    from traceroof import analyze, read_trace

    oracle, share = mover_oracle(analyze(read_trace(real(QWEN))).ops)
    proc, url = start_serve(str(real(QWEN)))
    try:
        open_dashboard(page, url)
        bw = wait_graph(page, "bandwidth-graph")
        assert sum(t["n"] for t in role(bw, "movers")) == bw["layout"]["meta"]["points"] == len(oracle) == 5
        roof_text = page.evaluate("() => document.querySelector('#roofline-graph .main-svg').parentNode.textContent")
        said = f"5 groups ({100 * share:.1f} % of device time) move bytes with no FLOPs: on the bandwidth panel below"
        assert said in roof_text
        page.wait_for_timeout(300)
        page.screenshot(path="/tmp/s-dashboard-qwen.png", full_page=True)
        shot(page, "qwen-roofline-bandwidth")
        open_tab(page, "Ops")
        page.wait_for_selector("#ops-table td[data-dash-column='label']")
        cells = page.locator("#ops-table td").all_inner_texts()
        assert cells and not [c for c in cells if SCI.search(c)]
        shot(page, "qwen-ops-numbers")
        assert page.errors == []
    finally:
        stop(proc)
