"""`traceroof watch DIR`: a torch CPU program fills DIR through tensorboard_trace_handler
while the watch runs; generated GPU traces of known step times for the history strip and
the gate-like exit; an unreadable trace is said, not dropped."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from live_helpers import TORCH_TARGET, Processes, gpu_trace

from traceroof.watch import History, strip


@pytest.fixture
def procs(tmp_path):
    ps = Processes(tmp_path)
    yield ps
    ps.stop_all()


def _watch(procs: Processes, folder: Path, *args: str):
    return procs.popen([sys.executable, "-m", "traceroof.cli", "watch", str(folder), "--every",
                        "0.3", "--idle-timeout", "120", *args])


def test_watch_analyzes_each_trace_a_torch_program_writes(procs, tmp_path):
    folder = tmp_path / "tb"
    folder.mkdir()
    watch = _watch(procs, folder, "--count", "3", "--format", "jsonl", "--chip", "h100")
    script = tmp_path / "torch_target.py"
    script.write_text(TORCH_TARGET)
    torch_run = procs.popen([sys.executable, str(script), str(folder), "3", "0.2"])
    out, err = watch.communicate(timeout=300)
    assert watch.returncode == 0, err
    assert torch_run.wait(timeout=120) == 0
    written = sorted(folder.glob("*.pt.trace.json"))  # w.<time ns>.pt.trace.json, in order
    assert len(written) == 3
    lines = [json.loads(ln) for ln in out.splitlines()]
    assert [ln["trace"] for ln in lines] == [str(p) for p in written]  # each once, in order
    assert [len(ln["history"]["traces"]) for ln in lines] == [1, 2, 3]
    # a CPU-only torch trace has no device op: its numbers are unknown (null), never 0
    assert lines[-1]["history"]["step_time_ns"] == [None, None, None]
    assert lines[-1]["history"]["hfu"] == [None, None, None]
    for p in written:  # the program's own step markers are in each trace (2 active steps)
        names = [e.get("name", "") for e in json.loads(p.read_text())["traceEvents"]]
        assert sum(n.startswith("ProfilerStep#") for n in names) == 2


def _wait_line(p, timeout_s: float = 120) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        assert line, "the watch ended early"
        if line.startswith("["):
            return line
    raise AssertionError("no trace line")


def test_step_time_gate_exits_1_at_the_first_slower_trace(procs, tmp_path):
    folder = tmp_path / "tb"
    folder.mkdir()
    watch = _watch(procs, folder, "--max-step-time-increase", "0.5", "--chip", "h100")
    gpu_trace(folder / "w.1.pt.trace.json", idle_ns=1_000_000)  # ~1.1 ms steps
    assert "w.1.pt.trace.json: 4 steps" in _wait_line(watch)
    gpu_trace(folder / "w.2.pt.trace.json", idle_ns=3_000_000)  # ~3.1 ms: +180 %
    out, err = watch.communicate(timeout=120)
    assert watch.returncode == 1
    assert "w.2.pt.trace.json: 4 steps" in out
    assert "  step time  ▁█" in out  # the first lowest, the second highest
    [failed] = [ln for ln in err.splitlines() if "watch failed" in ln]
    assert "w.2.pt.trace.json: step time" in failed and "(limit +50.0%)" in failed


def test_an_unreadable_trace_is_said_and_the_watch_goes_on(procs, tmp_path):
    folder = tmp_path / "tb"
    folder.mkdir()
    (folder / "w.1.pt.trace.json").write_text('{"traceEvents": [ {"ph": "X", "na')
    gpu_trace(folder / "w.2.pt.trace.json", idle_ns=1_000_000)
    watch = _watch(procs, folder, "--count", "2", "--chip", "h100")
    out, err = watch.communicate(timeout=120)
    assert watch.returncode == 0, err
    assert f"{folder / 'w.1.pt.trace.json'}: error: " in out
    assert "w.2.pt.trace.json: 4 steps" in out
    assert "1 of 2 traces could not be read" in err


def test_strip_draws_lowest_to_highest_and_unknown_apart():
    # lo 1, hi 3: 2 is half way -> block 4 of 0..7; None is "·", not the lowest block
    assert strip([1.0, None, 3.0, 2.0]) == "▁·█▅"
    assert strip([5.0, 5.0]) == "▁▁"
    assert strip([None]) == "·"


def test_history_keeps_unknown_as_none():
    class S:
        step_time_ns, steps, step, hfu = None, 0, None, None

    class R:
        summary = S()

    h = History()
    h.add("a", R())
    assert h.to_dict() == {"traces": ["a"], "step_time_ns": [None], "busy_fraction": [None],
                           "hfu": [None]}
    assert h.lines()[0].endswith("unknown")
