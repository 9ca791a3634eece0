"""The Dash app and ``traceroof serve`` at the HTTP level (no browser): layout, callbacks
through Dash's own endpoint, saved reports, and errors shown in the page."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner
from conftest import real, write

pytest.importorskip("dash", reason="the web extra (dash, plotly) is not installed")
pytestmark = pytest.mark.filterwarnings("ignore:\\s*The dash_table.DataTable will be removed:DeprecationWarning")

from traceroof import analyze, read_trace  # noqa: E402
from traceroof.analysis import load_report  # noqa: E402
from traceroof.cli import cli  # noqa: E402
from traceroof.report import Report  # noqa: E402
from traceroof.web.app import create_app, load_app  # noqa: E402

QWEN = "TraceLens/tests/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
BAD_TRACE = b'{"traceEvents": [1, 2'  # cut before any event: nothing recoverable


@pytest.fixture(scope="module")
def qwen():
    return analyze(read_trace(real(QWEN)))


@pytest.fixture(scope="module")
def client(qwen):
    return create_app(qwen, str(real(QWEN))).server.test_client()


def page_text(client_or_url) -> str:
    """Every string in the served layout (Dash's JSON escapes '/' and non-ASCII characters)."""
    if isinstance(client_or_url, str):
        raw = urllib.request.urlopen(client_or_url + "_dash-layout", timeout=30).read()
    else:
        raw = client_or_url.get("/_dash-layout").get_data()
    out: list[str] = []

    def walk(x) -> None:
        if isinstance(x, str):
            out.append(x)
        elif isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(json.loads(raw))
    return "\n".join(out)


def _inp(i: str, p: str, v):
    return {"id": i, "property": p, "value": v}


def _table(client, kinds):
    body = {
        "output": "..ops-table.data...ops-summary.children..",
        "outputs": [{"id": "ops-table", "property": "data"}, {"id": "ops-summary", "property": "children"}],
        "inputs": [_inp("rank-select", "value", "all"), _inp("step-select", "value", "all"),
                   _inp("group-by", "value", "op"), _inp("kind-filter", "value", kinds),
                   _inp("bound-filter", "value", []), _inp("stream-filter", "value", []), _inp("selected", "data", None)],
        "changedPropIds": ["kind-filter.value"], "state": [],
    }
    res = client.post("/_dash-update-component", json=body)
    assert res.status_code == 200, res.data[:500]
    return res.get_json()["response"]


def test_page_layout_has_header_tabs_and_selectors(client):
    assert client.get("/").status_code == 200
    layout = page_text(client)
    for needle in ("Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz", "NVIDIA H100 SXM5 80GB", "bf16 989.4 TFLOP/s",
                   "3.35 TB/s", "cost coverage", "rank-select", "step-select", "roofline-graph", "ops-table",
                   "timeline-graph", "steps-graph", "Findings (", "no host launch"):
        assert needle in layout, needle
    deps = {d["output"] for d in client.get("/_dash-dependencies").get_json()}
    assert {"roofline-graph.figure", "steps-graph.figure", "selected.data", "download.data"} <= deps


def test_kind_filter_callback_changes_the_rows(client, qwen):
    everything = _table(client, [])
    mm = _table(client, ["matmul"])
    assert len(everything["ops-table"]["data"]) == qwen.ranking.height  # one row per ranked op group
    n_mm = qwen.ranking.filter(pl.col("kind") == "matmul").height  # aten::mm, addmm, bmm
    assert len(mm["ops-table"]["data"]) == n_mm == 3 and {r["kind"] for r in mm["ops-table"]["data"]} == {"matmul"}
    assert mm["ops-summary"]["children"].startswith(f"{n_mm} op groups · 242 ops")


def test_roofline_callback_returns_the_figure(client):
    body = {"output": "roofline-graph.figure", "outputs": {"id": "roofline-graph", "property": "figure"},
            "inputs": [_inp("rank-select", "value", "all"), _inp("step-select", "value", "6"),
                       _inp("group-by", "value", "op"), _inp("selected", "data", "aten::mm")],
            "changedPropIds": [], "state": []}
    fig = client.post("/_dash-update-component", json=body).get_json()["response"]["roofline-graph"]["figure"]
    roles = [t["meta"]["role"] for t in fig["data"]]
    assert roles.count("roof") == 5 and "selected" in roles and roles.count("ops") >= 3


def test_a_saved_report_serves_the_same_dashboard(qwen, tmp_path):
    p = tmp_path / "report.json"
    qwen.save(p)
    app, err = load_app(str(p), None, load_report)
    assert err is None
    layout = app.server.test_client().get("/_dash-layout").get_data(as_text=True)
    assert "roofline-graph" in layout and "report.json" in page_text(app.server.test_client())
    # a report saved without its op table still opens: steps and findings, a note instead of the roofline
    p2 = tmp_path / "no_ops.json"
    qwen.save(p2, include_ops=False)
    app2 = create_app(Report.load(p2), str(p2))
    text = app2.server.test_client().get("/_dash-layout").get_data(as_text=True)
    assert "saved without its op table" in text and "steps-graph" in text and "roofline-graph" not in text


def test_a_cpu_only_trace_opens_with_notes_instead_of_charts():
    r = analyze(read_trace(real("HolisticTraceAnalysis/tests/data/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz")))
    assert r.chip is None and r.ops.height == 0
    c = create_app(r, "cpu.json").server.test_client()
    assert c.get("/").status_code == 200
    assert "nothing to put against a roofline" in page_text(c)
    assert c.get("/_dash-dependencies").get_json() == []  # nothing to update: no callbacks


def test_bad_trace_shows_the_cli_error_line_in_the_page(tmp_path):
    bad = write(tmp_path, "broken.json", BAD_TRACE)
    res = CliRunner().invoke(cli, ["analyze", str(bad)])
    assert res.exit_code == 4
    line = res.stderr.strip()
    assert line.startswith("traceroof: error: ") and "broken.json" in line
    app, err = load_app(str(bad), None, load_report)
    assert err == line
    assert line in page_text(app.server.test_client()).splitlines()


def test_unknown_chip_is_shown_in_the_page_too(tmp_path):
    app, err = load_app(str(real(QWEN)), "no-such-chip", load_report)
    assert err is not None and err.startswith("traceroof: error: ") and "no-such-chip" in err


def test_serve_exits_at_once_on_a_missing_file_a_chip_with_a_report_or_a_busy_port(qwen, tmp_path):
    r = CliRunner()
    res = r.invoke(cli, ["serve", str(tmp_path / "nope.json")])
    assert res.exit_code == 3 and res.stderr.splitlines()[-1].startswith("traceroof: error: ")
    p = tmp_path / "report.json"
    qwen.save(p)
    res = r.invoke(cli, ["serve", str(p), "--chip", "h100"])
    assert res.exit_code == 2 and "--chip needs a trace" in res.stderr
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        res = r.invoke(cli, ["serve", str(p), "--port", str(port)])
    assert res.exit_code == 2 and f"cannot listen on 127.0.0.1:{port}" in res.stderr


def start_serve(*args: str) -> tuple[subprocess.Popen, str]:
    """``traceroof serve ARGS --port 0`` in a subprocess; returns it and the URL it printed."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "from traceroof.cli import main; main()", "serve", *args, "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.monotonic() + 120
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        m = re.search(r"(http://\S+/)", line)
        if m:
            wait_until_up(m.group(1), deadline)
            return proc, m.group(1)
    proc.kill()
    raise AssertionError(f"serve printed no URL; stderr: {proc.stderr.read() if proc.stderr else ''}")


def wait_until_up(url: str, deadline: float) -> None:
    """The URL is printed just before the server binds: poll until it answers."""
    while True:
        try:
            urllib.request.urlopen(url, timeout=5).read()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def stop(proc: subprocess.Popen) -> str:
    proc.terminate()
    try:
        _, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    return err


def test_serve_on_a_bad_trace_starts_and_serves_the_error(tmp_path):
    bad = write(tmp_path, "broken.json", BAD_TRACE)
    proc, url = start_serve(str(bad))
    try:
        assert url.startswith("http://127.0.0.1:")
        layout = page_text(url)
        assert "traceroof: error: " in layout and "broken.json" in layout and "none could be recovered" in layout
    finally:
        err = stop(proc)
    assert "traceroof: error: " in err and "broken.json" in err


def test_serve_help_has_an_example():
    res = CliRunner().invoke(cli, ["serve", "--help"])
    assert res.exit_code == 0 and "traceroof serve trace.json.gz" in res.output and "--host" in res.output


def test_artifacts_dir_is_ignored():
    assert "test-artifacts/" in (Path(__file__).parents[1] / ".gitignore").read_text()
