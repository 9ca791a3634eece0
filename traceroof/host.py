"""Queries over the host table (:data:`traceroof.schema.HOST_SCHEMA`) shared by the parser
and the analysis."""

from __future__ import annotations

import polars as pl


def innermost_cpu_ops(host: pl.DataFrame, by: list[str]) -> pl.Series:
    """Row indices (in table order) of the framework op each ``by`` key names: the ``cpu_op``
    event with that key (``["external_id"]`` within one file, ``["rank", "external_id"]``
    across ranks); when several share it (nested ops in old traces), the one that started
    last, the innermost; of several that started at the same ns, the last in table order
    (the rule :func:`traceroof.findings.unfused_elementwise._shape_keys_of` uses).

    Only the integer columns are sorted; callers gather the text columns they need with the
    result once (``host.select(...)[rows]``), which keeps this fast on millions of events.

    Args:
        host: a host table (``cat``, ``start_ns`` and the ``by`` columns are read).
        by: the key columns; rows with a null ``external_id`` are never picked.

    Returns:
        A ``UInt32`` series of row indices into ``host``, ascending.
    """
    return (
        host.lazy()
        .with_row_index("_h")
        .filter(pl.col("cat") == "cpu_op", pl.col("external_id").is_not_null())
        .select("_h", "start_ns", *by)
        .sort(["start_ns", "_h"], descending=[True, True])
        .unique(by, keep="first", maintain_order=True)
        .select("_h")
        .sort("_h")
        .collect()
    )["_h"]
