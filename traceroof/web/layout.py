"""The dashboard's components: header, tabs and the findings list, built from a Report.

Pure functions of the report (no callbacks, no figures): :mod:`.app` assembles them and
:mod:`.callbacks` fills the figures and tables.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dash import dash_table, dcc, html

from .. import units
from ..findings import Finding
from ..render import sections
from ..report import Report
from . import numbers, views

CSS = """
body { margin: 0; font-family: system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif; font-size: 14px;
       color: #1d1d1d; background: #f6f7f9; }
.tr-header { background: #fff; border-bottom: 1px solid #dfe3e8; padding: 10px 18px 8px; }
.tr-title { font-size: 19px; font-weight: 600; margin: 0 0 6px; }
.tr-title small { font-weight: 400; color: #666; font-size: 13px; margin-left: 8px; }
.tr-facts { display: grid; grid-template-columns: max-content 1fr; gap: 2px 14px; font-size: 12.5px; margin: 0; }
.tr-facts dt { color: #666; } .tr-facts dd { margin: 0; overflow-wrap: anywhere; }
.tr-controls { display: flex; gap: 14px; align-items: center; flex-wrap: wrap; margin-top: 8px; }
.tr-controls label { font-size: 12.5px; color: #555; }
.tr-select { min-width: 190px; }
.tr-selected { font-size: 12.5px; background: #fff7cc; border: 1px solid #e6d27a; border-radius: 4px; padding: 3px 8px;
               overflow-wrap: anywhere; max-width: 100%; }
.tr-warn { font-size: 12.5px; margin-top: 6px; }
.tr-warn summary { cursor: pointer; color: #8a5a00; font-weight: 600; }
.tr-warn ul { margin: 4px 0 0; padding-left: 20px; color: #5a4300; }
.tr-incons summary { color: #b22222; }
.tr-body { padding: 8px 18px 24px; }
.tr-note { font-size: 12.5px; color: #555; margin: 6px 0; }
.tr-filters { display: flex; gap: 22px; flex-wrap: wrap; align-items: flex-start; margin: 6px 0 8px; font-size: 12.5px; }
.tr-filters .dash-checklist label, .tr-filters label { margin-right: 8px; }
.tr-btn { font-size: 12.5px; padding: 4px 10px; border: 1px solid #bbb; border-radius: 4px; background: #fff; cursor: pointer; }
.tr-btn:hover { background: #eef; }
.tr-link { background: none; border: none; color: #0b5cad; cursor: pointer; padding: 0; font-size: 13px; text-decoration: underline; }
.tr-card { background: #fff; border: 1px solid #dfe3e8; border-left: 4px solid #999; border-radius: 4px; padding: 10px 14px; margin: 10px 0; }
.tr-card.high { border-left-color: #d62728; } .tr-card.medium { border-left-color: #ff7f0e; } .tr-card.low { border-left-color: #bcbd22; }
.tr-card h3 { margin: 0 0 4px; font-size: 15px; }
.tr-card .tr-rec { font-weight: 600; color: #0a6e31; }
.tr-card p { margin: 6px 0; line-height: 1.4; }
.tr-ev { font-size: 12px; border-collapse: collapse; margin-top: 4px; }
.tr-ev td { padding: 1px 10px 1px 0; vertical-align: top; } .tr-ev td:first-child { color: #666; }
.tr-error { margin: 40px auto; max-width: 900px; background: #fff; border: 1px solid #e3b3b3; border-left: 5px solid #d62728;
            border-radius: 4px; padding: 18px 22px; }
.tr-error pre { white-space: pre-wrap; font-size: 14px; color: #8b0000; margin: 10px 0; }
.tab-content { background: #fff; border: 1px solid #dfe3e8; border-top: none; padding: 6px 10px; }
"""


def index_string(title: str) -> str:
    """Dash's page template with our CSS inlined (no asset folder to package)."""
    return (
        "<!DOCTYPE html><html><head>{%metas%}<title>" + _html_escape(title) + "</title>{%favicon%}{%css%}"
        "<style>" + CSS + "</style></head><body>{%app_entry%}<footer>{%config%}{%scripts%}{%renderer%}</footer>"
        "</body></html>"
    )


# --------------------------------------------------------------------- header
def _devices_table(report: Report) -> list[Any]:
    """The per-device table (:func:`sections.device_rows`) of a rank driving several devices,
    folded; nothing otherwise."""
    rows = sections.device_rows(report)
    if not rows:
        return []
    head = html.Tr([html.Th(c) for c in sections.DEVICE_COLUMNS])
    body = [html.Tr([html.Td(c) for c in r]) for r in rows]
    return [html.Details(open=len(rows) <= 8, children=[
        html.Summary(f"{len(rows)} devices (per device, means per complete step)"),
        html.Table([html.Thead(head), html.Tbody(body)], id="devices-table"),
    ])]


def header(report: Report, source: str) -> html.Div:
    """Trace, chip and peaks, cost coverage, summary, warnings, and the rank/step/group selectors."""
    facts: list[Any] = []
    for k, v in sections.header(report) + sections.summary(report):
        if k in ("chip sources",):
            continue
        facts += [html.Dt(k), html.Dd(v)]
    ops = report.ops
    controls: list[Any] = []
    if ops is not None and ops.height:
        ranks = views.rank_options(ops)
        controls += [
            html.Label(["rank ", dcc.Dropdown(id="rank-select", options=ranks, value=views.ALL, clearable=False,
                                              className="tr-select", disabled=len(ranks) <= 2)]),
            html.Label(["step ", dcc.Dropdown(id="step-select", options=views.step_options(ops), value=views.ALL,
                                              clearable=False, className="tr-select")]),
            html.Label(["group ops by ", dcc.RadioItems(
                id="group-by", options=[{"label": " framework op", "value": "op"}, {"label": " kernel", "value": "kernel"}],
                value=(report.filters.group_by if report.filters else None) or "op", inline=True)]),
        ]
    else:
        controls += [dcc.Store(id="rank-select", data=views.ALL), dcc.Store(id="step-select", data=views.ALL),
                     dcc.Store(id="group-by", data="op")]
    controls.append(html.Div(id="selected-banner", className="tr-selected", style={"display": "none"}, children=[
        html.Span(id="selected-text"), " ", html.Button("clear", id="clear-selection", className="tr-link"),
    ]))
    warn = []
    if report.warnings:
        warn.append(html.Details(open=len(report.warnings) <= 4, className="tr-warn", children=[
            html.Summary(f"{len(report.warnings)} warning{'s' if len(report.warnings) != 1 else ''}"),
            html.Ul([html.Li(w) for w in report.warnings], id="warnings-list"),
        ]))
    lines = sections.inconsistency_lines(report)
    if lines:
        warn.append(html.Details(open=True, className="tr-warn tr-incons", children=[
            html.Summary(f"{len(lines)} inconsistenc{'ies' if len(lines) != 1 else 'y'} (results that cannot be true)"),
            html.Ul([html.Li(x) for x in lines]),
        ]))
    return html.Div(className="tr-header", children=[
        html.Div(className="tr-title", children=["traceroof", html.Small(Path(source).name or source)]),
        html.Dl(facts, className="tr-facts", id="header-facts"),
        *_devices_table(report),
        *warn,
        html.Div(controls, className="tr-controls"),
    ])


# --------------------------------------------------------------------- tabs
def tabs(report: Report, initial: dict[str, Any] | None = None) -> dcc.Tabs:
    """The five tabs. ``initial`` holds what the first page shows (``roofline``, ``steps``
    figures, ``table`` rows, ``summary`` line), so it paints without waiting for callbacks;
    later changes come from the callbacks."""
    initial = initial or {}
    ops = report.ops
    has_ops = ops is not None and ops.height > 0
    no_ops = html.P("This report was saved without its op table (or the trace has no device ops): "
                    "re-run `traceroof analyze TRACE -o report.json` to keep it.", className="tr-note")
    return dcc.Tabs(id="tabs", value="roofline", children=[
        dcc.Tab(label="Roofline", value="roofline", children=[
            dcc.Graph(id="roofline-graph", style={"height": "640px"}, config={"displaylogo": False},
                      figure=initial.get("roofline") or {})
            if has_ops else no_ops,
            html.P("Click a point to select its op group everywhere (ops table, timeline). Marker area ∝ device time; "
                   "achieved FLOP/s = the group's FLOPs ÷ its measured time.", className="tr-note"),
            dcc.Graph(id="bandwidth-graph", config={"displaylogo": False}, figure=initial.get("bandwidth") or {})
            if has_ops else html.Div(),
            html.P("Ops with bytes but no FLOPs (copies, memsets, bytes-only kernels) have no point under the roofs: "
                   "this panel puts them at their achieved bandwidth against the HBM bandwidth.", className="tr-note")
            if has_ops else html.Div(),
        ]),
        dcc.Tab(label="Ops", value="ops", children=[ops_tab(report, initial) if has_ops else _ranking_only(report)]),
        dcc.Tab(label="Timeline", value="timeline", children=[
            html.P("Device streams and host launches of the chosen rank/step. Drag to zoom, double-click to reset; "
                   "big steps are drawn as merged bars until you zoom in. Shaded: findings.", className="tr-note"),
            dcc.Graph(id="timeline-graph", config={"displaylogo": False, "scrollZoom": True}) if has_ops else no_ops,
        ]),
        dcc.Tab(label="Steps", value="steps", children=[
            dcc.Graph(id="steps-graph", style={"height": "520px"}, config={"displaylogo": False},
                      figure=initial.get("steps") or {}),
            steps_table(report),
        ]),
        dcc.Tab(label=f"Findings ({len(report.findings)})", value="findings", children=[findings_list(report)]),
    ], className="tr-tabs", content_className="tab-content")


def ops_tab(report: Report, initial: dict[str, Any] | None = None) -> html.Div:
    initial = initial or {}
    ops = report.ops
    assert ops is not None
    columns = []
    unit = initial.get("table_unit") or views.ops_table_unit(ops)
    for cid, name, kind in views.table_columns(unit):
        col: dict[str, Any] = {"id": cid, "name": name}
        if kind != "text":
            col["type"] = "numeric"
            col["format"] = {"specifier": views.TABLE_FORMATS[kind]}
        columns.append(col)
    return html.Div([
        html.Div(className="tr-filters", children=[
            html.Div(["kind", dcc.Checklist(id="kind-filter", options=views.present_kinds(ops), value=[], inline=True)]),
            html.Div(["bound", dcc.Checklist(id="bound-filter", options=views.present_bounds(ops), value=[], inline=True)]),
            html.Div(["stream", dcc.Dropdown(id="stream-filter", options=views.stream_options(ops), value=[], multi=True,
                                             placeholder="all streams", className="tr-select")]),
            html.Div([html.Button("Download CSV (groups)", id="csv-groups", className="tr-btn"), " ",
                      html.Button("Download CSV (ops)", id="csv-ops", className="tr-btn"),
                      dcc.Download(id="download")]),
        ]),
        html.P(initial.get("summary", ""), id="ops-summary", className="tr-note"),
        dash_table.DataTable(
            id="ops-table", columns=columns, data=initial.get("table") or [], sort_action="native", filter_action="native",
            page_action="native", page_size=25, sort_by=[],
            style_table={"overflowX": "auto"},
            style_cell={"fontSize": 12, "fontFamily": "system-ui, sans-serif", "padding": "3px 6px", "textAlign": "right",
                        "maxWidth": 520, "overflow": "hidden", "textOverflow": "ellipsis"},
            style_cell_conditional=[{"if": {"column_id": c}, "textAlign": "left"} for c in ("label", "kind", "bound", "peak_dtype")]
            + [{"if": {"column_id": "label"}, "maxWidth": 360, "minWidth": 200, "width": 360},
               {"if": {"column_id": "sel"}, "width": 18, "maxWidth": 18, "textAlign": "center"}],
            style_header={"fontWeight": 600, "backgroundColor": "#f0f2f5"},
            tooltip_duration=None,
            css=[{"selector": ".dash-spreadsheet td.focused", "rule": "background-color: #fff3b0 !important;"}],
        ),
        html.P("Ranked by gap (measured − roofline time). Click a row to select its op group. Type in the filter row to "
               "filter by text or number (e.g. > 100).", className="tr-note"),
    ])


def _ranking_only(report: Report) -> html.Div:
    """The saved ranking, when the report has no op table: times in one unit (the Ops tab's
    rule, :func:`views.table_unit`), numbers in plain decimals, the other columns as saved."""
    rk = report.ranking
    unit = views.table_unit(rk)
    data, columns = [], []
    for c in rk.columns:
        if c.endswith("_ns"):
            cid = f"{c[:-3]}_{unit.key}"
            columns.append({"id": cid, "name": f"{c[:-3]} ({unit.name})", "type": "numeric",
                            "format": {"specifier": views.TABLE_FORMATS["time"]}})
        elif rk[c].dtype.is_float():
            columns.append({"id": c, "name": c, "type": "numeric", "format": {"specifier": views.TABLE_FORMATS["float"]}})
        else:
            columns.append({"id": c, "name": c})
    for r in rk.iter_rows(named=True):
        data.append({(f"{k[:-3]}_{unit.key}" if k.endswith("_ns") else k):
                     (None if v is None else v / unit.ns) if k.endswith("_ns") else _plain(v) for k, v in r.items()})
    return html.Div([
        html.P("No op table in this report: showing the saved ranking.", className="tr-note"),
        dash_table.DataTable(data=data, columns=columns, page_size=25, id="ranking-table",
                             sort_action="native", style_table={"overflowX": "auto"}),
    ])


def steps_table(report: Report) -> html.Div:
    s = report.steps
    if s.height == 0:
        return html.Div()
    cols = [c for c in ("rank", "step", "wall_ns", "busy_ns", "compute_bound_ns", "memory_bound_ns",
                        "unknown_bound_ns", "comm_ns", "comm_exposed_ns", "idle_ns", "ops", "flops", "hfu", "mfu", "partial") if c in s.columns]
    data = []
    for r in s.select(cols).iter_rows(named=True):
        row = {}
        for c in cols:
            v = r[c]
            if c.endswith("_ns"):
                row[c] = units.ns(v)
            elif c in ("hfu", "mfu"):
                row[c] = units.pct(v)
            elif c == "flops":
                row[c] = units.count(v)
            else:
                row[c] = "—" if v is None else str(v)
        data.append(row)
    return html.Div([
        html.P("Per step (unions over streams; busy + idle = wall; busy = compute-bound + memory/latency-bound + no cost model + the time only communication ran).",
               className="tr-note"),
        dash_table.DataTable(id="steps-table", data=data, columns=[{"id": c, "name": c.replace("_ns", "")} for c in cols],
                             page_size=20, style_cell={"fontSize": 12, "padding": "2px 6px"},
                             style_header={"fontWeight": 600, "backgroundColor": "#f0f2f5"}),
    ])


def findings_list(report: Report) -> html.Div:
    """One card per finding: recoverable time, explanation, evidence, a link to the timeline."""
    if not report.findings:
        return html.P("No findings: no detector fired on this trace.", className="tr-note", id="findings-empty")
    cards = [_finding_card(i, f) for i, f in enumerate(report.findings)]
    total = sum(f.recoverable_ns or 0 for f in report.findings)
    return html.Div([
        html.P(f"{units.plural(len(report.findings), 'finding')}, largest recoverable time first (estimates overlap; their sum, "
               f"{units.ns(total)}, is an upper bound).", className="tr-note"),
        *cards,
    ])


def error_page(message: str, source: str | None = None) -> html.Div:
    """The page shown when the input cannot be read: the CLI's error line, verbatim."""
    return html.Div(className="tr-error", id="error", children=[
        html.Div("traceroof could not load " + (Path(source).name if source else "the input"),
                 style={"fontWeight": 600, "fontSize": "17px"}),
        html.Pre(message, id="error-text"),
        html.P("Fix the input (or pass --chip NAME for an unknown chip) and start `traceroof serve` again. "
               "`traceroof analyze` on the same file prints the same line."),
    ])


def _plain(v: Any) -> Any:
    return v if isinstance(v, (int, float, str)) or v is None else str(v)


def _html_escape(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _finding_card(i: int, f: Finding) -> html.Div:
    """The card of finding number ``i``: where (rank, step, stream, window ms), what, evidence."""
    where = [f"{k} {v}" for k, v in (("rank", f.rank), ("device", f.device), ("step", f.step), ("stream", f.stream)) if v is not None]
    if f.start_ns is not None and f.end_ns is not None:
        where.append(numbers.window_text(f.start_ns, f.end_ns))
    ev = views.evidence_rows(f.evidence or {})
    return html.Div(className=f"tr-card {f.severity}", id=f"finding-{i}", children=[
        html.H3(f"#{i + 1} {f.title}"),
        html.Div([
            html.Span(f"recoverable {units.ns(f.recoverable_ns)}", className="tr-rec"),
            f" · {f.kind} · severity {f.severity}"
            + (f" · {f.occurrences} occurrences" if f.occurrences > 1 else "")
            + (f" · {', '.join(where)}" if where else ""),
            " · ",
            html.Button("show on timeline →", id={"type": "finding-goto", "index": i}, className="tr-link",
                        disabled=f.start_ns is None),
        ]),
        html.P(f.explanation),
        html.Details([html.Summary(f"evidence ({len(ev)})"),
                      html.Table([html.Tr([html.Td(k), html.Td(v)]) for k, v in ev], className="tr-ev")],
                     open=False),
        html.Div(f"docs: {f.docs}", className="tr-note") if f.docs else None,
    ])
