"""Dash callbacks: thin adapters from component values to the pure functions in
:mod:`.views` and :mod:`.figures`. No analysis happens here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dash import ALL, Dash, Input, Output, State, ctx, dcc, no_update

from ..report import Report
from . import bandwidth, figures, views

TIMELINE_MAX_BARS = 4000


def register(app: Dash, report: Report) -> None:
    """Wire the dashboard of ``report`` (which must carry its op table)."""
    ops = report.ops
    assert ops is not None

    def sel_ops(rank: str, step: str) -> Any:
        return views.filter_ops(ops, rank, step)

    _register_roofline_and_table(app, report, sel_ops)
    _register_selection(app)
    _register_timeline(app, report, sel_ops)
    _register_steps_and_findings(app, report, ops)


def _register_roofline_and_table(app: Dash, report: Report, sel_ops: Callable[[str, str], Any]) -> None:
    """The roofline figure, the op-group table and its CSV downloads."""

    @app.callback(Output("roofline-graph", "figure"),
                  Input("rank-select", "value"), Input("step-select", "value"), Input("group-by", "value"),
                  Input("selected", "data"), prevent_initial_call=True)  # first figure: app.initial_view
    def _roofline(rank: str, step: str, by: str, selected: str | None) -> Any:
        return figures.roofline_figure(sel_ops(rank, step), report.chip, by=by, selected=selected)

    @app.callback(Output("bandwidth-graph", "figure"),
                  Input("rank-select", "value"), Input("step-select", "value"), Input("group-by", "value"),
                  Input("selected", "data"), prevent_initial_call=True)  # first figure: app.initial_view
    def _bandwidth(rank: str, step: str, by: str, selected: str | None) -> Any:
        return bandwidth.bandwidth_figure(sel_ops(rank, step), report.chip, by=by, selected=selected)

    assert report.ops is not None
    unit = views.ops_table_unit(report.ops)  # the columns' unit, as app.initial_view chose it

    @app.callback(Output("ops-table", "data"), Output("ops-summary", "children"),
                  Input("rank-select", "value"), Input("step-select", "value"), Input("group-by", "value"),
                  Input("kind-filter", "value"), Input("bound-filter", "value"), Input("stream-filter", "value"),
                  Input("selected", "data"), prevent_initial_call=True)
    def _table(rank: str, step: str, by: str, kinds: list[str], bounds: list[str], streams: list[str],
               selected: str | None) -> Any:
        sub = views.filter_table_ops(sel_ops(rank, step), kinds, bounds, streams)
        groups = views.op_groups(sub, by)
        return views.table_records(groups, selected=selected, unit=unit), views.table_summary(groups, sub)

    @app.callback(Output("download", "data"),
                  Input("csv-groups", "n_clicks"), Input("csv-ops", "n_clicks"),
                  State("rank-select", "value"), State("step-select", "value"), State("group-by", "value"),
                  State("kind-filter", "value"), State("bound-filter", "value"), State("stream-filter", "value"),
                  prevent_initial_call=True)
    def _csv(_g: int, _o: int, rank: str, step: str, by: str, kinds: list[str], bounds: list[str],
             streams: list[str]) -> Any:
        sub = views.filter_table_ops(sel_ops(rank, step), kinds, bounds, streams)
        if ctx.triggered_id == "csv-ops":
            return dcc.send_string(views.ops_csv(sub), "traceroof-ops.csv")
        return dcc.send_string(views.groups_csv(views.op_groups(sub, by)), "traceroof-op-groups.csv")



def _register_selection(app: Dash) -> None:
    """The selected op group: set by a click on the roofline, the table or the timeline."""

    @app.callback(Output("selected", "data"),
                  Input("roofline-graph", "clickData"), Input("ops-table", "active_cell"),
                  Input("timeline-graph", "clickData"), Input("clear-selection", "n_clicks"),
                  Input("group-by", "value"), Input("bandwidth-graph", "clickData"), prevent_initial_call=True)
    def _select(roof_click: Any, cell: Any, tl_click: Any, _clear: Any, _by: Any, bw_click: Any) -> Any:
        label = views.selection_from_event(ctx.triggered_id, roof_click, cell, tl_click, bw_click)
        return no_update if label is views.UNCHANGED else label

    @app.callback(Output("selected-text", "children"), Output("selected-banner", "style"), Input("selected", "data"),
                  prevent_initial_call=True)
    def _banner(selected: str | None) -> Any:
        return views.selection_banner(selected)



def _register_timeline(app: Dash, report: Report, sel_ops: Callable[[str, str], Any]) -> None:
    """The timeline: drawn when its tab opens, re-drawn on zoom/pan with the window's ops."""

    def timeline(rank: str, step: str, by: str, selected: str | None, focus: Any, relayout: Any, window: Any,
                 triggered: list[str]) -> Any:
        sub = sel_ops(rank, step)
        key = f"{rank}|{step}"
        window = views.timeline_window(triggered, focus, relayout, views.stored_window(window, key),
                                       n_ops=sub.height, max_bars=TIMELINE_MAX_BARS,
                                       unit_ns=views.timeline_unit(sub).ns)
        if window is views.UNCHANGED:
            return no_update, no_update
        fig = figures.timeline_figure(sub, findings=report.findings, selected=selected, by=by, window=window,
                                      focus=(focus or {}).get("finding"), max_bars=TIMELINE_MAX_BARS,
                                      uirevision=f"{key}|{(focus or {}).get('n', 0)}")
        return fig, {"key": key, "window": window}

    # drawn only while its tab is open (the biggest figure: it must not delay the roofline)
    @app.callback(Output("timeline-graph", "figure"), Output("timeline-window", "data"),
                  Input("tabs", "value"),
                  Input("rank-select", "value"), Input("step-select", "value"), Input("group-by", "value"),
                  Input("selected", "data"), Input("focus", "data"), State("timeline-window", "data"))
    def _timeline(tab: str, rank: str, step: str, by: str, selected: str | None, focus: Any, window: Any) -> Any:
        if tab != "timeline":
            return no_update, no_update
        return timeline(rank, step, by, selected, focus, None, window, list(ctx.triggered_prop_ids))

    # zoom/pan re-draws big steps with the ops of the new window. A callback of its own:
    # Dash drops the result of a callback re-triggered while in flight, so a zoom event
    # (often a no-op) must not share one with "show on timeline".
    @app.callback(Output("timeline-graph", "figure", allow_duplicate=True),
                  Output("timeline-window", "data", allow_duplicate=True),
                  Input("timeline-graph", "relayoutData"),
                  State("rank-select", "value"), State("step-select", "value"), State("group-by", "value"),
                  State("selected", "data"), State("focus", "data"), State("timeline-window", "data"),
                  prevent_initial_call=True)
    def _timeline_zoom(relayout: Any, rank: str, step: str, by: str, selected: str | None, focus: Any,
                       window: Any) -> Any:
        return timeline(rank, step, by, selected, focus, relayout, window, ["timeline-graph.relayoutData"])



def _register_steps_and_findings(app: Dash, report: Report, ops: Any) -> None:
    """The steps figure, and the findings' "show on timeline" buttons."""

    @app.callback(Output("steps-graph", "figure"), Input("rank-select", "value"), prevent_initial_call=True)
    def _steps(rank: str) -> Any:
        return figures.steps_figure(report.steps, rank=rank)

    @app.callback(Output("rank-select", "value"), Output("step-select", "value"), Output("tabs", "value"),
                  Output("focus", "data"),
                  Input({"type": "finding-goto", "index": ALL}, "n_clicks"), State("focus", "data"),
                  prevent_initial_call=True)
    def _goto(clicks: list[int | None], focus: Any) -> Any:
        if not ctx.triggered_id or not any(clicks):
            return no_update, no_update, no_update, no_update
        i = ctx.triggered_id["index"]
        t = views.finding_target(report.findings[i], views.step_values(ops))
        return t["rank"], t["step"], "timeline", {"finding": i, "window": t["window"], "n": (focus or {}).get("n", 0) + 1}
