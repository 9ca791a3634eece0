"""The summary stage of :func:`traceroof.analysis.analyze`: step means, HFU, MFU and the
roofline efficiency, each checked against 100 % (accounting rule 4: a utilization above 1 is
left unknown and comes back as an inconsistency with suspects).

Formulas: HFU = op-table FLOPs per step / (step time × devices × dense peak)
(:func:`traceroof.mfu.hfu`); MFU = model FLOPs per step / (step time × devices × peak)
(:func:`traceroof.mfu.mfu`, PaLM's definition, Chowdhery et al. 2022, appendix B); roofline
efficiency = Σ expected / Σ measured over the costed ops (DESIGN §6). Times are ns.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from . import steps as steps_mod
from .chips import ChipSpec
from .costing import Coverage
from .device_accounting import per_device
from .mfu import Inconsistency, Peak, achieved_flops_per_s, hfu, mfu
from .roofline import MATRIX_KINDS
from .sections import (
    HfuInfo,
    InconsistencyInfo,
    MfuInfo,
    RooflineInfo,
    StepStats,
    Summary,
    TimelineInfo,
)
from .trace import TraceMeta


@dataclass(frozen=True)
class Utilization:
    """What :func:`summarize` gives: the summary, the steps with ``hfu``/``mfu`` per step,
    and the utilizations that came out above 100 % (as inconsistencies)."""

    summary: Summary
    steps: pl.DataFrame
    inconsistencies: list[InconsistencyInfo]


def summarize(ops: pl.DataFrame, steps: pl.DataFrame, spec: ChipSpec, reason: str, meta: TraceMeta,
              coverage: Coverage, model_flops_per_step: float | None, model_flops_formula: str | None,
              n_devices: int | None, timeline_info: TimelineInfo | None = None,
              device_steps: pl.DataFrame | None = None) -> Utilization:
    """Step averages, HFU (:func:`traceroof.mfu.hfu`), roofline efficiency and MFU
    (:func:`traceroof.mfu.mfu`); the same formula per step; per device when a rank drives
    several (:func:`traceroof.device_accounting.per_device` of ``device_steps``, the
    per-device step table of :func:`segment_steps`). ``n_devices`` defaults to the
    world size, else the number of ranks × the devices each drives (a jax process driving 4
    chips is 4 devices)."""
    stats = steps_mod.summarize(steps)
    step = StepStats.from_dict(stats) if len(stats) > 1 else None
    dom, peak = _hfu_peak(ops, spec)
    hfu_info, hfu_bad = _hfu(step, dom, peak, spec, reason)
    per_rank = (step.devices_per_rank or 1) if step else 1
    nd = n_devices or meta.world_size or max(len(meta.ranks), 1) * per_rank
    mfu_info = mfu_bad = None
    if model_flops_per_step is not None and step and step.step_time_ns:
        mfu_info, mfu_bad = _mfu(model_flops_per_step, model_flops_formula, step.step_time_ns, nd,
                                 Peak(peak, dom, f"{spec.name}: {reason}", spec.name) if peak else None)
    roof, roof_bad = roofline_above_one(_roofline_efficiency(ops, coverage), spec)
    summary = Summary(steps=int(stats["steps"]), step=step, hfu=hfu_info,
                      roofline=roof, mfu=mfu_info,
                      devices=per_device(device_steps, steps, peak, ops.select("rank", "device")) if device_steps is not None else None,
                      timeline=timeline_info)
    if step is not None and step.complete_steps == 0:
        meta.warn(f"no complete step ({summary.steps} step(s), all partial): no step time, busy share "
                  "or HFU is given (accounting rule 5)")
    return Utilization(summary, _per_step_utilization(steps, peak, model_flops_per_step, nd),
                       [i for i in (hfu_bad, mfu_bad, roof_bad) if i is not None])


def _hfu_peak(ops: pl.DataFrame, spec: ChipSpec) -> tuple[str, float | None]:
    """The dtype carrying most matrix FLOPs (bf16 when none) and ``spec``'s dense peak for it
    (FLOP/s; falling back to bf16, fp16, fp32)."""
    mat = ops.select("kind", "flops", "peak_dtype").filter(pl.col("kind").is_in(list(MATRIX_KINDS)),
                                                        pl.col("flops").is_not_null())
    dom = (
        mat.group_by("peak_dtype").agg(pl.col("flops").sum()).sort("flops", descending=True)["peak_dtype"][0]
        if mat.height
        else "bf16"
    )
    return dom, spec.peak(dom) or spec.peak("bf16") or spec.peak("fp16") or spec.peak("fp32")


def _hfu(step: StepStats | None, dom: str, peak: float | None, spec: ChipSpec,
         reason: str) -> tuple[HfuInfo, InconsistencyInfo | None]:
    """HFU per device from the op table's FLOPs per step; above 100 % it is left unknown and
    comes back as an inconsistency."""
    st = step.step_time_ns if step else None
    fl = step.flops_per_step if step else None
    if not (st and fl and peak):
        return HfuInfo(peak_dtype=dom, peak_flops_per_s=peak), None
    # per device: a rank with several devices (XPlane host) shares its FLOPs among them
    ndev = step.devices_per_rank or 1
    u = hfu(fl, st, peak, ndev)
    bad = None
    if isinstance(u, Inconsistency):
        bad = InconsistencyInfo(
            what="HFU above 100 %", value=u.value,
            suspects=[
                f"peak taken: {peak:.4g} FLOP/s {dom} dense for {spec.name} ({reason})",
                "a FLOP formula that over-counts (causal attention not halved?)",
                "a chip whose clocks/peaks differ from the datasheet",
            ],
        )
    info = HfuInfo(peak_dtype=dom, peak_flops_per_s=peak, achieved_flops_per_s=achieved_flops_per_s(fl, st, ndev),
                   value=None if bad else u.value)
    return info, bad


def _mfu(model_flops: float, formula: str | None, step_time_ns: float, nd: int,
         peak: Peak | None) -> tuple[MfuInfo, InconsistencyInfo | None]:
    """MFU of ``model_flops`` per step over ``nd`` devices; above 100 % it is left unknown and
    comes back as an inconsistency."""
    u = mfu(model_flops, step_time_ns, peak, nd, flops_formula=formula)
    if isinstance(u, Inconsistency):
        bad = InconsistencyInfo(what=u.what, value=u.value, suspects=list(u.suspects))
        return MfuInfo(value=None, model_flops_per_step=model_flops, devices=nd), bad
    return MfuInfo(value=u.value, note=f"{formula or 'model FLOPs given'}; {nd} device(s)",
                   model_flops_per_step=model_flops, devices=nd), None


def _roofline_efficiency(ops: pl.DataFrame, cov: Coverage) -> RooflineInfo:
    """Σ expected / Σ measured over the costed ops (None without any), and its coverage."""
    # only the two sums: filtering the whole table would copy its text columns
    n_costed, exp_ns, costed_dur_ns = ops.select(
        pl.col("expected_ns").is_not_null().sum().alias("n"),
        pl.col("expected_ns").filter(pl.col("expected_ns").is_not_null()).sum().alias("expected"),
        pl.col("dur_ns").filter(pl.col("expected_ns").is_not_null()).sum().alias("measured"),
    ).row(0)
    eff = float(exp_ns) / float(costed_dur_ns) if n_costed and costed_dur_ns else None
    return RooflineInfo(efficiency=eff, covers=cov.costed_share)


def roofline_above_one(info: RooflineInfo, spec: ChipSpec) -> tuple[RooflineInfo, InconsistencyInfo | None]:
    """``info`` unchanged while its efficiency is at most 1; above, the efficiency is left
    unknown and comes back as an inconsistency (accounting rule 4: Σ expected > Σ measured
    means some costed op runs above its roof)."""
    if info.efficiency is None or info.efficiency <= 1.0:
        return info, None
    bad = InconsistencyInfo(
        what="roofline efficiency above 100 %", value=info.efficiency,
        suspects=[f"ops above their roof (listed below) on {spec.name}", "FLOP/byte formulas of the costed ops",
                  "kernel durations clipped or overlapping"])
    return RooflineInfo(efficiency=None, covers=info.covers), bad


def _per_step_utilization(steps: pl.DataFrame, peak: float | None, model_flops: float | None, n_devices: int) -> pl.DataFrame:
    """Add ``hfu`` (op-table FLOPs per device) and ``mfu`` (model FLOPs over all devices) per
    step, by :func:`traceroof.mfu.achieved_flops_per_s` over the peak.

    Values above 1.0 are set to null here; the summary reports them as inconsistencies.
    """
    if not peak or steps.height == 0:
        return steps.with_columns(pl.lit(None, dtype=pl.Float64).alias("hfu"), pl.lit(None, dtype=pl.Float64).alias("mfu"))
    wall_ns = pl.col("wall_ns").cast(pl.Float64)
    hfu_ = achieved_flops_per_s(pl.col("flops"), wall_ns, pl.col("devices")) / peak
    mfu_ = (achieved_flops_per_s(pl.lit(model_flops), wall_ns, n_devices) / peak if model_flops is not None
            else pl.lit(None, dtype=pl.Float64))
    return steps.with_columns(
        pl.when(hfu_ <= 1.0).then(hfu_).alias("hfu"),
        pl.when(mfu_ <= 1.0).then(mfu_).cast(pl.Float64).alias("mfu"),
    )



__all__ = ["Utilization", "roofline_above_one", "summarize"]
