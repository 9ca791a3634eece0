"""The step's speed of light: the time a step would take if every device op ran at its own
roof, communication hid behind compute wherever the trace shows it can, and the device never
idled (docs/speed-of-light.md).

Everything is computed per (rank, step, device) of the complete steps, in whole ns:

* ``expected_i`` = ``round(expected_ns)`` of op *i* (roofline time: max of compute, memory and
  link terms, with the kernel floor; :mod:`traceroof.roofline`); an op with no cost model
  (``expected_ns`` null) counts at its measured ``dur_ns``: nothing is claimed for it, and
  its time is reported (``uncosted_ns``).
* ``C`` = Σ expected of the non-collective ops; collectives split into ``O`` (those that ran
  beside a non-collective op of the same device in the measured step: the program did not
  make them wait) and ``E`` (the others, which ran alone: taken to be waited for).
* ``sol_raw = C + E + max(0, O − C)``: the overlapped collectives hide behind compute up to
  the compute time there is; ``sol = min(sol_raw, wall)``: never above the measured step.

The exact identity the waterfall (:mod:`traceroof.waterfall`) is built on, per device-step
(all terms int ns):

    wall − sol = idle + (busy − Σ dur) + Σ (dur − expected) + min(O, C) + max(0, sol_raw − wall)

with ``idle = wall − busy`` (accounting rule 3) and ``busy`` the clipped interval union of the
device's ops in the step (:mod:`traceroof.steps`).
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

#: the kind of ops that may hide behind compute
COMM_KIND = "collective"

#: the overlap convention, as printed in every output
CONVENTION = ("every op at its roofline time (an op with no cost model at its measured time); a collective that "
              "ran beside compute on its device hides behind compute up to the compute time there is, a "
              "collective that ran alone costs its link roofline; no idle time")


@dataclass(frozen=True)
class DeviceSteps:
    """Per (rank, step, device) of the complete steps (int ns): ``wall_ns``, ``busy_ns``,
    ``idle_ns``, ``ops_dur_ns`` (Σ op durations), ``gap_<kind>_ns`` (Σ dur − expected per op
    kind), ``compute_ns`` (C), ``comm_overlapped_ns`` (O), ``comm_alone_ns`` (E),
    ``uncosted_ns`` (Σ dur of ops with no cost model), ``sol_raw_ns`` and ``sol_ns``; ``kinds``
    lists the kinds with a ``gap_<kind>_ns`` column."""

    table: pl.DataFrame
    kinds: tuple[str, ...]


def _overlapped(stepped: pl.DataFrame, keys: list[str]) -> pl.Series:
    """Per row of ``stepped``, whether it is a collective that ran beside a non-collective op
    of its own ``keys`` group (one (rank, step, device)): some non-collective op there starts
    before it ends and ends after it starts (both strict; times in int ns).

    One query for every group (no per-group loop, no numpy): per group the non-collective
    ops' ends, cumulative max in start order; each collective takes the last non-collective
    start strictly before its end (as-of join) and is overlapped when that running max end is
    after its start. A row with a null time is not overlapped.

    Returns:
        A Boolean series, one per row of ``stepped`` in order (never null).
    """
    t = stepped.select(
        pl.struct(keys).rank("dense").alias("_g"),  # one id per group, null keys included
        (pl.col("kind") == COMM_KIND).fill_null(False).alias("_c"),
        "start_ns", (pl.col("start_ns") + pl.col("dur_ns")).alias("_e"),
    ).with_row_index("_r").filter(pl.col("start_ns").is_not_null(), pl.col("_e").is_not_null())
    compute = (t.filter(~pl.col("_c")).group_by("_g", "start_ns").agg(pl.col("_e").max())
               .sort("_g", "start_ns").select("_g", pl.col("start_ns").alias("_cs"),
                                              pl.col("_e").cum_max().over("_g").alias("_ce"))
               .sort("_cs"))
    hit = (t.filter(pl.col("_c")).sort("_e")
           .join_asof(compute, left_on="_e", right_on="_cs", by="_g", strategy="backward",
                      allow_exact_matches=False, check_sortedness=False)
           .filter(pl.col("_ce") > pl.col("start_ns")))
    return pl.repeat(False, stepped.height, dtype=pl.Boolean, eager=True).alias("_ov").scatter(hit["_r"], True)


def device_steps(ops: pl.DataFrame, device_steps_table: pl.DataFrame, steps: pl.DataFrame) -> DeviceSteps:
    """The per-device-step terms of the speed of light (see the module docstring).

    Args:
        ops: the op table with ``bucket``, ``step``, ``device``, ``kind``, ``start_ns``,
            ``dur_ns`` and ``expected_ns`` (:func:`traceroof.analysis.segment_steps`).
        device_steps_table: ``steps.DEVICE_STEP_SCHEMA`` rows (``wall_ns``, ``busy_ns``, int ns).
        steps: the per-step table (``partial``): partial steps are left out, as in the summary.

    Returns:
        :class:`DeviceSteps` (an empty table when no complete step has a device window).
    """
    keys = ["rank", "step", "device"]
    complete = steps.filter(~pl.col("partial").fill_null(False)).select("rank", "step")
    dev = device_steps_table.join(complete, on=["rank", "step"], how="semi", nulls_equal=True).select(
        *keys, "wall_ns", "busy_ns")
    if dev.height == 0:  # no complete step with a device window: the empty table, without a query
        return DeviceSteps(empty_table(dev), ())
    return _terms(ops, dev, keys)


#: the columns :func:`device_steps` adds to the device-step rows when no op kind has a gap
#: column (Int64 ns each), in order
_TERMS = ("ops_dur_ns", "compute_ns", "comm_overlapped_ns", "comm_alone_ns", "uncosted_ns",
          "idle_ns", "sol_raw_ns", "sol_ns")


def empty_table(dev: pl.DataFrame) -> pl.DataFrame:
    """The table of :func:`device_steps` with no row: the ``rank``/``step``/``device``,
    ``wall_ns``, ``busy_ns`` columns of ``dev`` (no row) and the :data:`_TERMS` (Int64 ns), as
    :func:`_terms` gives them for no device-step (tests/test_speed_of_light.py)."""
    return pl.DataFrame(schema={**dev.schema, **{c: pl.Int64 for c in _TERMS}})


def _terms(ops: pl.DataFrame, dev: pl.DataFrame, keys: list[str]) -> DeviceSteps:
    """:func:`device_steps` of the device-step rows ``dev`` (``keys``, ``wall_ns``, ``busy_ns``)."""
    # one lazy query over the six columns read (an eager filter copied every column first)
    stepped = (ops.lazy().filter(pl.col("bucket") == "step") if "bucket" in ops.columns else ops.lazy().clear())
    stepped = (stepped.select(*keys, pl.col("kind").cast(pl.String), "start_ns", "dur_ns", "expected_ns")
               .join(dev.lazy().select(keys), on=keys, how="semi", nulls_equal=True).collect())
    # the overlap test is per (rank, step, device), one query for all of them; without any
    # collective it is false on every row
    has_comm = stepped.height > 0 and bool((stepped["kind"] == COMM_KIND).any())
    stepped = stepped.with_columns(_overlapped(stepped, keys) if has_comm else pl.lit(False).alias("_ov"))
    exp = pl.col("expected_ns").round(0).cast(pl.Int64)
    stepped = stepped.with_columns(
        pl.when(pl.col("expected_ns").is_null()).then(pl.col("dur_ns")).otherwise(exp).alias("_exp"),
        pl.col("expected_ns").is_null().alias("_unc"),
        (pl.col("kind") == COMM_KIND).alias("_comm"))
    kinds = tuple(sorted(stepped["kind"].drop_nulls().unique().to_list())) if stepped.height else ()
    agg = [pl.col("dur_ns").sum().alias("ops_dur_ns"),
           pl.col("_exp").filter(~pl.col("_comm")).sum().alias("compute_ns"),
           pl.col("_exp").filter(pl.col("_comm") & pl.col("_ov")).sum().alias("comm_overlapped_ns"),
           pl.col("_exp").filter(pl.col("_comm") & ~pl.col("_ov")).sum().alias("comm_alone_ns"),
           pl.col("dur_ns").filter(pl.col("_unc")).sum().alias("uncosted_ns")]
    agg += [(pl.col("dur_ns") - pl.col("_exp")).filter(pl.col("kind") == k).sum().alias(f"gap_{k}_ns") for k in kinds]
    sums = stepped.group_by(keys).agg(agg)
    cols = ["ops_dur_ns", "compute_ns", "comm_overlapped_ns", "comm_alone_ns", "uncosted_ns", *(f"gap_{k}_ns" for k in kinds)]
    t = dev.join(sums, on=keys, how="left", nulls_equal=True).with_columns(
        pl.col(c).fill_null(0).cast(pl.Int64) for c in cols)
    c, o, e = pl.col("compute_ns"), pl.col("comm_overlapped_ns"), pl.col("comm_alone_ns")
    t = t.with_columns((pl.col("wall_ns") - pl.col("busy_ns")).alias("idle_ns"),
                       (c + e + pl.max_horizontal(o - c, pl.lit(0))).alias("sol_raw_ns"))
    t = t.with_columns(pl.min_horizontal("sol_raw_ns", "wall_ns").alias("sol_ns")).sort(keys, nulls_last=True)
    return DeviceSteps(t, kinds)


__all__ = ["COMM_KIND", "CONVENTION", "DeviceSteps", "device_steps"]
