"""The ``estimate`` command's options and ``analyze --model``'s floor block, kept out of
:mod:`traceroof.cli` (which stays the thin click layer): each option name says its unit,
and the floor is computed by :mod:`traceroof.estimate_floor` and rendered by
:mod:`traceroof.render.estimate`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

__all__ = ["estimate_options", "with_model_floor"]


def estimate_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The options of ``estimate`` (each name says its unit; docs/estimate.md has them all)."""
    pos, cnt = click.IntRange(min=1), click.IntRange(min=1)
    opts = [
        click.option("--model", "model_path", required=True,
                     type=click.Path(dir_okay=False, path_type=str), help="Hugging Face-style config.json."),
        click.option("--chip", metavar="NAME|FILE.toml", help="Chip name or alias (see `traceroof chips`), "
                     "or a path to a chip TOML. Required: there is no trace to detect it from."),
        click.option("--seq", "seq_len", type=pos, default=4096, show_default=True,
                     help="Sequence length in tokens (training sequences; decode position S)."),
        click.option("--batch", type=pos, default=1, show_default=True, help="Sequences per batch (decode, memory)."),
        click.option("--dtype", default="bf16", show_default=True, help="Compute dtype: sets the peak taken."),
        click.option("--weight-dtype", help="Weight storage dtype (int8, int4, fp8: weight-only "
                     "quantization; default --dtype)."),
        click.option("--kv-dtype", help="KV-cache dtype (default: --dtype)."),
        click.option("--kv-budget-gb", type=click.FloatRange(min=0, min_open=True),
                     help="HBM for the KV cache in GB (1e9 B), all --tp chips (default: 95 % of HBM minus weights)."),
        click.option("--tokens", type=click.FloatRange(min=0, min_open=True), help="Training tokens (count, 15e12)."),
        click.option("--hours", type=click.FloatRange(min=0, min_open=True), help="Training hours (gives the tokens)."),
        click.option("--chips", type=cnt, help="Chips of the training run (or the search)."),
        click.option("--mfu", type=click.FloatRange(0, 1, min_open=True), help="Model FLOPs utilization (fraction: 0.40 = 40 %)."),
        click.option("--price-per-chip-hour", "price", type=click.FloatRange(min=0), help="US dollars per chip-hour."),
        *[click.option(f"--{k}", type=cnt, help=h) for k, h in (
            ("tp", "Tensor-parallel degree."), ("pp", "Pipeline-parallel degree."),
            ("dp", "Data-parallel degree, replicated (DDP)."), ("fsdp", "Data-parallel degree, sharded (ZeRO-3)."),
            ("ep", "Expert-parallel degree (MoE)."), ("cp", "Context-parallel degree."))],
        click.option("--micro-batch", type=cnt, help="Sequences per micro-batch per data-parallel rank (default 1)."),
        click.option("--global-batch-tokens", type=click.FloatRange(min=0, min_open=True),
                     help="Tokens per optimizer step over all chips (with a layout or --search)."),
        click.option("--search", is_flag=True, help="Try the layouts of --chips chips; fastest that fits first."),
        click.option("--recompute", type=click.Choice(["none", "selective", "full"]), default="selective",
                     show_default=True, help="Activation checkpointing for the training memory."),
        click.option("--serve", is_flag=True, help="Serving: prefill, decode batch sweep, costs."),
        click.option("--prompt-tokens", type=pos, help="Prompt length in tokens for prefill (default --seq)."),
        click.option("--tpot-ms", type=click.FloatRange(min=0, min_open=True),
                     help="Time-per-output-token target in ms: the largest batch within it."),
        click.option("--plot", type=click.Path(dir_okay=False, path_type=str),
                     help="Write the latency-throughput curve as a self-contained HTML chart."),
        click.option("--format", "fmt", type=click.Choice(["table", "markdown", "json"]), default="table",
                     show_default=True),
    ]
    for o in reversed(opts):
        fn = o(fn)
    return fn


def with_model_floor(text: str, report: Any, model_path: str | None, mode: str,
                      tokens_per_step: float | None, fmt: str) -> str:
    """``text`` followed by the estimate's floor for the measured step (issue 18 item 6)."""
    import polars as pl

    from .estimate_floor import model_floor
    from .model import load_model_config
    from .render.estimate import render_model_floor

    mfu = report.summary.mfu
    step = report.summary.step
    if mfu is None or step is None:
        return text
    expected = None
    if report.ops is not None and report.steps.height and "expected_ns" in report.ops.columns:
        done = report.steps.filter(~pl.col("partial")).select("rank", "step", "devices")
        ops = report.ops.join(done.select("rank", "step"), on=["rank", "step"], how="semi")
        total = ops["expected_ns"].drop_nulls().sum() if ops.height else None
        if total and done.height:
            expected = float(total) / float(done["devices"].fill_null(1).sum())
    chip = report.chip
    peak = report.summary.hfu.peak_flops_per_s if report.summary.hfu else None  # MFU's peak
    floor = model_floor(
        load_model_config(model_path) if model_path else None, mode=mode,
        model_flops_per_step=mfu.model_flops_per_step, tokens_per_step=tokens_per_step,
        n_devices=mfu.devices or 1, peak_flops_per_s=peak,
        hbm_bytes_per_s=chip.hbm_bytes_per_s if chip else None,
        measured_step_ns=step.step_time_ns, ops_expected_ns_per_step=expected)
    return text.rstrip("\n") + "\n\n" + render_model_floor(floor, fmt)  # type: ignore[arg-type]
