"""Per-device accounting of a rank driving several devices (rule 3 of ``docs/accounting.md``).

A jax process can drive 4 TPU chips or 8 GPUs: one rank, several ``device`` values in the op
table. The step table (:mod:`traceroof.steps`) gives each (rank, step) the *mean* over the
rank's devices; this module gives each device its own numbers, over the rank's complete
steps: busy (the union of the device's ops over all its streams), idle (the step wall − busy),
communication and exposed communication (as :func:`traceroof.steps.step_table` counts them),
FLOPs and HFU. The mean over a rank's devices of a device's busy share is the step table's busy
share (both are per-device busy over the same wall).

All times are int64 ns inside; the means are floats (ns per step).
"""

from __future__ import annotations

from typing import Any

import polars as pl

from . import intervals as iv
from .sections import DeviceStats

#: kinds that are not compute: they do not hide communication (as in :mod:`traceroof.steps`)
_NOT_COMPUTE = ["collective", "memcpy", "memset"]


def complete_steps(steps: pl.DataFrame) -> pl.DataFrame:
    """The step rows the summary averages (:func:`traceroof.steps.summarize`): the complete
    ones, or every row when none is complete."""
    if steps.height == 0:
        return steps
    full = steps.filter(~pl.col("partial"))
    return full if full.height else steps


def per_device(ops: pl.DataFrame, steps: pl.DataFrame, peak_flops_per_s: float | None) -> list[DeviceStats] | None:
    """One :class:`~traceroof.sections.DeviceStats` per (rank, device) of the ranks whose ops
    run on more than one device, rank then device order; None when every rank drives one
    device (its numbers are the summary's).

    Args:
        ops: the op table (``rank``, ``device``, ``step``, ``kind``, ``start_ns``, ``dur_ns``,
            ``flops``).
        steps: the step table (``rank``, ``step``, ``start_ns``, ``end_ns``, ``wall_ns``,
            ``partial``); its complete rows (:func:`complete_steps`) are averaged.
        peak_flops_per_s: dense peak of one device (FLOP/s) for the HFU, None when unknown.

    Each device is averaged over the complete steps it has ops in (``steps``), as the step
    table averages the devices present in each step; a device with ops only outside them keeps
    a row with ``steps`` 0 and unknown (None) times, so it is shown, not dropped. HFU per device = its FLOPs per step / (mean wall × peak)
    (the summary's HFU is the same over all devices: FLOPs / (wall × peak × devices)); above
    100 % it is left None (the summary reports the inconsistency).
    """
    if ops.height == 0 or steps.height == 0:
        return None
    devs = ops.select("rank", "device").unique()
    multi = devs.group_by("rank").len().filter(pl.col("len") > 1)["rank"]
    if multi.len() == 0:
        return None
    full = complete_steps(steps).filter(pl.col("rank").is_in(multi.implode()))
    scope = _ops_of_steps(ops.filter(pl.col("rank").is_in(multi.implode())), full)
    k = pl.col("kind")
    sets = {"busy": pl.lit(True), "comm": k == "collective", "comp": ~k.is_in(_NOT_COMPUTE),
            "coll_or_comp": ~k.is_in(["memcpy", "memset"])}
    keys = ["rank", "step", "device"]
    u = iv.union_lengths(scope, sets, keys) if scope.height else pl.DataFrame(
        schema={"rank": pl.Int32, "step": pl.Int32, "device": pl.Int32, **{n: pl.Int64 for n in sets}})
    # exposed = |comm| − |comm ∩ comp| = |comm ∪ comp| − |comp|
    u = u.with_columns((pl.col("coll_or_comp") - pl.col("comp")).alias("exposed"))
    fl = scope.group_by(keys).agg(pl.col("flops").sum().alias("fl"), pl.col("flops").is_not_null().any().alias("has"))
    # each device over the complete steps it has ops in, as the step table averages the
    # devices present in each step; a device with none of them keeps a row with steps 0
    g = full.select("rank", "step", "wall_ns").join(u, on=["rank", "step"], how="inner", nulls_equal=True)
    g = g.join(fl, on=keys, how="left", nulls_equal=True).with_columns(pl.col("has").fill_null(False))
    per = g.group_by("rank", "device").agg(
        pl.len().alias("steps"), pl.col("wall_ns").mean().alias("wall"), pl.col("busy").mean().alias("busy"),
        pl.col("comm").mean().alias("comm"), pl.col("exposed").mean().alias("exposed"),
        pl.col("fl").fill_null(0.0).mean().alias("fl"), pl.col("has").any().alias("has"),
    )
    absent = devs.filter(pl.col("rank").is_in(multi.implode())).join(per, on=["rank", "device"], how="anti", nulls_equal=True)
    per = pl.concat([per, absent.with_columns(pl.lit(0, dtype=pl.UInt32).alias("steps"))], how="diagonal_relaxed")
    per = per.sort("rank", "device", nulls_last=True)
    return [_row(r, peak_flops_per_s) for r in per.iter_rows(named=True)]


def _ops_of_steps(ops: pl.DataFrame, full: pl.DataFrame) -> pl.DataFrame:
    """The ops of the step rows ``full`` with ``end_ns``: those assigned to a step of
    ``full``; for an unsegmented step (``step`` null) all of its rank's ops."""
    d = ops.select("rank", "device", "step", "kind", "flops", "start_ns",
                   (pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns"))
    unseg = full.filter(pl.col("step").is_null())["rank"]
    seg = d.join(full.filter(pl.col("step").is_not_null()).select("rank", "step"), on=["rank", "step"], how="semi")
    if unseg.len() == 0:
        return seg
    whole = d.filter(pl.col("rank").is_in(unseg.implode())).with_columns(pl.lit(None, dtype=d.schema["step"]).alias("step"))
    return pl.concat([seg, whole])


def _row(r: dict[str, Any], peak: float | None) -> DeviceStats:
    """The :class:`DeviceStats` of one aggregated (rank, device) row."""
    if not r["steps"]:
        return DeviceStats(rank=int(r["rank"]), device=None if r["device"] is None else int(r["device"]), steps=0)
    wall, busy = float(r["wall"]), float(r["busy"])
    fl = float(r["fl"]) if r["has"] else None
    hfu = fl / (wall * 1e-9) / peak if fl is not None and wall > 0 and peak else None
    return DeviceStats(
        rank=int(r["rank"]), device=None if r["device"] is None else int(r["device"]), steps=int(r["steps"]),
        wall_ns=wall, busy_ns=busy, idle_ns=wall - busy, busy_fraction=busy / wall if wall > 0 else None,
        comm_ns=float(r["comm"]), comm_exposed_ns=float(r["exposed"]), flops_per_step=fl,
        hfu=hfu if hfu is None or hfu <= 1.0 else None,
    )


__all__ = ["complete_steps", "per_device"]
