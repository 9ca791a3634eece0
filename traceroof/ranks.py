"""The cross-rank view: one timeline for all ranks, per-rank summaries, stragglers.

A multi-rank trace (``read_trace(dir_of_per_rank_files)``) keeps every rank's times relative to
its *own* first event; the absolute origin of rank r is ``meta.stats['origin_ns[r]']`` on that
rank's host clock. This module puts the ranks on one timeline and compares them. Small pure
functions over polars tables; :func:`analyze_ranks` strings them together for the report.
See ``docs/ranks.md`` for the method, its assumptions and an example.

The ranks are put on one clock by :mod:`traceroof.rank_clock` (timeline, matching rule,
clock offsets); this module measures the waits and builds the section.

**Waits.** On the clock used, for a matched instance with arrivals (kernel starts) ``s_r``:
``wait_r = max_q s_q − s_r``; the *straggler* of the instance is the rank that arrived last
(lowest rank on ties; none when all arrived together); the wait it causes is ``Σ_r wait_r``.
"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple

import polars as pl

from . import steps as steps_mod
from .rank_clock import (
    MAX_MAD_NS,
    MIN_MATCHED,
    absolute,
    apply_offsets,
    decide_alignment,
    duration_text,
    estimate_offsets,
    match_collectives,
    origins,
)

logger = logging.getLogger(__name__)

#: A matched instance whose ends disagree by more than this (ns, on the clock used) is not
#: compared: either its kernels are not one collective (p2p between non-peers, a different
#: order) or the clocks are not comparable. Same bound as :data:`MAX_MAD_NS`.
END_TOLERANCE_NS = MAX_MAD_NS
#: Collective instances listed in the report, most wait first.
TOP_COLLECTIVES = 10


# --------------------------------------------------------------------------- waits


def consistent(instances: pl.DataFrame, tolerance_ns: int = END_TOLERANCE_NS) -> pl.DataFrame:
    """The instances whose ends agree: ``max_r abs_end_ns − min_r abs_end_ns ≤ tolerance_ns``
    on the instances' clock (the check that a matched instance is one collective and that the
    clock makes the ranks comparable). Adds ``end_spread_ns``."""
    if instances.height == 0:
        return instances.with_columns(pl.lit(None, dtype=pl.Int64).alias("end_spread_ns"))
    es = (pl.col("abs_end_ns").max() - pl.col("abs_end_ns").min()).over("instance")
    return instances.with_columns(es.alias("end_spread_ns")).filter(pl.col("end_spread_ns") <= tolerance_ns)


def collective_waits(instances: pl.DataFrame) -> pl.DataFrame:
    """Per (instance, rank) wait at matched collectives, on the instances' (aligned) clock.

    ``wait_ns = max_q abs_start_ns[q] − abs_start_ns[r]`` (a collective kernel starts when its
    rank arrives and spins until the last rank has arrived). ``last_rank`` is the rank that
    arrived last (lowest on ties; null when all arrived at once, spread 0).

    Returns:
        :data:`~traceroof.rank_clock.INSTANCE_SCHEMA` columns plus ``wait_ns`` (Int64), ``last_rank`` (Int32),
        ``arrival_spread_ns`` (Int64: last − first arrival).
    """
    if instances.height == 0:
        return instances.with_columns(
            pl.lit(None, dtype=pl.Int64).alias("wait_ns"), pl.lit(None, dtype=pl.Int32).alias("last_rank"),
            pl.lit(None, dtype=pl.Int64).alias("arrival_spread_ns"),
        )
    last = pl.col("abs_start_ns").max().over("instance")
    spread = last - pl.col("abs_start_ns").min().over("instance")
    lr = (
        pl.when(pl.col("abs_start_ns") == last).then(pl.col("rank")).otherwise(None).min().over("instance")
    )
    return instances.with_columns(
        (last - pl.col("abs_start_ns")).alias("wait_ns"),
        pl.when(spread > 0).then(lr).otherwise(None).cast(pl.Int32).alias("last_rank"),
        spread.alias("arrival_spread_ns"),
    )


def instance_summary(waits: pl.DataFrame) -> pl.DataFrame:
    """One row per matched instance: ``instance, step, stream, name, group_size, ranks,
    last_rank, arrival_spread_ns, total_wait_ns`` (Σ over ranks of ``wait_ns``), most wait first."""
    if waits.height == 0:
        return pl.DataFrame(schema={"instance": pl.Int64, "step": pl.Int32, "stream": pl.Int64, "name": pl.String,
                                    "group_size": pl.Int32, "ranks": pl.Int64, "last_rank": pl.Int32,
                                    "arrival_spread_ns": pl.Int64, "total_wait_ns": pl.Int64})
    return (
        waits.group_by("instance")
        .agg(
            pl.col("step").first(), pl.col("stream").first(), pl.col("name").first(), pl.col("group_size").first(),
            pl.len().cast(pl.Int64).alias("ranks"), pl.col("last_rank").first(),
            pl.col("arrival_spread_ns").first(), pl.col("wait_ns").sum().cast(pl.Int64).alias("total_wait_ns"),
        )
        .sort(["total_wait_ns", "instance"], descending=[True, False])
    )


def wait_by_rank(waits: pl.DataFrame, ranks: list[int]) -> pl.DataFrame:
    """Per rank: ``wait_ns`` (time it waited at matched collectives), ``last_arrivals`` (instances
    it arrived last at), ``wait_caused_ns`` (Σ of every rank's wait at those instances).

    Ranks without matched instances get nulls (unknown), never 0."""
    schema = {"rank": pl.Int32, "wait_ns": pl.Int64, "last_arrivals": pl.Int64, "wait_caused_ns": pl.Int64}
    base = pl.DataFrame({"rank": [int(r) for r in ranks]}, schema={"rank": pl.Int32})
    if waits.height == 0:
        return base.with_columns(*[pl.lit(None, dtype=t).alias(c) for c, t in schema.items() if c != "rank"])
    suffered = waits.group_by("rank").agg(pl.col("wait_ns").sum().cast(pl.Int64))
    inst = instance_summary(waits).filter(pl.col("last_rank").is_not_null())
    caused = inst.group_by(pl.col("last_rank").alias("rank")).agg(
        pl.len().cast(pl.Int64).alias("last_arrivals"), pl.col("total_wait_ns").sum().cast(pl.Int64).alias("wait_caused_ns")
    )
    out = base.join(suffered, on="rank", how="left").join(caused, on="rank", how="left")
    return out.with_columns(
        pl.when(pl.col("wait_ns").is_not_null()).then(pl.col("last_arrivals").fill_null(0)).alias("last_arrivals"),
        pl.when(pl.col("wait_ns").is_not_null()).then(pl.col("wait_caused_ns").fill_null(0)).alias("wait_caused_ns"),
    ).select(list(schema))


# --------------------------------------------------------------------------- summaries


def per_rank_summary(steps: pl.DataFrame) -> pl.DataFrame:
    """One row per rank from the step table (:func:`traceroof.steps.step_table`, one row per
    (rank, step)), averages over complete steps (:func:`traceroof.steps.summarize`).

    Columns: ``rank``, ``steps``, ``complete_steps``, ``step_time_ns`` (mean wall), ``busy_ns``,
    ``busy_fraction``, ``compute_ns`` (union of the non-collective device ops: compute-bound +
    memory/latency-bound), ``comm_ns``, ``comm_exposed_ns`` (all ns per step), ``flops_per_step``
    and ``hfu`` (mean of the per-step ``hfu`` column when the table has one; null = unknown).
    """
    rows = []
    # one split of the table (its rows in order), not a filter of it per rank
    of_rank = ({int(k[0]): v for k, v in steps.partition_by("rank", as_dict=True, maintain_order=True).items()}
               if steps.height else {})
    for r in sorted(of_rank):
        st = of_rank[r]
        done = steps_mod.complete(st)  # (one filter for the summary and the HFU)
        s = steps_mod.summarize_complete(st, done)
        full = done if done.height else st
        hfu = None
        if "hfu" in st.columns and full["hfu"].is_not_null().any():
            hfu = float(full["hfu"].mean())
        cb, mb = s.get("compute_bound_ns"), s.get("memory_bound_ns")
        rows.append({
            "rank": r,
            "steps": int(s.get("steps", 0)),
            "complete_steps": s.get("complete_steps"),
            "step_time_ns": s.get("step_time_ns"),
            "busy_ns": s.get("busy_ns"),
            "busy_fraction": s.get("busy_fraction"),
            "compute_ns": (cb + mb + (s.get("unknown_bound_ns") or 0.0)) if cb is not None and mb is not None else None,
            "comm_ns": s.get("comm_ns"),
            "comm_exposed_ns": s.get("comm_exposed_ns"),
            "flops_per_step": s.get("flops_per_step"),
            "hfu": hfu,
        })
    schema = {"rank": pl.Int32, "steps": pl.Int64, "complete_steps": pl.Int64, "step_time_ns": pl.Float64,
              "busy_ns": pl.Float64, "busy_fraction": pl.Float64, "compute_ns": pl.Float64, "comm_ns": pl.Float64,
              "comm_exposed_ns": pl.Float64, "flops_per_step": pl.Float64, "hfu": pl.Float64}
    return pl.DataFrame(rows, schema=schema)


def step_spread(steps: pl.DataFrame, waits: pl.DataFrame | None = None) -> pl.DataFrame:
    """Per step, the spread of step time across ranks (complete steps only).

    Columns: ``step``, ``ranks``, ``step_time_min_ns`` / ``_median_ns`` / ``_max_ns`` (of
    ``wall_ns``), ``max_over_median`` (max ÷ median), ``slowest_rank`` (largest ``wall_ns``,
    lowest rank on ties), and from ``waits`` (:func:`collective_waits`) ``last_rank`` (the rank
    that caused the most collective wait in the step) and its ``wait_caused_ns``; null when the
    step has no matched collective with a late arrival.
    """
    full = steps.filter(~pl.col("partial"))
    sp = (
        full.sort("rank")
        .group_by("step")
        .agg(
            pl.len().cast(pl.Int64).alias("ranks"),
            pl.col("wall_ns").min().alias("step_time_min_ns"),
            pl.col("wall_ns").median().alias("step_time_median_ns"),
            pl.col("wall_ns").max().alias("step_time_max_ns"),
            pl.col("rank").sort_by("wall_ns", descending=True, maintain_order=True).first().alias("slowest_rank"),
        )
        .with_columns(
            pl.when(pl.col("step_time_median_ns") > 0)
            .then(pl.col("step_time_max_ns") / pl.col("step_time_median_ns"))
            .alias("max_over_median")
        )
        .sort("step")
    )
    if waits is not None and waits.height:
        inst = instance_summary(waits).filter(pl.col("last_rank").is_not_null())
        by = (
            inst.group_by("step", "last_rank").agg(pl.col("total_wait_ns").sum().alias("wait_caused_ns"))
            .sort(["step", "wait_caused_ns", "last_rank"], descending=[False, True, False])
            .group_by("step", maintain_order=True).first()
        )
        sp = sp.join(by, on="step", how="left", nulls_equal=True)
    else:
        sp = sp.with_columns(pl.lit(None, dtype=pl.Int32).alias("last_rank"), pl.lit(None, dtype=pl.Int64).alias("wait_caused_ns"))
    return sp.select(
        "step", "ranks", "step_time_min_ns", "step_time_median_ns", "step_time_max_ns", "max_over_median",
        "slowest_rank", pl.col("last_rank").cast(pl.Int32), pl.col("wait_caused_ns").cast(pl.Int64),
    )


def slowest_rank(spread: pl.DataFrame, steps: pl.DataFrame) -> dict[str, Any] | None:
    """The rank slowest most often by step time (ties: the larger total excess over each step's
    median, then the lower rank); None with fewer than 2 ranks per step.

    Returns ``rank``, ``slowest_steps`` (how often), ``steps`` (compared), ``excess_ns`` (Σ over
    steps of its ``wall_ns − median``)."""
    sp = spread.filter(pl.col("ranks") >= 2)
    if sp.height == 0:
        return None
    full = steps.filter(~pl.col("partial")).join(sp.select("step", "step_time_median_ns"), on="step", how="inner", nulls_equal=True)
    excess = full.group_by("rank").agg((pl.col("wall_ns") - pl.col("step_time_median_ns")).sum().alias("excess_ns"))
    often = sp.group_by(pl.col("slowest_rank").alias("rank")).agg(pl.len().alias("n"))
    t = excess.join(often, on="rank", how="left").with_columns(pl.col("n").fill_null(0)).sort(
        ["n", "excess_ns", "rank"], descending=[True, True, False]
    )
    r, ex, n = int(t["rank"][0]), float(t["excess_ns"][0]), int(t["n"][0])
    return {"rank": r, "slowest_steps": n, "steps": sp.height, "excess_ns": ex}


# --------------------------------------------------------------------------- the section


class Comparison(NamedTuple):
    """The collectives of several ranks put side by side (:func:`compare_collectives`).

    Attributes:
        origins: per rank, the absolute ns of its ``start_ns == 0`` (None when unknown).
        offsets: :func:`estimate_offsets` (``offset_ns``, ``mad_ns`` per rank).
        alignment: :func:`decide_alignment`.
        instances: :func:`match_collectives`, on the aligned clock when the alignment applies.
        compared: the instances whose ends agree (:func:`consistent`), with ``end_spread_ns``.
        waits: :func:`collective_waits` of the compared instances.
    """

    origins: dict[int, int | None]
    offsets: pl.DataFrame
    alignment: dict[str, Any]
    instances: pl.DataFrame
    compared: pl.DataFrame
    waits: pl.DataFrame


def compare_collectives(ops: pl.DataFrame, stats: dict[str, Any]) -> Comparison | None:
    """Match the collectives of every rank, align the clocks on them when that is sound, and
    measure the waits: the work :func:`analyze_ranks` and :func:`wait_intervals` share, done
    once. None for fewer than 2 ranks.

    Args:
        ops: op table (per-rank relative ``start_ns``), all ranks.
        stats: ``meta.stats`` (holds ``origin_ns[r]``).
    """
    ranks = sorted(int(r) for r in ops["rank"].unique().to_list()) if ops.height else []
    if len(ranks) < 2:
        return None
    org = origins(stats, ranks)
    abs_ops, base = absolute(ops, org)
    inst = match_collectives(abs_ops)
    offs = estimate_offsets(inst)
    al = decide_alignment(offs, ranks, base)
    if al["applied"]:
        inst = apply_offsets(inst, {int(r): int(o) for r, o in offs.select("rank", "offset_ns").iter_rows() if o is not None})
    ok = consistent(inst) if al["method"] != "none" else consistent(inst.clear())
    return Comparison(org, offs, al, inst, ok, collective_waits(ok.drop("end_spread_ns")))


def wait_intervals(comparison: Comparison | None) -> pl.DataFrame:
    """Where each rank waited at the compared collectives, on its own clock.

    Columns ``rank``, ``device``, ``start_ns``, ``end_ns`` (rank-relative ns, as the op table:
    ``[kernel start, kernel start + wait_ns)``), ``last_rank`` (who was waited for). Only
    instances with a wait (``wait_ns > 0``) on the ranks that did not arrive last; empty
    without a comparison (fewer than 2 ranks).
    """
    schema = {"rank": pl.Int32, "device": pl.Int32, "start_ns": pl.Int64, "end_ns": pl.Int64, "last_rank": pl.Int32}
    if comparison is None or comparison.waits.height == 0:
        return pl.DataFrame(schema=schema)
    waits = comparison.waits
    return waits.filter(pl.col("wait_ns") > 0, pl.col("last_rank").is_not_null(), pl.col("rank") != pl.col("last_rank")).select(
        "rank", "device", "start_ns", (pl.col("start_ns") + pl.col("wait_ns")).alias("end_ns"), "last_rank"
    ).cast(schema)  # type: ignore[arg-type]


def analyze_ranks(ops: pl.DataFrame, steps: pl.DataFrame, stats: dict[str, Any],
                  comparison: Comparison | None = None,
                  labels: dict[int, str] | None = None) -> dict[str, Any] | None:
    """The report's ``ranks`` section; None when the op table has fewer than 2 ranks.

    Args:
        ops: op table (per-rank relative ``start_ns``), all ranks.
        steps: step table, one row per (rank, step) (optionally with ``hfu``).
        stats: ``meta.stats`` (holds ``origin_ns[r]``).
        comparison: :func:`compare_collectives` of ``ops``, when the caller has it already.
        labels: rank → the label the trace gives it (``TraceMeta.rank_labels``, e.g.
            ``"TP01-PP00"``); when any, each ``per_rank`` record gets ``label`` (null for a
            rank without one).

    Returns:
        A JSON-ready dict: ``ranks``, ``alignment`` (:func:`decide_alignment` plus ``clock``),
        ``per_rank`` (records: :func:`per_rank_summary` + offsets + waits), ``per_step``
        (:func:`step_spread`), ``slowest_rank`` (:func:`slowest_rank`), ``collectives``
        (``matched``, ``total_wait_ns``, ``top``: the instances with most wait),
        ``straggler`` (the rank causing the most wait: ``rank``, ``last_arrivals``, ``instances``,
        ``wait_caused_ns``, ``waiting_ranks``, ``mean_wait_per_rank_ns``, ``steps``,
        ``wait_caused_per_step_ns``, ``critical_path_ns``, ``sufficient`` (≥ MIN_MATCHED compared
        instances); None when no wait or no comparable clock).
    """
    ranks = sorted(int(r) for r in ops["rank"].unique().to_list()) if ops.height else []
    if len(ranks) < 2:
        return None
    cmp = comparison if comparison is not None else compare_collectives(ops, stats)
    assert cmp is not None  # ≥ 2 ranks
    org, offs, al, inst, ok, waits = cmp
    clock = al["method"]
    matched = int(inst["instance"].n_unique()) if inst.height else 0
    compared = int(ok["instance"].n_unique()) if ok.height else 0
    per_rank = per_rank_summary(steps)
    per_rank = (
        per_rank.join(pl.DataFrame({"rank": ranks, "origin_ns": [org[r] for r in ranks]},
                                   schema={"rank": pl.Int32, "origin_ns": pl.Int64}), on="rank", how="left")
        .join(offs, on="rank", how="left")
        .join(wait_by_rank(waits, ranks), on="rank", how="left")
    )
    if labels:
        per_rank = per_rank.with_columns(
            pl.col("rank").replace_strict(labels, default=None, return_dtype=pl.String).alias("label"))
    spread = step_spread(steps, waits)
    inst_sum = instance_summary(waits)
    n_steps = max(int(steps["step"].n_unique()), 1) if steps.height else 1
    return {
        "ranks": ranks,
        "alignment": {**al, "clock": clock},
        "per_rank": per_rank.to_dicts(),
        "per_step": spread.to_dicts(),
        "slowest_rank": slowest_rank(spread, steps),
        "straggler": _straggler(waits, ranks, int(inst_sum.height), n_steps, compared),
        "collectives": {
            "matched": matched,
            "compared": compared,
            "end_tolerance_ns": END_TOLERANCE_NS,
            "note": _collectives_note(clock, matched, compared),
            "total_wait_ns": int(waits["wait_ns"].sum()) if compared else None,
            "top": inst_sum.head(TOP_COLLECTIVES).to_dicts(),
        },
    }


def _collectives_note(clock: str, matched: int, compared: int) -> str:
    """The ``collectives.note`` line: which instances were compared on which clock."""
    if clock == "none":
        return "no comparable clock: per-rank origins unknown and no collective alignment"
    if matched == 0:
        return "no collective instance is matched on every rank"
    if compared < matched:
        return (f"{matched - compared} of {matched} matched instances end more than {duration_text(END_TOLERANCE_NS)} "
                f"apart on the {clock} clock and are not compared")
    return f"all {matched} matched instances end within {duration_text(END_TOLERANCE_NS)} on the {clock} clock"


def _straggler(waits: pl.DataFrame, ranks: list[int], instances: int, n_steps: int,
               compared: int) -> dict[str, Any] | None:
    """The section's ``straggler``: the rank causing the most wait (:func:`analyze_ranks`
    lists the keys; times in ns), None when nobody waited. ``instances``: the instances with
    waits; ``compared``: the instances whose ends agree."""
    wr = wait_by_rank(waits, ranks).filter(pl.col("wait_caused_ns") > 0).sort(
        ["wait_caused_ns", "rank"], descending=[True, False]
    )
    if wr.height == 0:
        return None
    r = int(wr["rank"][0])
    caused = int(wr["wait_caused_ns"][0])
    return {
        "rank": r,
        "last_arrivals": int(wr["last_arrivals"][0]),
        "instances": instances,
        "wait_caused_ns": caused,
        "waiting_ranks": len(ranks) - 1,
        "mean_wait_per_rank_ns": caused / (len(ranks) - 1),
        "steps": n_steps,
        "wait_caused_per_step_ns": caused / n_steps,
        "critical_path_ns": _critical_path(waits, r),
        # enough compared instances to call it a straggler (the finding's bar too)
        "sufficient": compared >= MIN_MATCHED,
    }


def _critical_path(waits: pl.DataFrame, rank: int) -> int:
    """Σ over the instances where ``rank`` arrived last of (its arrival − the second-last
    arrival): how much earlier those collectives could have started had it arrived with the
    next-latest rank (a lower bound on the job-level gain), ns."""
    w = waits.filter(pl.col("last_rank") == rank)
    if w.height == 0:
        return 0
    g = w.group_by("instance").agg(
        pl.col("wait_ns").filter(pl.col("rank") != rank).min().alias("gap")
    )
    return int(g["gap"].fill_null(0).sum())


__all__ = [
    "END_TOLERANCE_NS", "Comparison", "consistent", "collective_waits", "instance_summary", "wait_by_rank",
    "per_rank_summary", "step_spread", "slowest_rank", "compare_collectives", "wait_intervals", "analyze_ranks",
]
