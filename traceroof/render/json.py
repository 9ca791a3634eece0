"""JSON renderer: the versioned report (docs/report-json.md), ranking limited to ``top``."""

from __future__ import annotations

from ..report import Report


def render(report: Report, *, top: int = 20) -> str:
    return report.to_json(top=top)
