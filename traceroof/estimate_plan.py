"""Everything ``traceroof estimate`` computes for one set of options, as one value:
:func:`plan_estimate` takes the options (the command line passes them as they are) and returns
an :class:`EstimatePlan` holding the per-token numbers (:class:`~traceroof.estimate.Estimate`),
the memory per device, and, when asked for, the training totals, the parallel layout (given or
searched) and the serving plan. Pure: no printing, no files.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from .errors import UsageError
from .estimate import DEFAULT_HBM_UTILIZATION, Estimate, estimate
from .estimate_memory import (
    InferenceMemory,
    Layout,
    TrainingMemory,
    inference_memory,
    training_memory,
)
from .estimate_parallel import ParallelPlan, plan_layout, search_layouts
from .estimate_serve import ServingPlan, serving_plan
from .estimate_train import TrainingPlan, training_plan
from .model import ModelConfig

__all__ = ["EstimatePlan", "plan_estimate", "PLAN_SCHEMA_VERSION"]

PLAN_SCHEMA_VERSION = 2


@dataclass(frozen=True)
class EstimatePlan:
    """The sections of one ``estimate`` run; a section not asked for is None.
    ``search_tried`` / ``search_rejected`` count the layouts ``--search`` tried and those that
    did not fit or could not take the batch (``layouts`` holds the rest, fastest first)."""

    estimate: Estimate
    training_memory: TrainingMemory
    inference_memory: InferenceMemory
    training: TrainingPlan | None = None
    parallel: ParallelPlan | None = None
    layouts: tuple[ParallelPlan, ...] = ()
    search_tried: int = 0
    search_rejected: int = 0
    serving: ServingPlan | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        """The estimate's JSON (``estimate_schema_version`` 2): the per-token numbers as in
        version 1, plus one key per section (null when not asked for)."""
        out = self.estimate.to_dict()
        out["estimate_schema_version"] = PLAN_SCHEMA_VERSION
        out["memory"] = {"training": self.training_memory.to_dict(),
                         "inference": self.inference_memory.to_dict()}
        out["training"] = None if self.training is None else self.training.to_dict()
        out["parallel"] = None if self.parallel is None else self.parallel.to_dict()
        out["search"] = None if not self.search_tried else {
            "tried": self.search_tried, "rejected": self.search_rejected,
            "layouts": [p.to_dict() for p in self.layouts]}
        out["serving"] = None if self.serving is None else self.serving.to_dict()
        out["notes"] = list(self.estimate.notes) + list(self.notes)
        return out


def _layout(opts: dict[str, int | None]) -> Layout:
    return Layout(**{k: (v if v is not None else 1) for k, v in opts.items()})


def _check_unused(*, training: bool, search: bool, layout: bool, serving: bool,
                  chips: int | None, mfu: float | None, price: float | None,
                  global_batch: float | None) -> None:
    """Raises UsageError for an option no asked-for section uses (nothing is ignored
    silently): --chips needs training totals or --search; --mfu training or a layout;
    --price-per-chip-hour training or serving; --global-batch-tokens a layout or --search."""
    unused = []
    if chips is not None and not (training or search):
        unused.append("--chips (used by --tokens/--hours and --search)")
    if mfu is not None and not (training or search or layout):
        unused.append("--mfu (used by --tokens/--hours, a layout and --search)")
    if price is not None and not (training or serving):
        unused.append("--price-per-chip-hour (used by --tokens/--hours and --serve)")
    if global_batch is not None and not (search or layout):
        unused.append("--global-batch-tokens (used by a layout and --search)")
    if unused:
        raise UsageError("no section uses " + "; ".join(unused))


def _parallel(cfg: ModelConfig, chip: Any, lay: Layout, *, search: bool, serving: bool,
              n_chips: int | None, peak_flops_per_s: float, global_batch_tokens: float | None,
              seq_len: int, mfu: float | None, recompute: str,
              hbm_utilization: float) -> tuple[ParallelPlan | None, list[ParallelPlan], int, int]:
    """The parallel section: (the layout's plan, the searched layouts, tried, rejected). A
    layout given with serving and no training batch is the serving group: no training step.

    Raises:
        UsageError: a layout or --search without --global-batch-tokens, --search without
            --chips."""
    if not (search or (lay.chips > 1 and (global_batch_tokens is not None or not serving))):
        return None, [], 0, 0
    if global_batch_tokens is None:
        raise UsageError("a layout (--tp/--pp/--dp/--fsdp/--ep/--cp) or --search needs "
                         "--global-batch-tokens (tokens per optimizer step, all chips)")
    kw: dict[str, Any] = dict(peak_flops_per_s=peak_flops_per_s,
                              global_batch_tokens=global_batch_tokens, seq_len=seq_len,
                              mfu=mfu or 1.0, recompute=recompute,
                              hbm_utilization=hbm_utilization)
    if not search:
        return plan_layout(cfg, chip, lay, **kw), [], 0, 0
    if n_chips is None:
        raise UsageError("--search needs --chips (how many chips to lay out)")
    found, tried, rejected = search_layouts(cfg, chip, n_chips, **kw)
    return None, found, tried, rejected


def plan_estimate(cfg: ModelConfig, chip: Any, *, seq_len: int = 4096, batch: int = 1,
                  dtype: str = "bf16", weight_dtype: str | None = None,
                  kv_dtype: str | None = None, kv_budget_bytes: float | None = None,
                  tokens: float | None = None, hours: float | None = None,
                  chips: int | None = None, mfu: float | None = None,
                  price_per_chip_hour_usd: float | None = None,
                  layout: dict[str, int | None] | None = None, search: bool = False,
                  global_batch_tokens: float | None = None, recompute: str = "selective",
                  serve: bool = False, prompt_tokens: int | None = None,
                  tpot_target_s: float | None = None,
                  hbm_utilization: float = DEFAULT_HBM_UTILIZATION) -> EstimatePlan:
    """Run every section the options ask for (see docs/estimate.md for each).

    ``layout`` maps tp/pp/dp/fsdp/ep/cp/micro_batch to a degree (None = 1). Training totals
    run with ``tokens`` or ``hours`` (and need ``mfu``, and ``chips`` or a layout); the parallel
    section with a layout of more than one chip or ``search`` (both need
    ``global_batch_tokens``); serving with ``serve``, ``prompt_tokens`` or ``tpot_target_s``.

    Raises:
        UsageError: a missing or contradictory option (the message names it).
    """
    _check_unused(training=tokens is not None or hours is not None, search=search,
                  layout=any((v or 1) > 1 for k, v in (layout or {}).items() if k != "micro_batch"),
                  serving=serve or prompt_tokens is not None or tpot_target_s is not None,
                  chips=chips, mfu=mfu, price=price_per_chip_hour_usd,
                  global_batch=global_batch_tokens)
    est = estimate(cfg, chip, seq_len=seq_len, batch=batch, dtype=dtype, kv_dtype=kv_dtype,
                   weight_dtype=weight_dtype, hbm_utilization=hbm_utilization,
                   kv_budget_bytes=kv_budget_bytes)
    chip_spec = chip
    if isinstance(chip, str):
        from .chips import get_chip

        chip_spec = get_chip(chip)
    lay = _layout(layout or {})
    if chips is not None and lay.chips > 1 and chips != lay.chips and not search:
        raise UsageError(f"--chips {chips} disagrees with the layout's tp·pp·cp·dp·fsdp = "
                         f"{lay.chips}")
    n_chips = chips if chips is not None else (lay.chips if lay.chips > 1 else None)
    peak = est.peak.flops_per_s
    train = None
    if tokens is not None or hours is not None:
        if mfu is None:
            raise UsageError("--tokens/--hours need --mfu (a fraction: 0.40 = 40 %)")
        if n_chips is None:
            raise UsageError("--tokens/--hours need --chips (or a layout: --tp/--pp/--dp/...)")
        train = training_plan(cfg, peak, chips=n_chips, mfu=mfu, seq_len=seq_len, tokens=tokens,
                              hours=hours, price_per_chip_hour_usd=price_per_chip_hour_usd)
    tmem = training_memory(cfg, lay, seq_len=seq_len, hbm_bytes=est.hbm_bytes,
                           hbm_utilization=hbm_utilization, recompute=recompute)  # type: ignore[arg-type]
    imem = inference_memory(cfg, weight_bytes=est.weight_bytes,
                            kv_bytes_per_sequence=est.kv_bytes_per_sequence, batch=batch,
                            seq_len=seq_len, hbm_bytes=est.hbm_bytes, tp=lay.tp,
                            hbm_utilization=hbm_utilization)
    serving_asked = serve or prompt_tokens is not None or tpot_target_s is not None
    parallel, found, tried, rejected = _parallel(
        cfg, chip_spec, lay, search=search, serving=serving_asked, n_chips=n_chips,
        peak_flops_per_s=peak, global_batch_tokens=global_batch_tokens, seq_len=seq_len,
        mfu=mfu, recompute=recompute, hbm_utilization=hbm_utilization)
    serving = None
    if serving_asked:
        serving = serving_plan(
            cfg, position=seq_len, prompt_tokens=prompt_tokens or seq_len,
            bytes_per_param=est.bytes_per_param, weight_dtype=est.weight_dtype,
            kv_dtype=est.kv_dtype, peak_flops_per_s=peak, hbm_bytes_per_s=est.hbm_bytes_per_s,
            hbm_bytes=est.hbm_bytes, tp=lay.tp, hbm_utilization=hbm_utilization,
            kv_budget_bytes=kv_budget_bytes, tpot_target_s=tpot_target_s,
            price_per_chip_hour_usd=price_per_chip_hour_usd)
    if parallel is not None or found:
        # the single-device note ("... do not fit in one device's HBM: shard them") is about
        # the per-token numbers; with a layout, the memory per device under it says what fits
        est = dataclasses.replace(est, notes=tuple(
            n if not n.endswith(": shard them") else
            n.replace(": shard them", ": the single-device numbers (KV budget, sequences that fit) assume "
                      "them unsharded; the parallel section gives the memory per device of the layout")
            for n in est.notes))
    return EstimatePlan(estimate=est, training_memory=tmem, inference_memory=imem,
                        training=train, parallel=parallel, layouts=tuple(found),
                        search_tried=tried, search_rejected=rejected, serving=serving)
