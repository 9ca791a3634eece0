"""Live capture (traceroof.capture): a real jax profiler server on loopback, and the failure
layers of BC-19/BC-20 -- no server, idle server, silent server, empty or missing file."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import polars as pl
import pytest
from live_helpers import silent_acceptor

from traceroof import capture as cap

TARGET = textwrap.dedent(
    """
    import os, sys, time
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax, jax.numpy as jnp
    port, mode, seconds = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
    server = jax.profiler.start_server(port)  # keep the handle alive (BC-19)

    @jax.jit
    def loop_step(x):
        return jnp.tanh(x @ x) * 0.5

    x = jnp.ones((64, 64))
    loop_step(x).block_until_ready()
    print("READY", flush=True)
    end = time.time() + seconds
    while time.time() < end:
        if mode == "busy":
            x = loop_step(x).block_until_ready()
        else:
            time.sleep(0.05)
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def target(tmp_path):
    pytest.importorskip("jax")
    pytest.importorskip("xprof")
    script = tmp_path / "target.py"
    script.write_text(TARGET)
    procs = []

    def start(mode: str, seconds: float = 20.0) -> int:
        port = _free_port()
        p = subprocess.Popen([sys.executable, str(script), str(port), mode, str(seconds)],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        procs.append(p)
        line = p.stdout.readline()
        assert line.strip() == "READY", f"target did not start: {line!r}"
        return port

    yield start
    for p in procs:
        p.kill()
        p.wait(timeout=10)


def test_capture_end_to_end(target, tmp_path):
    port = target("busy")
    t0 = time.monotonic()
    trace = cap.capture(f"127.0.0.1:{port}", 1.0, tmp_path / "out", timeout_s=60)
    assert time.monotonic() - t0 < 30
    path = Path(trace.meta.sources[0])
    assert path.name.endswith(".xplane.pb") and path.stat().st_size > 0
    assert (tmp_path / "out") in path.parents  # found recursively under plugins/profile/<ts>/
    ops = trace.ops.filter(pl.col("hlo_module") == "jit_loop_step")
    assert ops.height > 10  # the loop ran many times during the window
    assert ops["dur_ns"].sum() > 0
    # the dot of the loop: 2*64*64*64 FLOPs per execution, from the captured HLO
    mm = ops.filter(pl.col("kind") == "matmul")
    assert mm.height > 0 and set(mm["flops"].unique()) == {2.0 * 64**3}


def test_capture_xplane_returns_the_written_file(target, tmp_path):
    port = target("busy")
    path = cap.capture_xplane(f"localhost:{port}", 0.5, tmp_path, timeout_s=60)
    assert path.exists() and path.stat().st_size > 0
    assert path.parent.parent.name == "profile" and path.parent.parent.parent.name == "plugins"


def test_idle_server_is_an_empty_capture(target, tmp_path):
    port = target("idle")
    with pytest.raises(cap.EmptyCaptureError) as exc:
        cap.capture(f"127.0.0.1:{port}", 0.5, tmp_path, timeout_s=60, retries=0)
    assert exc.value.exit_code == 7
    assert "recorded nothing" in str(exc.value) and "start_server" in str(exc.value)


def test_refused_port_is_no_server_quickly():
    port = _free_port()  # nothing listens there now
    t0 = time.monotonic()
    with pytest.raises(cap.NoServerError) as exc:
        cap.capture(f"127.0.0.1:{port}", 1.0)
    assert time.monotonic() - t0 < 3
    assert exc.value.exit_code == 6
    assert "connection refused" in str(exc.value)


def test_unresolvable_host_is_no_server():
    with pytest.raises(cap.NoServerError, match="cannot resolve"):
        cap.capture_xplane("no-such-host.invalid:9999", 1.0)


def test_silent_server_times_out(tmp_path):
    """A port that accepts TCP and never speaks: the probe gives up after PROBE_TIMEOUT_S
    (5 s) of silence, before any client runs."""
    pytest.importorskip("xprof")
    with silent_acceptor() as port:
        t0 = time.monotonic()
        with pytest.raises(cap.CaptureTimeoutError) as exc:
            cap.capture_xplane(f"127.0.0.1:{port}", 0.5, tmp_path, timeout_s=3, retries=0)
        elapsed = time.monotonic() - t0
        assert cap.PROBE_TIMEOUT_S <= elapsed < cap.PROBE_TIMEOUT_S + 5
        assert exc.value.exit_code == 8


# --- client behaviour with a stand-in client (no jax needed) --------------------------------

FAKE_CLIENT = textwrap.dedent(
    """
    import json, os, sys
    address, logdir, duration_ms = sys.argv[1], sys.argv[2], int(sys.argv[3])
    log = os.path.join(logdir, "calls.json")
    calls = json.load(open(log)) if os.path.exists(log) else []
    calls.append(duration_ms)
    json.dump(calls, open(log, "w"))
    mode = os.environ["FAKE_MODE"]
    if mode == "empty-then-data" and len(calls) < 2:
        print(json.dumps({"status": "error", "error": "UNAVAILABLE: No trace event was collected"}))
        sys.exit(2)
    run = os.path.join(logdir, "plugins", "profile", "2026_01_01_00_00_0%d" % len(calls))
    os.makedirs(run, exist_ok=True)
    with open(os.path.join(run, "h_1.xplane.pb"), "wb") as f:
        if mode != "zero-bytes":
            f.write(open(os.environ["FAKE_XPLANE"], "rb").read())
    print(json.dumps({"status": "ok"}))
    """
)

CPU_XPLANE = Path(__file__).resolve().parents[1] / "fixtures" / "jax_cpu" / "train_step.xplane.pb"


@pytest.fixture
def fake_server(monkeypatch):
    """A server that answers the probe's HTTP/2 preface with a SETTINGS frame, as gRPC does
    (so the probe passes), and the fake client in place of xprof's."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.2)
    stop = threading.Event()

    def answer() -> None:
        while not stop.is_set():
            try:
                conn = srv.accept()[0]
            except OSError:
                continue
            with conn:
                conn.sendall(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")  # empty SETTINGS

    th = threading.Thread(target=answer, daemon=True)
    th.start()
    monkeypatch.setattr(cap, "_CLIENT", FAKE_CLIENT)
    monkeypatch.setenv("FAKE_XPLANE", str(CPU_XPLANE))
    yield srv.getsockname()[1]
    stop.set()
    th.join(timeout=10)
    srv.close()


def test_empty_capture_is_retried_with_a_longer_window(fake_server, monkeypatch, tmp_path):
    monkeypatch.setenv("FAKE_MODE", "empty-then-data")
    trace = cap.capture(f"127.0.0.1:{fake_server}", 1.0, tmp_path, retries=1)
    assert trace.ops.height == 477
    assert json.loads((tmp_path / "calls.json").read_text()) == [1000, 2000]


def test_zero_byte_file_is_an_empty_capture(fake_server, monkeypatch, tmp_path):
    monkeypatch.setenv("FAKE_MODE", "zero-bytes")
    with pytest.raises(cap.EmptyCaptureError, match="empty file"):
        cap.capture_xplane(f"127.0.0.1:{fake_server}", 1.0, tmp_path, retries=0)


def test_parse_address():
    assert cap.parse_address("localhost:9999") == ("localhost", 9999)
    assert cap.parse_address("9999") == ("127.0.0.1", 9999)
    assert cap.parse_address("grpc://10.0.0.1:6009") == ("10.0.0.1", 6009)
    assert cap.parse_address("[::1]:9001") == ("::1", 9001)
    with pytest.raises(cap.BadAddressError):
        cap.parse_address("localhost")
    with pytest.raises(cap.BadAddressError, match="outside 1..65535"):
        cap.parse_address("localhost:99999")


def test_library_api_is_the_module_however_imported():
    import types

    import traceroof

    assert isinstance(traceroof.capture, types.ModuleType)
    import traceroof.capture as module
    from traceroof.capture import capture

    assert traceroof.capture is module and module.capture is capture
    assert module.capture_xplane and module.NoServerError
    with pytest.raises(cap.NoServerError):
        traceroof.capture.capture(f"127.0.0.1:{_free_port()}", 0.5)
    codes = {c.__name__: c.exit_code for c in (
        cap.BadAddressError, cap.NoServerError, cap.EmptyCaptureError, cap.CaptureTimeoutError,
        cap.NotProfilerServerError, cap.ProfilerBusyError, cap.TargetExitedError,
        cap.CaptureUnavailable)}
    # docs/capture.md's table; 9 is the CLI's "output cannot be written", so xprof missing is 13
    assert codes == {"BadAddressError": 2, "NoServerError": 6, "EmptyCaptureError": 7,
                     "CaptureTimeoutError": 8, "NotProfilerServerError": 10,
                     "ProfilerBusyError": 11, "TargetExitedError": 12, "CaptureUnavailable": 13}


@pytest.mark.parametrize("line", [
    "import traceroof; traceroof.capture.capture_xplane; traceroof.capture.capture; traceroof.capture.NoServerError",
    "import traceroof, types; assert isinstance(traceroof.capture, types.ModuleType)",
    "from traceroof.capture import capture, capture_xplane; assert callable(capture) and callable(capture_xplane)",
    "from traceroof import capture; capture.capture_xplane; capture.parse_address('localhost:9999')",
    "import traceroof.capture as c; import traceroof; assert traceroof.capture is c",
])
def test_documented_lines_work_in_a_fresh_interpreter(line):
    """The lines docs/capture.md shows, each in a new interpreter (nothing imported before)."""
    done = subprocess.run([sys.executable, "-c", line], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_failed_capture_steps_leave_no_temporary_folder(monkeypatch, tmp_path):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with pytest.raises(cap.NoServerError):
        cap.capture_steps(f"127.0.0.1:{_free_port()}", 5, 0.5)
    with pytest.raises(cap.NoServerError):
        cap.capture(f"127.0.0.1:{_free_port()}", 0.5)
    assert list(tmp_path.iterdir()) == []


def test_capture_steps_grows_the_window_to_the_step_rate(fake_server, monkeypatch, tmp_path):
    """The fake client writes the CPU fixture (its steps, counted here from the trace) every
    time: a first 1 s window that holds k steps asks next for 1.5 * N / (k / 1 s) seconds."""
    from traceroof.parsers import xplane

    k = xplane.read(CPU_XPLANE).ops["step"].drop_nulls().n_unique()
    monkeypatch.setenv("FAKE_MODE", "data")
    trace = cap.capture_steps(f"127.0.0.1:{fake_server}", 10 * k, 1.0, tmp_path, attempts=2)
    calls = json.loads((tmp_path / "calls.json").read_text())
    assert calls == [1000, round(1000 * 1.5 * 10 * k / k)]  # ms: 1 s, then 15 s
    assert f"capture: {k} of the {10 * k} steps asked for" in trace.meta.warnings[-1]


#: xprof's client log lines, as measured on loopback (jax 0.10.2, xprof 2.24.2), one per cause
MEASURED_LOGS = {
    "http": "W0000 capture_profile.cc:181] 127.0.0.1:1 returned UNAVAILABLE: failed to connect to "
            "all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:1: Failed parsing HTTP/2 "
            "(Expected SETTINGS frame as the first frame, got frame type 79)",
    "silent": "W0000 capture_profile.cc:181] 127.0.0.1:1 returned UNAVAILABLE: failed to connect "
              "to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: connection attempt timed "
              "out before receiving SETTINGS frame",
    "busy": "W0000 capture_profile.cc:181] 127.0.0.1:1 returned INTERNAL: Another profiling "
            "session active.",
    "killed": "W0000 capture_profile.cc:181] 127.0.0.1:1 returned UNAVAILABLE: Stream removed "
              "(Socket closed)",
    "idle": "W0000 capture_profile.cc:169] No trace event is collected from 127.0.0.1:1",
}


@pytest.mark.parametrize("cause, error, code", [
    ("http", cap.NotProfilerServerError, 10), ("silent", cap.CaptureTimeoutError, 8),
    ("busy", cap.ProfilerBusyError, 11), ("killed", cap.TargetExitedError, 12),
    ("idle", cap.EmptyCaptureError, 7)])
def test_the_client_log_names_the_cause(cause, error, code):
    """xprof raises "No trace event was collected" for all five; its log tells them apart."""
    from traceroof.capture_errors import classify

    said = "UNAVAILABLE: No trace event was collected because there were no responses"
    exc = classify("127.0.0.1:1", MEASURED_LOGS[cause], said, 3.0, 1.47)
    assert type(exc) is error and exc.exit_code == code
    assert "\n" not in str(exc) and str(exc).startswith("127.0.0.1:1: ")
    if cause == "killed":
        assert "1.5 s into the 3.0 s window" in str(exc) and exc.elapsed_s == 1.47
