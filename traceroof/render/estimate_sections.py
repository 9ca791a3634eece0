"""The sections of an ``estimate`` plan as rows of text (quantity, value, how) and grids,
shared by the terminal and markdown renderers of :mod:`traceroof.render.estimate`. Only
formatting: every number comes computed from :mod:`traceroof.estimate_plan`."""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import units
from ..estimate_floor import ModelFloor
from ..estimate_memory import RECOMPUTE_MODES, InferenceMemory, TrainingMemory
from ..estimate_parallel import ParallelPlan
from ..estimate_plan import EstimatePlan
from ..estimate_serve import ServingPlan
from ..estimate_train import SECONDS_PER_DAY, TrainingPlan

Row = tuple[str, str, str]


@dataclass(frozen=True)
class Grid:
    """A table of ``headers`` × ``rows``; ``drop`` lists the columns a narrow terminal
    leaves out first; ``how`` says how the columns are computed."""

    title: str
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    drop: tuple[str, ...] = ()
    how: str = ""
    left: int = 1  # leading columns aligned left (the rest, numbers, right)


@dataclass(frozen=True)
class Section:
    title: str
    rows: list[Row]
    grids: list[Grid] = field(default_factory=list)
    after: list[str] = field(default_factory=list)


def _gb(b: float) -> str:
    return f"{b / 1e9:,.2f} GB"


def _days(s: float) -> str:
    return f"{s / SECONDS_PER_DAY:,.1f} days ({s:,.0f} s)"


def _usd(v: float | None) -> str:
    return units.NONE if v is None else f"${v:,.2f}"


def training_section(t: TrainingPlan) -> Section:
    rows: list[Row] = [
        ("tokens", units.count_exact(t.tokens), t.tokens_from),
        ("6·N·T", f"{t.linear_flops:.3e} FLOP", "training FLOPs per token 6N_active x tokens"),
        (f"attention term (S={t.seq_len:,})", f"{t.attention_flops:.3e} FLOP",
         "3 x 4·L·d_attn·(S+1)/2 per token x tokens"),
        ("total FLOPs", f"{t.total_flops:.3e} FLOP", "6·N·T + attention"),
        ("cluster throughput", units.flops_per_s(t.cluster_flops_per_s),
         f"{t.chips:,} chips x {units.flops_per_s(t.peak_flops_per_s)} x MFU {units.pct(t.mfu)}"),
        ("wall-clock", _days(t.wall_clock_s), "total FLOPs / cluster throughput"),
        ("wall-clock, 6·N·T alone", _days(t.wall_clock_linear_only_s),
         "the figure quoted without the attention term"),
        ("chip-hours", f"{t.chip_hours:,.0f} chip-h", "chips x wall-clock / 3600 s"),
        ("cost", _usd(t.cost_usd), "chip-hours x --price-per-chip-hour" if t.cost_usd is not None
         else "unknown: pass --price-per-chip-hour (US dollars)"),
    ]
    return Section(f"Training totals ({t.chips:,} chips, MFU {units.pct(t.mfu)})", rows)


def memory_sections(m: TrainingMemory, inf: InferenceMemory) -> tuple[Section, Section]:
    per = m.activation_per_token_layer_bytes
    rows: list[Row] = [
        ("weights (bf16)", _gb(m.weights_bytes), "2 B x parameters held by the device"),
        ("gradients (bf16)", _gb(m.gradients_bytes), "2 B x parameters held"),
        ("optimizer state", _gb(m.optimizer_bytes),
         f"12 B x parameters held: fp32 master {_gb(m.master_weights_bytes)} + Adam m, v "
         f"{_gb(m.adam_moments_bytes)}"),
    ]
    for mode in RECOMPUTE_MODES:
        rows.append((f"activations per token per layer, {mode}", units.bytes_exact(per[mode]),
                     {"none": "Korthikanti et al. 2022 term by term (34h + 5aS for GPT-style "
                              "with dropout)",
                      "selective": "attention scores recomputed: the 5aS term dropped",
                      "full": "only the layer input kept: 2h"}[mode]))
    for mode in RECOMPUTE_MODES:
        mark = " (used)" if mode == m.recompute else ""
        rows.append((f"activations, {mode}{mark}", _gb(m.activations_bytes[mode]),
                     f"per token per layer / tp x {m.tokens_in_flight:,.0f} tokens in flight x "
                     f"{m.layers_per_stage:g} layers"))
    if m.recompute == "full":
        rows.append(("recompute buffer", _gb(m.recompute_buffer_bytes),
                     "one layer's full activations while it is recomputed"))
    rows += [
        ("logits", _gb(m.logits_bytes), "4·V B (fp32) / tp per token of a micro-batch"),
        ("total per device", _gb(m.total_bytes), f"state + activations ({m.recompute}) + logits"),
        ("usable HBM", _gb(m.usable_bytes), "HBM x utilization"),
        ("fits", "yes" if m.fits else "NO", f"{m.total_bytes / m.usable_bytes:.0%} of usable HBM"),
    ]
    inf_rows: list[Row] = [
        ("weights", _gb(inf.weights_bytes), "weight bytes / tp"),
        (f"KV cache ({inf.batch} x {inf.seq_len:,} tokens)", _gb(inf.kv_cache_bytes),
         "batch x KV per sequence / min(tp, kv_heads)"),
        ("activations (one layer, prefill)", _gb(inf.activations_bytes),
         "selective per-token bytes x batch x S / tp"),
        ("logits", _gb(inf.logits_bytes), "2·V B per sequence (last token)"),
        ("total per device", _gb(inf.total_bytes), "sum"),
        ("fits", "yes" if inf.fits else "NO",
         f"{inf.total_bytes / inf.usable_bytes:.0%} of usable HBM"),
    ]
    title = f"Training memory per device ({m.layout.describe()}, micro-batch " \
            f"{m.layout.micro_batch} x {m.seq_len:,} tokens)"
    return (Section(title, rows, after=list(m.notes)),
            Section(f"Inference memory per device (tp={inf.tp}, batch {inf.batch})", inf_rows))


def _time(v: float | None) -> str:
    return "unknown" if v is None else units.seconds(v)


def parallel_section(p: ParallelPlan) -> Section:
    rows: list[Row] = [
        ("global batch", f"{p.global_batch_tokens:,.0f} tokens",
         f"{units.plural(p.micro_batches, 'micro-batch', 'micro-batches')} of "
         f"{p.layout.micro_batch} x {p.seq_len:,} per data-parallel rank"),
        ("compute", units.seconds(p.compute_s),
         f"step FLOPs {p.step_flops:.3e} / ({p.layout.chips:,} chips x peak"
         + (" x MFU " + units.pct(p.mfu) + ")" if p.mfu < 1 else "): the floor; --mfu scales it")),
        ("pipeline bubble", units.seconds(p.bubble_s), "(pp - 1) / m x compute"),
        ("exposed communication", _time(p.exposed_comm_s),
         "tp, ep, pp transfers + what dp/fsdp/cp transfers exceed the compute"),
        ("step time", _time(p.step_s), "compute + bubble + exposed communication"),
        ("memory per device", _gb(p.memory.total_bytes),
         ("fits" if p.memory.fits else "does NOT fit") + f" in {_gb(p.memory.usable_bytes)}"),
    ]
    grid = Grid(
        "collectives per step and device",
        ("strategy", "collective", "count", "bytes each", "link", "time", "on path"),
        tuple((c.strategy, c.kind, f"{c.count:,.0f}", units.bytes_binary(c.bytes_each), c.link,
               _time(c.time_s), "yes" if c.exposed else "overlap") for c in p.collectives),
        drop=("count", "on path"), left=2,
        how="all-gather, reduce-scatter: bytes / link B/s; all-reduce 2 x; all-to-all "
            "(n-1)/n x; scale-up link inside the domain, network beyond")
    after = [f"{c.strategy} {c.kind}: {c.formula}" for c in p.collectives]
    tgrid = Grid(
        "what each strategy needs to stay compute-bound",
        ("strategy", "quantity", "needs", "layout", "met"),
        tuple((t.strategy, t.quantity,
               units.NONE if t.limit is None else f"{'<=' if t.at_most else '>='} {t.limit:,.1f}",
               units.NONE if t.value is None else f"{t.value:,.0f}",
               units.NONE if t.met is None else ("yes" if t.met else "NO"))
              for t in p.thresholds),
        drop=("layout",), left=2, how="C = peak x MFU, W = the group's link B/s; the derivations are in "
                              "docs/estimate.md")
    return Section(f"Parallel layout: {p.layout.describe()}", rows, [grid, tgrid], after)


def search_section(plan: EstimatePlan, top: int = 8) -> Section:
    found = plan.layouts
    rows: list[Row] = [("layouts tried", f"{plan.search_tried:,}",
                        "tp a power of 2 within the scale-up domain, pp dividing L, rest fsdp or dp"),
                       ("did not fit or take the batch", f"{plan.search_rejected:,}",
                        "memory per device > usable HBM, or < 1 micro-batch per rank")]
    grid = Grid(
        f"fastest {min(top, len(found))} of {len(found)} that fit",
        ("layout", "step", "compute", "bubble", "exposed comm", "memory"),
        tuple((p.layout.describe(), _time(p.step_s), units.seconds(p.compute_s),
               units.seconds(p.bubble_s), _time(p.exposed_comm_s), _gb(p.memory.total_bytes))
              for p in found[:top]),
        drop=("bubble", "compute"))
    after = []
    if found:
        best = found[0]
        worst = max(best.collectives, key=lambda c: c.time_s or 0.0, default=None)
        why = (f"fastest: {best.layout.describe()}, step {_time(best.step_s)} = compute "
               f"{units.seconds(best.compute_s)} + bubble {units.seconds(best.bubble_s)} + "
               f"exposed communication {_time(best.exposed_comm_s)}")
        if worst is not None:
            why += f"; its largest transfer is {worst.strategy} {worst.kind} " \
                   f"({_time(worst.time_s)} on the {worst.link} link)"
        after.append(why)
    else:
        after.append("no layout fits: more chips, full recomputation (--recompute full) or a "
                     "smaller micro-batch")
    return Section("Layout search", rows, [grid], after)


def serving_section(s: ServingPlan) -> Section:
    rows: list[Row] = [
        (f"prefill ({s.prompt_tokens:,}-token prompt)", units.seconds(s.prefill_s),
         f"{s.prefill_bound}-bound: max(FLOPs / (tp·peak), bytes / (tp·HBM bandwidth))"),
        ("KV cache per sequence", units.bytes_exact(s.kv_bytes_per_sequence),
         f"at position S={s.position:,} ({s.kv_dtype})"),
        ("KV budget", _gb(s.kv_budget_bytes), s.kv_budget_source),
        ("max concurrent sequences", f"{s.max_concurrent_sequences:,}",
         "floor(KV budget / KV per sequence)"),
    ]
    if s.tpot_target_s is not None:
        b = s.max_batch_within_tpot or 0
        rows.append((f"largest batch within {s.tpot_target_s * 1e3:g} ms/token", f"{b:,}",
                     "largest B <= concurrency with decode step t(B) <= target" if b else
                     "none: no sequence fits in the KV budget" if not s.max_concurrent_sequences
                     else "none: batch 1 already misses the target"))
        if s.at_max_batch is not None:
            d = s.at_max_batch
            cost = ("cost unknown (no --price-per-chip-hour)" if d.cost_per_million_tokens_usd is None
                    else f"{_usd(d.cost_per_million_tokens_usd)} per M tokens")
            rows.append(("  at that batch", f"{d.tokens_per_s_per_chip:,.0f} tok/s/chip",
                         f"{units.seconds(d.time_s)} per token, {d.tokens_per_s_per_user:,.1f} "
                         f"tok/s per user, {cost}"))
    grid = Grid(
        f"decode at position {s.position:,} (weights {s.weight_dtype}, tp={s.tp})",
        ("batch", "time/token", "bound", "tok/s/user", "tok/s/chip", "$/M tokens"),
        tuple((f"{d.batch:,}", units.seconds(d.time_s), d.bound,
               f"{d.tokens_per_s_per_user:,.1f}", f"{d.tokens_per_s_per_chip:,.0f}",
               _usd(d.cost_per_million_tokens_usd)) for d in s.sweep),
        drop=("$/M tokens", "bound"),
        how="t(B) = max((weights read + B x KV at S) / (tp·HBM B/s), B·(2N + 4·L·d_attn·S) / "
            "(tp·peak)); per user 1/t, per chip B/(t·tp); $ = price x tp / 3600 / (B/t) x 1e6")
    if not s.sweep:
        return Section(f"Serving (tp={s.tp}, position {s.position:,})", rows, after=[
            "no decode sweep: the weights leave no KV budget for one sequence (more --tp, "
            "--weight-dtype int4, or --kv-budget-gb)"])
    return Section(f"Serving (tp={s.tp}, position {s.position:,})", rows, [grid])


def plan_sections(plan: EstimatePlan) -> list[Section]:
    """The sections after the per-token one, in reading order."""
    out: list[Section] = []
    if plan.training is not None:
        out.append(training_section(plan.training))
    out += list(memory_sections(plan.training_memory, plan.inference_memory))
    if plan.parallel is not None:
        out.append(parallel_section(plan.parallel))
    if plan.search_tried:
        out.append(search_section(plan))
    if plan.serving is not None:
        out.append(serving_section(plan.serving))
    return out



def model_floor_section(f: ModelFloor) -> Section:
    """``analyze --model``'s floor: the model floor, the ops' summed roofline time and the
    measured step, and what it means when the floor is above the step."""
    what = ("model FLOPs / (devices x peak); layout communication not included"
            if f.mode == "train" else
            "max(model FLOPs / (devices x peak), weight bytes read / (devices x HBM B/s)); "
            "KV reads not included")
    rows: list[Row] = [
        ("model floor (estimate)", _time(f.floor_s),
         f"{what}; {units.plural(f.n_devices, 'device')}"),
        ("ops' roofline time", _time(f.ops_expected_s),
         "sum of the complete steps' ops' expected_ns per step and device (overlapping streams "
         "add up)" if f.ops_expected_s is not None else "unknown: no costed ops in complete steps"),
        ("measured step", _time(f.measured_step_s), "mean over complete steps")]
    if f.above_measured:
        verdict = ("the model floor is ABOVE the measured step: the model FLOPs count work the "
                   "trace did not run (check --tokens-per-step, --mode, --devices)")
    elif f.above_measured is None or not f.measured_step_s or f.floor_s is None:
        verdict = "floor or step time unknown: no comparison"
    else:
        verdict = f"model floor <= measured step: the floor is {f.floor_s / f.measured_step_s:.0%} of it"
    return Section("Model floor (traceroof estimate) beside the measured step", rows, after=[verdict])
