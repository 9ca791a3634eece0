"""``analyze``: Trace + chip → Report, as a short pipeline of named stages (DESIGN §1).

The walk of one trace: trace → chip → costs → roofline → steps → findings → report. Each
stage below is a pure function of its inputs returning a table or a typed section
(:mod:`traceroof.sections`); :data:`STAGES` declares them in the order :func:`analyze` runs
them, each once. :func:`load_report` is the one door from "a path, a trace or a report" to a
:class:`Report`, used by ``analyze``, ``gate`` and ``serve``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ContextManager

import polars as pl

from . import frames, graph_replay, units, unlaunched
from . import steps as steps_mod
from .chips import ChipSpec, detect_chip, get_chip
from .costing import Coverage, apply_costs, apply_costs_to
from .errors import UnknownChipError, UsageError
from .findings import Finding
from .graph_replay import Replays
from .host import device_launches, no_device_ops_reason
from .parsers.kineto_vocab import device_family
from .parsers.registry import facts_for
from .rank_prep import segments_of
from .report import Report
from .roofline import (
    above_roof,
    add_roofline,
    group_label_expr,
    rank_ops,
)
from .sections import (
    ChipInfo,
    CoverageInfo,
    Filters,
    GraphInfo,
    InconsistencyInfo,
    RanksInfo,
    SpeedOfLightInfo,
    Summary,
    TraceInfo,
    TraceSays,
    UnlaunchedInfo,
    section_from_dict,
)
from .steps import Segments
from .trace import Trace, TraceMeta
from .utilization import summarize

logger = logging.getLogger(__name__)

#: The stages of :func:`analyze`, in the order it runs them (each exactly once).
STAGES = (
    "resolve_chip",       # chip
    "attribute_replays",  # graph replays: captured ops lent to replayed kernels
    "cost_ops",           # costs (FLOPs, bytes per op) and coverage
    "apply_roofline",     # roofline (expected_ns, bound, gap_ns)
    "segment_steps",      # steps
    "rank_groups",        # ranking
    "summarize",          # summary: step time, HFU, roofline efficiency, MFU
    "check_roofs",        # inconsistencies: ops above their roof
    "compare_ranks",      # ranks (cross-rank view)
    "detect_findings",    # findings
    "light_speed",        # speed of light and the waterfall down to it
    "describe_trace",     # report sections: trace info,
    "describe_chip",      # chip,
    "describe_coverage",  # coverage,
    "collect_warnings",   # warnings
    "check_accounting",   # the accounting rules (docs/accounting.md), violations as warnings
)


# --------------------------------------------------------------------------- stages


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
        cut = truncation(trace.meta)
        if cut:
            raise UnknownChipError(f"{cut}; it names no device (deviceProperties may be in the lost part): "
                                   "pass --chip NAME (see `traceroof chips`)")
        family = device_family(trace.meta.stats)
        if family is not None:
            # recognised, never guessed: the runtime calls say which family, not which chip
            raise UnknownChipError(
                f"an {family} trace (its runtime calls say so) whose header names no device (no "
                "deviceProperties): pass --chip NAME, or --chip path/to/chip.toml for a chip traceroof "
                "does not list (see `traceroof chips`; docs/extending.md, 'A chip')")
        raise UnknownChipError(
            "the trace names no device (no deviceProperties / device plane stats): pass "
            "--chip NAME (see `traceroof chips`)"
        )
    # some formats (XPlane GPU planes) carry no device name, only capability stats: identify
    # those by properties, as the format intends. Kineto's deviceProperties always name the
    # device, so an empty or generic name there stays an error that asks for --chip.
    facts = facts_for(trace.meta.format)
    return detect_chip(trace.meta.devices, allow_property_match=facts.chip_from_properties)


def attribute_replays(trace: Trace, capture_traces: list[str] | None) -> Replays:
    """The replayed CUDA/HIP graph kernels attributed to framework ops
    (:func:`traceroof.graph_replay.attribute`; ``capture_traces``: ``--capture-trace``), and
    the kernels whose launch is not in the trace (:func:`traceroof.unlaunched.attribute`).

    Raises:
        InputNotFoundError: a given capture trace does not exist.
    """
    from .rank_prep import replays_of

    prepared = replays_of(trace)  # done per rank by the processes that read the ranks
    if prepared is not None:
        from .graph_sources import resolve_given

        resolve_given(capture_traces)  # a capture trace given must exist, prepared or not
        return prepared  # type: ignore[return-value]
    replays = graph_replay.attribute(trace.ops, trace.host, list(trace.meta.sources), capture_traces)
    return unlaunched.attribute(replays, trace.host)


@dataclass(frozen=True)
class CostedOps:
    """The op table with ``flops``/``bytes``/``cost_source``, the host table (both limited
    to ``--rank``), and the cost coverage of the whole trace."""

    ops: pl.DataFrame
    host: pl.DataFrame
    coverage: Coverage


def cost_ops(trace: Trace, rank: int | None, replays: Replays | None = None) -> CostedOps:
    """Cost every op (:func:`traceroof.costing.apply_costs`), then keep ``rank`` if given.
    Replayed kernels ``replays`` attributed are costed by the host rows made for them (the
    host table handed on is the trace's own).

    Raises:
        UsageError: ``rank`` is not in the trace.
    """
    from .rank_prep import costs_of

    host = trace.host
    stored = costs_of(trace, replays)  # costed per rank by the processes that read the ranks
    ops, cov = (apply_costs_to(replays.ops, host, trace.meta, stored, replays.shape_rows)
                if replays is not None and (replays.changed or stored is not None) else apply_costs(trace))
    if rank is not None:
        if rank not in set(ops["rank"].unique().to_list()) | set(host["rank"].unique().to_list()):
            raise UsageError(f"--rank {rank}: the trace has ranks {sorted(trace.meta.ranks)}")
        ops = ops.filter(pl.col("rank") == rank)
        host = host.filter(pl.col("rank") == rank)
    return CostedOps(ops, host, cov)


def apply_roofline(ops: pl.DataFrame, spec: ChipSpec) -> pl.DataFrame:
    """The op table with the roofline columns of ``spec`` (DESIGN §2: ``expected_ns``,
    ``bound``, ``gap_ns``, ``efficiency``, ...)."""
    return add_roofline(ops, spec)


def segment_steps(ops: pl.DataFrame, host: pl.DataFrame, meta: TraceMeta, step: int | None,
                  prepared: list[steps_mod.RankSegments] | None = None) -> Segments:
    """Partition the timeline (:func:`traceroof.timeline.partition`) and build the step
    tables; ops, both tables and the buckets limited to ``step`` when it is given. Done per
    rank (:func:`traceroof.steps.segment_rank`) by the processes that read the ranks when
    ``prepared`` holds their results (:func:`traceroof.rank_prep.segments_of`: only when
    they are the whole table's, :func:`traceroof.steps.segments_agree`), else here on the
    whole table; joined by :func:`traceroof.steps.join_segments`.

    Raises:
        UsageError: ``step`` is not in the trace.
    """
    parts = prepared if prepared is not None and step is None else [steps_mod.segment_rank(ops, host, meta, step)]
    return steps_mod.join_segments(ops, parts, meta, step)


def rank_groups(ops: pl.DataFrame, group_by: str) -> pl.DataFrame:
    """The ranking: ops grouped by ``group_by`` (``op`` or ``kernel``), largest gap first."""
    return rank_ops(ops, by=group_by)


def check_roofs(ops: pl.DataFrame, spec: ChipSpec, group_by: str = "op") -> list[InconsistencyInfo]:
    """Ops measured above their roof (efficiency > 1), one inconsistency per label, most ops
    first; labelled as their ranking rows are (``group_by``:
    :func:`~traceroof.roofline.group_label_expr`). Every label is listed (accounting rule 4:
    no efficiency above 100 % goes unexplained); the renderers shorten the list."""
    above = above_roof(ops)
    if not above.height:
        return []
    top = (
        above.group_by(group_label_expr(group_by).alias("label"))
        .agg(pl.len().alias("count"), pl.col("efficiency").max().alias("max_efficiency"),
             pl.col("peak_dtype").first(), pl.col("cost_source").first(),
             # the roof the ops were judged against: compute (a FLOP peak) or memory (bandwidth)
             (pl.col("bound").cast(pl.String) == "compute").any().alias("_compute"))
        .sort(["count", "label"], descending=[True, False])
    )
    return [
        InconsistencyInfo(
            what="op above its roof (>100 % of roofline)",
            op=label, count=count, max_efficiency=eff,
            suspects=_roof_suspects(spec, pdt, src, compute),
        )
        for label, count, eff, pdt, src, compute in top.iter_rows()
    ]


def _roof_suspects(spec: ChipSpec, peak_dtype: str | None, source: str, compute: bool) -> list[str]:
    """What may be wrong when ops ran above their roof: for compute-bound ops the FLOP peak
    taken; for memory-bound ones (and copies: no FLOPs) the bandwidth roof, which traffic
    served from on-chip cache (L2 reuse, a small working set) beats."""
    roof = (f"peak taken: {peak_dtype} on {spec.name}" if compute else
            f"bandwidth roof: {units.bytes_per_s(spec.hbm_bytes_per_s)} HBM on {spec.name}, or a copy's link "
            "(traffic served from L2 / on-chip cache is faster)")
    return [roof, f"FLOP/byte formula ({source})", "kernel duration clipped or concurrent-kernel timing"]


def compare_ranks(ops: pl.DataFrame, steps: pl.DataFrame, meta: TraceMeta,
                  rank: int | None) -> tuple[dict[str, Any] | None, Any]:
    """The cross-rank view and the matched collectives (:mod:`traceroof.ranks`), only when
    the analysed ops span ≥ 2 ranks (``--rank`` keeps it off); else ``(None, None)``."""
    if rank is not None or not ops.height or ops["rank"].n_unique() < 2:
        return None, None
    from .ranks import analyze_ranks, compare_collectives

    comparison = compare_collectives(ops, meta.stats)
    return analyze_ranks(ops, steps, meta.stats, comparison, labels=meta.rank_labels), comparison


def detect_findings(ops: pl.DataFrame, host: pl.DataFrame, steps: pl.DataFrame, spec: ChipSpec,
                    meta: TraceMeta, ranks: dict[str, Any] | None, rank_comparison: Any,
                    names: list[str] | None, captures: pl.DataFrame | None = None) -> tuple[list[Finding], list[str]]:
    """Run the detectors ``names`` (default: all), largest recoverable time first; returns
    the findings and the detectors' warnings (what they left out, :attr:`FindingContext.warnings`).
    The detectors' shared results (cross-rank view, matched collectives, the graph-capture
    windows ``captures`` the timeline found) are handed over here.

    The detectors see the device time the summary accounts (rule 2): ops off the recorded
    timeline never; and on a rank with steps only the ops in its steps (and under graph
    capture), so no finding claims idle or time in what the header reports as before the
    first step / after the last, and shares are of the steps' time."""
    from .findings import FindingContext, run_detectors

    if "bucket" in ops.columns:
        b = pl.col("bucket")
        stepped = (b == "step") & pl.col("step").is_not_null()
        keep = ops.select(b.is_in(["step", "graph_capture"]) | (b.is_in(["before_first_step", "after_last_step"])
                                                                & ~stepped.any().over("rank")))[:, 0]
        ops = _kept_rows(ops, keep.fill_null(False))
    ctx = FindingContext(ops=ops, host=host, steps=steps, chip=spec, meta=meta,
                         ranks=ranks, rank_comparison=rank_comparison, captures=captures)
    found = run_detectors(ctx, names)
    return found, list(ctx.warnings)


def _kept_rows(ops: pl.DataFrame, keep: pl.Series) -> pl.DataFrame:
    """The rows of ``ops`` where ``keep`` (Boolean, no nulls): ``ops`` itself when every row is
    kept, a slice (no copy) when the kept rows are one run of positions (one rank whose ops
    before the first / after the last step are left out), a filter (a copy of every column)
    otherwise. Session 8: the filter was the 1 GB trace's peak, +84 MB."""
    idx = keep.arg_true()
    if idx.len() == ops.height:
        return ops
    if idx.len() and int(idx[-1]) - int(idx[0]) + 1 == idx.len():
        return ops.slice(int(idx[0]), idx.len())
    return ops.filter(keep)


def light_speed(ops: pl.DataFrame, seg: Segments, steps: pl.DataFrame, summary: Summary,
                found: list[Finding], ranking: pl.DataFrame) -> SpeedOfLightInfo | None:
    """The step's speed of light and the waterfall to it (:mod:`traceroof.waterfall`,
    docs/speed-of-light.md); the model floor (model FLOPs per step ÷ (devices × the HFU's dense
    peak), ns) beside it when model FLOPs were given. None without a complete step."""
    from . import speed_of_light, waterfall

    floor = None
    m, h = summary.mfu, summary.hfu
    if m and m.model_flops_per_step and m.devices and h and h.peak_flops_per_s:
        floor = m.model_flops_per_step / (m.devices * h.peak_flops_per_s) * 1e9
    kind_of = dict(zip(ranking["label"].to_list(), ranking["kind"].cast(pl.String).to_list())) if ranking.height else {}
    ds = speed_of_light.device_steps(ops, seg.device_steps, steps, seg.terms)
    return waterfall.build(ds, found, steps, kind_of, floor)


def describe_trace(meta: TraceMeta, ops: pl.DataFrame, host: pl.DataFrame) -> TraceInfo:
    """The trace section: the metadata, and counts of the analysed ops and host events."""
    return TraceInfo(
        format=meta.format, sources=meta.sources, ranks=meta.ranks, world_size=meta.world_size,
        devices=sorted({d.name for d in meta.devices}), synthetic=meta.synthetic,
        device_ops=int(ops.height), device_time_ns=int(ops["dur_ns"].sum() or 0) if ops.height else 0,
        host_events=int(host.height), stats=meta.stats, versions=meta.versions,
        record_shapes=meta.record_shapes,
        rank_labels={str(r): lb for r, lb in sorted(meta.rank_labels.items())} or None,
    )


def describe_chip(spec: ChipSpec, reason: str, meta: TraceMeta) -> ChipInfo:
    """The chip section: ``spec``'s peaks and sources, and what the trace says, if anything."""
    trace_peaks = [d for d in meta.devices if d.peak_flops_per_s or d.peak_hbm_bytes_per_s]
    says = None
    if trace_peaks:
        d0 = trace_peaks[0]
        says = TraceSays(device=d0.name, peak_flops_per_s=d0.peak_flops_per_s,
                         peak_hbm_bytes_per_s=d0.peak_hbm_bytes_per_s)
    return ChipInfo(
        key=spec.key, name=spec.name, reason=reason, peak_flops_per_s=dict(spec.peak_flops_per_s),
        hbm_bytes_per_s=spec.hbm_bytes_per_s, hbm_bytes=spec.hbm_bytes,
        ridge_point_bf16=spec.ridge_point("bf16") if spec.peak("bf16") else None,
        launch_overhead_ns=spec.launch_overhead_ns, sources=dict(spec.sources),
        peak_source=spec.source("peak_flops_per_s"), hbm_source=spec.source("hbm_bytes_per_s"),
        trace_says=says,
    )


def describe_coverage(cov: Coverage, graphs: list[GraphInfo] | None = None,
                      unlaunched_info: UnlaunchedInfo | None = None) -> CoverageInfo:
    """The coverage section (ns, shares of device time) of a costing's :class:`Coverage`,
    with the replayed graphs ``graphs`` (:mod:`traceroof.graph_replay`) and the kernels
    with no launch in the trace (:mod:`traceroof.unlaunched`), if any."""
    return CoverageInfo(
        device_time_ns=cov.device_ns, by_source_ns=dict(sorted(cov.by_source_ns.items())),
        costed_share=cov.costed_share, shapes_share=cov.share("shapes"), trace_share=cov.share("trace"),
        linked_device_time_ns=cov.linked_ns, linked_costed_share=cov.linked_costed_share,
        kernel_time_ns=cov.kernel_ns,
        split_ops=cov.split_ops, uncosted_top=cov.uncosted_top,
        uncosted_families=cov.families() or None,
        bytes_only_share=cov.bytes_only_share if cov.bytes_only_ns else None,
        graphs=graphs or None, unlaunched=unlaunched_info,
    )


def truncation(meta: TraceMeta) -> str | None:
    """The reader's warning that a file is truncated (the first, when several are), or None."""
    return next((w for w in meta.warnings if _TRUNCATED in w), None)


_TRUNCATED = ": trace is truncated at byte "


def _truncated_first(warnings: list[str]) -> list[str]:
    """``warnings`` with the truncation warnings first: every other number stands on them."""
    return [w for w in warnings if _TRUNCATED in w] + [w for w in warnings if _TRUNCATED not in w]


def collect_warnings(meta: TraceMeta, ops: pl.DataFrame, cov: Coverage) -> list[str]:
    """The parse warnings (a truncated file's first), plus what the costing could not cover
    and how to get more."""
    warnings = _truncated_first(list(meta.warnings))
    if ops.height and cov.device_ns and cov.costed_share < 0.999:  # no device time: no share to cost
        unk = 1.0 - cov.costed_share
        msg = f"{unk:.0%} of device time has no cost model (no FLOPs/bytes)"
        fams = cov.families(examples=1)
        if fams:
            msg += "; by family: " + "; ".join(
                f"{f['kind']} {f['device_time_ns'] / cov.device_ns:.1%} ({f['why']}; e.g. {units.short(f['examples'][0], 50)})"
                for f in fams[:3])
        warnings.append(msg)
    if cov.group_size_assumed_ns and cov.device_ns:
        warnings.append(
            f"collectives ({cov.group_size_assumed_ns / cov.device_ns:.1%} of device time) recorded no group size: "
            f"their ring factor assumes the whole world (world size {meta.world_size})")
    hint = facts_for(meta.format).shapes_hint
    if hint and ops.height and not meta.record_shapes and cov.share("shapes") == 0:
        warnings.append(hint)
    return warnings


def mfu_above_hfu(summary: Summary, cov: CoverageInfo) -> list[str]:
    """A warning when MFU (model FLOPs) is above HFU (the FLOPs the op table counted): the
    model config or tokens per step do not match the trace (MFU counts a subset of the work
    HFU counts: no recomputation, no extra ops), unless the op table leaves FLOPs unknown
    (ops without a cost model, or costed by bytes alone), which the warning says."""
    mfu = summary.mfu.value if summary.mfu is not None else None
    hfu = summary.hfu.value if summary.hfu is not None else None
    if mfu is None or hfu is None or mfu <= hfu:
        return []
    unknown = cov.flops_unknown_share or 0.0
    why = (f"; or the op table's FLOPs are short: they are unknown for {unknown:.1%} of device time"
           if unknown > 0.01 else "")
    return [f"MFU ({mfu:.1%}) is above HFU ({hfu:.1%}): the model FLOPs per step (--model, --tokens-per-step, "
            f"--mode) do not match the trace, which ran fewer FLOPs than the model config says{why}"]


def check_accounting(report: Report) -> Report:
    """``report`` with one warning per accounting violation (:func:`traceroof.accounting.check`,
    a few lines per rule with a count; docs/accounting.md) appended to its warnings."""
    from .accounting import check, warnings_for

    report.warnings.extend(w for w in warnings_for(check(report)) if w not in report.warnings)
    return report


# --------------------------------------------------------------------------- analyze


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
    capture_traces: list[str] | None = None,
) -> Report:
    """Cost every op, put it against the chip's roofline, rank the ops by lost time.

    Runs the :data:`STAGES`, each once, in order.

    Args:
        trace: from :func:`traceroof.read_trace`.
        chip: a chip name/alias, a path to a chip TOML, a :class:`ChipSpec`, or None to
            detect it from the trace.
        rank: keep only this rank.
        step: keep only this step (``ProfilerStep#N`` number).
        group_by: ``op`` (framework op, else kernel name) or ``kernel``; default: the
            format's (``op`` for Kineto, ``kernel``, the HLO instruction, for XPlane, whose
            ``op`` is only the HLO opcode: every fusion would be one row).
        model_flops_per_step: model FLOPs of one step of the whole job (all devices), for
            MFU (:func:`traceroof.model.model_flops_per_step`); None → no MFU.
        model_flops_formula: how those FLOPs were computed (shown with the MFU).
        n_devices: devices the job ran on, for MFU (default: world size, else the number of
            ranks in the trace).
        findings: detector names to run (default: all registered detectors).
        capture_traces: CUDA-graph capture traces (files or folders) to attribute graph
            replays from (:mod:`traceroof.graph_replay`); None: those in ``capture_traces/``
            / ``graph_capture_profile/`` beside the trace's files; ``[]``: none.

    Returns:
        A :class:`Report`.

    Raises:
        UnknownChipError: the chip cannot be resolved.
        UsageError: ``rank``/``step`` not present in the trace.
        InputNotFoundError: a capture trace given does not exist.
    """
    if trace.ops.height == 0:
        return _no_device_ops(trace, chip)
    with frames.engine_for(trace.ops.height + trace.host.height):  # in-memory for a small trace
        meta = trace.meta
        spec, reason = resolve_chip(trace, chip)
        replays = attribute_replays(trace, capture_traces)
        costed = cost_ops(trace, rank, replays)
        ops = apply_roofline(costed.ops, spec)
        # the costed op table is not held past its roofline copy (each stage's table is a new
        # copy of every column on polars' default engine: ~40 MB a copy on the 1 GB trace)
        host, cov = costed.host, costed.coverage
        del costed
        seg = segment_steps(ops, host, meta, step, segments_of(trace, spec, rank, ops))
        ops, steps = seg.ops, seg.steps
        group_by = group_by or facts_for(meta.format).default_group_by
        ranking = rank_groups(ops, group_by)
        util = summarize(ops, steps, spec, reason, meta, cov, model_flops_per_step,
                         model_flops_formula, n_devices, seg.timeline, seg.device_steps)
        above = check_roofs(ops, spec, group_by)
        ranks, comparison = compare_ranks(ops, util.steps, meta, rank)
        found, found_warnings = detect_findings(ops, host, util.steps, spec, meta, ranks, comparison, findings,
                                                seg.captures)
        light = light_speed(ops, seg, util.steps, util.summary, found, ranking)
        trace_info, chip_info = describe_trace(meta, ops, host), describe_chip(spec, reason, meta)
        coverage = describe_coverage(cov, replays.graphs, replays.unlaunched)
        return check_accounting(Report(
            trace=trace_info, chip=chip_info, coverage=coverage, summary=util.summary, steps=util.steps,
            ranking=ranking, ops=ops,
            warnings=unlaunched.replace_warning(graph_replay.replace_warning(
                collect_warnings(meta, ops, cov), replays), replays, cov.device_ns)
            + mfu_above_hfu(util.summary, coverage) + found_warnings,
            inconsistencies=util.inconsistencies + above, findings=found,
            filters=Filters(rank=rank, step=step, group_by=group_by),
            ranks=section_from_dict(RanksInfo, ranks, strict=True) if ranks is not None else None,
            speed_of_light=light,
        ))


def load_report(
    source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | Trace | Report,
    chip: str | os.PathLike[str] | ChipSpec | None = None,
    *,
    jobs: int | None = None,
    progress: Any = None,
    on_saved: Callable[[Report], None] | None = None,
    analyzing: Callable[[Trace], ContextManager[Any]] | None = None,
    **options: Any,
) -> Report:
    """The one door to a :class:`Report`: a saved report is read, anything else is read as a
    trace and analysed.

    Args:
        source: a report saved with ``analyze -o report.json``; a trace path (file, ``.gz``,
            directory, cache, glob) or several of them (the ranks of one job); a
            :class:`Trace`; or a :class:`Report` (returned as is).
        chip: for :func:`analyze` (traces only).
        jobs, progress: for :func:`traceroof.io.read_trace` (processes; a progress bar).
        on_saved: called with a saved report once it is read; raise there to refuse options
            that need a trace.
        analyzing: a context manager factory wrapped around the analysis (CLI progress).
        **options: the other keyword arguments of :func:`analyze`.

    Raises:
        UsageError: a saved report given together with other inputs.
        InputNotFoundError, TraceFormatError, ReportVersionError: unreadable input.
        UnknownChipError, UsageError: from :func:`analyze`.
    """
    if isinstance(source, Report):
        return source
    if isinstance(source, Trace):
        trace = source
    else:
        from .io import read_trace
        from .report import is_report

        paths = [source] if isinstance(source, (str, os.PathLike)) else list(source)
        reports = [p for p in paths if is_report(p)]
        if reports:
            if len(paths) > 1:
                raise UsageError(f"{reports[0]} is a saved report: give it alone, not with other inputs")
            report = Report.load(reports[0])
            if on_saved is not None:
                on_saved(report)
            return report
        # the detectors' and the cross-rank stages' modules loaded while the workers read their last files
        trace = read_trace(paths[0] if len(paths) == 1 else paths, jobs=jobs, progress=progress, prepare=True,
                           while_waiting=_while_waiting, chip=None if isinstance(chip, ChipSpec) else chip)
    with analyzing(trace) if analyzing else contextlib.nullcontext():
        return analyze(trace, chip, **options)


# --------------------------------------------------------------------------- helpers


def _while_waiting() -> None:
    """Called by :func:`traceroof.io.read_trace` once this process has no rank left to read while
    workers read theirs (several inputs only): the modules the analysis of several ranks imports
    on first use (the detectors, ~0.03 s; the cross-rank view, the accounting checks, the speed
    of light and its waterfall, ~0.015 s of CPU) are imported then, off the serial tail that
    follows the last worker result."""
    from . import accounting, ranks, speed_of_light, waterfall  # noqa: F401
    from .findings import _load_builtin

    _load_builtin()


def _no_device_ops(trace: Trace, chip: str | os.PathLike[str] | ChipSpec | None = None) -> Report:
    """A trace without device ops: nothing to put against a roofline, and no step time,
    busy or idle figure (zero device ops say nothing about the device; rule 5). Says which
    kind it is: kernel launches recorded without device activity (the GPU activity was not
    recorded), a CPU-only trace (no launch either), or metadata only. A ``--chip`` given is
    checked (an unknown name still raises :class:`UnknownChipError`) and otherwise unused."""
    if chip is not None:
        resolve_chip(trace, chip)
    meta = trace.meta
    launches = device_launches(trace.host)
    cut = truncation(meta)
    ranges = any("profiler-range mode" in w for w in meta.warnings)
    if cut:
        reason = "the file is truncated: the device ops may be in the part that is lost"
    elif ranges and launches:
        reason = (f"{launches:,} kernel launches / copies recorded, but the kernels were recorded in CUPTI "
                  "profiler-range mode (counters, no execution times)")
    else:
        reason = no_device_ops_reason(trace.host)
    msg = f"no device ops (kernels, memcpy, memset) in the trace; {reason}"
    if chip is not None:
        msg += f"; --chip {chip} is not used: nothing to put against its roofline, no step time, busy or idle"
    warnings = _truncated_first([msg] + [w for w in meta.warnings if "no device ops (kernels, memcpy, memset)" not in w])
    info = describe_trace(meta, trace.ops, trace.host)
    info = dataclasses.replace(info, stats={**info.stats, "device_launches": launches,
                                               "truncated": int(cut is not None), "profiler_ranges": int(ranges)})
    return Report(
        trace=info, chip=None,
        coverage=CoverageInfo(device_time_ns=0), summary=Summary(steps=0),
        steps=pl.DataFrame(schema=steps_mod.STEP_SCHEMA), ranking=pl.DataFrame(),
        ops=trace.ops, warnings=warnings,
    )
