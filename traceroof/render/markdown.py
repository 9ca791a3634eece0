"""Markdown renderer: the same sections as the table renderer, for PRs and CI summaries."""

from __future__ import annotations

from ..report import Report
from . import light, sections

#: what the ranking's columns cover (accounting rule 7, docs/accounting.md)
RANKING_NOTE = ("measured, expected, gap and efficiency cover each row's costed ops (gap = measured − expected, "
                "efficiency = expected / measured); total is the time of all its ops, costed the share of it that "
                "is costed.")


def _table(headers: list[str], rows: list[list[str]]) -> str:
    esc = [[c.replace("|", "\\|") for c in r] for r in rows]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(r) + " |" for r in esc]
    return "\n".join(lines)


def render(report: Report, *, top: int = 20) -> str:
    out = ["# traceroof report", ""]
    out.append(_table(["", ""], [[f"**{k}**", v] for k, v in sections.header(report) + sections.summary(report)
                                                     + light.headline(report)]))
    devices = sections.device_rows(report)
    if devices:
        out += ["", "## Devices (per device, means per complete step)", ""]
        out.append(_table(list(sections.DEVICE_COLUMNS), devices))
    lines = sections.ranks_lines(report)
    if lines:
        out += ["", "## Ranks", ""]
        out.append(_table(["", ""], [[f"**{k}**", v] for k, v in lines]))
        rows, note = sections.ranks_rows(report, top)
        out += ["", _table(list(sections.RANKS_COLUMNS), rows)]
        if note:
            out += ["", note]
    if report.ranking.height:
        out += ["", f"## Top {min(top, report.ranking.height)} ops by time lost against the roofline", "",
                RANKING_NOTE, ""]
        out.append(_table([n for n, _ in sections.RANK_COLUMNS], sections.ranking_rows(report, top)))
    fall, note = light.waterfall_rows(report, top)
    if fall:
        out += ["", "## From the measured step to its speed of light", "", note or "", ""]
        out.append(_table(list(light.COLUMNS), fall))
    if report.findings:
        out += ["", "## Findings", ""]
        out.append(_table(["finding", "severity", "recoverable", "what"], sections.findings_rows(report, top)))
    inc = sections.inconsistency_lines(report)
    if inc:
        out += ["", "## Inconsistencies (not results)", ""] + [f"- {x}" for x in inc]
    if report.warnings:
        out += ["", "## Warnings", ""] + [f"- {w}" for w in report.warnings]
    return "\n".join(out) + "\n"
