"""Notebooks: ``Report._repr_html_``, ``report.figures`` and ``docs/notebook.ipynb`` run by a kernel.

The notebook is executed with nbclient on an ipykernel (the ``test`` extra); its figures
are then drawn in headless chromium (marked ``browser``; skipped locally without chromium,
failing in CI, as in ``tests/test_web_browser.py``), screenshot in ``test-artifacts/``.
"""

from __future__ import annotations

import json
import os

import pytest
from conftest import FIXTURES, REPO

from traceroof import analyze, read_trace

NOTEBOOK = REPO / "docs" / "notebook.ipynb"
ARTIFACTS = REPO / "test-artifacts"


@pytest.fixture(scope="module")
def example():
    return analyze(read_trace(FIXTURES / "example_h100_decoder.json.gz"), chip="h100")


@pytest.fixture(scope="module")
def executed():
    import nbclient
    import nbformat

    nb = nbformat.read(NOTEBOOK, as_version=4)
    env = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(REPO) + (os.pathsep + env if env else "")  # the kernel imports this checkout
    try:
        nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    finally:
        if env is None:
            os.environ.pop("PYTHONPATH")
        else:
            os.environ["PYTHONPATH"] = env
    return nb


def _outputs(nb) -> list[dict]:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]


def test_waterfall_terms_add_up_to_the_sum_of_expected_op_times(example):
    fig = example.figures.waterfall()
    meta = fig.layout.meta
    # the default step is the lower median of the complete steps' walls: 2,467,964 (step 2),
    # 2,526,464 (step 0), 2,526,464 (step 1) ns (make_example.py) → index 1 → step 0, the first of equals
    assert meta["step"] == "rank 0 · step 0"
    terms = meta["terms_ns"]
    assert terms["step wall time"] == 2_532_964 - 6_500
    ops = [o for o in example.ops.to_dicts() if o["step"] == 0]
    assert terms["idle, net of stream overlap"] == sum(o["dur_ns"] for o in ops) - (2_532_964 - 6_500)
    want = sum(o["expected_ns"] for o in ops if o["expected_ns"] is not None)
    assert sum(terms.values()) == pytest.approx(want, rel=1e-12) and meta["total_ns"] == pytest.approx(want, rel=1e-12)
    for kind in {str(o["kind"]) for o in ops}:
        gap = sum(o["gap_ns"] for o in ops if str(o["kind"]) == kind and o["gap_ns"] is not None)
        assert terms[f"gap of {kind} ops"] == pytest.approx(-gap, rel=1e-12)
    # the bars plotly draws are these terms (ms); the total bar is computed by plotly from them
    w = fig.data[0]
    assert list(w.measure) == ["absolute"] + ["relative"] * (len(terms) - 1) + ["total"]
    assert [round(v * 1e6, 3) for v in w.y[:-1]] == [round(v, 3) for v in terms.values()]


def test_figures_are_plotly_figures_of_the_report(example):
    import plotly.graph_objects as go

    figs = example.figures
    roof, tl, steps = figs.roofline(), figs.timeline(), figs.steps()
    assert all(isinstance(f, go.Figure) for f in (roof, tl, steps))
    assert {t.meta["role"] for t in roof.data} >= {"hbm", "roof", "ridge", "ops"}
    # the default timeline is step 0's ops (the median step): 84 of the example's 252 ops (3 equal steps)
    assert tl.layout.meta["ops_in_view"] == sum(o["step"] == 0 for o in example.ops.to_dicts()) == 84
    assert figs.timeline(all_steps=True).layout.meta["ops_in_view"] == 252
    assert steps.layout.meta["steps"] == 3


def test_the_example_notebook_runs(executed, example):
    outs = _outputs(executed)
    assert not [o for o in outs if o.output_type == "error"]
    html = outs[0]["data"]["text/html"]
    name = "example_h100_decoder.json.gz"  # read there as ../fixtures/NAME (the notebook runs in docs/)
    assert html == example._repr_html_().replace(str(FIXTURES / name), f"../fixtures/{name}")  # headline, top ops
    assert "Top 10 ops by time lost against the roofline" in html and "HFU" in html
    plots = [o["data"]["application/vnd.plotly.v1+json"] for o in outs if "application/vnd.plotly.v1+json" in o.get("data", {})]
    assert [p["layout"]["title"]["text"].split(" · ")[0] for p in plots] == ["Roofline", "Timeline", "Waterfall", "Steps"]
    want = example.figures.waterfall().layout.meta["total_ns"]
    assert plots[2]["layout"]["meta"]["total_ns"] == pytest.approx(want, rel=1e-12)
    printed = outs[-1]["text"].splitlines()
    assert len(printed) == len(example.findings) == 5


@pytest.mark.browser
def test_notebook_figures_draw_in_chromium(executed, tmp_path, offline_page):
    from plotly.offline import get_plotlyjs

    plots = [o["data"]["application/vnd.plotly.v1+json"] for o in _outputs(executed)
             if "application/vnd.plotly.v1+json" in o.get("data", {})]
    divs = "".join(f'<div id="p{i}" style="height:520px"></div>' for i in range(len(plots)))
    calls = "".join(f"Plotly.newPlot('p{i}', {json.dumps(p['data'])}, {json.dumps(p['layout'])});" for i, p in enumerate(plots))
    page = tmp_path / "nb.html"
    page.write_text(f"<!DOCTYPE html><html><head><meta charset='utf-8'><script>{get_plotlyjs()}</script></head>"
                    f"<body>{divs}<script>{calls}</script></body></html>")
    pg = offline_page
    pg.goto(page.as_uri())
    pg.wait_for_function(f"() => document.querySelectorAll('.js-plotly-plot .main-svg').length >= {len(plots)}",
                         timeout=60_000)
    drawn = pg.evaluate("() => [...document.querySelectorAll('.js-plotly-plot')].map(g => "
                        "g.querySelectorAll('.point, .scatterlayer .trace').length)")
    ARTIFACTS.mkdir(exist_ok=True)
    pg.screenshot(path=str(ARTIFACTS / "notebook-figures.png"), full_page=True)
    assert pg.errors == []
    assert len(drawn) == 4 and all(n > 0 for n in drawn)


def test_light_is_the_speed_of_light_waterfall_and_its_steps_add_up(example):
    s = example.speed_of_light
    fig = example.figures.light()
    (w,) = fig.data
    # the steps down sum to speed of light − measured, exactly as the report's waterfall terms
    assert w.meta["down_ns"] == pytest.approx(s.speed_of_light_ns - s.measured_ns, abs=1e-6)
    assert list(w.measure)[0] == "absolute" and list(w.measure)[-1] == "total"
    assert w.y[0] == pytest.approx(s.measured_ns / 1e6) and w.y[-1] == pytest.approx(s.speed_of_light_ns / 1e6)
