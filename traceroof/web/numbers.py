"""How the dashboard writes numbers: one time unit per table column or axis, chosen from the
values it holds, and plain decimals (never ``7.777e+7``, never Plotly's ``20k``).

Pure functions, no Dash and no plotly: :mod:`.views`, :mod:`.figures`, :mod:`.bandwidth` and
:mod:`.layout` format through here. Text that is not tied to a column or axis (hovers, the
summary line) uses :mod:`traceroof.units`, which picks the unit per value.
"""

from __future__ import annotations

import math
import sys
from typing import Any, NamedTuple


class TimeUnit(NamedTuple):
    """A display unit for durations: its ``name`` (``s``, ``ms``, ``µs``), ``ns`` per unit,
    and ``key`` (the ASCII spelling used in column ids: ``s``, ``ms``, ``us``)."""

    name: str
    ns: float
    key: str


SECONDS = TimeUnit("s", 1e9, "s")
MILLISECONDS = TimeUnit("ms", 1e6, "ms")
MICROSECONDS = TimeUnit("µs", 1e3, "us")

#: a column or axis switches to the next larger unit once its largest value reaches this
#: many of the smaller one: up to 9,999 µs stays µs, 10 ms and up is ms, 10 s and up is s
SWITCH_AT = 10_000


def time_unit(max_ns: Any) -> TimeUnit:
    """The unit for durations whose largest magnitude is ``max_ns`` (ns): s from 10 s, ms from
    10 ms, else µs (:data:`SWITCH_AT`); µs for None, NaN or 0 (nothing to scale)."""
    try:
        v = abs(float(max_ns))
    except (TypeError, ValueError):
        return MICROSECONDS
    if math.isnan(v):
        return MICROSECONDS
    if v >= SWITCH_AT * MILLISECONDS.ns:
        return SECONDS
    if v >= SWITCH_AT * MICROSECONDS.ns:
        return MILLISECONDS
    return MICROSECONDS


def plain(v: Any, digits: int = 3, *, none: str = "—") -> str:
    """``v`` with ``digits`` significant digits in plain decimal notation, thousands
    separated, trailing zeros dropped: ``plain(77_770_000.0)`` -> ``"77,770,000"``,
    ``plain(0.0001234)`` -> ``"0.000123"``, ``plain(1234.56, 4)`` -> ``"1,235"`` (never an
    exponent); ``none`` for None, NaN or infinity."""
    if v is None:
        return none
    x = float(v)
    if math.isnan(x) or math.isinf(x):
        return none
    if x == 0:
        return "0"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    text = f"{round(x, decimals):,.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def log_bound(v: float) -> float:
    """``v`` clamped into the positive finite floats (``sys.float_info.min`` to ``.max``), so
    its ``log10`` exists: the end of a log axis whose padding under- or overflowed (a value
    of 1e-320 ÷ 4, or 1e308 × 4). NaN is taken as the smallest."""
    if not v > sys.float_info.min:  # NaN too
        return sys.float_info.min
    return min(v, sys.float_info.max)


def log_ticks(lo: float, hi: float, fmt: Any = plain) -> dict[str, Any]:
    """Plotly log-axis settings with a tick at every power of ten in [lo, hi], each labelled
    by ``fmt`` (``plain``: ``0.1``, ``1``, ``10``, ``1,000``; or a unit formatter such as
    :func:`traceroof.units.flops_per_s`): one notation on the whole axis, not Plotly's mix of
    ``10^15`` and ``100T``. A range of less than a factor 10 may hold no power of ten: callers
    pad their ranges (the roofline ×4 each way). ``lo`` and ``hi`` are taken through
    :func:`log_bound` (the float range holds the powers 10^-307 to 10^308)."""
    lo, hi = log_bound(lo), log_bound(hi)
    vals = [10.0 ** k for k in range(max(math.floor(math.log10(lo)), -307), min(math.ceil(math.log10(hi)), 308) + 1)
            if lo <= 10.0 ** k <= hi]
    return {"tickmode": "array", "tickvals": vals, "ticktext": [fmt(v) for v in vals]}


#: a linear axis in plain numbers: no SI suffix (``20k``), no exponent, thousands separated
LINEAR_AXIS: dict[str, Any] = {"exponentformat": "none", "separatethousands": True}


def window_text(start_ns: int | float, end_ns: int | float) -> str:
    """A time window since the trace start, both ends in the unit of the later one
    (:func:`time_unit`) with as many decimals as show its length to 3 significant digits:
    ``window_text(3_101_000, 10_736_000)`` -> ``"3.10–10.74 ms"``,
    ``window_text(91_234_500_000, 91_234_600_000)`` -> ``"91.234500–91.234600 s"``."""
    unit = time_unit(max(abs(start_ns), abs(end_ns)))
    s, e = start_ns / unit.ns, end_ns / unit.ns
    span = abs(e - s)
    decimals = min(9, max(0, 2 - math.floor(math.log10(span)))) if span > 0 else 3
    return f"{s:,.{decimals}f}–{e:,.{decimals}f} {unit.name}"
