"""The Dash app factory and the server runner behind ``traceroof serve``.

``create_app(report)`` builds the dashboard of a :class:`~traceroof.report.Report`;
``create_error_app(message)`` the page shown when the input cannot be read (the same line
the CLI prints). ``run`` serves either on loopback by default.
"""

from __future__ import annotations

import logging
import socket
import threading
import webbrowser
from collections.abc import Callable
from typing import Any

from dash import Dash, dcc, html

from ..errors import InputNotFoundError, TraceroofError, UsageError
from ..report import Report
from . import bandwidth, figures, layout, light_view, views

logger = logging.getLogger(__name__)

try:  # plotly's validators import numpy lazily; two server threads doing it first race
    import numpy  # noqa: F401  ("partially initialized module 'numpy'"), so import it here, once
except ImportError:  # pragma: no cover - plotly works without numpy
    pass

LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def error_line(exc: BaseException) -> str:
    """The one line the CLI prints for a :class:`TraceroofError` (``traceroof.cli._handle_errors``)."""
    return f"traceroof: error: {exc}"


def _dash(title: str) -> Dash:
    app = Dash(__name__, title=title, update_title=None, suppress_callback_exceptions=False,
               assets_ignore=".*", serve_locally=True)
    app.index_string = layout.index_string(title)
    return app


def create_app(report: Report, source: str = "") -> Dash:
    """The dashboard of ``report``: header + Roofline / Ops / Timeline / Steps / Findings tabs.

    Args:
        report: from :func:`traceroof.analyze` or :meth:`Report.load` (with its op table for
            the roofline, ops and timeline tabs).
        source: the trace or report path, shown in the header.
    """
    from . import callbacks

    name = source or (report.trace.sources or [""])[0]
    app = _dash(f"traceroof · {name.rsplit('/', 1)[-1]}")
    has_ops = report.ops is not None and report.ops.height > 0
    app.layout = html.Div([
        dcc.Store(id="selected", data=None),
        dcc.Store(id="focus", data=None),
        dcc.Store(id="timeline-window", data=None),
        layout.header(report, name),
        html.Div([*light_view.overview(report), layout.tabs(report, initial_view(report))], className="tr-body"),
    ])
    if has_ops:
        callbacks.register(app, report)
    return app


def initial_view(report: Report) -> dict[str, Any]:
    """What the first page shows (the callbacks' results for the default selectors).

    Built here, in the main thread, before the server starts: the page paints without
    waiting for a callback, and plotly's lazily loaded validators are loaded before the
    server's threads use them.
    """
    out: dict[str, Any] = {"steps": figures.steps_figure(report.steps)}
    ops = report.ops
    if ops is not None and ops.height:
        by = (report.filters.group_by if report.filters else None) or "op"
        groups = views.op_groups(ops, by)
        out["roofline"] = figures.roofline_figure(ops, report.chip, by=by)
        out["bandwidth"] = bandwidth.bandwidth_figure(ops, report.chip, by=by)
        out["table_unit"] = views.ops_table_unit(ops)
        out["table"] = views.table_records(groups, unit=out["table_unit"])
        out["summary"] = views.table_summary(groups, ops)
        figures.timeline_figure(ops.head(2))  # loads the Bar/annotation validators too
    return out


def create_error_app(message: str, source: str | None = None) -> Dash:
    """A one-page app that shows ``message`` (the CLI's error line) instead of a blank page."""
    app = _dash("traceroof · error")
    app.layout = html.Div([
        html.Div(className="tr-header", children=[html.Div("traceroof", className="tr-title")]),
        layout.error_page(message, source),
    ])
    return app


def load_app(path: str, chip: str | None, loader: Callable[..., Report] | None = None, *,
             reraise: bool = False) -> tuple[Dash, str | None]:
    """Read ``path`` (a trace or a saved report) and build its app.

    Args:
        path: trace or report path.
        chip: ``--chip`` (traces only).
        loader: ``loader(path, chip, on_saved=...)`` → Report (default
            :func:`traceroof.analysis.load_report`, the one door of analyze, gate and serve).
        reraise: raise every error instead of serving it (``--debug``).

    Returns:
        (app, None) on success; (error app, error line) when the input exists but cannot be
        read or analysed (bad trace, unknown chip, unreadable report): the server still
        starts and shows that line, and the caller prints it too.

    Raises:
        InputNotFoundError: ``path`` does not exist (nothing to show: a typo; the CLI exits 3).
        UsageError: ``--chip`` given with a saved report (the CLI exits 2).
    """
    if loader is None:
        from ..analysis import load_report

        loader = load_report

    def trace_only(_report: Report) -> None:
        if chip:
            raise UsageError("--chip needs a trace, not a saved report (the report already names its chip)")

    try:
        report = loader(path, chip, on_saved=trace_only)
    except (InputNotFoundError, UsageError):
        raise
    except TraceroofError as exc:
        if reraise:
            raise
        line = error_line(exc)
        return create_error_app(line, path), line
    return create_app(report, path), None


def free_port(host: str) -> int:
    """A port the OS says is free on ``host`` (for ``--port 0``)."""
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(fam, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def check_port(host: str, port: int) -> None:
    """Raise UsageError when ``host:port`` cannot be bound (in use, or a bad address)."""
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(fam, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            raise UsageError(f"cannot listen on {host}:{port} ({exc.strerror or exc}); pass --port N, or --port 0 "
                             "for any free port") from exc


def url_for(host: str, port: int) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
    if ":" in shown:
        shown = f"[{shown}]"
    return f"http://{shown}:{port}/"


def run(app: Dash, host: str = "127.0.0.1", port: int = 8050, *, open_browser: bool = False,
        echo: Callable[[str], None] = print, warn: Callable[[str], None] | None = None) -> None:
    """Serve ``app`` until interrupted; prints the URL first (``echo``).

    Args:
        host: address to bind; loopback by default. Anything else exposes the trace to the
            network, and ``warn`` says so.
        port: TCP port; 0 picks a free one.
        open_browser: open the URL in the default browser once the server is up.

    Raises:
        UsageError: the port cannot be bound.
    """
    if port == 0:
        port = free_port(host)
    else:
        check_port(host, port)
    url = url_for(host, port)
    if host not in LOOPBACK and warn is not None:
        warn(f"listening on {host}: anyone who can reach this machine on port {port} can read the trace")
    echo(f"traceroof: dashboard at {url} (Ctrl-C to stop)")
    if open_browser:
        threading.Timer(1.0, webbrowser.open, args=(url,)).start()
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    app.logger.setLevel(logging.WARNING)  # Dash's own "Dash is running on" repeats the URL
    app.run(host=host, port=port, debug=False, use_reloader=False)
