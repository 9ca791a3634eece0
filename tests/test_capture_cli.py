"""`traceroof capture HOST:PORT` as a subprocess against a real jax program on loopback, and
each failure kind of docs/capture.md reproduced: its exit code and its message."""

from __future__ import annotations

import http.server
import json
import threading
import time
from pathlib import Path

import polars as pl
import pytest
from live_helpers import (
    JAX_TARGET,
    Processes,
    free_port,
    kill_group,
    silent_acceptor,
    traceroof,
)

from traceroof.parsers import xplane


@pytest.fixture
def procs(tmp_path):
    ps = Processes(tmp_path)
    yield ps
    ps.stop_all()


def _xplanes(root: Path) -> list[Path]:
    return sorted(root.rglob("*.xplane.pb"))


def test_capture_reports_ops_steps_and_flops_of_the_executions(procs, tmp_path):
    port, flops_per_exec, _ = procs.jax_target("steps")
    out = tmp_path / "prof"
    done = traceroof("capture", f"127.0.0.1:{port}", "--duration", "1", "-o", str(out),
                     "--chip", "h100", "--format", "json")
    assert done.returncode == 0, done.stderr
    said = done.stderr
    assert f"connecting to 127.0.0.1:{port}" in said and "recording 1.0 s" in said
    report = json.loads(done.stdout)
    [kept] = _xplanes(out)  # -o keeps the one capture
    ops = xplane.read(kept).ops.filter(pl.col("hlo_module") == "jit_train_step")
    executions = ops.filter(pl.col("kind") == "matmul").height  # one dot per execution
    assert executions > 10
    # FLOPs: the report's op table is cost_analysis() x the executions it holds
    assert sum(r["flops"] or 0 for r in report["ranking"]) == pytest.approx(
        flops_per_exec * executions)
    assert report["summary"]["flops_per_step"] == pytest.approx(flops_per_exec)
    # steps: each annotated step is one execution; the two at the window's edges may be cut
    assert executions - 2 <= report["summary"]["steps"] <= executions
    assert f"{ops.height} ops" in said
    # each HLO op leads back to the user's line: the target's `return jnp.tanh(x @ x) * 0.5`
    line = JAX_TARGET.splitlines().index("    return jnp.tanh(x @ x) * 0.5") + 1
    script = tmp_path / "jax_target.py"
    assert set(ops["source_location"]) == {f"{script}:{line}"}
    assert set(ops["hlo_op_name"]) == {"jit(train_step)/dot_general", "jit(train_step)/mul"}


def test_no_analyze_keeps_only_the_capture(procs, tmp_path):
    port, _, _ = procs.jax_target("plain")
    done = traceroof("capture", f"127.0.0.1:{port}", "--duration", "0.5", "--no-analyze",
                     "-o", str(tmp_path / "p"))
    assert done.returncode == 0, done.stderr
    [kept] = _xplanes(tmp_path / "p")
    assert done.stdout.strip() == f"wrote {kept} ({kept.stat().st_size:,} bytes)"


def _one_error_line(done) -> str:
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("traceroof: error:")]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


def test_nothing_listening_is_6_at_once(tmp_path):
    port = free_port()
    t0 = time.monotonic()
    done = traceroof("capture", f"127.0.0.1:{port}", env={"TMPDIR": str(tmp_path)})
    assert done.returncode == 6 and time.monotonic() - t0 < 30
    assert "connection refused" in _one_error_line(done)
    assert list(tmp_path.iterdir()) == []  # no temporary folder left behind


def test_no_analyze_refuses_the_analysis_options():
    done = traceroof("capture", f"127.0.0.1:{free_port()}", "--no-analyze", "--steps", "3",
                     "--chip", "h100")
    assert done.returncode == 2
    assert "--no-analyze captures only: --steps, --chip need the analysis" in done.stderr


def test_invalid_port_is_a_usage_error():
    done = traceroof("capture", "127.0.0.1:99999")
    assert done.returncode == 2
    assert "port 99999 is outside 1..65535" in _one_error_line(done)


@pytest.fixture
def http_server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()
    th.join(timeout=10)


def test_an_http_server_is_not_a_profiler_server(http_server, tmp_path):
    done = traceroof("capture", f"127.0.0.1:{http_server}", env={"TMPDIR": str(tmp_path)})
    assert done.returncode == 10
    line = _one_error_line(done)
    # http.server answers the HTTP/2 preface with its HTML error page (505), quoted
    assert "not a jax profiler server (it answered '<!DOCTYPE HTML>" in line
    assert "an HTTP server listens there" in line
    assert list(tmp_path.iterdir()) == []


def test_xprof_client_log_names_http_too(http_server, tmp_path):
    """Past the probe, xprof's own log ("Failed parsing HTTP/2") gives the same error."""
    from traceroof import capture as cap

    with pytest.raises(cap.NotProfilerServerError, match="Failed parsing HTTP/2"):
        cap._attempt("127.0.0.1", http_server, 0.5, tmp_path, 60, cap.DEFAULT_OPTIONS)


@pytest.fixture
def silent_port():
    """A port that accepts TCP connections and never sends a byte."""
    with silent_acceptor() as port:
        yield port


def test_a_silent_acceptor_times_out_at_the_probe_bound(silent_port):
    from traceroof.capture import PROBE_TIMEOUT_S

    t0 = time.monotonic()
    done = traceroof("capture", f"127.0.0.1:{silent_port}", "--duration", "2")
    elapsed = time.monotonic() - t0
    assert done.returncode == 8
    # the documented bound: PROBE_TIMEOUT_S (5 s) of silence, plus the interpreter's start
    assert PROBE_TIMEOUT_S <= elapsed < PROBE_TIMEOUT_S + 15
    assert "did not answer in 5.0 s" in _one_error_line(done)


def test_two_captures_at_once(procs, tmp_path):
    port, _, _ = procs.jax_target("plain")
    first = procs.popen([*_cli(), "capture", f"127.0.0.1:{port}", "--duration", "8",
                         "--no-analyze", "-o", str(tmp_path / "first")])
    _wait_for(first, "recording 8.0 s")
    time.sleep(3.0)  # the first client is in its session (it starts in ~1 s), for 5 s more
    second = traceroof("capture", f"127.0.0.1:{port}", "--duration", "0.5", "--no-analyze",
                       "-o", str(tmp_path / "second"))
    assert second.returncode == 11, second.stderr
    assert "another profiling session is active" in _one_error_line(second)
    assert first.wait(timeout=60) == 0  # the first capture is not disturbed
    assert len(_xplanes(tmp_path / "first")) == 1
    assert not (tmp_path / "second").exists()  # the folder it made, empty, is removed


def _cli() -> list[str]:
    import sys

    return [sys.executable, "-m", "traceroof.cli"]


def test_target_killed_mid_capture_keeps_the_window_before(procs, tmp_path):
    port, _, target = procs.jax_target("steps")
    out = tmp_path / "prof"
    run = procs.popen([*_cli(), "capture", f"127.0.0.1:{port}", "--duration", "1", "--steps",
                       "100000", "-o", str(out), "--chip", "h100", "--format", "json"])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not _xplanes(out):  # the first window is written
        time.sleep(0.2)
    [first] = _xplanes(out)
    time.sleep(2.0)  # into the second window
    kill_group(target)
    stdout, stderr = run.communicate(timeout=120)
    assert run.returncode == 12, stderr
    [line] = [ln for ln in stderr.splitlines() if ln.startswith("traceroof: error:")]
    assert "the target closed the connection" in line and "exited or was killed" in line
    kept = xplane.read(first)
    steps = int(kept.ops["step"].drop_nulls().n_unique())
    assert f"kept the previous window ({first}): {steps} steps, {kept.ops.height} ops" in line
    assert _xplanes(out) == [first]  # nothing else written; no empty folder left
    assert [p for p in out.rglob("*") if p.is_dir() and not any(p.iterdir())] == []
    report = json.loads(stdout)  # the kept window's report came first
    assert report["trace"]["sources"] == [str(first)]
    assert report["trace"]["device_ops"] == kept.ops.height


def test_target_killed_in_the_only_window_records_nothing(procs, tmp_path):
    port, _, target = procs.jax_target("plain")
    run = procs.popen([*_cli(), "capture", f"127.0.0.1:{port}", "--duration", "6",
                       "--chip", "h100"], env={"TMPDIR": str(tmp_path)})
    _wait_for(run, "recording 6.0 s")
    time.sleep(3.0)  # the client is connected and recording (it starts in ~1 s)
    kill_group(target)
    _, stderr = run.communicate(timeout=120)
    assert run.returncode == 12, stderr
    assert "nothing was recorded" in stderr
    assert [p for p in tmp_path.iterdir() if p.name.startswith("traceroof-capture-")] == []


def _wait_for(p, text: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = p.stderr.readline()
        if text in line:
            return
        assert line, f"{text!r} never came"
    raise AssertionError(f"{text!r} not within {timeout_s} s")


def test_an_idle_target_is_an_empty_capture(procs, tmp_path):
    port, _, _ = procs.jax_target("idle")
    done = traceroof("capture", f"127.0.0.1:{port}", "--duration", "0.5",
                     env={"TMPDIR": str(tmp_path)})
    assert done.returncode == 7
    assert "recorded nothing" in _one_error_line(done)
    assert [p for p in tmp_path.iterdir() if p.name.startswith("traceroof-capture-")] == []


def test_steps_of_an_unannotated_program_are_inferred(procs, tmp_path):
    """No StepTraceAnnotation: --steps counts the executions of jit_train_step (item 5)."""
    port, flops_per_exec, _ = procs.jax_target("plain")
    out = tmp_path / "prof"
    done = traceroof("capture", f"127.0.0.1:{port}", "--duration", "0.3", "--steps", "40",
                     "-o", str(out), "--chip", "h100", "--format", "json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    last = _xplanes(out)[-1]  # the window analyzed (an earlier, shorter one may be kept too)
    assert report["trace"]["sources"] == [str(last)]
    ops = xplane.read(last).ops
    executions = ops.filter(pl.col("kind") == "matmul").height
    # n executions start n - 1 steps (the first may have been dispatched before the window)
    assert executions - 2 <= report["summary"]["steps"] <= executions - 1
    assert report["summary"]["steps"] >= 40
    assert report["summary"]["flops_per_step"] == pytest.approx(flops_per_exec)
    [said] = [w for w in report["warnings"] if "inferred" in w]
    assert "executions of jit_train_step" in said and "StepTraceAnnotation" in said
