"""The cross-rank view: one timeline for all ranks, per-rank summaries, stragglers.

A multi-rank trace (``read_trace(dir_of_per_rank_files)``) keeps every rank's times relative to
its *own* first event; the absolute origin of rank r is ``meta.stats['origin_ns[r]']`` on that
rank's host clock. This module puts the ranks on one timeline and compares them. Small pure
functions over polars tables; :func:`analyze_ranks` strings them together for the report.
See ``docs/ranks.md`` for the method, its assumptions and an example.

**Timeline.** ``abs_start_ns = origin_ns[rank] + start_ns`` (method ``origins``: the hosts'
clocks, which may disagree by µs–ms across hosts). When a rank's origin is unknown, every rank
stays on its own relative clock (method ``none``) and cross-rank comparisons of instants are
not made unless the collectives give an alignment.

**Matching rule.** A collective kernel (``kind == collective``) belongs to the bucket
``(step, stream, name, group_size)``; within a bucket its sequence number ``k`` is its order by
start on its rank. Instance ``(bucket, k)`` is *matched* when every rank of the trace has the
bucket the same number of times (NCCL requires the ranks of a communicator to issue its
collectives in the same order; the stream stands for the communicator; the step keeps a
missing instance from shifting the pairing of every later one). Collectives whose known
``group_size`` is smaller than the number of ranks in the trace involve only a subset of them,
which the trace cannot name: they are not matched.

**Clock offsets.** A collective completes only when every participant has arrived, so matched
instances *end* at nearly the same true time on all ranks. With the reference rank ``ref`` the
lowest rank: ``offset_ns[r] = median_k(end_r,k − end_ref,k)`` (on the origins timeline,
rounded to the ns), ``mad_ns[r] = median_k |end_r,k − end_ref,k − offset|`` (the alignment
uncertainty). The offsets are applied (``aligned = abs − offset``) only when at least
:data:`MIN_MATCHED` instances are matched, every ``mad_ns`` is at most :data:`MAX_MAD_NS`, and
some offset exceeds :data:`SIGNIFICANCE` × its MAD; otherwise the reason is reported and the
origins timeline is kept. Never applied silently: the section always says which clock was used.

**Waits.** On the clock used, for a matched instance with arrivals (kernel starts) ``s_r``:
``wait_r = max_q s_q − s_r``; the *straggler* of the instance is the rank that arrived last
(lowest rank on ties; none when all arrived together); the wait it causes is ``Σ_r wait_r``.
"""

from __future__ import annotations

import logging
import re
from typing import Any, NamedTuple

import polars as pl

from . import steps as steps_mod

logger = logging.getLogger(__name__)

#: Fewest matched collective instances an alignment is estimated from.
MIN_MATCHED = 3
#: Largest residual spread (MAD, ns) of a rank's end differences for an alignment to be applied.
#: Completion skew of one collective between ranks is a few µs (NCCL's last-packet latency);
#: a larger spread means the matched kernels do not end together (wrong pairing, p2p between
#: non-peers, sub-group collectives).
MAX_MAD_NS = 20_000
#: An offset is worth applying when it exceeds this multiple of its MAD.
SIGNIFICANCE = 3.0
#: A matched instance whose ends disagree by more than this (ns, on the clock used) is not
#: compared: either its kernels are not one collective (p2p between non-peers, a different
#: order) or the clocks are not comparable. Same bound as :data:`MAX_MAD_NS`.
END_TOLERANCE_NS = MAX_MAD_NS
#: Collective instances listed in the report, most wait first.
TOP_COLLECTIVES = 10

_ORIGIN_KEY = re.compile(r"^origin_ns\[(-?\d+)\]$")

#: Columns of :func:`match_collectives`.
INSTANCE_SCHEMA = {
    "instance": pl.Int64,
    "rank": pl.Int32,
    "step": pl.Int32,
    "stream": pl.Int64,
    "name": pl.String,
    "group_size": pl.Int32,
    "abs_start_ns": pl.Int64,
    "abs_end_ns": pl.Int64,
    "device": pl.Int32,  # the collective kernel's device, and its start on its rank's own clock:
    "start_ns": pl.Int64,  # where the wait lies in the op table (rank-relative ns)
}


# --------------------------------------------------------------------------- timeline


def origins(stats: dict[str, Any], ranks: list[int]) -> dict[int, int | None]:
    """Per-rank absolute origin (ns, that rank's host clock) from ``meta.stats['origin_ns[r]']``
    (written by :func:`traceroof.io.merge`); None for a rank that has none."""
    have: dict[int, int] = {}
    for k, v in stats.items():
        m = _ORIGIN_KEY.match(str(k))
        if m and isinstance(v, int):
            have[int(m.group(1))] = int(v)
    return {int(r): have.get(int(r)) for r in ranks}


def absolute(ops: pl.DataFrame, origin_ns: dict[int, int | None]) -> tuple[pl.DataFrame, str]:
    """Add ``abs_start_ns`` / ``abs_end_ns`` (int64 ns) to an op table: ``origin_ns[rank] +
    start_ns`` when every rank's origin is known (method ``origins``), else ``start_ns``
    itself, each rank on its own relative clock (method ``none``).

    Returns:
        (ops with the two columns, method).
    """
    known = bool(origin_ns) and all(v is not None for v in origin_ns.values())
    if known:
        base = pl.col("rank").replace_strict(
            {int(r): int(v) for r, v in origin_ns.items()}, default=None, return_dtype=pl.Int64
        )
        method = "origins"
    else:
        base = pl.lit(0, dtype=pl.Int64)
        method = "none"
    s = (base + pl.col("start_ns")).cast(pl.Int64)
    return ops.with_columns(s.alias("abs_start_ns"), (s + pl.col("dur_ns")).alias("abs_end_ns")), method


def apply_offsets(df: pl.DataFrame, offset_ns: dict[int, int], cols: tuple[str, ...] = ("abs_start_ns", "abs_end_ns")) -> pl.DataFrame:
    """Subtract each rank's clock offset (ns) from ``cols``: ``aligned = abs − offset_ns[rank]``
    (a rank without an offset is left as is)."""
    off = pl.col("rank").replace_strict({int(r): int(v) for r, v in offset_ns.items()}, default=0, return_dtype=pl.Int64)
    return df.with_columns(*[(pl.col(c) - off).alias(c) for c in cols])


# --------------------------------------------------------------------------- matching


def match_collectives(ops: pl.DataFrame) -> pl.DataFrame:
    """The matched collective instances (see the module docstring for the rule).

    Args:
        ops: op table with ``abs_start_ns`` / ``abs_end_ns`` (:func:`absolute`).

    Returns:
        :data:`INSTANCE_SCHEMA`: one row per (instance, rank); ``instance`` numbers the matched
        instances in the reference (lowest) rank's start order.
    """
    ranks = sorted(int(r) for r in ops["rank"].unique().to_list())
    n = len(ranks)
    c = ops.filter(pl.col("kind").cast(pl.String) == "collective")
    c = c.filter(pl.col("group_size").is_null() | (pl.col("group_size") >= n))
    if c.height == 0 or n < 2:
        return pl.DataFrame(schema=INSTANCE_SCHEMA)
    key = ["_step", "_stream", "name", "_gs"]
    c = c.with_columns(
        pl.col("step").fill_null(-(2**31)).alias("_step"),
        pl.col("stream").fill_null(-(2**62)).alias("_stream"),
        pl.col("group_size").fill_null(-1).alias("_gs"),
    ).sort("rank", "abs_start_ns", "abs_end_ns")
    c = c.with_columns(
        pl.int_range(pl.len()).over(["rank", *key]).alias("_seq"),
        pl.len().over(["rank", *key]).alias("_cnt"),
    )
    ok = (
        c.group_by(key)
        .agg(pl.col("rank").n_unique().alias("_nr"), pl.col("_cnt").n_unique().alias("_nc"))
        .filter(pl.col("_nr") == n, pl.col("_nc") == 1)
        .select(key)
    )
    m = c.join(ok, on=key, how="inner")
    if m.height == 0:
        return pl.DataFrame(schema=INSTANCE_SCHEMA)
    ids = (
        m.filter(pl.col("rank") == ranks[0])
        .sort("abs_start_ns", "abs_end_ns")
        .with_row_index("instance")
        .select("instance", *key, "_seq")
    )
    out = m.join(ids, on=[*key, "_seq"], how="inner")
    return out.select(
        pl.col("instance").cast(pl.Int64), "rank", "step", "stream", "name", "group_size", "abs_start_ns", "abs_end_ns",
        "device", "start_ns",
    ).sort("instance", "rank")


# --------------------------------------------------------------------------- alignment


def estimate_offsets(instances: pl.DataFrame) -> pl.DataFrame:
    """Per-rank clock offset from the ends of matched collectives.

    ``offset_ns[r] = median_k(end_r,k − end_ref,k)``, ``mad_ns[r] = median_k |end_r,k −
    end_ref,k − median|`` (both rounded to the ns; the reference rank ``ref`` is the lowest
    rank: offset 0, MAD 0). Source: a collective completes only when all participants have
    arrived, so its end is (nearly) one true instant on every rank; medians make the estimate
    robust to a few mismatched instances.

    Args:
        instances: :func:`match_collectives` output.

    Returns:
        Columns ``rank`` (Int32), ``matched`` (Int64: instances used), ``offset_ns`` and
        ``mad_ns`` (Int64; null when the rank has no matched instance).
    """
    schema = {"rank": pl.Int32, "matched": pl.Int64, "offset_ns": pl.Int64, "mad_ns": pl.Int64}
    if instances.height == 0:
        return pl.DataFrame(schema=schema)
    ref = int(instances["rank"].min())
    r0 = instances.filter(pl.col("rank") == ref).select("instance", pl.col("abs_end_ns").alias("_ref_end"))
    d = instances.join(r0, on="instance").with_columns((pl.col("abs_end_ns") - pl.col("_ref_end")).alias("_d"))
    d = d.with_columns(pl.col("_d").median().over("rank").alias("_med"))
    out = d.group_by("rank").agg(
        pl.len().cast(pl.Int64).alias("matched"),
        pl.col("_med").first().round(0).cast(pl.Int64).alias("offset_ns"),
        (pl.col("_d") - pl.col("_med")).abs().median().round(0).cast(pl.Int64).alias("mad_ns"),
    )
    return out.with_columns(pl.col("rank").cast(pl.Int32)).sort("rank").select(list(schema))


def decide_alignment(offsets: pl.DataFrame, ranks: list[int], base_method: str) -> dict[str, Any]:
    """Whether to apply the collective-based offsets, and why (never silently).

    Rules (in order): fewer than :data:`MIN_MATCHED` matched instances → not applied; a rank's
    MAD above :data:`MAX_MAD_NS` → not applied (the matched kernels do not end together); no
    ``|offset| > SIGNIFICANCE × MAD`` on any rank → not applied (the clocks already agree within
    the uncertainty); else applied.

    Args:
        offsets: :func:`estimate_offsets` output.
        ranks: every rank of the trace.
        base_method: ``origins`` or ``none`` (:func:`absolute`).

    Returns:
        ``method`` (the clock the cross-rank view uses: ``collectives``, ``origins`` or
        ``none``), ``applied``, ``reason``, ``reference_rank``, ``matched_collectives``,
        ``uncertainty_ns`` (largest MAD; null when nothing was estimated), ``max_abs_offset_ns``,
        and the thresholds.
    """
    n = int(offsets["matched"].min()) if offsets.height == len(ranks) and offsets.height else 0
    d: dict[str, Any] = {
        "reference_rank": min(ranks) if ranks else None,
        "matched_collectives": n,
        "uncertainty_ns": int(offsets["mad_ns"].max()) if offsets.height and offsets["mad_ns"].is_not_null().any() else None,
        "max_abs_offset_ns": int(offsets["offset_ns"].abs().max()) if offsets.height and offsets["offset_ns"].is_not_null().any() else None,
        "base": base_method,
        "min_matched": MIN_MATCHED,
        "max_mad_ns": MAX_MAD_NS,
        "significance": SIGNIFICANCE,
    }
    keep = "the hosts' clocks (per-rank origins) are used as they are" if base_method == "origins" else (
        "per-rank origins are unknown: each rank stays on its own clock and instants are not compared across ranks"
    )
    if n < MIN_MATCHED:
        return {**d, "method": base_method, "applied": False,
                "reason": f"{n} matched collective instance(s), need ≥ {MIN_MATCHED}; {keep}"}
    bad = offsets.filter(pl.col("mad_ns") > MAX_MAD_NS)
    if bad.height:
        r, mad = int(bad["rank"][0]), int(bad["mad_ns"][0])
        return {**d, "method": base_method, "applied": False,
                "reason": f"rank {r}: end differences spread (MAD) {_ns(mad)} > {_ns(MAX_MAD_NS)}, "
                          f"the matched collectives do not end together (p2p between non-peers, sub-group "
                          f"collectives, or a different order); {keep}"}
    sig = offsets.filter(pl.col("offset_ns").abs() > SIGNIFICANCE * pl.col("mad_ns"))
    if sig.height == 0:
        return {**d, "method": base_method, "applied": False,
                "reason": f"every offset is within {SIGNIFICANCE:g}× its uncertainty: the clocks already agree; {keep}"}
    return {**d, "method": "collectives", "applied": True,
            "reason": f"offsets from the ends of {n} matched collective instances (median; uncertainty = MAD)"}


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
        :data:`INSTANCE_SCHEMA` columns plus ``wait_ns`` (Int64), ``last_rank`` (Int32),
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
    for r in sorted(int(x) for x in steps["rank"].unique().to_list()):
        st = steps.filter(pl.col("rank") == r)
        s = steps_mod.summarize(st)
        full = st.filter(~pl.col("partial")) if st.filter(~pl.col("partial")).height else st
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
            "compute_ns": (cb + mb) if cb is not None and mb is not None else None,
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
                  comparison: Comparison | None = None) -> dict[str, Any] | None:
    """The report's ``ranks`` section; None when the op table has fewer than 2 ranks.

    Args:
        ops: op table (per-rank relative ``start_ns``), all ranks.
        steps: step table, one row per (rank, step) (optionally with ``hfu``).
        stats: ``meta.stats`` (holds ``origin_ns[r]``).
        comparison: :func:`compare_collectives` of ``ops``, when the caller has it already.

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
    if clock == "none":
        note = "no comparable clock: per-rank origins unknown and no collective alignment"
    elif matched == 0:
        note = "no collective instance is matched on every rank"
    elif compared < matched:
        note = (f"{matched - compared} of {matched} matched instances end more than {_ns(END_TOLERANCE_NS)} "
                f"apart on the {clock} clock and are not compared")
    else:
        note = f"all {matched} matched instances end within {_ns(END_TOLERANCE_NS)} on the {clock} clock"
    per_rank = per_rank_summary(steps)
    per_rank = (
        per_rank.join(pl.DataFrame({"rank": ranks, "origin_ns": [org[r] for r in ranks]},
                                   schema={"rank": pl.Int32, "origin_ns": pl.Int64}), on="rank", how="left")
        .join(offs, on="rank", how="left")
        .join(wait_by_rank(waits, ranks), on="rank", how="left")
    )
    spread = step_spread(steps, waits)
    inst_sum = instance_summary(waits)
    n_steps = max(int(steps["step"].n_unique()), 1) if steps.height else 1
    straggler = None
    wr = wait_by_rank(waits, ranks).filter(pl.col("wait_caused_ns") > 0).sort(
        ["wait_caused_ns", "rank"], descending=[True, False]
    )
    if wr.height:
        r = int(wr["rank"][0])
        caused = int(wr["wait_caused_ns"][0])
        straggler = {
            "rank": r,
            "last_arrivals": int(wr["last_arrivals"][0]),
            "instances": int(inst_sum.height),
            "wait_caused_ns": caused,
            "waiting_ranks": len(ranks) - 1,
            "mean_wait_per_rank_ns": caused / (len(ranks) - 1),
            "steps": n_steps,
            "wait_caused_per_step_ns": caused / n_steps,
            "critical_path_ns": _critical_path(waits, r),
            # enough compared instances to call it a straggler (the finding's bar too)
            "sufficient": compared >= MIN_MATCHED,
        }
    return {
        "ranks": ranks,
        "alignment": {**al, "clock": clock},
        "per_rank": per_rank.to_dicts(),
        "per_step": spread.to_dicts(),
        "slowest_rank": slowest_rank(spread, steps),
        "straggler": straggler,
        "collectives": {
            "matched": matched,
            "compared": compared,
            "end_tolerance_ns": END_TOLERANCE_NS,
            "note": note,
            "total_wait_ns": int(waits["wait_ns"].sum()) if compared else None,
            "top": inst_sum.head(TOP_COLLECTIVES).to_dicts(),
        },
    }


def _ns(v: float) -> str:
    """A duration for a message: ``21.3 ms``, ``20 µs``, ``150 ns``."""
    a = abs(v)
    for div, unit in ((1e9, "s"), (1e6, "ms"), (1e3, "µs")):
        if a >= div:
            return f"{v / div:.3g} {unit}"
    return f"{v:.0f} ns"


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
    "MIN_MATCHED", "MAX_MAD_NS", "SIGNIFICANCE", "origins", "absolute", "apply_offsets", "match_collectives",
    "estimate_offsets", "decide_alignment", "collective_waits", "instance_summary", "wait_by_rank",
    "per_rank_summary", "step_spread", "slowest_rank", "analyze_ranks",
]
