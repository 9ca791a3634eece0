"""The live dashboard behind ``traceroof serve --live HOST:PORT`` (and ``serve --watch DIR``):
capture a running jax program again and again (or analyze each trace that lands in a folder),
and show the latest one's roofline, ranking and findings with the history strip of step
time, busy share and HFU across them.

A :class:`Capturer` thread captures ``duration_s`` seconds every ``every_s`` seconds
(:func:`traceroof.capture.capture`) and analyzes it; the page polls :class:`LiveState` once a
second. A capture in progress is shown as such; a failed one shows its cause (the capture
error's one line) and the page keeps the last good capture (docs/capture.md, "Live
dashboard").
"""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import plotly.graph_objects as go
from dash import Dash, Input, Output, State, dcc, html, no_update
from plotly.subplots import make_subplots

from ..errors import TraceroofError
from ..watch import History
from . import figures, layout, light_view, views
from .numbers import LINEAR_AXIS

TICK_MS = 1000  # how often the page asks for news (ms)


class LiveState:
    """What the capture thread found so far, read by the page (under ``lock``).

    ``generation`` counts good captures (the page redraws when it changes); ``report`` is the
    latest good one's; ``history`` their headline numbers; ``capturing_since`` the wall time
    (s) a capture in progress started, else None; ``error`` the last failure's line, cleared
    by the next good capture; ``failures`` failed captures so far."""

    def __init__(self, noun: str = "captures") -> None:
        self.noun = noun  # what the status counts: captures (--live) or traces (--watch)
        self.lock = threading.Lock()
        self.generation = 0
        self.report: Any = None
        self.history = History()
        self.capturing_since: float | None = None
        self.error: str | None = None
        self.failures = 0

    def status(self) -> str:
        """The status line: capturing / last capture / failed, with counts."""
        with self.lock:
            parts = [f"{self.generation} {self.noun}", f"{self.failures} failed"]
            if self.capturing_since is not None:
                parts.insert(0, f"capturing… ({time.time() - self.capturing_since:.0f} s)")
            if self.error:
                parts.append(f"last failed: {self.error} (showing the last good one)")
            return " · ".join(parts)


class Capturer(threading.Thread):
    """Captures and analyzes every ``every_s`` seconds into ``state`` until :meth:`stop`.

    ``capture(address, duration_s, out_dir)`` -> Trace and ``analyze(trace)`` -> Report are
    injected (the CLI passes :func:`traceroof.capture.capture` and ``analyze`` with its chip).
    """

    def __init__(self, state: LiveState, address: str, *, every_s: float, duration_s: float,
                 capture: Callable[..., Any], analyze: Callable[[Any], Any]) -> None:
        super().__init__(daemon=True, name="traceroof-live-capture")
        self.state, self.address = state, address
        self.every_s, self.duration_s = every_s, duration_s
        self._capture, self._analyze = capture, analyze
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()

    def once(self) -> None:
        """One capture and analysis, into the state (a failure is recorded, not raised)."""
        with self.state.lock:
            self.state.capturing_since = time.time()
        try:
            with tempfile.TemporaryDirectory(prefix="traceroof-live-") as tmp:
                report = self._analyze(self._capture(self.address, self.duration_s, tmp))
        except TraceroofError as exc:
            with self.state.lock:
                self.state.error, self.state.capturing_since = str(exc), None
                self.state.failures += 1
            return
        with self.state.lock:
            self.state.report, self.state.error, self.state.capturing_since = report, None, None
            self.state.history.add(f"capture {self.state.generation + 1}", report)
            self.state.generation += 1

    def run(self) -> None:
        while not self._stop.is_set():
            self.once()
            self._stop.wait(self.every_s)


class Watcher(threading.Thread):
    """``serve --watch DIR``: each trace that lands in ``folder``
    (:func:`traceroof.watch.watch`), analyzed by ``analyze(path)``, into ``state`` as a
    capture is (an unreadable one is a failure, shown with its error)."""

    def __init__(self, state: LiveState, folder: str, *, every_s: float,
                 analyze: Callable[[Any], Any], count: int | None = None) -> None:
        super().__init__(daemon=True, name="traceroof-live-watch")
        self.state, self.folder, self.every_s = state, folder, every_s
        self._analyze, self.count = analyze, count

    def run(self) -> None:
        from ..watch import watch

        for landed in watch(self.folder, self._analyze, every_s=self.every_s, count=self.count):
            with self.state.lock:
                if landed.error is not None:
                    self.state.error = f"{landed.path}: {landed.error}"
                    self.state.failures += 1
                    continue
                self.state.report, self.state.error = landed.report, None
                self.state.history.add(landed.path.name, landed.report)
                self.state.generation += 1


def history_figure(history: History) -> go.Figure:
    """The history strip: step time (ms), busy share (%) and HFU (%) per capture (x: 1..n);
    an unknown number is a gap, never 0."""
    n = len(history.names)
    x = list(range(1, n + 1))
    fig = make_subplots(rows=1, cols=3, subplot_titles=("step time (ms)", "device busy (%)", "HFU (%)"))
    series = [([None if v is None else v / 1e6 for v in history.step_time_ns], "step time"),
              ([None if v is None else 100 * v for v in history.busy_fraction], "busy"),
              ([None if v is None else 100 * v for v in history.hfu], "HFU")]
    for col, (ys, name) in enumerate(series, start=1):
        fig.add_trace(go.Scatter(x=x, y=ys, mode="lines+markers", name=name, meta=name,
                                 connectgaps=False), row=1, col=col)
    fig.update_layout(height=200, margin=dict(l=40, r=10, t=30, b=30), showlegend=False,
                      meta={"captures": n})
    fig.update_xaxes(title_text="capture", dtick=1)
    # plain decimals (an HFU of 7.8e-5 % is not "78µ"): the dashboard's one number format
    fig.update_yaxes(**LINEAR_AXIS, tickformat="~r")
    return fig


def _ranking(report: Any, top: int = 15) -> html.Div:
    ops = report.ops
    if ops is None or ops.height == 0:
        return html.P("No device ops in this capture.", className="tr-note")
    by = (report.filters.group_by if report.filters else None) or "kernel"
    groups = views.op_groups(ops, by)
    rows = views.table_records(groups)[:top]
    sources = _sources(ops, by)
    for r in rows:
        r["source"] = sources.get(r.get("label"))
    cols = [("label", by), ("kind", "kind"), ("count", "count"), ("total_us", "total (µs)"),
            ("gap_us", "gap (µs)"), ("efficiency", "efficiency"), ("bound", "bound"),
            ("source", "source")]
    cols = [(k, t) for k, t in cols if rows and k in rows[0]]
    head = html.Tr([html.Th(t) for _k, t in cols])
    body = [html.Tr([html.Td(_cell(r.get(k))) for k, _t in cols]) for r in rows]
    return html.Div([html.P(views.table_summary(groups, ops), className="tr-note"),
                     html.Table([head, *body], id="live-ranking", className="tr-table")])


def _sources(ops: Any, by: str) -> dict[str, str]:
    """The user-code line of each op group (XPlane's ``source_location``: the most common
    one of the group's ops; groups without one are left out, shown blank)."""
    if "source_location" not in ops.columns:
        return {}
    import polars as pl

    known = ops.filter(pl.col("source_location").is_not_null())
    if known.height == 0:
        return {}
    top = (known.group_by(views.label_expr(by).alias("label"), "source_location").len()
           .sort(["label", "len", "source_location"], descending=[False, True, False])
           .unique("label", keep="first"))
    return dict(zip(top["label"].to_list(), top["source_location"].to_list()))


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return "" if v is None else str(v)


def body(report: Any) -> list[Any]:
    """The latest good capture: the speed of light and its waterfall (folded; none without a
    complete step), roofline, ranking, findings."""
    ops = report.ops
    by = (report.filters.group_by if report.filters else None) or "kernel"
    roof = figures.roofline_figure(ops, report.chip, by=by) if ops is not None and ops.height else None
    return [
        *light_view.overview(report),
        html.H3("Roofline"), dcc.Graph(id="live-roofline", figure=roof) if roof else html.P("—"),
        html.H3("Ranking"), _ranking(report),
        html.H3("Findings"), layout.findings_list(report),
    ]


def create_live_app(state: LiveState, address: str) -> Dash:
    """The live page of ``state`` (captures of ``address``), redrawn after each good capture."""
    app = Dash(__name__, title=f"traceroof live · {address}", update_title=None,
               assets_ignore=".*", serve_locally=True)
    app.index_string = layout.index_string(f"traceroof live · {address}")
    app.layout = html.Div([
        dcc.Interval(id="live-tick", interval=TICK_MS),
        dcc.Store(id="live-generation", data=-1),
        html.Div(className="tr-header", children=[
            html.Div(className="tr-title", children=["traceroof live", html.Small(address)]),
            html.Div(state.status(), id="live-status", className="tr-note")]),
        html.Div(className="tr-body", children=[
            dcc.Graph(id="live-history", figure=history_figure(state.history)),
            html.Div(id="live-body", children=html.P("waiting for the first capture…"))]),
    ])

    @app.callback(Output("live-status", "children"), Output("live-history", "figure"),
                  Output("live-body", "children"), Output("live-generation", "data"),
                  Input("live-tick", "n_intervals"), State("live-generation", "data"))
    def _tick(_n: int, shown: int) -> Any:
        status = state.status()
        with state.lock:
            gen, report = state.generation, state.report
            hist = History(list(state.history.names), list(state.history.step_time_ns),
                           list(state.history.busy_fraction), list(state.history.hfu))
        if gen == shown or report is None:
            return status, no_update, no_update, no_update
        return status, history_figure(hist), body(report), gen

    return app
