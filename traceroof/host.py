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
    # the rows are in table order (``_h`` ascending), so a stable sort by start alone orders
    # equal starts by row; the last row of each key is then the latest start, and of equal
    # starts the last in table order (one integer sort key: 1 GB trace, 0.16 -> 0.12 s CPU)
    if in_start_order(host):
        # that sort leaves a table in start order as it is: the last row of a key is its
        # largest row number (no sort: 1 GB trace, 711 k cpu_ops, 75 -> 43 MB, 0.10 -> 0.07 s)
        return (
            host.lazy()
            .select(pl.int_range(pl.len(), dtype=pl.UInt32).alias("_h"), "cat", *by)
            .filter(pl.col("cat") == "cpu_op", pl.col("external_id").is_not_null())
            .group_by(by)
            .agg(pl.col("_h").max())
            .select("_h")
            .sort("_h")
            .collect()
        )["_h"]
    return (
        host.lazy()
        .select(pl.int_range(pl.len(), dtype=pl.UInt32).alias("_h"), "cat", "start_ns", *by)
        .filter(pl.col("cat") == "cpu_op", pl.col("external_id").is_not_null())
        .select("_h", "start_ns", *by)
        .sort("start_ns", maintain_order=True)
        .group_by(by)
        .agg(pl.col("_h").last())
        .select("_h")
        .sort("_h")
        .collect()
    )["_h"]


def in_start_order(host: pl.DataFrame) -> bool:
    """Whether ``host``'s rows are known to be in ascending ``start_ns`` order: the column
    flagged sorted (as the Kineto reader's host table is, :func:`~traceroof.parsers.kineto_link.build_tables`)
    and without nulls. Reads the flag only; never raises."""
    s = host.get_column("start_ns", default=None)
    return s is not None and s.null_count() == 0 and bool(s.flags.get("SORTED_ASC"))


# runtime calls that put work on a device: a kernel launch (CUDA, HIP, the driver API, a graph
# launch) or an asynchronous copy/fill; each is expected to produce a device op
_DEVICE_WORK_CALL = r"(?i)launch|memcpy|memset"


def device_launches(host: pl.DataFrame) -> int:
    """The runtime calls in ``host`` that put work on a device (kernel and graph launches,
    memcpy, memset: ``cat == 'runtime'`` with such a name). With no device op in the trace,
    a count above 0 means device activity was not recorded (CUPTI / roctracer activity
    off), not a CPU-only program."""
    if host.height == 0:
        return 0
    return host.filter(pl.col("cat") == "runtime", pl.col("name").str.contains(_DEVICE_WORK_CALL)).height


def no_device_ops_reason(host: pl.DataFrame) -> str:
    """Why a trace has no device op, in words: launches recorded without device activity, a
    CPU-only trace (host events, no launch), or metadata only (no host event either)."""
    if host.height == 0:
        return "no timed host event either: a metadata-only trace"
    n = device_launches(host)
    if n:
        return (f"{n:,} kernel launches / copies recorded but no device activity: the GPU "
                "activity (CUPTI / roctracer) was not recorded; re-record with "
                "ProfilerActivity.CUDA among the activities")
    return "no kernel launch either: a CPU-only trace"
