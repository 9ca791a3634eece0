"""traceroof: rank the ops of a profiler trace against the roofline of the chip they ran on.

Public API (imported lazily, so ``import traceroof`` stays cheap)::

    from traceroof import read_trace, analyze, get_chip
    trace = read_trace("trace.json.gz")
    report = analyze(trace, chip="h100")

Submodules that are part of the API are imported on first use too: ``traceroof.capture`` is
the live-capture module (``traceroof.capture.capture(...)``,
``traceroof.capture.capture_xplane(...)``), whatever was imported before.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from . import _allocator  # noqa: F401  (first: polars' allocator setting, before polars loads)

__version__ = "0.1.0"

_EXPORTS = {
    "read_trace": "traceroof.io",
    "detect_format": "traceroof.io",
    "Trace": "traceroof.trace",
    "TraceMeta": "traceroof.trace",
    "DeviceInfo": "traceroof.trace",
    "ChipSpec": "traceroof.chips",
    "get_chip": "traceroof.chips",
    "detect_chip": "traceroof.chips",
    "list_chips": "traceroof.chips",
    "analyze": "traceroof.analysis",
    "load_report": "traceroof.analysis",
    "Report": "traceroof.report",
    "TraceroofError": "traceroof.errors",
    "TraceFormatError": "traceroof.errors",
    "UnknownChipError": "traceroof.errors",
}

#: submodules reachable as attributes of the package before anything imported them
_SUBMODULES = ("capture",)

__all__ = sorted([*_EXPORTS, *_SUBMODULES]) + ["__version__"]


def __getattr__(name: str) -> Any:
    """The lazy exports: a name of ``_EXPORTS`` from its module, a submodule of
    ``_SUBMODULES`` itself.

    Raises:
        AttributeError: any other name.
    """
    if name in _SUBMODULES:
        return import_module(f"{__name__}.{name}")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'traceroof' has no attribute {name!r}")
    return getattr(import_module(module), name)
