"""Renderers: a Report in, text out. One module per format; the CLI picks by name.

Each renderer is ``render(report, *, top: int) -> str`` registered in :data:`RENDERERS`
(pyinstrument's renderer pattern). Renderers never compute: they only present.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # not at run time: ``--format``'s choices are read before the command runs
    # (`--help` lists them), and ``report`` imports polars, which would then be loaded before
    # the early workers start
    from ..report import Report

Renderer = Callable[..., str]


def _lazy(module: str) -> Renderer:
    """The ``render`` of ``traceroof.render.<module>``, imported on the first call: the
    table renderer needs rich (~15 ms to import) and the HTML one plotly, which ``--format
    json`` never uses (issue 19: nothing imported that the output does not need)."""

    def render(report: Report, **kwargs: Any) -> str:
        return importlib.import_module(f"{__name__}.{module}").render(report, **kwargs)

    render.__name__ = render.__qualname__ = f"{module}.render"
    render.__doc__ = f"``traceroof.render.{module}.render``, imported when first called."
    return render


RENDERERS: dict[str, Renderer] = {
    "table": _lazy("table"),
    "json": _lazy("json"),
    "markdown": _lazy("markdown"),
    "csv": _lazy("csv"),
    "html": _lazy("html"),
}

#: output-file suffix → renderer name, for ``-o FILE`` without ``--format``.
SUFFIXES = {".json": "json", ".md": "markdown", ".csv": "csv", ".txt": "table", ".html": "html"}


def render(report: Report, fmt: str = "table", *, top: int = 20) -> str:
    """Render ``report`` in ``fmt`` (one of :data:`RENDERERS`)."""
    return RENDERERS[fmt](report, top=top)


__all__ = ["RENDERERS", "SUFFIXES", "render"]
