"""Numbers as text, each with its unit: the one home of every formatter traceroof prints with.

Durations are int/float **ns** unless the name says otherwise (:func:`seconds` takes s);
rates are FLOP/s and B/s (decimal prefixes); memory sizes are binary (KiB, MiB, GiB) where
the name says so and decimal (GB) otherwise. Every function returns a string and never raises
on ``None`` where it takes one: it prints the ``none`` placeholder instead ("—" in tables,
"?" in messages).

Terminal/markdown renderers (:mod:`traceroof.render`), findings messages, the dashboard and
``traceroof estimate`` all format through here, so a number reads the same everywhere.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = [
    "short",
    "ns",
    "ms",
    "seconds",
    "flops_per_s",
    "tflops",
    "bytes_per_s",
    "count",
    "count_exact",
    "pct",
    "ratio",
    "bytes_binary",
    "bytes_exact",
    "gigabytes",
    "flop",
    "short_name",
    "plural",
]

NONE = "—"


def short(name: Any, n: int = 70, *, none: str = NONE) -> str:
    """``name`` cut to at most ``n`` characters, an ellipsis ("…") as the last one when cut;
    ``none`` for ``None``. ``short("aten::convolution_backward", 12)`` -> ``"aten::convo…"``."""
    s = none if name is None else str(name)
    return s if len(s) <= n else s[: n - 1] + "…"


# --------------------------------------------------------------------------- time


def ns(v: Any, *, none: str = NONE) -> str:
    """A duration in ns with its unit, 3 significant digits: ``21.3 ms``, ``20 µs``,
    ``150 ns``, ``1.23 s``; ``none`` for ``None``."""
    if v is None:
        return none
    v = float(v)
    a = abs(v)
    if a >= 1e9:
        return f"{v / 1e9:.3g} s"
    if a >= 1e6:
        return f"{v / 1e6:.3g} ms"
    if a >= 1e3:
        return f"{v / 1e3:.3g} µs"
    return f"{v:.0f} ns"


def ms(v_ns: float, digits: int = 4) -> str:
    """A duration in ns, always in ms with ``digits`` significant digits: ``12.35 ms``."""
    return f"{v_ns / 1e6:.{digits}g} ms"


def seconds(s: float) -> str:
    """A duration in **s**: ``1.234 s``, ``12.50 ms``, ``80.0 µs`` (fixed decimals)."""
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} µs"


# --------------------------------------------------------------------------- rates


def _rate(v: Any, prefixes: tuple[tuple[float, str], ...], base: str) -> str:
    """``v`` in the first of ``prefixes`` (divisor, unit) it reaches, 4 significant digits;
    below all of them in ``base`` with 3; "—" for None."""
    if v is None:
        return NONE
    v = float(v)
    for div, unit in prefixes:
        if abs(v) >= div:
            return f"{v / div:.4g} {unit}"
    return f"{v:.3g} {base}"


def flops_per_s(v: Any) -> str:
    """FLOP/s with a decimal prefix, 4 significant digits (``989.4 TFLOP/s``); "—" for None."""
    return _rate(v, ((1e15, "PFLOP/s"), (1e12, "TFLOP/s"), (1e9, "GFLOP/s"), (1e6, "MFLOP/s")), "FLOP/s")


def tflops(v: float) -> str:
    """FLOP/s as a bare TFLOP/s number (no unit): 0 decimals from 100, 1 from 10, else 3
    significant digits (``989``, ``67.0``, ``1.23``)."""
    t = v / 1e12
    if abs(t) >= 100:
        return f"{t:.0f}"
    if abs(t) >= 10:
        return f"{t:.1f}"
    return f"{t:.3g}"


def bytes_per_s(v: Any) -> str:
    """B/s with a decimal prefix, 4 significant digits (``3.35 TB/s``); "—" for None."""
    return _rate(v, ((1e12, "TB/s"), (1e9, "GB/s"), (1e6, "MB/s")), "B/s")


def flop(f: float, per: str = "") -> str:
    """A FLOP count, 2 decimals with a decimal prefix (``13.48 GFLOP``), ``per`` appended
    (``"/token"``); below 1 MFLOP the exact count (``1,024 FLOP``)."""
    for div, unit in ((1e15, "PFLOP"), (1e12, "TFLOP"), (1e9, "GFLOP"), (1e6, "MFLOP")):
        if abs(f) >= div:
            return f"{f / div:.2f} {unit}{per}"
    return f"{f:,.0f} FLOP{per}"


# --------------------------------------------------------------------------- counts and shares


def count(v: Any, unit: str = "") -> str:
    """A count with a decimal prefix (k, M, G, T, P), 3 significant digits, then ``unit``
    (``"1.23 GFLOP"`` for ``count(1.23e9, "FLOP")``); "—" for None."""
    if v is None:
        return NONE
    v = float(v)
    for div, p in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return f"{v / div:.3g} {p}{unit}"
    return f"{v:.3g} {unit}".strip()


def count_exact(n: float) -> str:
    """A count in full with thousands separators, and its short form in parentheses from a
    thousand on: ``6,738,149,376 (6.74 B)`` (K, M, B, T: the model-size convention)."""
    for div, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= div:
            return f"{n:,.0f} ({n / div:.2f} {unit})"
    return f"{n:,.0f}"


def pct(v: Any, digits: int = 1) -> str:
    """A share (0.423) as a percentage with ``digits`` decimals (``42.3 %``); "—" for None."""
    return NONE if v is None else f"{100 * float(v):.{digits}f} %"


def ratio(v: Any, unit: str = "") -> str:
    """A plain number, 3 significant digits, then ``unit`` (``"156 FLOP/B"``); "—" for None."""
    return NONE if v is None else f"{float(v):.3g}{(' ' + unit) if unit else ''}"


# --------------------------------------------------------------------------- sizes


def bytes_binary(v: float | None, *, none: str = "? B") -> str:
    """Bytes with a binary prefix, 3 significant digits (``1.5 GiB``, ``64 KiB``), under
    1 KiB in whole bytes (``512 B``); ``none`` for None."""
    if v is None:
        return none
    a = abs(float(v))
    for div, unit in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if a >= div:
            return f"{v / div:.3g} {unit}"
    return f"{v:.0f} B"


def bytes_exact(b: float) -> str:
    """Bytes with a binary prefix (4 significant digits) and the exact count:
    ``512 KiB (524,288 B)``; under 1 KiB only the count."""
    for div, unit in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if abs(b) >= div:
            return f"{b / div:,.4g} {unit} ({b:,.0f} B)"
    return f"{b:,.0f} B"


def gigabytes(b: float) -> str:
    """Bytes in GB and GiB, 2 decimals each: ``13.48 GB (12.55 GiB)``."""
    return f"{b / 1e9:.2f} GB ({b / 2**30:.2f} GiB)"


# --------------------------------------------------------------------------- names

_TEMPLATE_GROUP = re.compile(r"<[^<>]*>")
_HOLE = "\x00"  # a collapsed template group while collapsing its enclosing ones
_BREAKS = "_:, (./-"


def _top_level_paren(t: str) -> int:
    """Index of the first ``(`` outside every ``<…>`` of ``t``, or -1."""
    depth = 0
    for i, ch in enumerate(t):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(depth - 1, 0)
        elif ch == "(" and depth == 0:
            return i
    return -1


def short_name(name: Any, n: int, *, none: str = NONE) -> str:
    """A kernel or op name shortened to at most ``n`` characters at sensible points, each
    step only while it is still too long: a leading ``void `` goes; a demangled signature's
    arguments become ``(…)``; template arguments collapse to ``<…>`` (innermost, leftmost
    first); the namespaces of a signature go
    (``void at::native::vectorized_elementwise_kernel<4, …>(int, …)`` →
    ``vectorized_elementwise_kernel<…>(…)``); last, the name is cut after the last word
    boundary (``_``, ``::``, ``,``, space …) that fits, with ``…``. Only a name with no boundary
    in its second half is cut inside a word. ``none`` for ``None``."""
    if name is None:
        return none
    t = str(name)
    if len(t) <= n:
        return t
    if t.startswith("void "):
        t = t[5:]
    paren = _top_level_paren(t)
    if " " in t[:paren].split("<", 1)[0]:
        paren = -1  # words before the "(" ("Memcpy DtoD (Device -> Device)"): not a signature
    if len(t) > n and paren > 0:
        t = t[:paren] + "(…)"
    while len(t) > n:
        m = _TEMPLATE_GROUP.search(t)
        if m is None:
            break
        t = t[: m.start()] + _HOLE + t[m.end():]
    t = t.replace(_HOLE, "<…>")
    if len(t) > n and paren > 0:
        base = t.split("<", 1)[0].split("(", 1)[0]
        if "::" in base:
            t = t[base.rindex("::") + 2:]
    if len(t) <= n:
        return t
    if n <= 1:
        return "…"[:n]
    for i in range(min(n, len(t)) - 1, (n - 1) // 2 - 1, -1):
        if t[i] in _BREAKS:  # cut before "_", ":", …; after ",", "(", " "
            head = t[: i + 1 if t[i] in ",( " else i].rstrip()
            if len(head) + 1 <= n:
                return head + "…"
    return t[: n - 1] + "…"


def plural(count: int, word: str, words: str | None = None) -> str:
    """``1 op``, ``2 ops``, ``1,707 ops`` (thousands separated): the count and the word that
    agrees with it (``words`` for an irregular plural)."""
    return f"{count:,} {word if count == 1 else (words or word + 's')}"
