"""Renderer for ``traceroof chips``: the database with dense peaks and ridge points."""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from typing import Any

from rich.markup import escape
from rich.table import Table

from .. import units
from ..dtypes import CHIP_TABLE_DTYPES
from . import terminal


def _row(c: Any) -> dict[str, Any]:
    ridge = c.ridge_point("bf16") if c.peak("bf16") else (c.ridge_point("fp16") if c.peak("fp16") else None)
    return {
        "key": c.key,
        "name": c.name,
        "vendor": c.vendor,
        "aliases": list(c.aliases),
        "peak_flops_per_s": dict(c.peak_flops_per_s),
        "hbm_bytes": c.hbm_bytes,
        "hbm_bytes_per_s": c.hbm_bytes_per_s,
        "ridge_point_flops_per_byte": ridge,
        "intra_node_bytes_per_s": c.intra_node_bytes_per_s,
        "inter_node_bytes_per_s": c.inter_node_bytes_per_s,
        "host_link_bytes_per_s": c.host_link_bytes_per_s,
        "scale_up_domain": c.scale_up_domain,
        "launch_overhead_ns": c.launch_overhead_ns,
        "sources": dict(c.sources),
    }


#: table columns dropped first on a narrow terminal
_DROP_ORDER = ("fp16\nTFLOP/s", "tf32\nTFLOP/s", "fp8\nTFLOP/s", "HBM\nGB", "fp32\nTFLOP/s", "name")


def render_chips(chips: Sequence[Any], fmt_name: str = "table", *, width: int | None = None) -> str:
    """The chip database as ``json`` (every field and source), ``markdown`` or a ``table``:
    dense peaks in TFLOP/s (:data:`~traceroof.dtypes.CHIP_TABLE_DTYPES`), HBM in GB and TB/s,
    the bf16 (else fp16) ridge point in FLOP/byte."""
    rows = [_row(c) for c in chips]
    if fmt_name == "json":
        return json.dumps(rows, indent=2)
    headers = ["key", "name"] + [f"{d} (TFLOP/s)" for d in CHIP_TABLE_DTYPES] + ["HBM (GB)", "HBM (TB/s)", "ridge bf16 (FLOP/B)"]  # fp16 where no bf16, marked
    body = []
    for r in rows:
        p = r["peak_flops_per_s"]
        body.append(
            [r["key"], r["name"]]
            + [f"{p[d] / 1e12:.4g}" if p.get(d) else "—" for d in CHIP_TABLE_DTYPES]
            + [f"{r['hbm_bytes'] / 1e9:.4g}", f"{r['hbm_bytes_per_s'] / 1e12:.4g}",
               # a chip without bf16 (V100, T4) shows its fp16 ridge, marked so
               units.ratio(r["ridge_point_flops_per_byte"]) + ("" if p.get("bf16") or not p.get("fp16")
                                                               or r["ridge_point_flops_per_byte"] is None else " fp16")]
        )
    if fmt_name == "markdown":
        lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
        lines += ["| " + " | ".join(b) + " |" for b in body]
        return "\n".join(lines)
    cols = terminal.width(width)
    headers = [h.replace(" (", "\n").rstrip(")") for h in headers]  # two-line headers: narrower
    kept, room = terminal.fit_columns(headers, body, cols, drop_order=_DROP_ORDER, flexible="name",
                                      flexible_min=20)
    idx = [headers.index(h) for h in kept]
    buf = io.StringIO()
    con = terminal.console(buf, cols)
    t = Table(title="Chip database (dense peaks; sources: `traceroof chips --format json`, docs/chips.md)",
              title_justify="left")
    for h in kept:
        t.add_column(h, justify="left" if h in ("key", "name") else "right", no_wrap=True)
    for b in body:
        if room is not None:
            b = [units.short_name(b[0], 10_000), units.short_name(b[1], room), *b[2:]]
        t.add_row(*(escape(b[i]) for i in idx))
    con.print(t)
    if len(kept) < len(headers):
        left = ", ".join(h.replace("\n", " ") for h in headers if h not in kept)
        con.print(terminal.wrap(f"(left out at {cols} columns: {left}; --format markdown or json has them)",
                                cols, "", ""))
    return terminal.finish(buf.getvalue())
