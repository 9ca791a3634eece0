"""``traceroof estimate`` on the command line (issue 18): every section from options, output
that fits 80 and 120 columns with no padding, one clear line (exit 2) for a bad value naming
the option, the JSON sections, the latency-throughput chart, the --help text; and the model
floor ``analyze --model`` prints beside the measured step (item 6)."""

from __future__ import annotations

import json
import re

import polars as pl
import pytest
from click.testing import CliRunner
from conftest import FIXTURES, MODELS

import traceroof
from traceroof.cli import cli

M7, M70, MIX = (str(MODELS / f) for f in ("llama2-7b.json", "llama3-70b.json", "mixtral-8x7b.json"))
EXAMPLE = str(FIXTURES / "example_h100_decoder.json.gz")


def _run(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(cli, list(args), env=env or {"COLUMNS": ""})


FULL = ("estimate", "--model", M70, "--chip", "h100", "--seq", "8192", "--tokens", "15e12",
        "--chips", "1024", "--mfu", "0.4", "--price-per-chip-hour", "2", "--tp", "8", "--pp", "4",
        "--fsdp", "32", "--global-batch-tokens", "4194304", "--serve", "--tpot-ms", "50")


@pytest.mark.parametrize("width", [80, 120])
def test_every_section_fits_the_terminal(width) -> None:
    res = _run(*FULL, env={"COLUMNS": str(width)})
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert max(len(ln) for ln in lines) <= width
    assert all(ln == ln.rstrip() for ln in lines)  # no padding
    text = res.output
    for title in ("Training totals", "Training memory per device", "Inference memory per device",
                  "Parallel layout: tp=8 pp=4 fsdp=32", "Serving (tp=8"):
        assert title in text, title
    # the numbers the library tests check, as printed: 6NT, chip-hours, the TP all-reduces
    assert "6.350e+24 FLOP" in text
    assert re.search(r"tp\s+all-reduce\s+.*763\.55 ms", text)
    # 80 columns leaves the lowest-value grid columns out, and says so
    assert ("left out" in text) == (width == 80)


def test_search_and_memory_cli() -> None:
    res = _run("estimate", "--model", MIX, "--chip", "h100", "--search", "--chips", "64",
               "--global-batch-tokens", "2e6", "--mfu", "0.4", "--format", "json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["estimate_schema_version"] == 2
    s = data["search"]
    assert s["tried"] == s["rejected"] + len(s["layouts"])
    steps = [p["step_s"] for p in s["layouts"]]
    assert steps == sorted(steps) and all(p["memory"]["fits"] for p in s["layouts"])
    # one device, no layout: 16 B per parameter of all 46,702,792,704 as weights/grads/optimizer
    tm = data["memory"]["training"]
    assert tm["weights_bytes"] + tm["gradients_bytes"] + tm["optimizer_bytes"] == \
        16 * 46_702_792_704
    assert data["training"] is None and data["serving"] is None and data["parallel"] is None


def test_json_training_example() -> None:
    res = _run("estimate", "--model", M70, "--chip", "tpu-v5p", "--tokens", "15e12",
               "--chips", "8960", "--mfu", "0.4", "--format", "json")
    assert res.exit_code == 0, res.output
    t = json.loads(res.stdout)["training"]
    # 6·70,552,387,584·15e12 / (8,960·459e12·0.4) / 86,400 s = 44.7 days
    assert round(t["wall_clock_linear_only_s"] / 86_400, 1) == 44.7
    assert t["cost_usd"] is None


@pytest.mark.parametrize("args, needle", [
    (("--mfu", "1.5", "--tokens", "1e9", "--chips", "8"), "--mfu"),
    (("--tokens", "1e9", "--chips", "8"), "--tokens/--hours need --mfu"),
    (("--tokens", "1e9", "--mfu", "0.4"), "need --chips"),
    (("--tp", "3", "--global-batch-tokens", "1e6"), "--tp 3 must divide the 32 attention heads"),
    (("--tp", "2"), "needs --global-batch-tokens"),
    (("--search", "--global-batch-tokens", "1e6"), "--search needs --chips"),
    (("--dtype", "int4"), "--weight-dtype int4"),
    (("--tpot-ms", "0"), "--tpot-ms"),
    (("--chips", "16", "--tp", "2", "--tokens", "1e9", "--mfu", "0.4"), "--chips 16 disagrees"),
    (("--chips", "16"), "no section uses --chips"),
    (("--price-per-chip-hour", "2", "--global-batch-tokens", "1e6"),
     "no section uses --price-per-chip-hour (used by --tokens/--hours and --serve); "
     "--global-batch-tokens"),
    (("--cp", "3", "--global-batch-tokens", "1e6"), "--cp 3 must divide the sequence length"),
])
def test_bad_values_are_one_line_exit_2(args, needle) -> None:
    res = _run("estimate", "--model", M7, "--chip", "h100", *args)
    assert res.exit_code == 2, res.output
    err = [ln for ln in res.output.splitlines() if ln.strip()]
    assert any(needle in ln for ln in err), res.output
    assert "Traceback" not in res.output


def test_help_does_not_claim_a_trace() -> None:
    res = _run("estimate", "--help")
    assert res.exit_code == 0
    flat = " ".join(res.output.split())
    assert "detected from the trace" not in flat
    for opt in ("--tokens", "--hours", "--mfu", "--price-per-chip-hour", "--weight-dtype",
                "--tp", "--pp", "--dp", "--fsdp", "--ep", "--cp", "--search", "--tpot-ms",
                "--kv-budget-gb", "--plot", "--recompute"):
        assert opt in flat, opt


def test_mla_config_is_estimated_not_refused() -> None:
    res = _run("estimate", "--model", str(MODELS / "deepseek-v2-lite.json"), "--chip", "h100",
               "--format", "json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["kv_bytes_per_token"] == 27 * (512 + 64) * 2


def test_plot_writes_a_self_contained_chart(tmp_path) -> None:
    out = tmp_path / "sweep.html"
    res = _run("estimate", "--model", M7, "--chip", "h100", "--tpot-ms", "20", "--plot", str(out))
    assert res.exit_code == 0, res.output
    html = out.read_text()
    assert "<script src=\"https://cdn.plot.ly" not in html  # plotly.js inlined: opens offline
    assert "plotly" in html.lower() and len(html) > 1_000_000
    # one point per batch of the sweep: 1, 2, 4, 8, 16, 29 (29 sequences of 4K fit)
    for b in (1, 2, 4, 8, 16, 29):
        assert f"B={b}" in html
    assert "B=32" not in html
    bad = _run("estimate", "--model", M7, "--chip", "h100", "--plot", str(tmp_path / "no" / "x.html"))
    assert bad.exit_code == 9 and "--plot" in bad.output


def _ops_expected_per_step_and_device(report) -> float:
    """Σ expected_ns of the ops in complete steps / (complete steps × devices), computed here
    step by step from the op and step tables."""
    total, devices = 0.0, 0
    for row in report.steps.iter_rows(named=True):
        if row["partial"]:
            continue
        ops = report.ops.filter((pl.col("rank") == row["rank"]) & (pl.col("step") == row["step"]))
        total += sum(x for x in ops["expected_ns"].to_list() if x is not None)
        devices += row["devices"] or 1
    return total / devices


def test_analyze_model_floor_below_and_above_the_step() -> None:
    report = traceroof.analyze(traceroof.read_trace(EXAMPLE))
    step_s = report.summary.step.step_time_ns / 1e9
    expected_s = _ops_expected_per_step_and_device(report) / 1e9
    # GPT-2 small, decode of 8 tokens: weights 124,439,808 · 2 B / 3.35e12 B/s = 74.3 µs, far
    # under the measured step: "model floor <= measured step"
    res = _run("analyze", EXAMPLE, "-q", "--model", str(MODELS / "gpt2.json"),
               "--tokens-per-step", "8", "--mode", "infer", env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    block = res.output.split("Model floor", 1)[1]
    assert "74.3 µs" in block and "model floor <= measured step" in block
    assert f"{expected_s * 1e3:.2f} ms" in block and f"{step_s * 1e3:.2f} ms" in block
    assert max(len(ln) for ln in res.output.split("Model floor", 1)[1].splitlines()) <= 80
    # the 7B decoding 8 tokens needs its 13.48 GB of weights: 4.02 ms > the 2.5 ms step: said
    res = _run("analyze", EXAMPLE, "-q", "--model", M7, "--tokens-per-step", "8",
               "--mode", "infer", "--format", "markdown")
    assert res.exit_code == 0, res.output
    assert "| model floor (estimate) | 4.02 ms |" in res.output
    assert "ABOVE the measured step" in res.output


def test_no_kv_budget_says_why_and_plot_is_refused_first(tmp_path) -> None:
    # Mixtral's 93.41 GB of bf16 weights exceed 0.95 · 80 GB: KV budget −17.41 GB, no sequence
    res = _run("estimate", "--model", MIX, "--chip", "h100", "--serve", "--tpot-ms", "30")
    assert res.exit_code == 0, res.output
    flat = " ".join(res.output.split())
    assert "KV budget -17.41 GB" in flat and "max concurrent sequences 0" in flat
    assert "none: no sequence fits in the KV budget" in flat
    assert "no decode sweep: the weights leave no KV budget for one sequence" in flat
    out = tmp_path / "x.html"
    res = _run("estimate", "--model", MIX, "--chip", "h100", "--plot", str(out))
    assert res.exit_code == 2 and "--plot needs a serving sweep" in res.output
    assert "parameters N" not in res.output and not out.exists()
