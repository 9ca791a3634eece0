"""The ranks on one clock: per-rank origins, matched collective instances, clock offsets.

The first half of the cross-rank view (:mod:`traceroof.ranks` builds the report section on
it): small pure functions over polars tables. See ``docs/ranks.md`` for the method, its
assumptions and an example.

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
"""

from __future__ import annotations

import re
from typing import Any

import polars as pl

from .units import ns as duration_text

#: Fewest matched collective instances an alignment is estimated from.
MIN_MATCHED = 3
#: Largest residual spread (MAD, ns) of a rank's end differences for an alignment to be applied.
#: Completion skew of one collective between ranks is a few µs (NCCL's last-packet latency);
#: a larger spread means the matched kernels do not end together (wrong pairing, p2p between
#: non-peers, sub-group collectives).
MAX_MAD_NS = 20_000
#: An offset is worth applying when it exceeds this multiple of its MAD.
SIGNIFICANCE = 3.0

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
    (written by :func:`traceroof.merge.merge`); None for a rank that has none."""
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
                "reason": f"rank {r}: end differences spread (MAD) {duration_text(mad)} > {duration_text(MAX_MAD_NS)}, "
                          f"the matched collectives do not end together (p2p between non-peers, sub-group "
                          f"collectives, or a different order); {keep}"}
    sig = offsets.filter(pl.col("offset_ns").abs() > SIGNIFICANCE * pl.col("mad_ns"))
    if sig.height == 0:
        return {**d, "method": base_method, "applied": False,
                "reason": f"every offset is within {SIGNIFICANCE:g}× its uncertainty: the clocks already agree; {keep}"}
    return {**d, "method": "collectives", "applied": True,
            "reason": f"offsets from the ends of {n} matched collective instances (median; uncertainty = MAD)"}


__all__ = [
    "MIN_MATCHED", "MAX_MAD_NS", "SIGNIFICANCE", "INSTANCE_SCHEMA", "origins", "absolute", "apply_offsets",
    "match_collectives", "estimate_offsets", "decide_alignment", "duration_text",
]
