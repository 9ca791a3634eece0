"""Renderer for ``traceroof chips``: the database with dense peaks and ridge points."""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .. import units
from ..dtypes import CHIP_TABLE_DTYPES


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
        "launch_overhead_ns": c.launch_overhead_ns,
        "sources": dict(c.sources),
    }


def render_chips(chips: Sequence[Any], fmt_name: str = "table") -> str:
    """The chip database as ``json`` (every field and source), ``markdown`` or a ``table``:
    dense peaks in TFLOP/s (:data:`~traceroof.dtypes.CHIP_TABLE_DTYPES`), HBM in GB and TB/s,
    the bf16 (else fp16) ridge point in FLOP/byte."""
    rows = [_row(c) for c in chips]
    if fmt_name == "json":
        return json.dumps(rows, indent=2)
    headers = ["key", "name"] + [f"{d} (TFLOP/s)" for d in CHIP_TABLE_DTYPES] + ["HBM (GB)", "HBM (TB/s)", "ridge bf16 (FLOP/B)"]
    body = []
    for r in rows:
        p = r["peak_flops_per_s"]
        body.append(
            [r["key"], r["name"]]
            + [f"{p[d] / 1e12:.4g}" if p.get(d) else "—" for d in CHIP_TABLE_DTYPES]
            + [f"{r['hbm_bytes'] / 1e9:.4g}", f"{r['hbm_bytes_per_s'] / 1e12:.4g}",
               units.ratio(r["ridge_point_flops_per_byte"])]
        )
    if fmt_name == "markdown":
        lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
        lines += ["| " + " | ".join(b) + " |" for b in body]
        return "\n".join(lines)
    buf = io.StringIO()
    con = Console(file=buf, width=200, color_system=None, highlight=False)
    t = Table(title="Chip database (dense peaks; sources: `traceroof chips --format json`, docs/chips.md)", title_justify="left")
    for h in headers:
        t.add_column(h, justify="left" if h in ("key", "name") else "right")
    for b in body:
        t.add_row(*(escape(c) for c in b))
    con.print(t)
    return buf.getvalue()
