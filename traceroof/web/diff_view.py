"""``traceroof serve A --compare B``: the diff view (docs/diff.md, docs/dashboard.md).

One page, static (no callbacks): the diff's top lines, the by-op waterfall from A's step to
B's, both rooflines in one chart (A's op groups as circles, B's as diamonds, each side's roofs),
the ops that moved most, and the per-op table with both sides' columns. Pure functions of the
two reports and their :class:`~traceroof.diff.Diff`.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from dash import Dash, dash_table, dcc, html

from .. import units
from ..diff import Diff, compare
from ..render.diff import headline
from ..report import Report
from . import figures

#: bars of the waterfall and of the moved-most chart
TOP = 15


def waterfall_figure(d: Diff, top: int = TOP) -> go.Figure:
    """A's step, the by-op terms (``top`` largest, one bar for the rest, then idle and
    concurrency), B's step. ``meta``: ``role`` ``diff-waterfall``, Σ of the relative bars (ns)."""
    if d.delta_ns is None or d.a.measured_ns is None or d.b.measured_ns is None:
        return go.Figure().add_annotation(text="A side has no complete step: no step-time change to draw.",
                                          xref="paper", yref="paper", x=0.5, y=0.5, showarrow=False)
    named = [t for t in d.by_op if t.source == "op"]
    bars = [(f"A: {units.short(d.a.name.rsplit('/', 1)[-1], 30)}", "absolute", d.a.measured_ns)]
    bars += [(units.short(t.term, 40), "relative", t.delta_ns) for t in named[:top]]
    if len(named) > top:
        bars.append((f"{len(named) - top} more ops", "relative", sum(t.delta_ns for t in named[top:])))
    bars += [(t.term, "relative", t.delta_ns) for t in d.by_op if t.source != "op"]
    bars.append((f"B: {units.short(d.b.name.rsplit('/', 1)[-1], 30)}", "total", d.b.measured_ns))
    fig = go.Figure(go.Waterfall(
        x=[b[0] for b in bars], y=[b[2] / 1e6 for b in bars], measure=[b[1] for b in bars],
        text=[units.ns(abs(b[2])) for b in bars], textposition="outside",
        increasing={"marker": {"color": "#c92a2a"}}, decreasing={"marker": {"color": "#2b8a3e"}},
        totals={"marker": {"color": "#1c5fa8"}}, hovertemplate="%{x}: %{text}<extra></extra>",
        meta={"role": "diff-waterfall", "bars": len(bars), "delta_ns": sum(b[2] for b in bars if b[1] == "relative")},
    ))
    fig.update_layout(title={"text": f"Step time A → B by op: {'+' if d.delta_ns >= 0 else '−'}{units.ns(abs(d.delta_ns))}"},
                      yaxis={"title": "step time (ms)", "rangemode": "tozero"},
                      xaxis={"tickangle": -35, "automargin": True}, plot_bgcolor="#fff", showlegend=False)
    return fig


def roofline_figure(a: Report, b: Report) -> go.Figure:
    """Both rooflines in one chart: A's figure (:func:`traceroof.web.figures.roofline_figure`)
    with B's op groups added as diamonds (``meta.role`` ``ops-b``), and B's roofs dashed when
    B's chip is another."""
    fa = figures.roofline_figure(a.ops, a.chip, by=_by(a)) if a.ops is not None else go.Figure()
    fb = figures.roofline_figure(b.ops, b.chip, by=_by(b)) if b.ops is not None else go.Figure()
    for t in fa.data:
        if (t.meta or {}).get("role") == "ops":
            t.name = f"A · {t.name}"
    other_chip = (a.chip.name if a.chip else None) != (b.chip.name if b.chip else None)
    for t in fb.data:
        role = (t.meta or {}).get("role")
        if role == "ops":
            t.name, t.marker.symbol = f"B · {t.name}", "diamond"
            t.meta = {**t.meta, "role": "ops-b"}
            fa.add_trace(t)
        elif role in ("roof", "hbm") and other_chip:
            t.name, t.line.dash = f"B {t.name}", "dash"
            t.meta = {**t.meta, "role": f"{role}-b"}
            fa.add_trace(t)
    names = " vs ".join(dict.fromkeys(c.name for c in (a.chip, b.chip) if c))
    fa.update_layout(title={"text": f"Roofline · A (circles) and B (diamonds) · {names}"},
                     xaxis={"autorange": True}, yaxis={"autorange": True})
    return fa


def _by(r: Report) -> str:
    return (r.filters.group_by if r.filters else None) or "op"


def moved_figure(d: Diff, top: int = TOP) -> go.Figure:
    """The ``top`` op labels whose measured time per step moved most (B − A, ns → ms)."""
    ops = d.ops[:top][::-1]
    return go.Figure(go.Bar(
        y=[units.short(o.label, 50) for o in ops], x=[o.delta_ns / 1e6 for o in ops], orientation="h",
        marker={"color": ["#c92a2a" if o.delta_ns > 0 else "#2b8a3e" for o in ops]}, textposition="auto",
        cliponaxis=False,
        text=[f"{o.status}: {units.ns(o.measured_a_ns)} → {units.ns(o.measured_b_ns)}" for o in ops],
        hovertemplate="%{y}: %{text}<extra></extra>", meta={"role": "moved", "ops": len(ops)},
    )).update_layout(title={"text": "The ops that moved most (measured per step, B − A)"},
                     xaxis={"title": "Δ per step (ms)"}, yaxis={"automargin": True}, plot_bgcolor="#fff")


def _eff(expected: float, measured: float, uncosted: float) -> str:
    if not measured or uncosted >= measured:
        return "—"
    return units.pct(expected / measured)


def _ns(v: float, measured: float, uncosted: float, count: float) -> str:
    """``v`` ns; ``—`` when the label has no op on that side, ``?`` when none of them is costed."""
    return "—" if not count else "?" if measured and uncosted >= measured else units.ns(v)


def table_rows(d: Diff) -> list[dict[str, Any]]:
    """The per-op table: both sides' columns per label (per step), largest change first."""
    return [{"op": o.label, "kind": o.kind or "", "status": o.status, "count A": f"{o.count_a:.4g}",
             "count B": f"{o.count_b:.4g}", "measured A": units.ns(o.measured_a_ns) if o.count_a else "—",
             "measured B": units.ns(o.measured_b_ns) if o.count_b else "—",
             "expected A": _ns(o.expected_a_ns, o.measured_a_ns, o.uncosted_a_ns, o.count_a),
             "expected B": _ns(o.expected_b_ns, o.measured_b_ns, o.uncosted_b_ns, o.count_b),
             "roof A": _eff(o.expected_a_ns, o.measured_a_ns, o.uncosted_a_ns),
             "roof B": _eff(o.expected_b_ns, o.measured_b_ns, o.uncosted_b_ns),
             "Δ measured": ("+" if o.delta_ns > 0 else "−" if o.delta_ns < 0 else "") + units.ns(abs(o.delta_ns))}
            for o in d.ops]


def layout(d: Diff, a: Report, b: Report) -> html.Div:
    """The page: top lines, waterfall, both rooflines, moved-most, the table."""
    rows = table_rows(d)
    cols = list(rows[0]) if rows else ["op"]
    return html.Div([
        html.Div(className="tr-header", children=[
            html.Div(className="tr-title", children=["traceroof diff", html.Small(f"{d.a.name} → {d.b.name}")]),
            html.Ul([html.Li(x) for x in headline(d)], id="diff-headline", className="tr-note"),
        ]),
        html.Div(className="tr-body", children=[
            dcc.Graph(id="diff-waterfall-graph", figure=waterfall_figure(d), style={"height": "480px"},
                      config={"displaylogo": False}),
            dcc.Graph(id="compare-roofline-graph", figure=roofline_figure(a, b), style={"height": "620px"},
                      config={"displaylogo": False}),
            dcc.Graph(id="moved-graph", figure=moved_figure(d), style={"height": "520px"}, config={"displaylogo": False}),
            html.P(f"{len(rows)} op labels (per step: A → B; roof = expected ÷ measured, — with no cost model). "
                   "docs/diff.md", className="tr-note", id="compare-summary"),
            dash_table.DataTable(id="compare-table", data=rows, columns=[{"name": c, "id": c} for c in cols],
                                 page_size=25, sort_action="native", filter_action="native",
                                 style_cell={"fontSize": 12, "textAlign": "right", "maxWidth": 380,
                                             "overflow": "hidden", "textOverflow": "ellipsis"},
                                 style_cell_conditional=[{"if": {"column_id": c}, "textAlign": "left"}
                                                         for c in ("op", "kind", "status")]),
        ]),
    ])


def create_compare_app(a: Report, b: Report, name_a: str = "A", name_b: str = "B") -> Dash:
    """The diff view of reports ``a`` → ``b``.

    Raises:
        UsageError: a report without a complete step or without its op table (from
            :func:`traceroof.diff.compare`).
    """
    from .app import _dash

    d = compare(a, b, name_a=name_a, name_b=name_b)
    app = _dash(f"traceroof diff · {name_a.rsplit('/', 1)[-1]} → {name_b.rsplit('/', 1)[-1]}")
    app.layout = layout(d, a, b)
    return app


__all__ = ["create_compare_app", "moved_figure", "roofline_figure", "table_rows", "waterfall_figure"]
