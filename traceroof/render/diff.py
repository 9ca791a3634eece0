"""``traceroof diff`` as text: a terminal table, markdown for a pull-request comment, or JSON
(docs/diff.md). Presents a :class:`~traceroof.diff.Diff`; computes nothing but running sums."""

from __future__ import annotations

import json
from typing import Any

from .. import units
from ..diff import Diff, Term

#: the per-op table's columns (per step: A → B)
OP_COLUMNS = ("op", "status", "count", "measured", "expected", "gap", "FLOPs", "Δ measured")


def _signed(v: float) -> str:
    return ("+" if v > 0 else "−" if v < 0 else "") + units.ns(abs(v))


#: below this many columns the Ops table drops :data:`NARROW_DROP` (the rest fold)
NARROW_WIDTH = 100
#: the Ops table's least important columns, dropped below :data:`NARROW_WIDTH` (--format json keeps all)
NARROW_DROP = ("expected", "gap", "FLOPs")


def _pct(a: float | None, b: float | None) -> str:
    """B against A as a signed percentage; as a factor (``×4997``, ``×0.02``) where B is ten
    times A or more, or a tenth or less: a percentage of a near-zero base says nothing."""
    if not a or b is None:
        return "—"
    if b >= 10 * a or 0 < b <= a / 10:
        return f"×{b / a:,.0f}" if b >= 10 * a else f"×{b / a:.2g}"
    return f"{(b - a) / a:+.1%}".replace("%", " %")


def headline(d: Diff) -> list[str]:
    """The top lines: the step-time change, the speed of light on both sides, what changed."""
    a, b = d.a, d.b
    if d.delta_ns is None or a.measured_ns is None or b.measured_ns is None:
        none = " and ".join(x.name for x in (a, b) if x.measured_ns is None)
        out = [f"no step-time change: no complete step in {none}"]
    else:
        out = [f"step {units.ns(a.measured_ns)} → {units.ns(b.measured_ns)}: {_signed(d.delta_ns)} "
               f"({_pct(a.measured_ns, b.measured_ns)}) per step",
               f"speed of light {units.ns(a.speed_of_light_ns)} → {units.ns(b.speed_of_light_ns)}"]
    out += [f"changed: {c}" for c in d.changed]
    out += d.notes
    return out


#: terms always shown, whatever --top: the device's own idle and concurrency
_ALWAYS = ("idle", "concurrency")


def _terms(terms: list[Term], top: int) -> list[tuple[str, str]]:
    named = [t for t in terms if t.source not in _ALWAYS]
    shown, rest = named[:top], named[top:]
    rows = [(t.term, _signed(t.delta_ns)) for t in shown]
    rows += [(t.term, _signed(t.delta_ns)) for t in terms if t.source in _ALWAYS]
    if rest:
        rows.append((f"{len(rest)} more terms (--format json lists each)", _signed(sum(t.delta_ns for t in rest))))
    return rows


def _op_rows(d: Diff, top: int) -> list[list[str]]:
    def fl(x: float | None) -> str:
        return units.flop(x) if x is not None else "?"

    def roof(v: float, measured: float, uncosted: float) -> str:
        if not measured:
            return "—"  # no op of the label on this side
        return "?" if uncosted >= measured else units.ns(v)  # no op of it is costed

    return [[units.short(o.label, 60), o.status, f"{o.count_a:.4g} → {o.count_b:.4g}",
             f"{units.ns(o.measured_a_ns) if o.count_a else '—'} → {units.ns(o.measured_b_ns) if o.count_b else '—'}",
             f"{roof(o.expected_a_ns, o.measured_a_ns, o.uncosted_a_ns)} → "
             f"{roof(o.expected_b_ns, o.measured_b_ns, o.uncosted_b_ns)}",
             f"{roof(o.gap_a_ns, o.measured_a_ns, o.uncosted_a_ns)} → {roof(o.gap_b_ns, o.measured_b_ns, o.uncosted_b_ns)}",
             f"{fl(o.flops_a)} → {fl(o.flops_b)}", _signed(o.delta_ns)] for o in d.ops[:top]]


def _finding_rows(d: Diff, top: int) -> list[list[str]]:
    return [[f.kind, units.short(f.title, 70) + (f" ({f.count_a} → {f.count_b} findings)" if max(f.count_a, f.count_b) > 1
                                                 else ""), f.status,
             f"{units.ns(f.recoverable_a_ns)} → {units.ns(f.recoverable_b_ns)}", _signed(f.delta_ns)]
            for f in d.findings[:top] if f.status != "same"]


def _roof_pct(expected: float, measured: float) -> str:
    return units.pct(expected / measured, 0) if measured else "—"


def matching_lines(d: Diff) -> list[str]:
    """The compute-signature matching's coverage line and notes (docs/diff.md)."""
    m = d.matching
    if m is None:
        return []
    out = [f"matched by what they compute: {units.pct(m.coverage_a)} of A's FLOPs, {units.pct(m.coverage_b)} of B's "
           f"({units.flop(m.matched_flops_a)} of {units.flop(m.flops_a)} → {units.flop(m.matched_flops_b)} of "
           f"{units.flop(m.flops_b)} per step)"]
    for g in m.groups:
        how = ("(unmatched)" if not g.matched else "(matched as a group: fusion boundaries differ)"
               if g.family in ("", g.kind) else f"(matched as one group {g.family}: the same work under two kinds)")
        out.append(f"{g.kind} left after one-to-one matching: {units.flop(g.flops_a)} → {units.flop(g.flops_b)} {how}")
    return out + list(m.notes)


def matching_rows(d: Diff, top: int) -> list[list[str]]:
    """The largest compute signatures: what they compute, A and B time and share of roof."""
    m = d.matching
    if m is None:
        return []
    out = []
    for r in m.signatures[:top]:
        size = ", ".join(x for x in (units.flop(r.flops_per_op) if r.flops_per_op else "",
                                      units.bytes_binary(r.bytes_per_op) if r.bytes_per_op else "") if x)
        if r.dtype_b is not None or r.bytes_b_per_op is not None:  # matched by FLOPs: B's dtype, bytes
            size += f" → {r.dtype_b or ''} {units.bytes_binary(r.bytes_b_per_op) if r.bytes_b_per_op else ''}".rstrip()
        what = f"{r.kind} {r.dtype or ''} {size}"
        out.append([what.strip(), f"{r.count_a:.4g} → {r.count_b:.4g}", _how(r, m.groups),
                    f"{units.ns(r.measured_a_ns)} ({_roof_pct(r.expected_a_ns, r.measured_a_ns)} of roof)",
                    f"{units.ns(r.measured_b_ns)} ({_roof_pct(r.expected_b_ns, r.measured_b_ns)} of roof)",
                    units.short(", ".join(r.labels_a), 40) or "—", units.short(", ".join(r.labels_b), 40) or "—"])
    return out


def _how(r: Any, groups: list[Any]) -> str:
    """How a signature row's ops were matched: one to one (same signature, or the same FLOPs in
    another dtype), the rest through its kind's group (FLOPs only: shapes not compared), or
    unmatched (docs/diff.md, "Limit of group matching")."""
    parts = [f"{r.matched:.4g} one to one"] if r.matched > 0 else []
    if max(r.count_a, r.count_b) - r.matched > 1e-9:
        g = next((g for g in groups if g.kind == r.kind), None)
        rest = "rest" if parts else "all"
        parts.append(f"{rest} via the {g.family or g.kind} group" if g is not None and g.matched
                     else f"{rest} unmatched")
    return ", ".join(parts)


#: the compute-signature table's title
MATCH_TITLE = ("Matched by what they compute (kind, dtype, FLOPs and bytes; or kind and FLOPs, B's dtype and bytes "
               "after →; names may differ)")
#: the compute-signature table's columns
MATCH_COLUMNS = ("computes", "count", "how", "A per step", "B per step", "A labels", "B labels")


def _md_table(headers: list[str] | tuple[str, ...], rows: list[list[str]] | list[tuple[str, str]]) -> list[str]:
    esc = [[c.replace("|", "\\|") for c in r] for r in rows]
    return ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)] + ["| " + " | ".join(r) + " |" for r in esc]


def markdown(d: Diff, *, top: int = 15) -> str:
    """The diff as markdown, ready for a pull-request comment."""
    out = [f"### traceroof diff: `{d.a.name}` → `{d.b.name}`", ""] + [f"- {x}" for x in headline(d)]
    if d.by_op:
        out += ["", "#### The change, by op (adds up to the step-time change)", ""]
        out += _md_table(["term", "Δ per step"], _terms(d.by_op, top))
    if d.by_cause:
        out += ["", "#### The change, by cause (roofline time of the work, findings, unclaimed gaps, idle)", ""]
        out += _md_table(["term", "Δ per step"], _terms(d.by_cause, top))
    out += ["", "#### Ops (per step, A → B)", ""] + _md_table(OP_COLUMNS, _op_rows(d, top))
    rows = _finding_rows(d, top)
    if rows:
        out += ["", "#### Findings that appeared, grew, shrank or went away (recoverable per step)", ""]
        out += _md_table(["detector", "finding", "status", "recoverable", "Δ in the waterfall"], rows)
    rows = matching_rows(d, top)
    if rows:
        out += ["", f"#### {MATCH_TITLE}", ""]
        out += [f"- {x}" for x in matching_lines(d)] + [""] + _md_table(MATCH_COLUMNS, rows)
    out += ["", f"Per step: means over each side's complete device-steps, or its partial ones when it has none "
                f"({d.a.device_steps} → {d.b.device_steps}); docs/diff.md."]
    return "\n".join(out) + "\n"


def table(d: Diff, *, top: int = 15, width: int | None = None) -> str:
    """The diff as terminal text (rich tables)."""
    import io

    from rich.markup import escape
    from rich.table import Table

    from . import terminal

    buf = io.StringIO()
    con = terminal.console(buf, terminal.width(width))
    con.print(f"[bold]traceroof diff[/bold] {escape(d.a.name)} → {escape(d.b.name)}")
    for line in headline(d):
        con.print("  " + escape(line))
    for title, terms in (("The change, by op (adds up to the step-time change)", d.by_op),
                         ("The change, by cause (roofline time of the work, findings, unclaimed gaps, idle)", d.by_cause)):
        if not terms:
            continue
        t = Table(title=title, title_justify="left")
        t.add_column("term", overflow="fold")
        t.add_column("Δ per step", justify="right")
        for row in _terms(terms, top):
            t.add_row(*(escape(c) for c in row))
        con.print(t)
    narrow = terminal.width(width) < NARROW_WIDTH
    cols = [i for i, h in enumerate(OP_COLUMNS) if not (narrow and h in NARROW_DROP)]
    title = "Ops (per step, A → B)" + (f"; {', '.join(NARROW_DROP)}: wider than {NARROW_WIDTH} columns" if narrow else "")
    t = Table(title=title, title_justify="left")
    for h in (OP_COLUMNS[i] for i in cols):
        t.add_column(h, justify="left" if h in ("op", "status") else "right", overflow="fold",
                     min_width=(16 if narrow else 24) if h == "op" else None, no_wrap=h not in ("op", "FLOPs"))
    for row in _op_rows(d, top):
        t.add_row(*(escape(row[i]) for i in cols))
    con.print(t)
    rows = _finding_rows(d, top)
    if rows:
        t = Table(title="Findings that appeared, grew, shrank or went away (recoverable per step)", title_justify="left")
        for h in ("detector", "finding", "status", "recoverable", "Δ in the waterfall"):
            t.add_column(h, overflow="fold")
        for row in rows:
            t.add_row(*(escape(c) for c in row))
        con.print(t)
    rows = matching_rows(d, top)
    if rows:
        for line in matching_lines(d):
            con.print(escape(line))
        t = Table(title=MATCH_TITLE,
                  title_justify="left")
        for h in MATCH_COLUMNS:
            t.add_column(h, overflow="fold")
        for row in rows:
            t.add_row(*(escape(c) for c in row))
        con.print(t)
    return terminal.finish(buf.getvalue())


def render(d: Diff, fmt: str = "table", *, top: int = 15) -> str:
    """``fmt``: ``table``, ``markdown`` or ``json`` (every row, not only ``top``)."""
    if fmt == "json":
        return json.dumps(d.to_dict(), indent=2)
    return markdown(d, top=top) if fmt == "markdown" else table(d, top=top)


__all__ = ["OP_COLUMNS", "headline", "markdown", "render", "table"]
