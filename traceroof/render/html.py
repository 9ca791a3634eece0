"""HTML renderer: one self-contained page (``--format html``, ``-o report.html``).

The page holds the headline (the same rows as the table and markdown renderers,
:mod:`.sections`), warnings and inconsistencies, the roofline, the ranked ops, the findings
with their explanations, the timeline of one step, the steps and the waterfall
(:mod:`.plots`). plotly.js is inlined once (a few MB), so the file opens offline, in a CI
artifact viewer or from a chat; nothing is fetched. Needs plotly (the ``web`` extra).

``summary_html(report, top)`` is the headline and top ops alone (no figures, no script):
what :meth:`traceroof.report.Report._repr_html_` shows in a notebook.
"""

from __future__ import annotations

from html import escape

from ..report import Report
from . import sections

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1400px;color:#222;padding:0 16px}
h1{font-size:22px;margin:0 0 8px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
table.tr{border-collapse:collapse;font-size:13px;margin:6px 0}
table.tr td,table.tr th{border:1px solid #e3e3e3;padding:3px 8px;text-align:left;vertical-align:top}
table.tr th{background:#f5f5f5}table.tr td.num{text-align:right;font-variant-numeric:tabular-nums}
table.kv th{width:180px}.warn{color:#8a4b00}.note{color:#555;font-size:12px}
details{margin:4px 0}summary{cursor:pointer}.fig{margin:8px 0 20px}
"""
#: ranking columns shown right-aligned (numbers)
_NUMERIC = {"count", "total", "costed", "measured", "expected", "gap", "efficiency", "intensity (FLOP/B)"}


def _table(headers: list[str], rows: list[list[str]], cls: str = "tr") -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f'<td class="num">{escape(c)}</td>' if h in _NUMERIC else f"<td>{escape(c)}</td>"
                         for h, c in zip(headers, r)) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _kv(rows: list[tuple[str, str]]) -> str:
    body = "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in rows)
    return f'<table class="tr kv"><tbody>{body}</tbody></table>'


def _ranking(report: Report, top: int) -> str:
    if not report.ranking.height:
        return ""
    from .markdown import RANKING_NOTE

    n = min(top, report.ranking.height)
    left = report.ranking.height - n
    more = f" ({left:,} more row{'s' if left != 1 else ''} in the JSON report)" if left else ""
    return (f"<h2>Top {n} ops by time lost against the roofline</h2><p class=\"note\">{escape(RANKING_NOTE)}{more}</p>"
            + _table([h for h, _ in sections.RANK_COLUMNS], sections.ranking_rows(report, top)))


def summary_html(report: Report, *, top: int = 10) -> str:
    """The headline (what was read, the chip, step time, HFU/MFU, roofline efficiency) and the
    ``top`` ranked ops as an HTML fragment; warnings are counted, with the first shown."""
    parts = [_kv(sections.header(report) + sections.summary(report)), _ranking(report, top)]
    if report.warnings:
        w = report.warnings
        parts.append(f'<p class="warn">{len(w):,} warning{"s" if len(w) != 1 else ""}: {escape(w[0])}'
                     + (" …" if len(w) > 1 else "") + "</p>")
    return f'<div class="traceroof-report"><style>{_CSS}</style>{"".join(parts)}</div>'


def _findings(report: Report, top: int) -> str:
    if not report.findings:
        return "<h2>Findings</h2><p>No findings.</p>"
    shown = report.findings[:top]
    more = f" ({len(report.findings) - len(shown):,} more in the JSON report)" if len(report.findings) > len(shown) else ""
    rows = sections.findings_rows(report, top)
    items = "".join(f"<details><summary>#{i + 1} {escape(r[3])}</summary><p>{escape(f.explanation)}</p></details>"
                    for i, (f, r) in enumerate(zip(shown, rows)))
    return (f"<h2>Findings</h2><p class=\"note\">largest recoverable time first{more}</p>"
            + _table(["finding", "severity", "recoverable", "what"], rows) + items)


def _figures(report: Report) -> list[tuple[str, str]]:
    """(title, section HTML) of each figure of :func:`.plots.figure_list`."""
    import plotly.io as pio

    from .plots import figure_list

    out = []
    for i, (title, fig) in enumerate(figure_list(report)):
        div = pio.to_html(fig, full_html=False, include_plotlyjs=False, div_id=f"fig-{i}",
                          config={"displaylogo": False, "responsive": True})
        out.append((title, f'<h2>{escape(title)}</h2><div class="fig" data-figure="{escape(title)}">{div}</div>'))
    return out


def render(report: Report, *, top: int = 20) -> str:
    """The whole page (module docstring); ``top`` ranked ops and findings.

    Raises:
        UsageError: plotly is not installed (exit code 2).
    """
    try:
        from plotly.offline import get_plotlyjs
    except ImportError as exc:
        from ..errors import UsageError

        raise UsageError(f"--format html needs plotly ({(exc.name or 'plotly').split('.')[0]} is missing): pip install 'traceroof[web]'") from exc

    figs = _figures(report)
    src = (report.trace.sources or [""])[0]
    warn = "".join(f"<li>{escape(w)}</li>" for w in report.warnings)
    inc = "".join(f"<li>{escape(x)}</li>" for x in sections.inconsistency_lines(report))
    body = [
        f"<h1>traceroof report · {escape(src.rsplit('/', 1)[-1])}</h1>",
        _kv(sections.header(report) + sections.summary(report)),
        f"<h2>Inconsistencies (not results)</h2><ul>{inc}</ul>" if inc else "",
        f'<h2>Warnings</h2><ul class="warn">{warn}</ul>' if warn else "",
        *[h for t, h in figs if t == "Roofline"],  # the roofline, the ranked ops and findings, the rest
        _ranking(report, top), _findings(report, top),
        *[h for t, h in figs if t != "Roofline"],
        f'<p class="note">traceroof {escape(report.traceroof_version)} · report schema {report.schema_version} · '
        f"{escape(report.created_at)} · self-contained: plotly.js inlined, nothing is fetched</p>",
    ]
    return (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>traceroof · "
            f"{escape(src.rsplit('/', 1)[-1])}</title><style>{_CSS}</style>"
            f"<script type=\"text/javascript\">{get_plotlyjs()}</script></head><body>{''.join(body)}</body></html>\n")
