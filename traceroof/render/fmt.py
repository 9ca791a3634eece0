"""Number formatting of the text renderers: the formatters of :mod:`traceroof.units`
(every number with its unit), under the names the renderers and the dashboard call
(``fmt.ns``, ``fmt.pct``, ...). Nothing is defined here."""

from __future__ import annotations

from ..units import bytes_per_s, count, flops_per_s, ns, pct, ratio, short

__all__ = ["bytes_per_s", "count", "flops_per_s", "ns", "pct", "ratio", "short"]
