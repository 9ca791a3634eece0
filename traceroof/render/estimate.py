"""Renderer for ``traceroof estimate``: an :class:`~traceroof.estimate.Estimate` or a whole
:class:`~traceroof.estimate_plan.EstimatePlan` as terminal text, markdown or JSON. Every number
carries its unit (:mod:`traceroof.units`); the text and markdown say how each one is computed.

The terminal text fits the width it is printed in (:func:`traceroof.render.terminal.width`):
a section is ``quantity  value  how`` in three columns when they fit, else the "how" goes on
the lines below its row; the grids (batch sweep, collectives, layouts) drop their
lowest-value columns first. No line carries trailing spaces.
"""

from __future__ import annotations

import json
import textwrap
from typing import Literal

from .. import units
from ..errors import UsageError
from ..estimate import Estimate
from ..estimate_floor import ModelFloor
from ..estimate_plan import EstimatePlan
from . import terminal
from .estimate_sections import Grid, Section, model_floor_section, plan_sections

Row = tuple[str, str, str]


def _rows(e: Estimate) -> list[Row]:
    """(quantity, value with units, how it is computed) of the per-token numbers."""
    p, f = e.params, e.flops
    moe = e.params.active != e.params.total
    act = "_active" if moe else ""
    rows: list[Row] = [
        ("parameters N", units.count_exact(p.total),
         "linear layers of the blocks + token embedding + untied LM head (norms excluded)"),
    ]
    if p.per_layer is not None:
        rows.append(("parameters per layer", units.count_exact(p.per_layer),
                     "attention + MLP weights"))
    if moe:
        rows.append(("active parameters per token", units.count_exact(p.active),
                     "attention + top-k experts + shared experts + router + embeddings"))
    rows += [
        ("parameters incl. norms", units.count_exact(p.all), "every stored tensor (= sum of numel)"),
        (f"weight bytes ({e.weight_dtype})", units.gigabytes(e.weight_bytes),
         f"{p.all:,} params x {e.bytes_per_param:g} B"),
        ("forward FLOPs per token", units.flop(f.linear_forward, "/token"),
         f"2N{act} (Kaplan et al. 2020; PaLM App. B)"),
        ("training FLOPs per token", units.flop(f.linear_train, "/token"), f"6N{act} = 3 x forward"),
        (f"attention FLOPs per token (S={e.seq_len:,}, causal)",
         units.flop(f.attention_forward, "/token"), "4·L·d_attn·(S+1)/2 forward; x3 for training"),
        ("attention/linear crossover", f"{e.crossover_context_len:,.0f} tokens",
         "S = N_blocks / (2·L·d_attn): 4·L·S·d_attn = 2·N_blocks"),
        ("training memory (1 device)", units.gigabytes(e.training_memory_bytes),
         "16 B/param (bf16 w + grad, fp32 master + Adam m, v); activations excluded"),
        (f"KV cache per token ({e.kv_dtype})", units.bytes_exact(e.kv_bytes_per_token),
         "L·(kv_lora_rank + rope dim)·bytes (MLA latent)" if "latent" in " ".join(e.notes)
         else "2·L·kv_heads·head_dim·bytes"),
        (f"KV cache per sequence (S={e.seq_len:,})", units.bytes_exact(e.kv_bytes_per_sequence),
         "per token x S (sliding-window layers keep W)"),
        ("KV budget in HBM", units.gigabytes(e.kv_budget_bytes), e.kv_budget_source),
        (f"max concurrent sequences (S={e.seq_len:,})", f"{e.max_concurrent_sequences:,}",
         "floor(KV budget / KV per sequence)"),
        ("peak taken", e.peak.describe().split(" (", 1)[0],
         f"dense peak of the compute dtype {e.dtype}: {e.chip}"
         + (f"; {e.peak.source.split(';')[0].strip()}" if e.peak.source else "")),
        ("HBM bandwidth", f"{e.hbm_bytes_per_s / 1e12:.3f} TB/s", "chip database"),
        ("ridge point", f"{e.ridge_point:,.1f} FLOP/byte", "peak / HBM bandwidth"),
        ("critical batch (decode)", f"{e.critical_batch:,.1f} tokens",
         f"ridge x weight bytes / (2·N{act})"),
        ("decode floor (batch 1)", units.seconds(e.decode_floor_s),
         ("active " if moe else "") + "weight bytes / HBM bandwidth"),
        (f"decode step floor (batch {e.batch}, S={e.seq_len:,})",
         units.seconds(e.decode_step_floor_s),
         "(weights read + batch x KV per sequence) / HBM bandwidth"),
        (f"prefill intensity (batch {e.batch} x {e.seq_len:,} tokens)",
         f"{e.prefill_intensity:,.0f} FLOP/byte",
         "forward FLOPs / (weights read + KV written); activations excluded"),
        ("prefill floor", units.seconds(e.prefill_floor_s), "max(FLOPs / peak, bytes / HBM bandwidth)"),
    ]
    return rows


def _title(e: Estimate) -> str:
    w = f", weights {e.weight_dtype}" if e.weight_dtype != e.dtype else ""
    return (f"{e.model} on {e.chip} ({e.dtype}{w}, KV {e.kv_dtype}, seq {e.seq_len:,}, "
            f"batch {e.batch})")


# ------------------------------------------------------------------------------ terminal text


def _wrap(text: str, cols: int, indent: int) -> list[str]:
    pad = " " * indent
    return textwrap.wrap(text, width=max(cols, indent + 20), initial_indent=pad,
                         subsequent_indent=pad, break_long_words=False,
                         break_on_hyphens=False) or [""]


def _text_rows(rows: list[Row], cols: int) -> list[str]:
    """``quantity  value  how`` aligned in three columns when the widest quantity (up to 44)
    and value (up to 32) leave the "how" column 28 characters; else, and for a longer quantity
    or value, the value and "how" go on the lines below the quantity, indented."""
    qw = min(max((len(q) for q, _, _ in rows), default=0), 44)
    vw = max((len(v) for _, v, _ in rows if len(v) <= 32), default=0)
    out: list[str] = []
    three = 2 + qw + 2 + vw + 2 + 28 <= cols
    for q, v, h in rows:
        if len(q) > qw or len(v) > vw or 2 + qw + 2 + vw > cols:
            out += _wrap(q, cols, 2)
            out += _wrap(v, cols, 4)
        else:
            head = f"  {q:<{qw}}  {v:>{vw}}"
            if three and h:
                hw = _wrap(h, cols - len(head) - 2, 0)
                out.append(head + "  " + hw[0])
                out += [" " * (len(head) + 2) + x for x in hw[1:]]
                continue
            out.append(head)
        if h:
            out += _wrap(h, cols, 6)
    return out


def _fit_grid(g: Grid, cols: int) -> tuple[list[str], list[list[str]]]:
    """The grid's columns that fit in ``cols`` (its ``drop`` columns go first)."""
    headers, rows = list(g.headers), [list(r) for r in g.rows]
    drop = list(g.drop)
    while True:
        widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
        if 2 + sum(widths) + 2 * (len(widths) - 1) <= cols or not drop:
            return headers, rows
        i = headers.index(drop.pop(0))
        headers.pop(i)
        for r in rows:
            r.pop(i)


def _text_grid(g: Grid, cols: int) -> list[str]:
    headers, rows = _fit_grid(g, cols)
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]

    left = g.left - sum(1 for h in g.headers[:g.left] if h not in headers)

    def line(cells: list[str]) -> str:
        parts = [c.ljust(w) if i < left else c.rjust(w)
                 for i, (c, w) in enumerate(zip(cells, widths))]
        return ("  " + "  ".join(parts)).rstrip()

    out = [line(headers), "  " + "  ".join("-" * w for w in widths)] + [line(r) for r in rows]
    gone = [h for h in g.headers if h not in headers]
    if gone:
        out += _wrap(f"(narrow terminal: column{'s' if len(gone) > 1 else ''} "
                     f"{', '.join(gone)} left out; --format markdown has them)", cols, 2)
    return out


def _text(sections: list[Section], notes: list[str], cols: int) -> str:
    out: list[str] = []
    for s in sections:
        if out:
            out.append("")
        out += textwrap.wrap(s.title, width=cols, break_long_words=False) or [s.title]
        out.append("=" * min(cols, max(len(x) for x in textwrap.wrap(s.title, width=cols) or [""])))
        out += _text_rows(s.rows, cols)
        for g in s.grids:
            out.append("")
            out += _wrap(g.title, cols, 2)
            out += _text_grid(g, cols)
            if g.how:
                out += _wrap(g.how, cols, 4)
        for line in s.after:
            out += _wrap(line, cols, 2)
    if notes:
        out.append("")
    for n in notes:
        out.append(terminal.wrap(n, cols, "note: ", "      "))
    return terminal.finish("\n".join(out)) + "\n"


# ------------------------------------------------------------------------------ markdown


def _md_cell(s: str) -> str:
    return s.replace("|", "\\|")


def _markdown(sections: list[Section], notes: list[str], title: str) -> str:
    out = [f"### Estimate: {title}"]
    for s in sections:
        out += ["", f"#### {s.title}", "", "| quantity | value | how |", "|---|---:|---|"]
        out += [f"| {_md_cell(q)} | {_md_cell(v)} | {_md_cell(h)} |" for q, v, h in s.rows]
        for g in s.grids:
            out += ["", f"{g.title}:", "", "| " + " | ".join(g.headers) + " |",
                    "|" + "|".join("---" if i < g.left else "---:" for i in range(len(g.headers))) + "|"]
            out += ["| " + " | ".join(_md_cell(c) for c in r) + " |" for r in g.rows]
            if g.how:
                out += ["", g.how]
        if s.after:
            out += [""] + [f"- {x}" for x in s.after]
    if notes:
        out += ["", *[f"- note: {n}" for n in notes]]
    return "\n".join(out) + "\n"


def render_estimate(est: Estimate | EstimatePlan,
                    fmt: Literal["table", "markdown", "json"] = "table", *,
                    width: int | None = None) -> str:
    """Render an :class:`Estimate` (the per-token numbers) or an :class:`EstimatePlan` (every
    section asked for) as terminal text (``table``, fitting ``width`` columns, default the
    terminal's), ``markdown`` or ``json`` (raw numbers, the unit in every key).

    Raises:
        UsageError: an unknown ``fmt``.
    """
    if fmt not in ("table", "markdown", "json"):
        raise UsageError(f"unknown format {fmt!r}; expected table, markdown or json")
    if fmt == "json":
        return json.dumps(est.to_dict(), indent=2, ensure_ascii=False) + "\n"
    e = est.estimate if isinstance(est, EstimatePlan) else est
    sections = [Section(_title(e), _rows(e))]
    notes = list(e.notes)
    if isinstance(est, EstimatePlan):
        sections += plan_sections(est)
        notes += list(est.notes)
    if fmt == "markdown":
        return _markdown(sections, notes, _title(e))
    return _text(sections, notes, terminal.width(width))


def render_model_floor(floor: ModelFloor, fmt: Literal["table", "markdown"] = "table", *,
                       width: int | None = None) -> str:
    """The ``analyze --model`` floor block (:class:`ModelFloor`) as terminal text fitting
    ``width`` columns, or as a markdown section."""
    sec = model_floor_section(floor)
    if fmt == "markdown":
        return _markdown([sec], [], "").split("\n", 2)[2]
    return _text([sec], [], terminal.width(width))
