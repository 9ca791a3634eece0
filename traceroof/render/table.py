"""Terminal renderer (rich): header, summary, ranked ops, findings, warnings."""

from __future__ import annotations

import io
import os

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
    rows = sections.header(report) + sections.summary(report) + light.headline(report)
    # wrapped here, not by rich: a number never on another line than its unit (terminal.wrap)
    room = max(20, width - max((len(k) for k, _ in rows), default=0) - 2)
    for k, v in rows:
        kv.add_row(escape(k), escape(terminal.wrap(v, room, "", "")))
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
    _tell_apart(rows, labels, room or MAX_LABEL)
    idx = [headers.index(h) for h in kept]
    shown = min(top, report.ranking.height)
    t = Table(title=f"Top {units.plural(shown, 'op')} by time lost against the roofline "
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


#: where a name may be split when two shortened names must be told apart (as units.short_name)
_SPLITS = "_:,( <>."


def _tell_apart(rows: list[list[str]], labels: list[str], room: int) -> None:
    """Where shortening gave two different ops the same label (``aten::_scaled_dot_product…``
    for both the flash attention and its ``_backward``; ``Cijk_Ailk…`` for five Tensile
    GEMMs), each of them shows where it differs: its start shortened, then what follows the
    names' common start (from the word boundary before it), shortened too:
    ``aten::_scaled…_backward``, ``Cijk_Ailk_Bljk…MT256x224x64…``. At most ``room``
    characters; labels already distinct are left as they are, and so are those this would
    not tell apart either (names differing only deep inside their template arguments)."""
    seen: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        seen.setdefault(row[0], []).append(i)
    for same in (idx for idx in seen.values() if len(idx) > 1):
        # a leading "void " is no part of a name (units.short_name drops it too)
        full = [labels[i][5:] if labels[i].startswith("void ") else labels[i] for i in same]
        if len(set(full)) < len(full):
            continue  # the same label twice (the ranking never does this): nothing to tell apart
        common = len(os.path.commonprefix(full))
        new = {}
        for i, label in zip(same, full):
            cut = common
            while cut > 0 and label[cut - 1] not in _SPLITS and (cut >= len(label) or label[cut] not in _SPLITS):
                cut -= 1  # back to a word boundary: never split the word where they differ
            if 0 < cut < len(label):  # else nothing in common, or the shortest: its start is its own
                new[i] = _differing(label, cut, room)
        after = [new.get(i, rows[i][0]) for i in same]
        if len(set(after)) == len(after):  # only when it does tell them apart (deep templates may not)
            for i, text in new.items():
                rows[i][0] = text


def _differing(label: str, cut: int, room: int) -> str:
    """``label`` in at most ``room`` characters showing what follows ``label[:cut]`` (the start
    it shares with another op): that rest whole if it fits beside a short start; else its
    beginning up to a word boundary; else (one long word) the label's end from a word
    boundary, after "…". The shared start takes what is left, cut at a word boundary too."""
    rest = label[cut:]
    budget = room - min(cut, max(8, room // 3))  # what the differing part may take
    if len(rest) <= budget:
        tail = rest
    else:
        tail = _start(rest, budget) or ""
    if not tail:  # one long word where they differ: show the end instead
        head = _start(label[:cut], max(8, room // 3)) or label[: max(8, room // 3) - 1] + "…"
        end = label[-(room - len(head) + 1):]
        j = next((k for k, ch in enumerate(end[: len(end) // 2]) if ch in _SPLITS), 0)
        return head + end[j:] if head.endswith("…") else head + "…" + end[j + 1:]
    n = room - len(tail)
    head = label[:cut] if cut <= n else (_start(label[:cut], n) or label[: n - 1] + "…")
    return head[:-1] + tail if head.endswith("…") and tail.startswith("…") else head + tail


def _start(text: str, n: int) -> str | None:
    """``text`` if it fits in ``n``, else its longest start that ends at a word boundary
    (``_SPLITS``; trailing ``:``, ``_``, ``,``, ``.`` and spaces dropped) with "…", in at most ``n`` characters; None when no
    boundary leaves a start of at least 3 characters."""
    if len(text) <= n:
        return text
    for i in range(n - 1, 2, -1):
        if text[i] in _SPLITS or text[i - 1] in _SPLITS:
            head = text[:i].rstrip(":_,. ")
            if len(head) >= 3:
                return head + "…"
    return None


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
