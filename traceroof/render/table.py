"""Terminal renderer (rich): header, summary, ranked ops, findings, warnings."""

from __future__ import annotations

import io
import shutil

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..report import Report
from . import sections


def render(report: Report, *, top: int = 20, width: int | None = None) -> str:
    """Trace values are escaped: kernel names and chip keys contain ``[...]``, which rich
    would otherwise read as markup and drop."""
    width = width or max(shutil.get_terminal_size((160, 40)).columns, 100)
    buf = io.StringIO()
    con = Console(file=buf, width=width, force_terminal=False, color_system=None, highlight=False)
    kv = Table.grid(padding=(0, 2))
    kv.add_column(style="bold")
    kv.add_column()
    for k, v in sections.header(report) + sections.summary(report):
        kv.add_row(escape(k), escape(v))
    con.print(kv)
    con.print()
    _ranks(con, report, top)
    if report.ranking.height == 0:
        _tail(con, report)
        return buf.getvalue()
    t = Table(title=f"Top {min(top, report.ranking.height)} ops by time lost against the roofline (gap = measured − expected)", title_justify="left")
    for name, _ in sections.RANK_COLUMNS:
        t.add_column(name, justify="right" if name not in ("op", "kind", "bound") else "left", overflow="fold")
    for row in sections.ranking_rows(report, top):
        t.add_row(*(escape(c) for c in row))
    con.print(t)
    _tail(con, report, top)
    return buf.getvalue()


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


def _tail(con: Console, report: Report, top: int = 20) -> None:
    if report.findings:
        f = Table(title="Findings (largest recoverable time first)", title_justify="left")
        for c in ("finding", "severity", "recoverable", "what"):
            f.add_column(c, overflow="fold")
        for row in sections.findings_rows(report, top):
            f.add_row(*(escape(c) for c in row))
        con.print(f)
    inc = sections.inconsistency_lines(report)
    if inc:
        con.print("[bold]Inconsistencies (not results):[/bold]")
        for line in inc:
            con.print(f"  ! {escape(line)}", soft_wrap=True)
    if report.warnings:
        con.print("[bold]Warnings:[/bold]")
        for w in report.warnings:
            con.print(f"  - {escape(w)}", soft_wrap=True)
