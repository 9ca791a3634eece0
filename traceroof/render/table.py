"""Terminal renderer (rich): header, summary, ranked ops, findings, warnings."""

from __future__ import annotations

import io

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .. import units
from ..report import Report
from . import light, sections, terminal

#: ranking columns dropped first when the terminal is narrow: at 80 columns the op, its kind,
#: measured time, gap and efficiency stay; narrower, the kind and then the efficiency go too
#: (the op, its gap and its measured time always stay)
RANK_DROP_ORDER = ("intensity (FLOP/B)", "count", "bound", "total", "expected", "costed", "kind", "efficiency")
#: the longest op label shown, however wide the terminal
MAX_LABEL = 60


def render(report: Report, *, top: int = 20, width: int | None = None) -> str:
    """The report as terminal text, ``width`` columns wide (default: the terminal's, see
    :mod:`traceroof.render.terminal`). Trace values are escaped: kernel names and chip keys
    contain ``[...]``, which rich would otherwise read as markup and drop."""
    width = terminal.width(width)
    buf = io.StringIO()
    con = terminal.console(buf, width)
    kv = Table.grid(padding=(0, 2))
    kv.add_column(style="bold")
    kv.add_column()
    for k, v in sections.header(report) + sections.summary(report) + light.headline(report):
        kv.add_row(escape(k), escape(v))
    con.print(kv)
    con.print()
    _devices(con, report)
    _ranks(con, report, top)
    if report.ranking.height == 0:
        _tail(con, report, width)
        return terminal.finish(buf.getvalue())
    _ranking(con, report, top, width)
    _waterfall(con, report, top, width)
    _tail(con, report, width, top)
    return terminal.finish(buf.getvalue())


def _ranking(con: Console, report: Report, top: int, width: int) -> None:
    """The ranked ops, with the columns that fit and op labels shortened at sensible points."""
    headers = [name for name, _ in sections.RANK_COLUMNS]
    rows = sections.ranking_rows(report, top)
    labels = report.ranking.head(top)["label"].to_list()
    for row, label in zip(rows, labels):
        row[0] = units.short_name(label, MAX_LABEL)
    kept, room = terminal.fit_columns(headers, rows, width, drop_order=RANK_DROP_ORDER, flexible="op",
                                      flexible_min=24)
    if room is not None:
        for row, label in zip(rows, labels):
            row[0] = units.short_name(label, room)
    idx = [headers.index(h) for h in kept]
    t = Table(title=f"Top {min(top, report.ranking.height)} ops by time lost against the roofline "
                    "(gap = measured − expected over the costed ops; costed = their share of the total)",
              title_justify="left")
    for h in kept:
        t.add_column(h, justify="left" if h in ("op", "kind", "bound") else "right", no_wrap=True)
    for row in rows:
        t.add_row(*(escape(row[i]) for i in idx))
    con.print(t)
    if len(kept) < len(headers):
        # a column's name is never split over two lines (NUL holds its spaces while wrapping)
        left = ", ".join(h.replace(" ", "\0") for h in headers if h not in kept)
        note = terminal.wrap(f"(left out at {width} columns: {left}; widen the terminal or use "
                             "--format markdown/json)", width, "", "")
        con.print(note.replace("\0", " "))


def _waterfall(con: Console, report: Report, top: int, width: int) -> None:
    """The waterfall from the measured step to its speed of light (:mod:`traceroof.render.light`)."""
    rows, note = light.waterfall_rows(report, top)
    if not rows:
        return
    t = Table(title="From the measured step to its speed of light", title_justify="left")
    for h in light.COLUMNS:
        t.add_column(h, justify="left" if h == "term" else "right", overflow="fold")
    for row in rows:
        t.add_row(*(escape(c) for c in row))
    con.print(t)
    con.print(escape(terminal.wrap(note or "", width, "", "")))
    con.print()


def _devices(con: Console, report: Report) -> None:
    """The per-device table of a rank driving several devices (nothing otherwise)."""
    rows = sections.device_rows(report)
    if not rows:
        return
    t = Table(title="Devices (per device, means per complete step)", title_justify="left")
    for name in sections.DEVICE_COLUMNS:
        t.add_column(name, justify="left" if name in ("rank", "device") else "right")
    for row in rows:
        t.add_row(*(escape(c) for c in row))
    con.print(t)
    con.print()


def _ranks(con: Console, report: Report, top: int) -> None:
    lines = sections.ranks_lines(report)
    if not lines:
        return
    kv = Table.grid(padding=(0, 2))
    kv.add_column(style="bold")
    kv.add_column()
    for k, v in lines:
        kv.add_row(escape(k), escape(v))
    con.print("[bold]Ranks[/bold] (docs/ranks.md)")
    con.print(kv)
    rows, note = sections.ranks_rows(report, top)
    t = Table(title="Per rank (per-step means; waits at matched collectives)", title_justify="left")
    for name in sections.RANKS_COLUMNS:
        t.add_column(name, justify="left" if name == "rank" else "right")
    for row in rows:
        t.add_row(*(escape(c) for c in row))
    con.print(t)
    if note:
        con.print(f"  {escape(note)}")
    con.print()


def _tail(con: Console, report: Report, width: int, top: int = 20) -> None:
    if report.findings:
        _findings(con, report, width, top)
    inc = sections.inconsistency_lines(report)
    if inc:
        con.print("[bold]Inconsistencies (not results):[/bold]")
        for line in inc:
            con.print(escape(terminal.wrap(line, width, "  ! ")))
    if report.warnings:
        con.print("[bold]Warnings:[/bold]")
        for w in report.warnings:
            con.print(escape(terminal.wrap(w, width)))


def _findings(con: Console, report: Report, width: int, top: int) -> None:
    headers = ["finding", "severity", "recoverable", "what"]
    rows = sections.findings_rows(report, top)
    kept, _ = terminal.fit_columns(headers, [r[:3] + [""] for r in rows], width,
                                   drop_order=("severity",), flexible="what", flexible_min=24)
    idx = [headers.index(h) for h in kept]
    f = Table(title="Findings (largest recoverable time first)", title_justify="left")
    for h in kept:
        f.add_column(h, no_wrap=h != "what", overflow="fold" if h == "what" else "ellipsis")
    for row in rows:
        f.add_row(*(escape(row[i]) for i in idx))
    con.print(f)
    n = len(report.findings)
    if n > len(rows):
        con.print(terminal.wrap(f"{len(rows)} of {units.plural(n, 'finding')} shown; --top {n} shows "
                                "them all, --format json gives every number", width, "", ""))
