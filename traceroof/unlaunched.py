"""Kernels whose launch is not in the trace: lent the framework ops of the identical kernel
sequence the trace does link (an eager match).

A kernel queued before the host recording began (the profiler's window opened while the
device still ran the previous iteration) has no launch runtime call in the file, so no
``External id`` and no framework op: nothing costs it (``costing._why``: "no launch in the
trace"). When the same kernel names, in the same order, also ran later with their launches
recorded (the next iteration of the same program), :func:`attribute` lends each such kernel
its twin's op (name, ``Input Dims``, ``Input type``, ``Concrete Inputs``), exactly as a graph
replay is eager-matched (:func:`traceroof.graph_match.eager_runs`: runs of at least
:data:`~traceroof.graph_match.MIN_RUN` kernels and :data:`~traceroof.graph_match.MIN_DISTINCT`
distinct names, whole op instances only; each distinct run of names is matched once per
rank and the match reused by its repeats), and the costing costs it like any op. Each run's op
instances get cost groups of their own (negative External ids below those the graph replays
took), so an op is costed once per iteration.

The eager match assumes the unlaunched kernels ran with the linked twin's shapes (true for
a repeated training or forward step; a decode step at another sequence length is mis-sized
in its attention, whose FLOPs grow with the KV length). The coverage says how much was
attributed this way (``coverage.unlaunched``) and a warning says it too.
"""

from __future__ import annotations

import dataclasses

import polars as pl

from .graph_match import MIN_RUN, Match, eager_runs
from .graph_replay import Lending, Replays, build_source
from .sections import UnlaunchedInfo

#: the parse warning :func:`replace_warning` replaces (``kineto_link._warn_links``)
_PARSE_WARNING = "have no host launch in the trace window (no matching correlation)"


def _runs(kern: pl.DataFrame) -> list[tuple[int, list[int], list[str]]]:
    """Per rank, the maximal runs of consecutive unlaunched kernels in device order
    (``start_ns`` then ``stream``): ``[(rank, row indices, kernel names)]``,
    ranks ascending, runs in device order. A run is numbered by the launched kernels before
    it on its rank (a cumulative count), so only the unlaunched rows leave polars."""
    runs = (kern.sort("rank", "start_ns", "stream")
            .with_columns((~pl.col("_miss")).cum_sum().over("rank").alias("_run"))
            .filter("_miss")
            .with_columns(pl.col("name").fill_null("").rank("dense").cast(pl.UInt32).alias("_n"))
            .group_by("rank", "_run", maintain_order=True)
            .agg("_r", "_n"))
    # each distinct name made once, not once per kernel (the dense rank's order is the sort's)
    table = kern.filter("_miss")["name"].fill_null("").unique().sort().to_list()
    return [(int(rank), rows, [table[c - 1] for c in codes]) for rank, _run, rows, codes in runs.iter_rows()]


def attribute(replays: Replays, host: pl.DataFrame) -> Replays:
    """``replays`` (the graph-replay stage's result) with the unlaunched kernels of its op
    table eager-matched (module docstring) and :class:`~traceroof.sections.UnlaunchedInfo`
    set when the table has any.

    Args:
        replays: from :func:`traceroof.graph_replay.attribute` (its ``ops`` is the op table,
            OP_SCHEMA).
        host: the trace's host table (HOST_SCHEMA).

    Returns:
        A new :class:`Replays`: ``ops`` with ``op``/``external_id`` set on the matched
        kernels, ``shape_rows`` with one host row per matched op instance added, and the
        warning. Never raises.
    """
    ops = replays.ops
    is_kernel = ~pl.col("kind").cast(pl.String).is_in(["memcpy", "memset"])
    miss = (pl.col("launch_start_ns").is_null() & pl.col("op").is_null() & pl.col("external_id").is_null()
            & ~pl.col("graph").fill_null(False))
    kern = (ops.lazy().with_row_index("_r").filter(is_kernel)
            .select("_r", "rank", "start_ns", "stream", "name", "dur_ns", miss.alias("_miss")).collect())
    n_miss = int(kern["_miss"].sum())
    if n_miss == 0:
        return replays
    total_ns = int(kern.filter("_miss")["dur_ns"].sum() or 0)
    src = build_source(ops, host, "eager", same_trace=True)
    ext = ops["external_id"].min()
    # below every id the graph replays took
    lending = Lending(next_id=min(int(ext) if ext is not None else 0, 0) - 1)
    lent: list[int] = []
    # identical runs match identically (eager_runs is a function of the names, the rank's
    # eager sequence and its kernel counts alone): each distinct (rank, names) is matched once
    matches: dict[tuple[int, tuple[str, ...]], Match] = {}
    for rank, rows, names in _runs(kern):
        seq = src.eager.get(rank)
        if seq is None or len(rows) < MIN_RUN:
            continue
        key = (rank, tuple(names))
        match = matches.get(key)
        if match is None:
            match = matches[key] = eager_runs(names, seq, src.op_kernels)
        lent += lending.lend(src, match, rows, rank)
    matched, attributed = len(lent), int(ops["dur_ns"].gather(lent).fill_null(0).sum())
    if not lending.rows:
        return dataclasses.replace(replays, unlaunched=UnlaunchedInfo(
            kernels=n_miss, device_time_ns=total_ns, kernels_matched=0, attributed_ns=0, method="unattributed"))
    info = UnlaunchedInfo(kernels=n_miss, device_time_ns=total_ns, kernels_matched=matched,
                          attributed_ns=attributed, method="eager_match")
    return dataclasses.replace(replays, ops=lending.write(ops),
                               shape_rows=pl.concat([replays.shape_rows, lending.shape_rows()]),
                               unlaunched=info)


def replace_warning(warnings: list[str], replays: Replays, device_ns: int) -> list[str]:
    """``warnings`` with the parser's no-launch warning (:data:`_PARSE_WARNING`) replaced,
    when some unlaunched kernels were eager-matched, by one saying how many (and that the
    rest keep no op); otherwise unchanged."""
    info = replays.unlaunched
    if info is None or not info.kernels_matched:
        return warnings
    left = info.kernels - info.kernels_matched
    parse = next((x for x in warnings if _PARSE_WARNING in x), None)
    head = (parse.split(" (no matching correlation)")[0] if parse
            else f"{info.kernels} kernels have no host launch in the trace window")
    w = (f"{head} (queued before the host recording began): {info.kernels_matched} of its {info.kernels} kernels "
         f"({info.attributed_ns / max(device_ns, 1):.1%} of device time) were given the framework ops and shapes "
         "of the identical kernel sequence the trace links (eager match: its shapes assumed)"
         + (f"; {left} have no framework op or shapes" if left else "")
         + "; copies and fills keep the byte counts the trace records")
    return [x for x in warnings if _PARSE_WARNING not in x] + [w]


__all__ = ["attribute", "replace_warning"]
