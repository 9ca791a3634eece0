"""Renderer for ``traceroof estimate``: an :class:`~traceroof.estimate.Estimate` as a terminal
table, markdown or JSON. Every number carries its unit (:mod:`traceroof.units`); the table and
markdown add how each one is computed."""

from __future__ import annotations

import io
import json
from typing import Literal

from .. import units
from ..errors import UsageError
from ..estimate import TRAINING_BYTES_PER_PARAM, Estimate


def _rows(e: Estimate) -> list[tuple[str, str, str]]:
    """(quantity, value with units, how it is computed)."""
    p, f = e.params, e.flops
    moe = e.params.active != e.params.total
    rows: list[tuple[str, str, str]] = [
        ("parameters N", units.count_exact(p.total),
         "linear layers of the blocks + token embedding + untied LM head (norms excluded)"),
    ]
    if p.per_layer is not None:
        rows.append(("parameters per layer", units.count_exact(p.per_layer), "attention + MLP weights"))
    if moe:
        rows.append(("active parameters per token", units.count_exact(p.active),
                     "attention + top-k experts + shared experts + router + embeddings"))
    rows += [
        ("parameters incl. norms", units.count_exact(p.all), "every stored tensor (= sum of numel)"),
        (f"weight bytes ({e.dtype})", units.gigabytes(e.weight_bytes),
         f"{p.all:,} params x {e.bytes_per_param:g} B"),
        ("forward FLOPs per token", units.flop(f.linear_forward, "/token"),
         "2N" + ("_active" if moe else "") + " (Kaplan et al. 2020; PaLM App. B)"),
        ("training FLOPs per token", units.flop(f.linear_train, "/token"),
         "6N" + ("_active" if moe else "") + " = 3 x forward"),
        (f"attention FLOPs per token (S={e.seq_len:,}, causal)",
         units.flop(f.attention_forward, "/token"),
         "4·L·d_attn·(S+1)/2 forward; x3 for training"),
        ("attention/linear crossover", f"{e.crossover_context_len:,.0f} tokens",
         "S = N_blocks / (2·L·d_attn): 4·L·S·d_attn = 2·N_blocks"),
        ("training memory", units.gigabytes(e.training_memory_bytes),
         f"{TRAINING_BYTES_PER_PARAM} B/param (bf16 w + grad, fp32 master + Adam m, v); "
         "activations excluded"),
        (f"KV cache per token ({e.kv_dtype})", units.bytes_exact(e.kv_bytes_per_token),
         "2·L·kv_heads·head_dim·bytes"),
        (f"KV cache per sequence (S={e.seq_len:,})", units.bytes_exact(e.kv_bytes_per_sequence),
         "per token x S"),
        ("KV budget in HBM", units.gigabytes(e.kv_budget_bytes), e.kv_budget_source),
        (f"max concurrent sequences (S={e.seq_len:,})", f"{e.max_concurrent_sequences:,}",
         "floor(KV budget / KV per sequence)"),
        ("peak taken", e.peak.describe(), "dense tensor-core peak"),
        ("HBM bandwidth", f"{e.hbm_bytes_per_s / 1e12:.3f} TB/s", "chip database"),
        ("ridge point", f"{e.ridge_point:,.1f} FLOP/byte", "peak / HBM bandwidth"),
        ("critical batch (decode)", f"{e.critical_batch:,.1f} tokens",
         "ridge x weight bytes / (2·N" + ("_active" if moe else "") + ")"),
        ("decode floor (batch 1)", units.seconds(e.decode_floor_s),
         ("active " if moe else "") + "weight bytes / HBM bandwidth"),
        (f"decode step floor (batch {e.batch}, S={e.seq_len:,})", units.seconds(e.decode_step_floor_s),
         "(weights read + batch x KV per sequence) / HBM bandwidth"),
        (f"prefill intensity (batch {e.batch} x {e.seq_len:,} tokens)",
         f"{e.prefill_intensity:,.0f} FLOP/byte",
         "forward FLOPs / (weights read + KV written); activations excluded"),
        ("prefill floor", units.seconds(e.prefill_floor_s),
         "max(FLOPs / peak, bytes / HBM bandwidth)"),
    ]
    return rows


def render_estimate(est: Estimate, fmt: Literal["table", "markdown", "json"] = "table", *,
                    width: int | None = None) -> str:
    """Render an :class:`Estimate` as a terminal ``table``, ``markdown`` or ``json``.

    Every number carries its unit; the table and markdown add how each one is computed.

    Raises:
        UsageError: an unknown ``fmt``.
    """
    if fmt == "json":
        return json.dumps(est.to_dict(), indent=2, ensure_ascii=False) + "\n"
    title = (f"{est.model} on {est.chip} ({est.dtype}, KV {est.kv_dtype}, seq {est.seq_len:,}, "
             f"batch {est.batch})")
    rows = _rows(est)
    if fmt == "markdown":
        out = [f"### Estimate: {title}", "", "| quantity | value | how |", "|---|---:|---|"]
        out += [f"| {q} | {v} | {h} |" for q, v, h in rows]
        if est.notes:
            out += ["", *[f"- note: {n}" for n in est.notes]]
        return "\n".join(out) + "\n"
    if fmt == "table":
        from rich.markup import escape
        from rich.table import Table

        from . import terminal

        cols = terminal.width(width)
        table = Table(title=escape(title), title_justify="left")
        table.add_column("quantity")
        table.add_column("value", justify="right")
        table.add_column("how")
        for r in rows:
            table.add_row(*(escape(c) for c in r))
        buf = io.StringIO()
        console = terminal.console(buf, cols)
        console.print(table)
        for n in est.notes:
            console.print(escape(terminal.wrap(n, cols, "note: ", "      ")))
        return terminal.finish(buf.getvalue())
    raise UsageError(f"unknown format {fmt!r}; expected table, markdown or json")
