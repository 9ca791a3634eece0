"""``traceroof mcp``: every tool driven through the official MCP Python client.

The server runs as ``python -m traceroof.cli mcp`` in a subprocess, spoken to over stdio by
``mcp.client.stdio.stdio_client`` + ``mcp.ClientSession`` (the ``mcp`` extra, pulled by the
``test`` extra), the way an agent starts it. The whole conversation has a timeout. Expected
values come from the library called in-process, from the raw files, or from DESIGN's
reference numbers.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import anyio
import pytest
from conftest import FIXTURES, MODELS, REPO

from traceroof import analyze, read_trace

EXAMPLE = FIXTURES / "example_h100_decoder.json.gz"
TIMEOUT_S = 240


async def _conversation(calls: list[tuple[str, dict]]) -> tuple[list, list]:
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    params = StdioServerParameters(command=sys.executable, args=["-m", "traceroof.cli", "mcp"],
                                   env={"PYTHONPATH": str(REPO)}, cwd=str(REPO))
    with anyio.fail_after(TIMEOUT_S):
        async with stdio_client(params) as streams:
            read, write = streams if isinstance(streams, tuple) else (streams.read, streams.write)
            async with ClientSession(read, write) as session:
                await session.initialize()
                tools = (await session.list_tools()).tools
                results = [await session.call_tool(name, args) for name, args in calls]
    return tools, results


@pytest.fixture(scope="module")
def saved_step0(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("mcp") / "step0.json"
    analyze(read_trace(EXAMPLE), chip="h100", step=0).save(p)
    return p


@pytest.fixture(scope="module")
def talk(saved_step0):
    calls = [
        ("analyze_trace", {"path": str(EXAMPLE), "chip": "h100", "top": 5}),
        ("diff_reports", {"baseline": str(EXAMPLE), "candidate": str(saved_step0), "chip": None, "top": 50}),
        ("explain_finding", {"path": str(EXAMPLE), "finding": 1, "chip": "h100"}),
        ("list_chips", {}),
        ("estimate_model", {"config": str(MODELS / "llama2-7b.json"), "chip": "h100"}),
        ("explain_finding", {"path": str(EXAMPLE), "finding": 99, "chip": "h100"}),
        ("analyze_trace", {"path": str(REPO / "no-such-trace.json")}),
        ("analyze_trace", {"path": str(saved_step0), "chip": "a100"}),
    ]
    return anyio.run(_conversation, calls)


@pytest.fixture(scope="module")
def example():
    return analyze(read_trace(EXAMPLE), chip="h100")


def _json(result) -> dict:
    assert not result.is_error, result.content[0].text
    return result.structured_content


def test_the_server_lists_the_five_tools_with_descriptions(talk):
    tools, _ = talk
    assert sorted(t.name for t in tools) == ["analyze_trace", "diff_reports", "estimate_model", "explain_finding",
                                             "list_chips"]
    for t in tools:
        assert len(t.description) > 80, t.name
    schema = next(t for t in tools if t.name == "analyze_trace").input_schema
    assert schema["required"] == ["path"] and {"chip", "top", "rank", "step", "group_by"} <= set(schema["properties"])


def test_analyze_trace_returns_the_versioned_report(talk, example):
    d = _json(talk[1][0])
    want = example.to_dict(top=5)
    assert d["schema_version"] == 2 and "ops" not in d
    assert [r["label"] for r in d["ranking"]] == [r["label"] for r in want["ranking"]]
    assert len(d["ranking"]) == 5
    assert d["summary"] == want["summary"] and d["chip"]["name"] == "NVIDIA H100 SXM5 80GB"
    assert [f["title"] for f in d["findings"]] == [f.title for f in example.findings]


def test_diff_reports_compares_headlines_and_per_label_time(talk, example):
    d = _json(talk[1][1])
    assert d["diff_schema_version"] == 1
    # the candidate is step 0 alone: a third of the example's 252 ops (3 identical-shape steps)
    assert d["headline"]["device_ops"] == {"baseline": 252, "candidate": 84, "delta": -168}
    ops = example.ops.to_dicts()
    label = lambda o: o["name"] if str(o["kind"]) in ("memcpy", "memset") or o["op"] is None else o["op"]  # noqa: E731
    full, step0 = {}, {}
    for o in ops:
        full[label(o)] = full.get(label(o), 0) + o["dur_ns"]
        if o["step"] == 0:
            step0[label(o)] = step0.get(label(o), 0) + o["dur_ns"]
    assert d["labels_total"] == len(full)
    for r in d["labels"]:
        assert r["baseline_ns"] == full[r["label"]] and r["candidate_ns"] == step0.get(r["label"])
        assert r["delta_ns"] == step0.get(r["label"], 0) - full[r["label"]]
    deltas = [abs(r["delta_ns"]) for r in d["labels"]]
    assert deltas == sorted(deltas, reverse=True)


def test_explain_finding_gives_the_finding_its_ops_and_its_page(talk, example):
    d = _json(talk[1][2])
    f = example.findings[0]
    assert (d["number"], d["of"]) == (1, 5)
    assert d["finding"]["title"] == f.title and d["finding"]["recoverable_ns"] == f.recoverable_ns
    assert {r["label"] for r in d["ops"]} | set(d["ops_not_ranked"]) == set(f.ops)
    assert d["doc_page"] == f"docs/findings/{f.kind}.md"
    assert d["doc"] == (REPO / d["doc_page"]).read_text()
    assert d["detector"]


def test_list_chips_is_the_chip_table(talk):
    d = _json(talk[1][3])
    # the chip tables of chips.toml, read from the raw file: one `[chips.<key>]` header each
    keys = re.findall(r"^\[chips\.([A-Za-z0-9_-]+)\]\s*$", (REPO / "traceroof" / "chips.toml").read_text(), re.M)
    assert d["chips_schema_version"] == 1
    assert sorted(c["key"] for c in d["chips"]) == sorted(keys)
    h100 = next(c for c in d["chips"] if c["key"] == "h100_sxm")
    assert h100["peak_flops_per_s"]["bf16"] == 989.4e12  # dense bf16 (DESIGN §5: 1979 is the sparse figure)


def test_estimate_model_counts_the_reference_7b(talk):
    d = _json(talk[1][4])
    assert d["estimate_schema_version"] == 1
    assert d["params"]["total"] == 6_738_149_376  # DESIGN §7: L=32, d=4096, d_ff=11008, V=32000, untied


def test_bad_input_is_a_tool_error_with_one_line(talk):
    bad_finding, missing, saved_with_chip = talk[1][5], talk[1][6], talk[1][7]
    assert saved_with_chip.is_error and "is a saved report: chip, rank, step and group_by need a trace" in \
        saved_with_chip.content[0].text  # never silently ignored
    assert bad_finding.is_error and missing.is_error
    assert "finding 99 does not exist; the report has 5 findings (numbered from 1)" in bad_finding.content[0].text
    assert f"traceroof: error: {REPO / 'no-such-trace.json'}: no such file" in missing.content[0].text
    assert "Traceback" not in missing.content[0].text


def test_without_the_sdk_the_command_says_which_extra():
    import os
    import subprocess

    code = "import sys; sys.modules['mcp'] = None; from traceroof.cli import main; main(['mcp'])"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(REPO)}, stdin=subprocess.DEVNULL)
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip() == "traceroof: error: mcp needs the mcp extra (mcp is missing): pip install 'traceroof[mcp]'"


def test_an_empty_path_is_refused_not_read_as_the_working_folder():
    from traceroof.errors import UsageError
    from traceroof.mcp_server import _report

    with pytest.raises(UsageError, match="found an empty string"):
        _report("  ")
