"""The roofline tab's second panel: the memory movers a log-log roofline cannot place.

An op with bytes but no FLOPs (a copy, a memset, a kernel costed by its bytes alone) has an
arithmetic intensity of 0 and no achieved FLOP/s, so it has no point under the roofs; on an
H100 training trace such ops can hold nearly half of the device time. This panel puts each
such op group at its achieved bandwidth (bytes ÷ measured time, B/s) against the chip's HBM
bandwidth, on a log axis, one row per op kind.

Pure: op table and chip in, plotly figure out (no Dash); every trace has ``meta["role"]``
(``movers``, ``selected``), as in :mod:`.figures`.
"""

from __future__ import annotations

import math
from typing import Any

import plotly.graph_objects as go
import polars as pl

from .. import units
from ..sections import ChipInfo
from . import figures, numbers, views


def bandwidth_figure(ops: pl.DataFrame, chip: ChipInfo | None, *, by: str = "op",
                     selected: str | None = None) -> go.Figure:
    """Achieved bandwidth of the op groups that move bytes with no FLOPs.

    Args:
        ops: op table with roofline columns (already filtered to the rank/step shown).
        chip: ``Report.chip`` (``hbm_bytes_per_s``, B/s, draws the HBM line; None: no line).
        by: op-group key, ``op`` or ``kernel`` (:func:`views.label_expr`).
        selected: label of the selected op group (ringed).

    Returns:
        A figure with one ``movers`` trace per kind: one point per group of
        :func:`views.mover_groups`, x = ``move_bytes_per_s`` (Σbytes ÷ Σmeasured time of
        its mover ops, B/s), y = the kind, marker area ∝ its measured time (the roofline's
        scale: 5 + 35·√(t / t_max)), ``customdata`` = the group label; a vertical line (a
        layout shape, labelled) at the HBM bandwidth. ``layout.meta`` has ``points``,
        ``share`` (the movers' fraction of the device time shown) and ``hbm_bytes_per_s``. Host↔device copies run on their link (PCIe,
        NVLink-C2C), slower than HBM: their expected time in the hover is the roofline's,
        which uses that link.
    """
    fig = go.Figure()
    fig.update_layout(**figures._BASE_LAYOUT)
    groups = views.op_groups(ops, by)
    movers = views.mover_groups(groups).sort("measured_ns", descending=True)
    if movers.height == 0:
        return figures._empty(fig, "No op moves bytes without FLOPs here: every costed op is on the roofline above.")
    total = float(ops["dur_ns"].sum() or 0)
    share = float(movers["total_ns"].sum() or 0) / total if total else None
    W = figures.positive(chip.hbm_bytes_per_s if chip else None)
    xs = movers["move_bytes_per_s"].to_list() + ([W] if W else [])
    # 16×: at least one decade tick (numbers.log_ticks); clamped into the floats (numbers.log_bound)
    x_lo, x_hi = numbers.log_bound(min(xs) / 4), numbers.log_bound(max(xs) * 4)
    kinds = [k for k in figures.KIND_COLORS if k in set(movers["kind"].to_list())] + sorted(
        set(movers["kind"].to_list()) - set(figures.KIND_COLORS))
    tmax = float(movers["measured_ns"].max())
    for kind in kinds:
        sub = movers.filter(pl.col("kind") == kind)
        fig.add_trace(go.Scattergl(
            x=sub["move_bytes_per_s"].to_list(), y=[kind] * sub.height, mode="markers", name=kind,
            marker={"color": figures.KIND_COLORS.get(kind, "#2ca02c"), "opacity": 0.75,
                    "size": [_size(t, tmax) for t in sub["measured_ns"].to_list()],
                    "line": {"width": 0.5, "color": "#ffffff"}},
            customdata=sub["label"].to_list(), text=[_hover(r, W) for r in sub.iter_rows(named=True)],
            hovertemplate="%{text}<extra></extra>", meta={"role": "movers", "kind": kind},
        ))
    if W:  # a vertical line over the whole panel (a trace between two categories has no length with one)
        fig.add_shape(type="line", xref="x", yref="paper", x0=W, x1=W, y0=0, y1=1, line={"color": "#444", "width": 2})
        fig.add_annotation(x=math.log10(W), y=1, yref="paper", text=f"HBM {units.bytes_per_s(W)}", showarrow=False,
                           xanchor="right", yanchor="bottom", font={"size": 10, "color": "#333"})
    _ring(fig, movers, selected, tmax)
    note = (f"{units.plural(movers.height, 'op group')} with bytes and no FLOPs (zero or unknown): "
            f"{units.pct(share)} of device time; achieved bandwidth = bytes ÷ measured time")
    fig.update_layout(
        title={"text": "Memory movers · achieved bandwidth", "subtitle": {"text": note}},
        xaxis={"type": "log", "title": "achieved bandwidth (B/s)", "range": [math.log10(x_lo), math.log10(x_hi)],
               **numbers.log_ticks(x_lo, x_hi, units.bytes_per_s)},
        yaxis={"type": "category", "categoryorder": "array", "categoryarray": list(reversed(kinds)),
               "range": [-0.6, len(kinds) - 0.4], "fixedrange": True, "automargin": True},
        height=max(260, 190 + 46 * len(kinds)),
        clickmode="event", hovermode="closest", uirevision="bandwidth",
        margin={"l": 90, "r": 30, "t": 80, "b": 55},
        meta={"points": movers.height, "share": share, "hbm_bytes_per_s": W or None},
    )
    return fig


def _size(t_ns: float, tmax_ns: float) -> float:
    """Marker diameter (px) of a group of ``t_ns`` measured time: area ∝ time, as on the roofline."""
    return 5 + 35 * math.sqrt(t_ns / tmax_ns) if tmax_ns > 0 else 5


def _ring(fig: go.Figure, movers: pl.DataFrame, selected: str | None, tmax: float) -> None:
    """A ring around the selected group, when it is one of the movers."""
    if selected is None:
        return
    sel = movers.filter(pl.col("label") == selected)
    if not sel.height:
        return
    fig.add_trace(go.Scatter(
        x=sel["move_bytes_per_s"].to_list(), y=sel["kind"].to_list(), mode="markers",
        marker={"symbol": "circle-open", "size": _size(float(sel["measured_ns"][0]), tmax) + 10,
                "color": figures.SELECT_COLOR, "line": {"width": 3}},
        name="selected", customdata=sel["label"].to_list(), hoverinfo="skip",
        meta={"role": "selected", "label": selected},
    ))


def _hover(r: dict[str, Any], W: float) -> str:
    """A mover group's hover: time, bytes, bandwidth (and its share of HBM), the roofline's
    expected time and gap."""
    bw = r["move_bytes_per_s"]
    lines = [
        f"<b>{figures._esc(units.short(r['label'], 90))}</b>",
        f"{r['kind']} · {units.plural(r['count'], 'op')} · {units.ns(r['move_ns'])} ({units.pct(r['share'])} of device time)",
        f"bytes {units.count(r['move_bytes'], 'B')} · achieved {units.bytes_per_s(bw)}"
        + (f" ({units.pct(bw / W)} of HBM {units.bytes_per_s(W)})" if W else ""),
        f"roofline {units.ns(r['expected_ns'])} · gap {units.ns(r['gap_ns'])} · efficiency {units.pct(r['efficiency'])}"
        f" · {r['bound']}-bound",
    ]
    return "<br>".join(lines)
