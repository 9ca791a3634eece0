"""Interval arithmetic on [start_ns, end_ns) sets, as polars operations.

Every busy/idle/exposed figure in traceroof is a union or a difference of unions, never a
sum of per-stream durations (BC-33: per-stream sums double count concurrent streams).
"""

from __future__ import annotations

import polars as pl


def union(df: pl.DataFrame, start: str = "start_ns", end: str = "end_ns", by: list[str] | None = None) -> pl.DataFrame:
    """Merge overlapping intervals.

    Args:
        df: rows with ``start`` and ``end`` (ns, end exclusive), optionally grouped by ``by``.

    Returns:
        Disjoint, sorted intervals: columns ``by + [start_ns, end_ns]``.
    """
    by = by or []
    if df.height == 0:
        return pl.DataFrame(schema={**{b: df.schema[b] for b in by}, "start_ns": pl.Int64, "end_ns": pl.Int64})
    # one lazy query, collected once (the steps and findings call this hundreds of times)
    d = df.lazy().select(*by, pl.col(start).alias("start_ns"), pl.col(end).alias("end_ns")).sort([*by, "start_ns"])
    if not by:
        seg = pl.col("start_ns") > pl.col("end_ns").cum_max().shift(1).fill_null(-(2**62))
        d = d.with_columns(seg.cum_sum().alias("_seg"))
        return d.group_by("_seg", maintain_order=True).agg(
            pl.col("start_ns").min(), pl.col("end_ns").max()
        ).drop("_seg").collect()
    lo, hi = df.select(pl.col(start).min(), pl.col(end).max()).row(0)
    span = int(hi - lo) + 1 if lo is not None and hi is not None else 1
    if span * (df.height + 1) < 2**62:
        # Groups are contiguous after the sort. Shifting group g by g * span puts every
        # group's times above the previous group's, so one running maximum (no per-group
        # window) tells where each group's merged segments start; exact integer arithmetic.
        new_group = pl.any_horizontal([pl.col(b).ne_missing(pl.col(b).shift(1)) for b in by]).fill_null(True)
        off = new_group.cum_sum().cast(pl.Int64) * span - lo
        d = d.with_columns((pl.col("start_ns") + off).alias("_s"), (pl.col("end_ns") + off).alias("_e"))
        seg = pl.col("_s") > pl.col("_e").cum_max().shift(1).fill_null(-(2**62))
        d = d.with_columns(seg.cum_sum().alias("_seg"))
    else:  # spans too large for the offset trick: a per-group running maximum
        prev_end = pl.col("end_ns").cum_max().shift(1).over(by)
        d = d.with_columns((pl.col("start_ns") > prev_end.fill_null(-(2**62))).cum_sum().over(by).alias("_seg"))
    return (
        d.group_by([*by, "_seg"], maintain_order=True)
        .agg(pl.col("start_ns").min(), pl.col("end_ns").max())
        .drop("_seg")
        .sort([*by, "start_ns"])
        .collect()
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
