"""Per-device accounting of a rank driving several devices (rule 3 of ``docs/accounting.md``).

A jax process can drive 4 TPU chips or 8 GPUs: one rank, several ``device`` values in the op
table. The step table (:mod:`traceroof.steps`) gives each (rank, step) the *mean* over the
rank's devices; this module gives each device its own numbers, over the rank's complete
steps, each device in its own step windows (:data:`traceroof.steps.DEVICE_STEP_SCHEMA`):
busy (the union of the device's ops over all its streams, clipped to its window), idle (the
window − busy), communication and exposed communication (as :func:`traceroof.steps.step_tables`
counts them), FLOPs and HFU. The means over a rank's devices of their busy and wall are the
step table's busy and wall.

All times are int64 ns inside; the means are floats (ns per step).
"""

from __future__ import annotations

from typing import Any

import polars as pl

from . import steps as steps_mod
from .sections import DeviceStats


def per_device(device_steps: pl.DataFrame, steps: pl.DataFrame, peak_flops_per_s: float | None,
               devices: pl.DataFrame | None = None) -> list[DeviceStats] | None:
    """One :class:`~traceroof.sections.DeviceStats` per (rank, device) of the ranks whose
    steps run on more than one device, rank then device order; None when every rank drives
    one device (its numbers are the summary's).

    Args:
        device_steps: the per-device step table (:data:`traceroof.steps.DEVICE_STEP_SCHEMA`:
            each device's own window and breakdown in each step, ns).
        steps: the step table (``rank``, ``step``, ``partial``); its complete rows
            (:func:`traceroof.steps.complete`, never the partial ones) are averaged.
        peak_flops_per_s: dense peak of one device (FLOP/s) for the HFU, None when unknown.
        devices: every (``rank``, ``device``) with device ops (default: those of
            ``device_steps``), so a device that took part in no step still gets its row.

    Each device is averaged over the complete steps it has a window in (its own window: a
    device idle through a step is idle there, not left out); a device of a multi-device rank
    with no window in them keeps a row with ``steps`` 0 and unknown (None) times, so it is
    shown, not dropped. The mean over a rank's devices of their busy (and wall) is the step
    table's. HFU per device = its FLOPs per step / (mean wall × peak) (the summary's HFU is
    the same over all devices: FLOPs / (wall × peak × devices)); above 100 % it is left None
    (the summary reports the inconsistency).
    """
    if device_steps.height == 0 or steps.height == 0:
        return None
    devs = (devices if devices is not None else device_steps).select("rank", "device").unique()
    multi = devs.group_by("rank").len().filter(pl.col("len") > 1)["rank"]
    if multi.len() == 0:
        return None
    full = steps_mod.complete(steps).filter(pl.col("rank").is_in(multi.implode())).select("rank", "step")
    g = device_steps.join(full, on=["rank", "step"], how="semi", nulls_equal=True)
    per = g.group_by("rank", "device").agg(
        pl.len().alias("steps"), pl.col("wall_ns").mean().alias("wall"), pl.col("busy_ns").mean().alias("busy"),
        pl.col("comm_ns").mean().alias("comm"), pl.col("comm_exposed_ns").mean().alias("exposed"),
        pl.col("flops").fill_null(0.0).mean().alias("fl"), pl.col("flops").is_not_null().any().alias("has"),
    )
    absent = devs.filter(pl.col("rank").is_in(multi.implode())).join(per, on=["rank", "device"], how="anti", nulls_equal=True)
    per = pl.concat([per, absent.with_columns(pl.lit(0, dtype=pl.UInt32).alias("steps"))], how="diagonal_relaxed")
    per = per.sort("rank", "device", nulls_last=True)
    return [_row(r, peak_flops_per_s) for r in per.iter_rows(named=True)]


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


__all__ = ["per_device"]
