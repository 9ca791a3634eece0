"""Renderers: a Report in, text out. One module per format; the CLI picks by name.

Each renderer is ``render(report, *, top: int) -> str`` registered in :data:`RENDERERS`
(pyinstrument's renderer pattern). Renderers never compute: they only present.
"""

from __future__ import annotations

from collections.abc import Callable

from ..report import Report
from . import csv as _csv
from . import html as _html
from . import json as _json
from . import markdown as _markdown
from . import table as _table

Renderer = Callable[..., str]

RENDERERS: dict[str, Renderer] = {
    "table": _table.render,
    "json": _json.render,
    "markdown": _markdown.render,
    "csv": _csv.render,
    "html": _html.render,
}

#: output-file suffix → renderer name, for ``-o FILE`` without ``--format``.
SUFFIXES = {".json": "json", ".md": "markdown", ".csv": "csv", ".txt": "table", ".html": "html"}


def render(report: Report, fmt: str = "table", *, top: int = 20) -> str:
    """Render ``report`` in ``fmt`` (one of :data:`RENDERERS`)."""
    return RENDERERS[fmt](report, top=top)


__all__ = ["RENDERERS", "SUFFIXES", "render"]
