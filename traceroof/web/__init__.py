"""The roofline dashboard (``traceroof serve``): a Dash app over a :class:`~traceroof.report.Report`.

Needs the ``web`` extra (``pip install 'traceroof[web]'``: dash, plotly). Layout:

- :mod:`.views`: pure data views (op groups, table rows, selections, timeline windows);
- :mod:`.figures`: pure figure builders (op table / step table + chip in, plotly Figure out);
- :mod:`.layout`: header, tabs and findings list built from a report;
- :mod:`.callbacks`: thin adapters from component values to views/figures;
- :mod:`.app`: the app factory (``create_app``, ``create_error_app``) and the server runner.
"""

from __future__ import annotations

from typing import Any

__all__ = ["create_app", "create_error_app", "load_app", "run"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import app

        return getattr(app, name)
    raise AttributeError(f"module 'traceroof.web' has no attribute {name!r}")
