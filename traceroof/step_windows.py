"""The step windows of every device (:mod:`traceroof.timeline`'s rule 1, ``docs/accounting.md``):
where each (rank, device) starts and ends each step, before the windows are made monotone
and the timeline is cut into segments.

Split out of :mod:`traceroof.timeline` (session 9) when the two common cases got a path of
their own (:func:`_common_starts`) beside the per-rank rules (:func:`_rank_starts`).
"""

from __future__ import annotations

from typing import Any

import polars as pl

from .frames import done, small


def step_starts(placed: pl.DataFrame, gpu: pl.DataFrame, cpu: pl.DataFrame) -> pl.DataFrame:
    """Per (rank, device, step): ``s`` (where the device starts the step) and ``e`` (the end of
    its last attributed op or marker), ns, sorted by step.

    A device takes its own device-side markers (``gpu``: :func:`_device_markers`); a device
    without markers of its own, on a rank that has some, takes the rank's (per step, the
    earliest start and latest end over its devices) when one of its ops starts inside them,
    else it has no step window (its ops are outside the steps); on a rank without device-side markers a
    device takes the span of its ops attributed to each step by launch; a device with none
    takes the span of the rank's attributed ops per step when one of its ops starts inside
    it, else (no op attributed on the rank) the host windows ``cpu``."""
    devs = placed.select("rank", "device").unique()
    by_ops = done(small(placed).filter(pl.col("step").is_not_null()).group_by("rank", "device", "step")
                  .agg(pl.col("start_ns").min().alias("s"), (pl.col("start_ns") + pl.col("dur_ns")).max().alias("e")))
    parts, slow = _common_starts(devs, gpu, by_ops)
    if slow:  # (no query when every rank is a common case, as most are)
        for (rank,), d in devs.filter(pl.col("rank").is_in(slow)).group_by(["rank"]):
            parts += _rank_starts(rank, d, gpu, cpu, placed, by_ops)
    if not parts:
        return pl.DataFrame(schema={"rank": pl.Int32, "device": pl.Int32, "step": pl.Int32, "s": pl.Int64, "e": pl.Int64})
    cols = ["rank", "device", "step", "s", "e"]
    have = pl.concat([p.select(cols).cast({"rank": pl.Int32, "device": pl.Int32, "step": pl.Int32, "s": pl.Int64,
                                           "e": pl.Int64}) for p in parts])
    return _fill_missing_steps(have).sort("rank", "device", "step")


def _common_starts(devs: pl.DataFrame, gpu: pl.DataFrame, by_ops: pl.DataFrame) -> tuple[list[pl.DataFrame], list[Any]]:
    """The step windows of the ranks in one of the two common cases, for all of them at once
    (the same rows :func:`_rank_starts` gives them; one rank at a time was ~20 queries per
    rank: 0.08 s of CPU for 16 ranks): every device of the rank has device-side markers of
    its own (its windows: the markers, each ending at the later of the marker's end and the
    end of its last attributed op), or the rank has none and every device has ops attributed
    to steps (its windows: their spans). Returns (those windows, the other ranks), which
    :func:`_rank_starts` does one by one. A null device is in neither case.

    Which rank is in which case is decided on Python sets of the few ``(rank, device)`` pairs
    (session 10: a dozen joins of one-row tables before, ~2 ms on a small trace), with the
    joins' rule for nulls: a pair with a null never matches another.
    """
    def pairs(df: pl.DataFrame) -> set[tuple[Any, Any]]:
        return {(r, d) for r, d in zip(df["rank"].to_list(), df["device"].to_list()) if r is not None and d is not None}

    dev_pairs = list(zip(devs["rank"].to_list(), devs["device"].to_list()))
    marked, attributed = pairs(gpu), pairs(by_ops)
    ranks = {r for r, _ in dev_pairs}
    # ranks with a device lacking markers of its own / lacking attributed ops (a null never matches)
    bare = {r for r, d in dev_pairs if (r, d) not in marked and r is not None}
    idle = {r for r, d in dev_pairs if (r, d) not in attributed and r is not None}
    # (a marker of a null device still marks its rank)
    with_marks = {r for r in ranks if r is not None} & set(gpu["rank"].drop_nulls().to_list())
    fast_marks = with_marks - bare
    fast_ops = {r for r in ranks if r not in with_marks and r not in idle}  # a null rank stays in (an anti join)
    parts = []
    if fast_marks:
        w = (devs.filter(pl.col("rank").is_in(sorted(fast_marks)))
             .join(gpu.select("rank", "device", "step", pl.col("start_ns").alias("s"), pl.col("end_ns").alias("e")),
                   on=["rank", "device"])
             .join(by_ops.select("rank", "device", "step", pl.col("e").alias("_oe")),
                   on=["rank", "device", "step"], how="left"))
        parts.append(w.with_columns(pl.max_horizontal("e", "_oe").alias("e")).drop("_oe"))
    if fast_ops - {None}:
        parts.append(by_ops.filter(pl.col("rank").is_in(sorted(fast_ops - {None}))))
    slow = sorted(r for r in ranks if r is not None and r not in fast_marks and r not in fast_ops)
    return parts, slow


def _rank_starts(rank: Any, d: pl.DataFrame, gpu: pl.DataFrame, cpu: pl.DataFrame, placed: pl.DataFrame,
                 by_ops: pl.DataFrame) -> list[pl.DataFrame]:
    """The step windows (``rank``, ``device``, ``step``, ``s``, ``e``) of the devices ``d`` of
    one rank, by the rules of :func:`_step_starts`; ``by_ops``: per (rank, device, step) the
    span of the ops attributed to the step."""
    parts = []
    m = gpu.filter(pl.col("rank") == rank)
    own = m.filter(pl.col("device").is_in(d["device"].implode())).select(
        "device", "step", pl.col("start_ns").alias("s"), pl.col("end_ns").alias("e"))
    w = d.join(own, on="device")
    if m.height:  # devices without markers of their own that ran something inside the
        # rank's marker windows take the rank's: per step, the earliest start and the
        # latest end of its markers on any device (a device that ran nothing inside them
        # has its ops outside the steps: it was not part of them)
        marks = m.group_by("step").agg(pl.col("start_ns").min().alias("s"), pl.col("end_ns").max().alias("e"))
        bare = d.join(own.select("device").unique(), on="device", how="anti")
        bare = bare.join(_inside_any(placed.filter(pl.col("rank") == rank), marks), on="device", how="semi")
        w = pl.concat([w, bare.join(marks, how="cross").select(w.columns)], how="vertical_relaxed")
    if w.height:
        w = w.join(by_ops.select("rank", "device", "step", pl.col("e").alias("_oe")),
                   on=["rank", "device", "step"], how="left")
        parts.append(w.with_columns(pl.max_horizontal("e", "_oe").alias("e")).drop("_oe"))
    rest = d.join(w.select("device").unique(), on="device", how="anti")  # devices without markers
    o = by_ops.join(rest, on=["rank", "device"], how="semi")
    if o.height:
        parts.append(o)
    # a device with no op attributed to a step takes, per step, the span of the rank's
    # attributed ops on its other devices; on a rank with none, the host windows
    idle = rest.join(o.select("device").unique(), on="device", how="anti") if not m.height else rest.clear()
    if idle.height:
        r_ops = by_ops.filter(pl.col("rank") == rank)
        spans = (r_ops.group_by("step").agg(pl.col("s").min(), pl.col("e").max()) if r_ops.height else
                 cpu.filter(pl.col("rank") == rank).select("step", pl.col("start_ns").alias("s"),
                                                          pl.col("end_ns").alias("e")))
        if r_ops.height:  # only a device that ran something inside them took part
            idle = idle.join(_inside_any(placed.filter(pl.col("rank") == rank), spans), on="device", how="semi")
        if spans.height and idle.height:
            parts.append(idle.join(spans, how="cross"))
    return parts


def _fill_missing_steps(have: pl.DataFrame) -> pl.DataFrame:
    """``have`` plus, for each (rank, device), a window for every step of its rank between its
    first and last step that it has none for (it ran nothing in it): the rank's window of
    that step (earliest start, latest end over its devices). Without it the device's previous
    step would run on through the step it sat idle in."""
    stepped = have.filter(pl.col("step").is_not_null())
    if stepped.height == 0:
        return have
    st = small(stepped)  # (one lazy plan on a small table, :mod:`traceroof.frames`)
    rank_steps = st.group_by("rank", "step").agg(pl.col("s").min(), pl.col("e").max())
    rng = st.group_by("rank", "device").agg(pl.col("step").min().alias("_lo"), pl.col("step").max().alias("_hi"))
    missing = done(rng.join(rank_steps, on="rank")
                   .filter(pl.col("step").is_between(pl.col("_lo"), pl.col("_hi")))
                   .join(st.select("rank", "device", "step"), on=["rank", "device", "step"], how="anti")
                   .select(have.columns))
    return pl.concat([have, missing.cast(have.schema)]) if missing.height else have


def _inside_any(ops: pl.DataFrame, marks: pl.DataFrame) -> pl.DataFrame:
    """The devices (column ``device``) of ``ops`` with an op starting inside a window of
    ``marks`` (``s``, ``e`` ns, end exclusive)."""
    o = ops.select("device", "start_ns").sort("start_ns")
    w = marks.select(pl.col("s").alias("start_ns"), "e").sort("start_ns")
    hit = o.join_asof(w, on="start_ns", strategy="backward").filter(pl.col("start_ns") < pl.col("e"))
    return hit.select("device").unique()


__all__ = ["step_starts"]
