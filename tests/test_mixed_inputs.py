"""Mixed inputs are never merged silently; per-rank files of one job still merge (issue 13)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from traceroof import read_trace
from traceroof.cli import cli
from traceroof.errors import MixedInputsError

REAL = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "real"
H100 = REAL / "TraceLens/tests/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
MI300 = REAL / "TraceLens/tests/traces/mi300/ddp_resnet18_no_pool/train_resnet18.json.gz"
XPLANE = REAL / "TraceLens/tests/traces/mi300/jax08_gemm/tw003.xplane.pb"


def kineto(path: Path, device: str, rank: int, kernel_us: float = 5.0) -> Path:
    """A one-kernel Kineto trace on ``device`` (its deviceProperties name), for ``rank``."""
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 100.0, "dur": 20.0,
         "args": {"External id": 1}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 105.0,
         "dur": 3.0, "args": {"External id": 1, "correlation": 7}},
        {"ph": "X", "cat": "kernel", "name": "gemm_kernel", "pid": 0, "tid": 7, "ts": 110.0,
         "dur": kernel_us, "args": {"External id": 1, "correlation": 7, "device": 0, "stream": 7}},
    ]
    doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": device, "totalGlobalMem": 85e9}],
           "distributedInfo": {"rank": rank, "world_size": 2}, "traceEvents": events}
    path.write_text(json.dumps(doc))
    return path


def test_two_chips_are_not_merged(tmp_path: Path) -> None:
    a = kineto(tmp_path / "a.json", "NVIDIA H100 80GB HBM3", 0)
    b = kineto(tmp_path / "b.json", "AMD Instinct MI300X", 1)
    with pytest.raises(MixedInputsError) as e:
        read_trace([a, b], jobs=1)
    msg = str(e.value)
    assert str(a) in msg and str(b) in msg
    assert "'NVIDIA H100 80GB HBM3' vs 'AMD Instinct MI300X'" in msg
    assert "one at a time" in msg
    assert e.value.exit_code == 4


def test_same_device_per_rank_files_still_merge(tmp_path: Path) -> None:
    kineto(tmp_path / "rank0.json", "NVIDIA H100 80GB HBM3", 0, kernel_us=5.0)
    kineto(tmp_path / "rank1.json", "NVIDIA H100 80GB HBM3", 1, kernel_us=7.0)
    t = read_trace(tmp_path, jobs=1)
    assert t.meta.ranks == [0, 1]
    # one kernel per rank: 5 µs and 7 µs, in ns
    assert sorted(t.ops["dur_ns"].to_list()) == [5_000, 7_000]
    assert not any("renumbered" in w for w in t.meta.warnings)


def test_a_trace_naming_no_device_is_not_compared(tmp_path: Path) -> None:
    a = kineto(tmp_path / "rank0.json", "NVIDIA H100 80GB HBM3", 0)
    b = kineto(tmp_path / "rank1.json", "", 1)
    assert read_trace([a, b], jobs=1).meta.ranks == [0, 1]


def _cli(*args: object) -> tuple[int, str]:
    r = CliRunner().invoke(cli, ["analyze", *map(str, args)])
    return r.exit_code, r.output


@pytest.mark.skipif(not MI300.exists(), reason="real fixtures not present")
def test_real_h100_and_mi300x_exit_4_one_line() -> None:
    code, out = _cli(H100, MI300, "--jobs", "1")
    assert code == 4, out
    lines = [x for x in out.splitlines() if x.strip()]
    assert len(lines) == 1
    assert "'NVIDIA H100 80GB HBM3' vs 'AMD Instinct MI300X'" in lines[0]
    assert H100.name in lines[0] and MI300.name in lines[0]


@pytest.mark.skipif(not XPLANE.exists(), reason="real fixtures not present")
def test_real_kineto_and_xplane_exit_4_not_70() -> None:
    code, out = _cli(H100, XPLANE, "--jobs", "1")
    assert code == 4, out
    assert "format kineto vs xplane" in out
    assert "schema lengths differ" not in out
