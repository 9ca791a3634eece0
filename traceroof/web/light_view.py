"""The dashboard's speed-of-light overview: the headline and the waterfall chart from the
measured step down to its speed of light (docs/speed-of-light.md). Pure functions of the report."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from dash import dcc, html

from .. import units
from ..render import light
from ..report import Report
from ..sections import SpeedOfLightInfo

#: findings drawn one bar each; the rest are one bar that says how many
TOP_FINDINGS = 12


def bars(s: SpeedOfLightInfo, top: int = TOP_FINDINGS) -> list[tuple[str, str, float]]:
    """The waterfall's bars as ``(label, measure, ns)``: the measured step (``absolute``),
    each term as a step down (``relative``, −ns; findings past ``top`` summed into one bar),
    and the speed of light (``total``). The relative bars sum to speed of light − measured."""
    out = [("measured step", "absolute", float(s.measured_ns or 0.0))]
    found = [t for t in s.waterfall if t.source == "finding"]
    out += [(units.short(t.term, 36), "relative", -t.ns) for t in found[:top]]
    if len(found) > top:
        out.append((f"{len(found) - top} more findings", "relative", -sum(t.ns for t in found[top:])))
    out += [(units.short(t.term, 36), "relative", -t.ns) for t in s.waterfall if t.source != "finding"]
    out.append(("speed of light", "total", float(s.speed_of_light_ns or 0.0)))
    return out


def waterfall_figure(report: Report, top: int = TOP_FINDINGS) -> go.Figure:
    """A plotly waterfall (ms) from the measured step to the speed of light; ``meta`` carries
    ``role`` ``waterfall``, the bar count and Σ of the steps down (ns), for tests."""
    s = report.speed_of_light
    fig = go.Figure()
    if s is None or s.measured_ns is None:
        fig.add_annotation(text="No complete step: no speed of light.", xref="paper", yref="paper", x=0.5, y=0.5,
                           showarrow=False)
        return fig
    b = bars(s, top)
    fig.add_trace(go.Waterfall(
        x=[x[0] for x in b], y=[x[2] / 1e6 for x in b], measure=[x[1] for x in b], orientation="v",
        text=[units.ns(abs(x[2])) for x in b], textposition="outside",
        decreasing={"marker": {"color": "#2b8a3e"}}, increasing={"marker": {"color": "#c92a2a"}},
        totals={"marker": {"color": "#1c5fa8"}}, connector={"line": {"color": "#999", "width": 1}},
        hovertemplate="%{x}: %{text}<extra></extra>",
        meta={"role": "waterfall", "bars": len(b), "down_ns": sum(x[2] for x in b if x[1] == "relative")},
    ))
    fig.update_layout(
        title={"text": f"From the measured step ({units.ns(s.measured_ns)}) to its speed of light "
                       f"({units.ns(s.speed_of_light_ns)}): {units.pct(s.fraction, 0)} of light"},
        yaxis={"title": "step time (ms)", "rangemode": "tozero"}, xaxis={"tickangle": -35, "automargin": True},
        margin={"l": 60, "r": 20, "t": 60, "b": 40}, plot_bgcolor="#fff", showlegend=False, height=520,
    )
    return fig


def overview(report: Report) -> list[Any]:
    """The overview block (nothing when the report has no speed of light): the headline, and
    the waterfall chart folded under it (one click; folded, the roofline keeps its place on
    the first screen)."""
    if report.speed_of_light is None or report.speed_of_light.measured_ns is None:
        return []
    line = light.headline(report)[0][1]
    _, note = light.waterfall_rows(report)
    return [html.Details(open=False, className="tr-light", id="light-overview", children=[
        html.Summary(f"speed of light: {line} — the waterfall ▸", style={"cursor": "pointer", "fontWeight": 600}),
        dcc.Graph(id="waterfall-graph", figure=waterfall_figure(report), style={"height": "540px"},
                  config={"displaylogo": False}),
        html.P(note or "", className="tr-note"),
    ])]


__all__ = ["TOP_FINDINGS", "bars", "overview", "waterfall_figure"]
