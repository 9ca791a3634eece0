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

from .steps import COMM_KIND, STEP_TERM_SUMS, step_terms

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


def device_steps(ops: pl.DataFrame, device_steps_table: pl.DataFrame, steps: pl.DataFrame,
                 terms: pl.DataFrame | None = None) -> DeviceSteps:
    """The per-device-step terms of the speed of light (see the module docstring).

    Args:
        ops: the op table with ``bucket``, ``step``, ``device``, ``kind``, ``start_ns``,
            ``dur_ns`` and ``expected_ns`` (:func:`traceroof.analysis.segment_steps`).
        device_steps_table: ``steps.DEVICE_STEP_SCHEMA`` rows (``wall_ns``, ``busy_ns``, int ns).
        steps: the per-step table (``partial``): partial steps are left out, as in the summary.
        terms: the sums of every device-step, when already computed
            (:func:`traceroof.steps.step_terms`, per rank by the processes that read the
            ranks: ``Segments.terms``); else computed here from ``ops``.

    Returns:
        :class:`DeviceSteps` (an empty table when no complete step has a device window).
    """
    keys = ["rank", "step", "device"]
    complete = steps.filter(~pl.col("partial").fill_null(False)).select("rank", "step")
    dev = device_steps_table.join(complete, on=["rank", "step"], how="semi", nulls_equal=True).select(
        *keys, "wall_ns", "busy_ns")
    if dev.height == 0:  # no complete step with a device window: the empty table, without a query
        return DeviceSteps(empty_table(dev), ())
    if terms is None:
        terms = step_terms(ops, device_steps_table)
    return _finish(terms.join(dev.select(keys), on=keys, how="semi", nulls_equal=True), keys)


#: the columns :func:`device_steps` adds to the device-step rows when no op kind has a gap
#: column (Int64 ns each), in order
_TERMS = ("ops_dur_ns", "compute_ns", "comm_overlapped_ns", "comm_alone_ns", "uncosted_ns",
          "idle_ns", "sol_raw_ns", "sol_ns")


def empty_table(dev: pl.DataFrame) -> pl.DataFrame:
    """The table of :func:`device_steps` with no row: the ``rank``/``step``/``device``,
    ``wall_ns``, ``busy_ns`` columns of ``dev`` (no row) and the :data:`_TERMS` (Int64 ns), as
    :func:`_finish` of :func:`~traceroof.steps.step_terms` gives them for no device-step
    (tests/test_speed_of_light.py)."""
    return pl.DataFrame(schema={**dev.schema, **{c: pl.Int64 for c in _TERMS}})


def _finish(t: pl.DataFrame, keys: list[str]) -> DeviceSteps:
    """:func:`device_steps` of the :func:`~traceroof.steps.step_terms` rows ``t`` of the
    complete device-steps: the gap columns of the kinds their ops hold, the idle and the
    speed of light."""
    kinds = tuple(sorted({k for ks in t["_kinds"].to_list() if ks is not None for k in ks}))
    gap = [(pl.col(f"gap_{k}_ns").fill_null(0) if f"gap_{k}_ns" in t.columns else pl.lit(0)).cast(pl.Int64).alias(f"gap_{k}_ns")
           for k in kinds]
    t = t.select(*keys, "wall_ns", "busy_ns", *STEP_TERM_SUMS, *gap)
    c, o, e = pl.col("compute_ns"), pl.col("comm_overlapped_ns"), pl.col("comm_alone_ns")
    t = t.with_columns((pl.col("wall_ns") - pl.col("busy_ns")).alias("idle_ns"),
                       (c + e + pl.max_horizontal(o - c, pl.lit(0))).alias("sol_raw_ns"))
    t = t.with_columns(pl.min_horizontal("sol_raw_ns", "wall_ns").alias("sol_ns")).sort(keys, nulls_last=True)
    return DeviceSteps(t, kinds)


__all__ = ["COMM_KIND", "CONVENTION", "DeviceSteps", "device_steps"]
