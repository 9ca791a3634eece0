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

import contextlib
import os
from collections.abc import Iterator

import polars as pl

#: A trace of at most this many rows (device ops + host events) is analysed on polars'
#: in-memory engine (:func:`engine_for`), a larger one on polars' default. Measured in
#: session 10 (docs/performance.md, "Small traces: analyze's queries"): a lazy query on the
#: default engine costs ~0.1–0.2 ms more to start, so on the real fixtures (676–45,000 rows)
#: ``analyze`` took 5–20 % less CPU in-memory; the 137 MB trace (180,000 rows) the same on
#: both; the 1 GB trace (1.4 M rows) more in-memory (session 9: 1.6 → 2.3 s). Results are
#: the same on both.
IN_MEMORY_MAX_ROWS = 200_000
#: a table of at most this many rows runs its chains as one lazy plan (:func:`small`)
SMALL_ROWS = IN_MEMORY_MAX_ROWS


def _engine_chosen() -> bool:
    """Whether the process chose polars' engine itself: ``POLARS_ENGINE_AFFINITY`` set to
    other than ``auto`` (``pl.Config.set_engine_affinity("streaming")`` sets it), or an engine
    object set with ``pl.Config.set_engine_affinity(pl.GPUEngine(...))``."""
    if os.environ.get("POLARS_ENGINE_AFFINITY", "auto") not in ("", "auto"):
        return True
    try:  # polars keeps an engine object outside the environment (read only, guarded)
        from polars.lazyframe.engine_config import get_engine_affinity_override
    except ImportError:  # another polars: only the environment variable is known
        return False
    return get_engine_affinity_override() is not None


@contextlib.contextmanager
def engine_for(rows: int) -> Iterator[None]:
    """The polars engine for the analysis of a trace of ``rows`` rows: in-memory for at most
    :data:`IN_MEMORY_MAX_ROWS` (``pl.Config.set_engine_affinity("in-memory")``, and on exit,
    an exception included, the variable put back as it was), unless the process chose an
    engine itself (:func:`_engine_chosen`); else nothing changed. Only the engine affinity is
    touched (no other polars setting is saved or restored). It is polars' process-wide
    setting: another thread's queries during the analysis run in-memory too (the results are
    the same, only the speed differs)."""
    if rows > IN_MEMORY_MAX_ROWS or _engine_chosen():
        yield
        return
    before = os.environ.get("POLARS_ENGINE_AFFINITY")
    pl.Config.set_engine_affinity("in-memory")
    try:
        yield
    finally:
        pl.Config.set_engine_affinity(before or None)  # type: ignore[arg-type]


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
    """The table of a chain begun with :func:`small`: collected if it is lazy (on the in-memory
    engine, or on the one the process chose: :func:`_engine_chosen`), as it is otherwise."""
    if not isinstance(frame, pl.LazyFrame):
        return frame
    return frame.collect() if _engine_chosen() else frame.collect(engine="in-memory")


__all__ = ["IN_MEMORY_MAX_ROWS", "SMALL_ROWS", "engine_for", "small", "smalls", "done"]
