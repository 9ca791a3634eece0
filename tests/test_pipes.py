"""A reader that leaves early is a normal end (issue 19 item 7; docs/cli.md, exit codes).

Each command runs in a subprocess whose stdout (or stderr) is a real pipe whose read end is
already closed, so that every write of the command fails with EPIPE (Python ignores SIGPIPE,
so the write raises ``BrokenPipeError``): the command must end with its own exit status,
print no "internal error"/traceback, and leave nothing half-done.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import FIXTURES, REPO, real

TIMEOUT_S = 120
LONG = ("HolisticTraceAnalysis", "tests", "data", "trace_diff", "control", "control.json.gz")  # 104 kB of JSON


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="120")


def _closed_pipe_run(args: list[str], *, stream: str = "stdout") -> subprocess.CompletedProcess:
    """``traceroof ARGS`` with ``stream`` a pipe nobody reads (read end closed before the
    start); the other stream is captured."""
    r, w = os.pipe()
    os.close(r)
    try:
        kw = {"stdout": w, "stderr": subprocess.PIPE} if stream == "stdout" else {"stderr": w,
                                                                                  "stdout": subprocess.PIPE}
        return subprocess.run([sys.executable, "-m", "traceroof.cli", *args], cwd=REPO, env=_env(),
                              timeout=TIMEOUT_S, **kw)
    finally:
        os.close(w)


def _no_error(text: bytes) -> None:
    s = text.decode(errors="replace")
    assert "internal error" not in s and "Traceback" not in s and "BrokenPipe" not in s, s
    assert "Exception ignored" not in s, s  # the interpreter's final flush


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The example trace's report, saved (for gate and diff)."""
    out = tmp_path_factory.mktemp("pipes") / "ex.json"
    res = subprocess.run([sys.executable, "-m", "traceroof.cli", "analyze", str(FIXTURES / "example_h100_decoder.json.gz"),
                          "-q", "-o", str(out)], cwd=REPO, env=_env(), capture_output=True, timeout=TIMEOUT_S)
    assert res.returncode == 0, res.stderr
    return out


def _hfu(saved) -> float:
    return json.loads(saved.read_text())["summary"]["hfu"]


@pytest.mark.parametrize("args", [
    ["analyze", "{ex}", "-q"],
    ["analyze", "{ex}", "-q", "--format", "json"],
    ["analyze", "{ex}", "-q", "--format", "csv"],
    ["chips"],
    ["chips", "--format", "json"],
    ["estimate", "--model", "{model}", "--chip", "h100"],
    ["diff", "{ex}", "{saved}", "-q"],
    ["ingest", "{ex}", "-o", "{tmp}/c", "-q"],
    ["--help"],
    ["analyze", "--help"],
    ["--version"],
], ids=lambda a: " ".join(a)[:40])
def test_a_closed_stdout_is_exit_0(args, saved, tmp_path):
    ex = str(FIXTURES / "example_h100_decoder.json.gz")
    model = str(FIXTURES / "models" / "llama2-7b.json")
    argv = [a.format(ex=ex, model=model, saved=saved, tmp=tmp_path) for a in args]
    res = _closed_pipe_run(argv)
    _no_error(res.stderr)
    assert res.returncode == 0, res.stderr
    if args[0] == "ingest":  # the work was done in full: the cache is there and readable
        assert (tmp_path / "c" / "meta.json").is_file()


def test_gate_keeps_its_exit_status_when_stdout_is_closed(saved):
    """A failed gate is exit 1 even when its summary could not be written (a CI job piping it
    into `head` must still fail); a passed one is 0. The thresholds straddle the saved HFU."""
    hfu = _hfu(saved)
    assert 0 < hfu < 1
    failed = _closed_pipe_run(["gate", str(saved), "-q", "--min-hfu", str(min(1.0, hfu * 2))])
    _no_error(failed.stderr)
    assert failed.returncode == 1, failed.stderr
    assert b"gate failed" in failed.stderr
    passed = _closed_pipe_run(["gate", str(saved), "-q", "--min-hfu", str(hfu / 2)])
    _no_error(passed.stderr)
    assert passed.returncode == 0, passed.stderr


def test_a_closed_stderr_does_not_stop_the_work(tmp_path):
    """Progress lines go to stderr; with stderr closed the report still reaches stdout whole."""
    res = _closed_pipe_run(["analyze", str(FIXTURES / "example_h100_decoder.json.gz"), "--format", "json"],
                           stream="stderr")
    assert res.returncode == 0
    assert json.loads(res.stdout)["schema_version"] >= 1


def test_head_3_on_a_long_table(tmp_path):
    """`traceroof analyze T --top 1000 | head -3` as a shell runs it, with pipefail: the three
    first lines, exit 0 for the whole pipeline. The full output is over the 64 KiB a pipe
    buffers (checked), so the write fails while head is gone."""
    trace = real(*LONG)
    full = subprocess.run([sys.executable, "-m", "traceroof.cli", "analyze", str(trace), "-q", "--top", "1000",
                           "--format", "json"], cwd=REPO, env=_env(), capture_output=True, timeout=TIMEOUT_S)
    assert full.returncode == 0 and len(full.stdout) > 65536, len(full.stdout)
    cmd = f"{sys.executable} -m traceroof.cli analyze {trace} -q --top 1000 --format json | head -3"
    res = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=REPO, env=_env(), capture_output=True,
                         timeout=TIMEOUT_S)
    _no_error(res.stderr)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == full.stdout.splitlines()[:3]


def test_watch_stops_when_its_reader_has_gone(tmp_path):
    """`traceroof watch DIR | head -1`: watch streams one block per trace and would otherwise
    look at DIR until its idle timeout (here 600 s, beyond the test's timeout); with its reader
    gone it stops at the first block it cannot write, exit 0."""
    import shutil

    shutil.copy(FIXTURES / "example_h100_decoder.json.gz", tmp_path / "w.1.pt.trace.json.gz")  # watch.PATTERNS
    res = _closed_pipe_run(["watch", str(tmp_path), "--every", "0.2", "--idle-timeout", "600", "-q"])
    _no_error(res.stderr)
    assert res.returncode == 0, res.stderr
