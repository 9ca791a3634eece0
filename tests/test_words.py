"""Words that match numbers; nothing on the device is never shown as idle (issue 13)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from traceroof import analyze, read_trace, units
from traceroof.cli import cli

REAL = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "real"
CPU_ONLY = REAL / "HolisticTraceAnalysis/tests/data/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"
QWEN = REAL / "TraceLens/tests/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"


def _events(launches: bool) -> list[dict]:
    ev: list[dict] = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1,
                       "ts": 0.0, "dur": 1000.0}]
    for i in range(3):
        ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 100.0 + 200 * i,
                   "dur": 50.0, "args": {"External id": i + 1}})
        if launches:
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                       "ts": 110.0 + 200 * i, "dur": 5.0, "args": {"External id": i + 1, "correlation": 10 + i}})
            ev.append({"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 10 + i, "pid": 1, "tid": 1, "ts": 110.0 + 200 * i})
    return ev


def _write(path: Path, launches: bool) -> Path:
    doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}],
           "traceEvents": _events(launches)}
    path.write_text(json.dumps(doc))
    return path


def _out(*args: object) -> tuple[int, str]:
    r = CliRunner().invoke(cli, ["analyze", *map(str, args)])
    return r.exit_code, r.output


@pytest.mark.parametrize("chip", [None, "h100"])
def test_launches_without_device_activity_are_not_cpu_only(tmp_path: Path, chip: str | None) -> None:
    p = _write(tmp_path / "launches.json", launches=True)
    rep = analyze(read_trace(p), chip)
    assert rep.chip is None and rep.summary.step_time_ns is None and rep.summary.step is None
    assert rep.steps.height == 0
    assert rep.warnings[0].startswith("no device ops")
    assert "3 kernel launches / copies recorded but no device activity" in rep.warnings[0]
    text = " ".join(rep.warnings)
    assert "CPU-only" not in text
    code, out = _out(p, *(["--chip", chip] if chip else []))
    assert code == 0
    head = " ".join(out.split("Warnings")[0].split())
    assert "CPU-only" not in out and "device busy" not in head
    assert "idle" not in head.replace("no step time, busy or idle", "")
    assert "3 kernel launches / copies recorded but no device activity" in out


def test_no_launch_is_cpu_only_said_once(tmp_path: Path) -> None:
    p = _write(tmp_path / "cpu.json", launches=False)
    rep = analyze(read_trace(p), "h100")
    assert rep.summary.step_time_ns is None and rep.steps.height == 0
    assert sum("CPU-only" in w for w in rep.warnings) == 1
    assert "--chip h100 is not used" in rep.warnings[0]


@pytest.mark.skipif(not CPU_ONLY.exists(), reason="real fixtures not present")
def test_real_cpu_only_with_chip_shows_no_idle() -> None:
    code, out = _out(CPU_ONLY, "--chip", "h100")
    assert code == 0
    head = " ".join(out.split("Warnings")[0].split())
    assert "device busy" not in head and "idle" not in head.replace("no step time, busy or idle", "")
    assert "step time" not in head.replace("no step time", "")
    assert "a CPU-only trace (no kernel launch)" in head


def test_unknown_chip_on_a_cpu_only_trace_still_exit_5(tmp_path: Path) -> None:
    code, _ = _out(_write(tmp_path / "cpu.json", launches=False), "--chip", "nosuch")
    assert code == 5


@pytest.mark.skipif(not QWEN.exists(), reason="real fixtures not present")
def test_linked_share_words_match_the_linked_number() -> None:
    rep = analyze(read_trace(QWEN))
    cov = rep.coverage
    code, out = _out(QWEN)
    assert code == 0
    flat = " ".join(out.split())
    linked = cov.linked_device_time_ns / cov.kernel_time_ns
    # 436 kernels have no launch in the file; the eager match lends them ops, so the linked
    # share is of all kernel time with those included (coverage.unlaunched says how many)
    assert cov.unlaunched is not None and cov.unlaunched.kernels_matched == 436
    assert linked > 0.99
    # the linked share is of the kernel time, said as such (copies and fills are never linked)
    kern = cov.linked_device_time_ns / cov.kernel_time_ns
    assert f"{100 * kern:.1f} % of kernel time ({units.ns(cov.kernel_time_ns)}) linked to a framework op" in flat
    assert f"{100 * cov.linked_costed_share:.1f} % of that linked time costed" in flat
    assert "of the kernel time linked" not in flat


@pytest.mark.skipif(not QWEN.exists(), reason="real fixtures not present")
@pytest.mark.parametrize("frac", [0.3, 0.6])
def test_truncated_file_says_truncated_first(tmp_path: Path, frac: float) -> None:
    with gzip.open(QWEN) as f:
        raw = f.read()
    cut = tmp_path / "cut.json"
    cut.write_bytes(raw[: int(len(raw) * frac)])
    rep = analyze(read_trace(cut))
    assert ": trace is truncated at byte " in rep.warnings[0]
    assert not any("CPU-only" in w for w in rep.warnings)
    code, out = _out(cut, "--chip", "h100")
    assert code == 0
    assert "CPU-only" not in out and "names no device" not in out
    warn = out.split("Warnings:")[1].strip().splitlines()[0]
    assert "truncated" in warn


def test_truncated_with_ops_but_no_device_names_says_truncated(tmp_path: Path) -> None:
    # deviceProperties written after the events (as Kineto does) and cut off with the tail
    events = [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 10.0 + i, "dur": 0.5,
               "args": {"device": 0, "stream": 7, "correlation": i}} for i in range(20)]
    text = json.dumps({"schemaVersion": 1, "traceEvents": events,
                       "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}]})
    cut = tmp_path / "cut.json"
    cut.write_text(text[: text.index('"deviceProperties"') - 40])
    code, out = _out(cut)
    assert code == 5
    assert "truncated" in out.splitlines()[0] and "names no device" in out


CUPTI_RANGES = REAL / "HolisticTraceAnalysis/tests/data/cupti_profiler/benchmark_result_924719_1679055439_trace.json.gz"


@pytest.mark.skipif(not CUPTI_RANGES.exists(), reason="real fixtures not present")
def test_real_launches_in_profiler_range_mode_are_not_cpu_only() -> None:
    tr = read_trace(CUPTI_RANGES)
    names = dict(tr.host.filter(tr.host["cat"] == "runtime").group_by("name").len().iter_rows())
    # by name, as the trace has them: 77 cudaLaunchKernel + 16 cudaMemcpyAsync + 1 cudaMemcpy
    # + 10 cudaMemsetAsync = 104
    assert [names[n] for n in ("cudaLaunchKernel", "cudaMemcpyAsync", "cudaMemcpy", "cudaMemsetAsync")] == [77, 16, 1, 10]
    rep = analyze(tr, "h100")
    assert rep.summary.step is None and rep.steps.height == 0
    assert "104 kernel launches / copies recorded" in rep.warnings[0]
    assert "profiler-range mode" in rep.warnings[0]
    assert not any("CPU-only" in w for w in rep.warnings)
