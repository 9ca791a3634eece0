"""Findings in `traceroof analyze` output: every format, largest recoverable time first, and
the JSON carries every evidence number."""

from __future__ import annotations

import json

from click.testing import CliRunner
from conftest import FIXTURES

from traceroof import analyze, read_trace
from traceroof.cli import cli

DECODE = str(FIXTURES / "faults" / "decode_launch_h100.json.gz")
NCCL = "HolisticTraceAnalysis/tests/data/nccl_parser_config/nccl_data.json.gz"


def run(*args: str):
    return CliRunner().invoke(cli, list(args))


def _api(path: str) -> list[dict]:
    return [f.to_dict() for f in analyze(read_trace(path)).findings]


def test_json_findings_sorted_and_carry_every_evidence_number():
    res = run("analyze", DECODE, "--format", "json", "-q")
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)["findings"]
    assert [f["kind"] for f in got] == ["launch_bound", "host_device_copies"]
    rec = [f["recoverable_ns"] for f in got]
    assert rec == sorted(rec, reverse=True) and rec[0] > 0
    want = _api(DECODE)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g["evidence"] == json.loads(json.dumps(w["evidence"]))
        for key in ("kind", "title", "severity", "explanation", "rank", "step", "start_ns", "end_ns", "ops",
                    "occurrences", "docs"):
            assert key in g
    ev = got[0]["evidence"]
    for key in ("recoverable_ns", "busy_fraction", "median_kernel_ns", "median_launch_spacing_ns",
                "median_launch_call_ns", "launch_gaps", "kernels", "steps"):
        assert ev[key] is not None, key


def test_table_and_markdown_list_findings_largest_first():
    res = run("analyze", DECODE, "-q")
    assert res.exit_code == 0, res.output
    out = res.output
    assert "Findings" in out and "launch_bound" in out and "host_device_copies" in out
    assert out.index("launch_bound") < out.index("host_device_copies")
    assert "10.9 ms" in out  # the launch-bound claim
    md = run("analyze", DECODE, "--format", "markdown", "-q").output
    sec = md[md.index("## Findings"):]
    assert sec.index("launch_bound") < sec.index("host_device_copies")


def test_findings_option_selects_detectors():
    res = run("analyze", DECODE, "--format", "json", "-q", "--findings", "host_device_copies")
    assert res.exit_code == 0, res.output
    assert {f["kind"] for f in json.loads(res.stdout)["findings"]} == {"host_device_copies"}
    bad = run("analyze", DECODE, "--findings", "nope")
    assert bad.exit_code == 2 and "nope" in bad.output


def test_real_trace_findings_in_json(tmp_path):
    from conftest import real

    res = run("analyze", str(real(*NCCL.split("/"))), "--format", "json", "-q")
    assert res.exit_code == 0, res.output
    found = json.loads(res.stdout)["findings"]
    kinds = {f["kind"] for f in found}
    assert {"exposed_collectives", "device_idle", "launch_bound"} <= kinds
    rec = [f["recoverable_ns"] for f in found]
    assert rec == sorted(rec, reverse=True)
