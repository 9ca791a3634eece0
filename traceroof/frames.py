"""Small tables as one query: a chain of frame operations run as one lazy plan on a small
table, as eager operations on a large one (issue 19, small traces; session 10).

An eager ``DataFrame`` operation (``filter``, ``select``, ``with_columns``, ``sort``, ``join``,
``group_by``) is a lazy query of its own: on a table of a few thousand rows each costs
~0.05–0.2 ms whatever its work, so a chain of five costs five starts. Collected once on
polars' in-memory engine, the same chain costs about one. On a large table the eager steps
are kept, as they were measured (session 9: a lazy plan on the default engine, or one whose
optimiser fuses every predicate, was slower there on several chains). The operations and
expressions are the same either way, so the result is the same table.

    out = done(small(df).filter(...).with_columns(...).sort(...))
"""

from __future__ import annotations

import polars as pl

#: a table of at most this many rows runs its chains as one lazy plan (the same bound as
#: :data:`traceroof.analysis.IN_MEMORY_MAX_ROWS`, below which the analysis runs polars'
#: in-memory engine)
SMALL_ROWS = 200_000


def small(df: pl.DataFrame) -> pl.DataFrame | pl.LazyFrame:
    """``df.lazy()`` when ``df`` has at most :data:`SMALL_ROWS` rows, else ``df`` itself: the
    start of a chain that :func:`done` ends."""
    return df.lazy() if df.height <= SMALL_ROWS else df


def smalls(*dfs: pl.DataFrame) -> tuple[pl.DataFrame | pl.LazyFrame, ...]:
    """:func:`small` of tables that meet in one chain (a join): all lazy when each has at most
    :data:`SMALL_ROWS` rows, else all as they are (a lazy and an eager frame do not join)."""
    if all(df.height <= SMALL_ROWS for df in dfs):
        return tuple(df.lazy() for df in dfs)
    return dfs


def done(frame: pl.DataFrame | pl.LazyFrame) -> pl.DataFrame:
    """The table of a chain begun with :func:`small`: collected (on the in-memory engine) if
    it is lazy, as it is otherwise."""
    return frame.collect(engine="in-memory") if isinstance(frame, pl.LazyFrame) else frame


__all__ = ["SMALL_ROWS", "small", "smalls", "done"]
