"""``analyze``: Trace + chip → Report. The pipeline of DESIGN §1, as one pure function."""

from __future__ import annotations

import logging
import os
from typing import Any

import polars as pl

from . import steps as steps_mod
from .chips import ChipSpec, detect_chip, get_chip
from .costing import apply_costs
from .errors import UnknownChipError, UsageError
from .report import Report
from .roofline import ABOVE_ROOF_TOLERANCE, MATRIX_KINDS, above_roof, add_roofline, rank_ops
from .trace import Trace

logger = logging.getLogger(__name__)


def resolve_chip(trace: Trace, chip: str | os.PathLike[str] | ChipSpec | None) -> tuple[ChipSpec, str]:
    """The chip to use and why: the user's choice, else detected from the trace.

    Raises:
        UnknownChipError: unknown name, or nothing/ambiguous detected (lists candidates and
            asks for ``--chip``). Never falls back to a default chip.
    """
    if isinstance(chip, ChipSpec):
        return chip, "given"
    if chip is not None:
        spec = get_chip(str(chip))
        return spec, f"--chip {chip}"
    if not trace.meta.devices:
        raise UnknownChipError(
            "the trace names no device (no deviceProperties / device plane stats): pass "
            "--chip NAME (see `traceroof chips`)"
        )
    # XPlane GPU planes carry no device name, only capability stats (compute capability, core
    # count, memory, clock): identify those by properties, as the format intends. Kineto's
    # deviceProperties always name the device, so an empty or generic name there stays an
    # error that asks for --chip.
    return detect_chip(trace.meta.devices, allow_property_match=trace.meta.format == "xplane")


def analyze(
    trace: Trace,
    chip: str | os.PathLike[str] | ChipSpec | None = None,
    *,
    rank: int | None = None,
    step: int | None = None,
    group_by: str | None = None,
    model_flops_per_step: float | None = None,
    model_flops_formula: str | None = None,
    n_devices: int | None = None,
    findings: list[str] | None = None,
) -> Report:
    """Cost every op, put it against the chip's roofline, rank the ops by lost time.

    Args:
        trace: from :func:`traceroof.read_trace`.
        chip: a chip name/alias, a path to a chip TOML, a :class:`ChipSpec`, or None to
            detect it from the trace.
        rank: keep only this rank.
        step: keep only this step (``ProfilerStep#N`` number).
        group_by: ``op`` (framework op, else kernel name) or ``kernel``; default ``op``
            for Kineto traces and ``kernel`` (the HLO instruction) for XPlane, whose ``op``
            is only the HLO opcode (every fusion would be one row).
        model_flops_per_step: model FLOPs of one step of the whole job (all devices), for
            MFU (:func:`traceroof.model.model_flops_per_step`); None → no MFU.
        model_flops_formula: how those FLOPs were computed (shown with the MFU).
        n_devices: devices the job ran on, for MFU (default: world size, else the number of
            ranks in the trace).
        findings: detector names to run (default: all registered detectors).

    Returns:
        A :class:`Report`.

    Raises:
        UnknownChipError: the chip cannot be resolved.
        UsageError: ``rank``/``step`` not present in the trace.
    """
    if trace.ops.height == 0 and chip is None:
        return _no_device_ops(trace)
    spec, reason = resolve_chip(trace, chip)
    ops, cov = apply_costs(trace)
    host = trace.host
    if rank is not None:
        if rank not in set(ops["rank"].unique().to_list()) | set(host["rank"].unique().to_list()):
            raise UsageError(f"--rank {rank}: the trace has ranks {sorted(trace.meta.ranks)}")
        ops = ops.filter(pl.col("rank") == rank)
        host = host.filter(pl.col("rank") == rank)
    ops = add_roofline(ops, spec)
    steps = steps_mod.step_table(ops, host, trace.meta)
    if step is not None:
        have = sorted(x for x in steps["step"].unique().to_list() if x is not None)
        if step not in have:
            raise UsageError(f"--step {step}: the trace has steps {have or 'none (unsegmented)'}")
        ops = ops.filter(pl.col("step") == step)
        steps = steps.filter(pl.col("step") == step)
    if group_by is None:
        group_by = "kernel" if trace.meta.format == "xplane" else "op"
    ranking = rank_ops(ops, by=group_by)
    summary: dict[str, Any] = steps_mod.summarize(steps)
    inconsistencies: list[dict[str, Any]] = []

    # HFU against the peak of the dtype that carries most matrix FLOPs
    mat = ops.select("kind", "flops", "peak_dtype").filter(pl.col("kind").is_in(list(MATRIX_KINDS)),
                                                        pl.col("flops").is_not_null())
    dom = (
        mat.group_by("peak_dtype").agg(pl.col("flops").sum()).sort("flops", descending=True)["peak_dtype"][0]
        if mat.height
        else "bf16"
    )
    peak = spec.peak(dom) or spec.peak("bf16") or spec.peak("fp16") or spec.peak("fp32")
    summary["hfu_peak_dtype"] = dom
    summary["hfu_peak_flops_per_s"] = peak
    hfu = None
    st = summary.get("step_time_ns")
    fl = summary.get("flops_per_step")
    ndev = summary.get("devices_per_rank") or 1
    if st and fl and peak:
        # per device: a rank with several devices (XPlane host) shares its FLOPs among them
        hfu = fl / ndev / (st * 1e-9) / peak
        summary["achieved_flops_per_s"] = fl / ndev / (st * 1e-9)
    if hfu is not None and hfu > 1.0:
        inconsistencies.append(
            {
                "what": "HFU above 100 %",
                "value": hfu,
                "suspects": [
                    f"peak taken: {peak:.4g} FLOP/s {dom} dense for {spec.name} ({reason})",
                    "a FLOP formula that over-counts (causal attention not halved?)",
                    "a chip whose clocks/peaks differ from the datasheet",
                ],
            }
        )
        hfu = None
    summary["hfu"] = hfu
    # only the two sums: filtering the whole table would copy its text columns
    n_costed, exp_ns, costed_dur_ns = ops.select(
        pl.col("expected_ns").is_not_null().sum().alias("n"),
        pl.col("expected_ns").filter(pl.col("expected_ns").is_not_null()).sum().alias("expected"),
        pl.col("dur_ns").filter(pl.col("expected_ns").is_not_null()).sum().alias("measured"),
    ).row(0)
    summary["roofline_efficiency"] = (
        float(exp_ns) / float(costed_dur_ns) if n_costed and costed_dur_ns else None
    )
    summary["roofline_efficiency_covers"] = cov.costed_share
    steps = _per_step_utilization(steps, peak, model_flops_per_step, n_devices or trace.meta.world_size or max(len(trace.meta.ranks), 1))
    if model_flops_per_step is not None and st:
        from .mfu import Inconsistency, Peak, mfu

        nd = n_devices or trace.meta.world_size or max(len(trace.meta.ranks), 1)
        u = mfu(model_flops_per_step, st, Peak(peak, dom, f"{spec.name}: {reason}", spec.name) if peak else None, nd,
                flops_formula=model_flops_formula)
        if isinstance(u, Inconsistency):
            inconsistencies.append({"what": u.what, "value": u.value, "suspects": list(u.suspects)})
            summary["mfu"] = None
        else:
            summary["mfu"] = u.value
            summary["mfu_note"] = f"{model_flops_formula or 'model FLOPs given'}; {nd} device(s)"
        summary["model_flops_per_step"] = model_flops_per_step
        summary["mfu_devices"] = nd

    above = above_roof(ops)
    if above.height:
        top = (
            above.group_by(pl.coalesce("op", "name").alias("label"))
            .agg(pl.len().alias("count"), pl.col("efficiency").max().alias("max_efficiency"),
                 pl.col("peak_dtype").first(), pl.col("cost_source").first())
            .sort(["count", "label"], descending=[True, False])
        )
        for label, count, eff, pdt, src in top.head(10).iter_rows():
            inconsistencies.append(
                {
                    "what": f"op above its roof (>{ABOVE_ROOF_TOLERANCE:.0%} of roofline)",
                    "op": label,
                    "count": count,
                    "max_efficiency": eff,
                    "suspects": [
                        f"peak taken: {pdt} on {spec.name}",
                        f"FLOP/byte formula ({src})",
                        "kernel duration clipped or concurrent-kernel timing",
                    ],
                }
            )

    # the cross-rank view: only when the analysed ops span ≥ 2 ranks (``--rank`` keeps it off)
    ranks_d = comparison = None
    if rank is None and ops.height and ops["rank"].n_unique() >= 2:
        from .ranks import analyze_ranks, compare_collectives

        comparison = compare_collectives(ops, trace.meta.stats)
        ranks_d = analyze_ranks(ops, steps, trace.meta.stats, comparison)

    from .findings import FindingContext, run_detectors

    ctx = FindingContext(ops=ops, host=host, steps=steps, chip=spec, meta=trace.meta,
                         cache={"ranks": ranks_d, "rank_comparison": comparison})
    found = run_detectors(ctx, findings)

    chip_d = {
        "key": spec.key,
        "name": spec.name,
        "reason": reason,
        "peak_flops_per_s": dict(spec.peak_flops_per_s),
        "hbm_bytes_per_s": spec.hbm_bytes_per_s,
        "hbm_bytes": spec.hbm_bytes,
        "ridge_point_bf16": spec.ridge_point("bf16") if spec.peak("bf16") else None,
        "launch_overhead_ns": spec.launch_overhead_ns,
        "sources": dict(spec.sources),
        "peak_source": spec.source("peak_flops_per_s"),
        "hbm_source": spec.source("hbm_bytes_per_s"),
    }
    trace_peaks = [d for d in trace.meta.devices if d.peak_flops_per_s or d.peak_hbm_bytes_per_s]
    if trace_peaks:
        d0 = trace_peaks[0]
        chip_d["trace_says"] = {
            "device": d0.name,
            "peak_flops_per_s": d0.peak_flops_per_s,
            "peak_hbm_bytes_per_s": d0.peak_hbm_bytes_per_s,
        }
    meta = trace.meta
    trace_d = {
        "format": meta.format,
        "sources": meta.sources,
        "ranks": meta.ranks,
        "world_size": meta.world_size,
        "devices": sorted({d.name for d in meta.devices}),
        "synthetic": meta.synthetic,
        "device_ops": int(ops.height),
        "device_time_ns": int(ops["dur_ns"].sum() or 0),
        "host_events": int(host.height),
        "stats": meta.stats,
        "versions": meta.versions,
        "record_shapes": meta.record_shapes,
    }
    kernel_ns = cov.device_ns
    coverage_d = {
        "device_time_ns": kernel_ns,
        "by_source_ns": dict(sorted(cov.by_source_ns.items())),
        "costed_share": cov.costed_share,
        "shapes_share": cov.share("shapes"),
        "trace_share": cov.share("trace"),
        "linked_device_time_ns": cov.linked_ns,
        "linked_costed_share": cov.linked_costed_share,
        "split_ops": cov.split_ops,
        "uncosted_top": cov.uncosted_top,
    }
    warnings = list(meta.warnings)
    if ops.height and cov.costed_share < 0.999:
        unk = 1.0 - cov.costed_share
        msg = f"{unk:.0%} of device time has no cost model (no FLOPs/bytes)"
        if cov.uncosted_top:
            msg += "; largest: " + ", ".join(f"{_short(n)} ({ns / 1e6:.3g} ms)" for n, ns in cov.uncosted_top[:3])
        warnings.append(msg)
    if meta.format == "kineto" and ops.height and not meta.record_shapes and cov.share("shapes") == 0:
        warnings.append(
            "no shapes recorded: re-run torch.profiler with record_shapes=True to get FLOPs and "
            "bytes per op"
        )
    return Report(
        trace=trace_d, chip=chip_d, coverage=coverage_d, summary=summary, steps=steps,
        ranking=ranking, ops=ops, warnings=warnings, inconsistencies=inconsistencies,
        filters={"rank": rank, "step": step, "group_by": group_by},
        findings=[f.to_dict() for f in found], ranks=ranks_d,
    )


def _per_step_utilization(steps: pl.DataFrame, peak: float | None, model_flops: float | None, n_devices: int) -> pl.DataFrame:
    """Add ``hfu`` (op-table FLOPs per device) and ``mfu`` (model FLOPs over all devices) per step.

    Values above 1.0 are set to null here; the summary reports them as inconsistencies.
    """
    if not peak or steps.height == 0:
        return steps.with_columns(pl.lit(None, dtype=pl.Float64).alias("hfu"), pl.lit(None, dtype=pl.Float64).alias("mfu"))
    wall_s = pl.col("wall_ns").cast(pl.Float64) * 1e-9
    hfu = pl.col("flops") / pl.col("devices") / wall_s / peak
    mfu = (pl.lit(model_flops) / wall_s / (peak * n_devices)) if model_flops is not None else pl.lit(None, dtype=pl.Float64)
    return steps.with_columns(
        pl.when(hfu <= 1.0).then(hfu).alias("hfu"),
        pl.when(mfu <= 1.0).then(mfu).cast(pl.Float64).alias("mfu"),
    )


def _no_device_ops(trace: Trace) -> Report:
    """A CPU-only (or metadata-only) trace: nothing to put against a roofline."""
    import polars as pl

    from .steps import STEP_SCHEMA

    meta = trace.meta
    warnings = list(meta.warnings)
    msg = "no device ops (kernels, memcpy, memset) in the trace: nothing to put against a roofline"
    if msg not in warnings:
        warnings.insert(0, msg)
    return Report(
        trace={
            "format": meta.format, "sources": meta.sources, "ranks": meta.ranks,
            "world_size": meta.world_size, "devices": sorted({d.name for d in meta.devices}),
            "synthetic": meta.synthetic, "device_ops": 0, "device_time_ns": 0,
            "host_events": int(trace.host.height), "stats": meta.stats, "versions": meta.versions,
            "record_shapes": meta.record_shapes,
        },
        chip={},
        coverage={"device_time_ns": 0, "costed_share": None, "shapes_share": None, "trace_share": None},
        summary={"steps": 0},
        steps=pl.DataFrame(schema=STEP_SCHEMA),
        ranking=pl.DataFrame(),
        ops=trace.ops,
        warnings=warnings,
    )


def _short(name: str, n: int = 60) -> str:
    return name if len(name) <= n else name[: n - 1] + "…"
