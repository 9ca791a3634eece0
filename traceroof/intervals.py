"""Interval arithmetic on [start_ns, end_ns) sets, as polars operations.

Every busy/idle/exposed figure in traceroof is a union or a difference of unions, never a
sum of per-stream durations (BC-33: per-stream sums double count concurrent streams).
"""

from __future__ import annotations

from typing import Any

import polars as pl

from .frames import done, small

#: Below every (shifted) time: the running maximum before a group's first row.
_NEG = -(2**62)


def _bounds(df: pl.DataFrame, start: str, end: str) -> tuple[Any, Any, int]:
    """(min, max, null count) over the ``start`` and ``end`` columns of ``df``, in one pass."""
    lo, hi, nulls = df.select(
        pl.min_horizontal(pl.col(start).min(), pl.col(end).min()).alias("lo"),
        pl.max_horizontal(pl.col(start).max(), pl.col(end).max()).alias("hi"),
        (pl.col(start).null_count() + pl.col(end).null_count()).alias("nulls"),
    ).row(0)
    return lo, hi, int(nulls)


def _stack(d: pl.DataFrame | pl.LazyFrame, by: list[str], lo: int, span: int, start: str,
           end: str) -> pl.DataFrame | pl.LazyFrame:
    """``d`` (sorted by ``by`` then start) with ``_g``, the index of its group (0, 1, … in
    sorted order), and the shifted times ``_s``, ``_e`` = time + ``_g * span - lo``.

    Every shifted time of group g lies in ``[g * span, (g + 1) * span)`` (``lo``: the least
    time, ``span``: max − min + 1), so one running maximum over the whole frame never carries
    a group's ends into the next group: no per-group window. Exact integer arithmetic;
    ``span * (rows + 1) < 2**62`` (:func:`_fast_path`) keeps it in int64."""
    # rle_id numbers runs of equal keys (nulls equal), i.e. the groups of the sorted frame
    g = pl.struct(by).rle_id().cast(pl.Int64) if by else pl.lit(0, dtype=pl.Int64)
    d = d.with_columns(g.set_sorted().alias("_g"))
    off = pl.col("_g") * span - lo
    return d.with_columns((pl.col(start) + off).alias("_s"), (pl.col(end) + off).alias("_e"))


def _fast_path(df: pl.DataFrame, start: str, end: str, by: list[str]) -> tuple[int, int] | None:
    """(lo, span) for the offset trick of :func:`_stack`, or None when it does not apply:
    null or non-integer times, or spans so large that the shifted times could overflow."""
    if not (df.schema[start].is_integer() and df.schema[end].is_integer()):
        return None
    lo, hi, nulls = _bounds(df, start, end)
    if nulls:
        return None
    span = int(hi - lo) + 1
    if span * (df.height + 1) >= 2**62:
        return None
    return int(lo), span


def union(df: pl.DataFrame, start: str = "start_ns", end: str = "end_ns", by: list[str] | None = None) -> pl.DataFrame:
    """Merge overlapping intervals.

    Args:
        df: rows with ``start`` and ``end`` (ns, end exclusive), optionally grouped by ``by``.

    Returns:
        Disjoint, sorted intervals: columns ``by + [start_ns, end_ns]``.
    """
    by = by or []
    d = df.select(*by, pl.col(start).alias("start_ns"), pl.col(end).alias("end_ns"))
    return _union_of_sorted(d.sort([*by, "start_ns"]), by)


def union_sorted(df: pl.DataFrame, by: list[str] | None = None) -> pl.DataFrame:
    """:func:`union` of ``start_ns``/``end_ns`` intervals already sorted by ``(*by,
    start_ns)`` (a filter of a table kept in that order): the same result, without the sort.

    Returns:
        Disjoint, sorted intervals: columns ``by + [start_ns, end_ns]``, ns.
    """
    by = by or []
    return _union_of_sorted(df.select(*by, "start_ns", "end_ns"), by)


def _union_of_sorted(d: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """:func:`union` of ``d``: columns ``*by, start_ns, end_ns``, sorted by ``(*by, start_ns)``."""
    if d.height == 0:
        return pl.DataFrame(schema={**{b: d.schema[b] for b in by}, "start_ns": pl.Int64, "end_ns": pl.Int64})
    fast = _fast_path(d, "start_ns", "end_ns", by)
    if fast is None:
        return _union_general(d.lazy(), by)
    # Eager frames on a large table (the in-memory engine beats a lazy query's default engine
    # several times over there), one lazy plan on the in-memory engine on a small one
    # (:mod:`traceroof.frames`)
    end_dtype = d.schema["end_ns"]
    d = _stack(small(d), by, *fast, "start_ns", "end_ns")
    # A row opens a merged segment when it starts after the running maximum ``_cm`` of the
    # (shifted) ends before it. A segment's start is its first row's (rows are sorted by
    # start); its end is ``_cm`` at its last row: earlier segments end before it starts and a
    # segment of several rows reaches past its start (its second row starts inside it). A
    # one-row segment keeps its own end, which may precede its start (as min/max would).
    d = d.with_columns(pl.col("_e").cum_max().alias("_cm"))
    d = d.with_columns((pl.col("_s") > pl.col("_cm").shift(1).fill_null(_NEG)).alias("_first"))
    first = pl.col("_first")
    last = first.shift(-1).fill_null(True)
    d = d.filter(first | last)  # each segment's first and last rows
    return done(d.select(
        *by,
        pl.when(first).then("start_ns").forward_fill().alias("start_ns"),
        pl.when(first & last).then("end_ns").otherwise(pl.col("_cm") - (pl.col("_e") - pl.col("end_ns")))
        .cast(end_dtype).alias("end_ns"),
        last.alias("_last"),
    ).filter("_last").drop("_last"))


def _union_general(d: pl.LazyFrame, by: list[str]) -> pl.DataFrame:
    """:func:`union` of ``d`` (sorted by ``by`` then start) with segments from a per-group
    window and a group-by: any dtype, nulls, any span."""
    if not by:
        seg = pl.col("start_ns") > pl.col("end_ns").cum_max().shift(1).fill_null(_NEG)
        d = d.with_columns(seg.cum_sum().alias("_seg"))
        return d.group_by("_seg", maintain_order=True).agg(
            pl.col("start_ns").min(), pl.col("end_ns").max()
        ).drop("_seg").collect()
    prev_end = pl.col("end_ns").cum_max().shift(1).over(by)
    d = d.with_columns((pl.col("start_ns") > prev_end.fill_null(_NEG)).cum_sum().over(by).alias("_seg"))
    return (
        d.group_by([*by, "_seg"], maintain_order=True)
        .agg(pl.col("start_ns").min(), pl.col("end_ns").max())
        .drop("_seg")
        .sort([*by, "start_ns"])
        .collect()
    )


def union_lengths(
    df: pl.DataFrame, sets: dict[str, pl.Expr], by: list[str], start: str = "start_ns", end: str = "end_ns"
) -> pl.DataFrame:
    """Length (ns) of the union of several subsets of the intervals, per group, in one pass.

    Args:
        df: rows with ``start`` and ``end`` (ns, end exclusive) and the ``by`` columns.
        sets: output column → boolean expression over ``df`` choosing that subset's rows
            (null counts as false).
        by: the group columns (at least one).

    Returns:
        One row per distinct ``by`` value, sorted by ``by``: the ``by`` columns and one Int64
        column per set, ``total(union(df.filter(cond), by=by))`` of that group (0 when the
        group has no row in the set).
    """
    schema = {**{b: df.schema[b] for b in by}, **{name: pl.Int64 for name in sets}}
    if df.height == 0:
        return pl.DataFrame(schema=schema)
    conds = [cond.fill_null(False).alias(f"_in{i}") for i, cond in enumerate(sets.values())]
    fast = _fast_path(df, start, end, by)
    if fast is None:  # the definition, one union per set
        keys = df.lazy().select(by).unique()
        for i, (name, cond) in enumerate(sets.items()):
            u = union(df.filter(conds[i]), start, end, by=by)
            tot = u.group_by(by).agg((pl.col("end_ns") - pl.col("start_ns")).sum().cast(pl.Int64).alias(name))
            keys = keys.join(tot.lazy(), on=by, how="left", nulls_equal=True)
        return keys.with_columns(pl.col(list(sets)).fill_null(0)).sort(by).collect()
    # Sweep each subset in start order (one sort serves every subset): a row adds what it
    # covers beyond the running maximum ``m`` of the subset's earlier ends, ``e − max(s, m)``
    # clipped at 0. This telescopes to (segment end − segment start) per merged segment of
    # :func:`union`; a row that opens a segment adds ``e − s`` even when negative, as
    # :func:`total` of that one-row segment does. Shifted times keep groups apart (:func:`_stack`).
    d = small(df).select(*by, start, end, *conds).sort([*by, start])  # (one lazy plan on a small table)
    d = _stack(d, by, *fast, start, end)
    d = d.with_columns(
        pl.when(f"_in{i}").then("_e").otherwise(pl.lit(_NEG)).cum_max().shift(1).fill_null(_NEG).alias(f"_m{i}")
        for i in range(len(sets))
    )
    s, e = pl.col("_s"), pl.col("_e")
    adds = []
    for i, name in enumerate(sets):
        m = pl.col(f"_m{i}")
        add = pl.when(s > m).then(e - s).otherwise(pl.max_horizontal(e - m, pl.lit(0)))
        adds.append(pl.when(f"_in{i}").then(add).otherwise(pl.lit(0)).alias(name))
    return done(
        d.select(*by, "_g", *adds)
        .group_by("_g", maintain_order=True)  # _g is sorted: groups are runs, no hashing
        .agg(pl.col(by).first(), pl.col(list(sets)).sum().cast(pl.Int64))
        .drop("_g")
    )


def total(intervals: pl.DataFrame) -> int:
    """Total length (ns) of disjoint intervals."""
    if intervals.height == 0:
        return 0
    return int((intervals["end_ns"] - intervals["start_ns"]).sum())


def union_ns(df: pl.DataFrame, start: str = "start_ns", end: str = "end_ns") -> int:
    """Length (ns) of the union of the intervals in ``df``."""
    return total(union(df, start, end))


def intersect(a: pl.DataFrame, b: pl.DataFrame) -> pl.DataFrame:
    """Intersection of two sets of disjoint sorted intervals (columns start_ns, end_ns)."""
    if a.height == 0 or b.height == 0:
        return pl.DataFrame(schema={"start_ns": pl.Int64, "end_ns": pl.Int64})
    # sweep: tag boundaries, count coverage
    la, lb = a.lazy(), b.lazy()
    ev = pl.concat(
        [
            la.select(pl.col("start_ns").alias("t"), pl.lit(1).alias("da"), pl.lit(0).alias("db")),
            la.select(pl.col("end_ns").alias("t"), pl.lit(-1).alias("da"), pl.lit(0).alias("db")),
            lb.select(pl.col("start_ns").alias("t"), pl.lit(0).alias("da"), pl.lit(1).alias("db")),
            lb.select(pl.col("end_ns").alias("t"), pl.lit(0).alias("da"), pl.lit(-1).alias("db")),
        ]
    )
    ev = ev.group_by("t").agg(pl.col("da").sum(), pl.col("db").sum()).sort("t")
    ev = ev.with_columns(pl.col("da").cum_sum().alias("ca"), pl.col("db").cum_sum().alias("cb"))
    ev = ev.with_columns(pl.col("t").shift(-1).alias("t_next"))
    both = ev.filter((pl.col("ca") > 0) & (pl.col("cb") > 0) & pl.col("t_next").is_not_null())
    return union(both.select(pl.col("t").alias("start_ns"), pl.col("t_next").alias("end_ns")).collect())


def clip(intervals: pl.DataFrame, lo: int, hi: int) -> pl.DataFrame:
    """Intervals clipped to [lo, hi)."""
    return intervals.with_columns(
        pl.col("start_ns").clip(lo, hi), pl.col("end_ns").clip(lo, hi)
    ).filter(pl.col("end_ns") > pl.col("start_ns"))
