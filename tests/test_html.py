"""``--format html``: one self-contained page, checked as text and in headless chromium.

The browser test is marked ``browser`` and follows ``tests/test_web_browser.py``'s rule:
Debian's chromium driven by Playwright (``.ci/browser-deps.sh``), skipped locally without
them and FAILING in CI. Its screenshot goes to ``test-artifacts/html-report.png``.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from html import escape

import pytest
from click.testing import CliRunner
from conftest import REPO, real

from traceroof import analyze, read_trace
from traceroof.cli import cli
from traceroof.render import html as html_render
from traceroof.render import sections

QWEN = "TraceLens/tests/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
ARTIFACTS = REPO / "test-artifacts"


@pytest.fixture(scope="module")
def qwen():
    return analyze(read_trace(real(QWEN)))


@pytest.fixture(scope="module")
def page_html(qwen):
    return html_render.render(qwen, top=20)


def _label(o: dict) -> str:
    """The ranking label by hand: the framework op, else the kernel; copies keep their name."""
    return o["name"] if str(o["kind"]) in ("memcpy", "memset") or o["op"] is None else o["op"]


def test_page_is_self_contained(page_html):
    from plotly.offline import get_plotlyjs

    assert page_html.startswith("<!DOCTYPE html>")
    assert get_plotlyjs() in page_html  # plotly.js inlined, once
    assert page_html.count(get_plotlyjs()[:200]) == 1
    # nothing is fetched: no external script, stylesheet, image or font
    assert not re.search(r"<script[^>]*\bsrc=", page_html)
    assert not re.search(r"<link\b", page_html) and not re.search(r"<img[^>]*\bsrc=\"?https?:", page_html)
    assert "@import" not in page_html.split("<script", 1)[0]


def test_page_holds_headline_ranked_ops_findings_and_figures(qwen, page_html):
    for k, v in sections.header(qwen) + sections.summary(qwen):
        assert f"<th>{escape(k)}</th><td>{escape(v)}</td>" in page_html, k
    # the first ranked op is the label that loses the most time, summed here by hand over costed ops
    gap = defaultdict(float)
    for o in qwen.ops.to_dicts():
        if o["gap_ns"] is not None:
            gap[_label(o)] += o["gap_ns"]
    top = max(gap, key=gap.get)
    ranked = page_html.split("<h2>Top 20 ops", 1)[1].split("</table>", 1)[0]
    assert ranked.count("<tr>") == 1 + 20  # the header and 20 rows (the trace has more op groups)
    assert ranked.split("<tbody><tr><td>", 1)[1].startswith(escape(top))
    left = qwen.ranking.height - 20
    assert left > 0 and f"({left} more row{'s' if left != 1 else ''} in the JSON report)" in page_html
    assert page_html.count("<details><summary>#") == len(qwen.findings) == 3
    for f in qwen.findings:
        assert escape(f.explanation) in page_html
    for w in qwen.warnings:
        assert f"<li>{escape(w)}</li>" in page_html
    titles = re.findall(r'<div class="fig" data-figure="([^"]+)">', page_html)
    assert titles == ["Roofline", "Timeline (rank 0 · step 6)", "Steps", "From the measured step to its speed of light"]


def test_cli_picks_html_from_the_suffix(example_trace, tmp_path):
    out = tmp_path / "r.html"
    res = CliRunner().invoke(cli, ["analyze", str(example_trace), "-o", str(out), "-q"])
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert text.startswith("<!DOCTYPE html>") and "example_h100_decoder.json.gz" in text
    assert "html" in CliRunner().invoke(cli, ["analyze", "--help"]).output


def test_without_plotly_html_is_a_usage_error(example_trace, tmp_path):
    import subprocess
    import sys

    code = ("import sys; sys.modules['plotly'] = None; from traceroof.cli import main; "
            f"main(['analyze', {str(example_trace)!r}, '-q', '--format', 'html'])")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip() == "traceroof: error: --format html needs plotly (plotly is missing): pip install 'traceroof[web]'"


def test_summary_fragment_is_what_a_notebook_shows(qwen):
    frag = qwen._repr_html_()
    assert frag.startswith('<div class="traceroof-report">') and "<script" not in frag
    assert "<h2>Top 10 ops by time lost against the roofline</h2>" in frag
    assert frag.count("<tr>") == len(sections.header(qwen) + sections.summary(qwen)) + 1 + 10
    n = len(qwen.warnings)
    assert f"{n} warning{'s' if n != 1 else ''}: {escape(qwen.warnings[0])}" in frag


# --------------------------------------------------------------------- browser
@pytest.mark.browser
def test_page_renders_in_chromium_with_every_chart_drawn(qwen, page_html, tmp_path, offline_page):
    pg = offline_page  # offline: nothing may be fetched
    path = tmp_path / "report.html"
    path.write_text(page_html)
    pg.goto(path.as_uri())
    pg.wait_for_function("() => document.querySelectorAll('.js-plotly-plot .main-svg').length >= 4", timeout=60_000)
    pg.wait_for_timeout(300)
    drawn = pg.evaluate("() => [...document.querySelectorAll('.js-plotly-plot')].map(g => ({"
                        "roles: g.data.map(t => (t.meta || {}).role), "
                        "points: g.data.filter(t => (t.meta || {}).role === 'ops').reduce((n, t) => n + t.x.length, 0), "
                        "bars: g.querySelectorAll('.bars .point, .waterfall .point').length}))")
    ARTIFACTS.mkdir(exist_ok=True)
    pg.screenshot(path=str(ARTIFACTS / "html-report.png"), full_page=True)
    assert pg.errors == []
    assert len(drawn) == 4
    roof, timeline, steps, waterfall = drawn
    assert {"hbm", "roof", "ridge", "ops"} <= set(roof["roles"])
    # one point per op group with FLOPs and bytes, counted here by hand from the op table
    placeable = {_label(o) for o in qwen.ops.to_dicts() if (o["flops"] or 0) > 0 and (o["bytes"] or 0) > 0}
    assert roof["points"] == len(placeable) == 16
    assert "bars" in timeline["roles"] and timeline["bars"] > 0
    assert "breakdown" in steps["roles"]
    # the speed-of-light waterfall: the measured step, one bar per term (findings past the
    # dashboard's top summed into one), the speed of light
    from traceroof.web.light_view import bars

    assert waterfall["roles"] == ["waterfall"] and waterfall["bars"] == len(bars(qwen.speed_of_light)) > 2
