"""`traceroof serve --live HOST:PORT` against a real jax program on loopback, in headless
chromium (Playwright, as tests/test_web_browser.py): at least two refreshes, the history
strip growing with them, a failed capture shown with its cause while the last good one
stays. Screenshot: /tmp/v-live.png."""

from __future__ import annotations

import re
import sys
import time

import pytest

pytest.importorskip("dash", reason="the web extra (dash, plotly) is not installed")

from live_helpers import JAX_TARGET, Processes, gpu_trace, kill_group  # noqa: E402
from test_web_app import wait_until_up  # noqa: E402

from traceroof.analysis import load_report  # noqa: E402
from traceroof.web.live import LiveState, Watcher, history_figure  # noqa: E402

pytestmark = [pytest.mark.browser]

#: the status line's text, or null before Dash rendered the page
STATUS_JS = "(document.querySelector('#live-status') || {}).innerText"
HISTORY_JS = ("() => { const g = document.querySelector('#live-history .js-plotly-plot');"
              " return g && g.data ? g.data.map(t => (t.y || []).length) : null; }")


@pytest.fixture
def procs(tmp_path):
    ps = Processes(tmp_path)
    yield ps
    ps.stop_all()


def _serve_live(procs: Processes, port: int):
    p = procs.popen([sys.executable, "-m", "traceroof.cli", "serve", "--live", f"127.0.0.1:{port}",
                     "--every", "1", "--duration", "0.5", "--chip", "h100", "--port", "0"])
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        assert line, f"serve ended: {p.stderr.read()}"
        m = re.search(r"(http://\S+/)", line)
        if m:
            wait_until_up(m.group(1), deadline)  # printed just before the server binds
            return p, m.group(1)
    raise AssertionError("serve --live printed no URL")


def _captures(pg) -> int:
    text = pg.locator("#live-status").inner_text()
    m = re.search(r"(\d+) captures", text)
    return int(m.group(1)) if m else -1


def test_live_dashboard_refreshes_and_keeps_the_last_good_capture(procs, page):
    port, _, target = procs.jax_target("steps")
    serve, url = _serve_live(procs, port)
    page.goto(url)
    # two good captures at least: the status counts them and the strip has a point per capture
    page.wait_for_function(f"() => {STATUS_JS} && /([2-9]|\\d\\d+) captures/.test({STATUS_JS})",
                           timeout=120_000)
    page.wait_for_function(f"() => {{ const n = ({HISTORY_JS})(); return n && n[0] >= 2; }}",
                           timeout=60_000)
    n = _captures(page)
    points = page.evaluate(HISTORY_JS)
    assert points == [points[0]] * 3 and 2 <= points[0] <= n + 1  # step time, busy, HFU
    assert page.locator("#live-roofline .js-plotly-plot").count() == 1
    ranking = page.locator("#live-ranking").inner_text()
    assert "fusion" in ranking  # the jitted step's HLO ops are ranked
    line = procs.tmp / "jax_target.py"  # each row leads back to the jitted function's line
    assert f"{line}:{JAX_TARGET.splitlines().index('    return jnp.tanh(x @ x) * 0.5') + 1}" in ranking
    page.screenshot(path="/tmp/v-live.png", full_page=True)
    # the target goes away: the next capture fails, its cause is shown, the last good one stays
    kill_group(target)
    page.wait_for_function(f"() => ({STATUS_JS} || '').includes('last failed')", timeout=60_000)
    status = page.locator("#live-status").inner_text()
    # which cause depends on when the next capture starts: the port already closed (the TCP
    # check: "connection refused"), closed between that check and the gRPC call (a loaded
    # machine: "no profiler server answers"), or closed during the window
    assert any(s in status for s in ("connection refused", "no profiler server answers",
                                     "closed the connection")), status
    assert "showing the last good one" in status
    kept, good = page.locator("#live-ranking").inner_text(), _captures(page)
    assert "fusion" in kept
    failed = int(re.search(r"(\d+) failed", status).group(1))
    page.wait_for_function(f"(f) => {{ const m = /(\\d+) failed/.exec({STATUS_JS} || ''); "
                           "return m && +m[1] > f; }", arg=failed, timeout=60_000)
    # another capture failed since: the page still shows the same last good capture
    assert page.locator("#live-ranking").inner_text() == kept and _captures(page) == good
    page.screenshot(path="/tmp/v-live-failed.png", full_page=True)
    kill_group(serve)


def test_history_figure_has_gaps_for_unknown_numbers():
    state = LiveState()
    state.history.names[:] = ["capture 1", "capture 2"]
    state.history.step_time_ns[:] = [2e6, None]
    state.history.busy_fraction[:] = [0.5, 0.25]
    state.history.hfu[:] = [None, None]
    fig = history_figure(state.history)
    ys = [list(t.y) for t in fig.data]
    assert ys == [[2.0, None], [50.0, 25.0], [None, None]]  # ms and %, None stays a gap
    assert fig.layout.meta == {"captures": 2}


def test_serve_watch_feeds_each_landed_trace_to_the_page(tmp_path):
    """serve --watch's thread: two traces land, the second with steps ~3x longer; a broken
    one is a failure shown with its error, not a capture."""
    folder = tmp_path / "tb"
    folder.mkdir()
    gpu_trace(folder / "w.1.pt.trace.json", idle_ns=1_000_000)  # ~1.1 ms steps
    (folder / "w.2.pt.trace.json").write_text('{"traceEvents": [')
    gpu_trace(folder / "w.3.pt.trace.json", idle_ns=3_000_000)  # ~3.1 ms steps
    state = LiveState("traces")
    w = Watcher(state, str(folder), every_s=0.1, count=3,
                analyze=lambda p: load_report(str(p), "h100"))
    w.start()
    w.join(timeout=120)
    assert not w.is_alive()
    assert state.generation == 2 and state.failures == 1
    assert state.history.names == ["w.1.pt.trace.json", "w.3.pt.trace.json"]
    first, second = state.history.step_time_ns
    assert 2.5 < second / first < 3.5  # (3.0 + 0.1) / (1.0 + 0.1) = 2.8 by construction
    assert state.report.trace.sources == [str(folder / "w.3.pt.trace.json")]
    assert state.status().startswith("2 traces · 1 failed")


def test_history_strip_axes_are_plain_decimals_not_si_prefixes():
    # an HFU of 7.8e-7 (7.8e-5 %) drawn on a plotly axis with SI prefixes read "78µ" (%)
    from traceroof.watch import History
    from traceroof.web.live import history_figure

    fig = history_figure(History(names=["a", "b"], step_time_ns=[1e7, 2e7], busy_fraction=[0.003, 0.004],
                                 hfu=[7.7e-7, 7.8e-7]))
    ys = [fig.layout[k] for k in ("yaxis", "yaxis2", "yaxis3")]
    assert [(y.exponentformat, y.tickformat) for y in ys] == [("none", "~r")] * 3
    assert list(fig.data[2].y) == [7.7e-5, 7.8e-5]  # HFU in %, unknown never 0


def test_each_capture_shows_its_speed_of_light_waterfall():
    from conftest import FIXTURES

    from traceroof import analyze, read_trace
    from traceroof.web.live import body

    r = analyze(read_trace(FIXTURES / "example_h100_decoder.json.gz"), "h100")
    blocks = body(r)
    (overview,) = [b for b in blocks if getattr(b, "id", None) == "light-overview"]
    graph = overview.children[1]
    # the waterfall's steps down add up to speed of light − measured (traceroof.waterfall)
    (w,) = graph.figure.data
    s = r.speed_of_light
    assert w.meta["down_ns"] == pytest.approx(s.speed_of_light_ns - s.measured_ns, abs=1e-6)
