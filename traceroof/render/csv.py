"""CSV renderer: the ranked op table, one row per op group, units in the column names."""

from __future__ import annotations

from ..report import Report


def render(report: Report, *, top: int = 20) -> str:
    df = report.ranking.head(top) if top else report.ranking
    return df.write_csv()
