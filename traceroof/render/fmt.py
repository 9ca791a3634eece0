"""Number formatting shared by the text renderers: every number with its unit."""

from __future__ import annotations

from typing import Any


def ns(v: Any) -> str:
    """A duration in ns as a readable string with its unit."""
    if v is None:
        return "—"
    v = float(v)
    a = abs(v)
    if a >= 1e9:
        return f"{v / 1e9:.3g} s"
    if a >= 1e6:
        return f"{v / 1e6:.3g} ms"
    if a >= 1e3:
        return f"{v / 1e3:.3g} µs"
    return f"{v:.0f} ns"


def flops_per_s(v: Any) -> str:
    if v is None:
        return "—"
    v = float(v)
    for div, unit in ((1e15, "PFLOP/s"), (1e12, "TFLOP/s"), (1e9, "GFLOP/s"), (1e6, "MFLOP/s")):
        if abs(v) >= div:
            return f"{v / div:.4g} {unit}"
    return f"{v:.3g} FLOP/s"


def bytes_per_s(v: Any) -> str:
    if v is None:
        return "—"
    v = float(v)
    for div, unit in ((1e12, "TB/s"), (1e9, "GB/s"), (1e6, "MB/s")):
        if abs(v) >= div:
            return f"{v / div:.4g} {unit}"
    return f"{v:.3g} B/s"


def count(v: Any, unit: str = "") -> str:
    if v is None:
        return "—"
    v = float(v)
    for div, p in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return f"{v / div:.3g} {p}{unit}"
    return f"{v:.3g} {unit}".strip()


def pct(v: Any) -> str:
    return "—" if v is None else f"{100 * float(v):.1f} %"


def ratio(v: Any, unit: str = "") -> str:
    return "—" if v is None else f"{float(v):.3g}{(' ' + unit) if unit else ''}"


def short(name: Any, n: int = 70) -> str:
    s = "—" if name is None else str(name)
    return s if len(s) <= n else s[: n - 1] + "…"
