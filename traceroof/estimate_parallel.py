"""Parallel training layouts for ``traceroof estimate --tp/--pp/--dp/--fsdp/--ep/--cp`` and
``--search``: per-step communication volume and time of every collective, on the link it runs
on, the pipeline bubble, what each strategy needs to stay compute-bound, and the fastest layout
that fits in memory.

Cost model (docs/estimate.md, "Parallelism"; the JAX scaling book, Austin et al. 2025,
"How to Parallelize a Transformer for Training"):

* an all-gather or a reduce-scatter of an array of B bytes costs B / bandwidth, an
  all-reduce 2·B / bandwidth (ring: reduce-scatter + all-gather), whatever the shard count;
  an all-to-all B·(n−1)/n / bandwidth (the share that leaves the device);
* a group runs on the scale-up link (NVLink, ICI; ``intra_node_bytes_per_s``) when it fits in
  one scale-up domain, else on the network (``inter_node_bytes_per_s``). Ranks are placed tp
  innermost, then cp, ep (inside the data-parallel ranks), fsdp, dp, and pp outermost (the
  Megatron-LM order), so a group spans the product of its own and the inner degrees;
* pipeline bubble = (pp − 1) / m of the compute time with m micro-batches (1F1B or GPipe:
  Narayanan et al. 2021, arXiv:2104.04473, §2.2);
* step time = compute + bubble + the exposed communication: tensor-parallel, expert and
  pipeline transfers sit on the critical path; data-parallel, FSDP and context-parallel
  transfers overlap the compute and show only what exceeds it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import UsageError
from .estimate_memory import (
    Layout,
    Recompute,
    TrainingMemory,
    expert_params,
    training_memory,
)
from .model import ModelConfig, flops_per_token, param_counts
from .roofline import scale_up_domain

__all__ = ["Collective", "Threshold", "ParallelPlan", "plan_layout", "search_layouts"]

BF16 = 2


@dataclass(frozen=True)
class Collective:
    """One kind of transfer in one step, per device: ``count`` collectives of ``bytes_each``
    bytes (the array operated on) on ``link`` at ``bytes_per_s`` (None: unknown bandwidth);
    ``time_s`` = count × cost factor × bytes / bandwidth; ``exposed`` says whether it sits
    on the critical path."""

    strategy: str
    kind: str
    count: float
    bytes_each: float
    factor: float
    link: str
    bytes_per_s: float | None
    exposed: bool
    formula: str

    @property
    def bytes_total(self) -> float:
        return self.count * self.bytes_each

    @property
    def time_s(self) -> float | None:
        if self.bytes_per_s is None:
            return None
        return self.count * self.factor * self.bytes_each / self.bytes_per_s

    def to_dict(self) -> dict[str, Any]:
        return {"strategy": self.strategy, "kind": self.kind, "count": self.count,
                "bytes_each": self.bytes_each, "bytes_total": self.bytes_total,
                "cost_factor": self.factor, "link": self.link,
                "link_bytes_per_s": self.bytes_per_s, "time_s": self.time_s,
                "exposed": self.exposed, "formula": self.formula}


@dataclass(frozen=True)
class Threshold:
    """What ``strategy`` needs to stay compute-bound: ``quantity`` must be at least (or, with
    ``at_most``, at most) ``limit``; ``value`` is what the layout has (None: not used)."""

    strategy: str
    quantity: str
    limit: float | None
    value: float | None
    at_most: bool
    formula: str

    @property
    def met(self) -> bool | None:
        if self.limit is None or self.value is None:
            return None
        return self.value <= self.limit if self.at_most else self.value >= self.limit

    def to_dict(self) -> dict[str, Any]:
        return {"strategy": self.strategy, "quantity": self.quantity, "limit": self.limit,
                "value": self.value, "at_most": self.at_most, "met": self.met,
                "formula": self.formula}


@dataclass(frozen=True)
class ParallelPlan:
    """One layout's step: ``compute_s`` (step FLOPs / (chips × peak × mfu)), ``bubble_s``,
    the collectives, ``exposed_comm_s`` and ``step_s`` (None when a link bandwidth is
    unknown), the memory per device and the compute-bound thresholds."""

    layout: Layout
    global_batch_tokens: float
    seq_len: int
    micro_batches: int
    step_flops: float
    compute_s: float
    bubble_s: float
    collectives: tuple[Collective, ...]
    thresholds: tuple[Threshold, ...]
    memory: TrainingMemory
    mfu: float

    @property
    def exposed_comm_s(self) -> float | None:
        times = [c.time_s for c in self.collectives]
        if any(t is None for t in times):
            return None
        on_path = sum(c.time_s or 0.0 for c in self.collectives if c.exposed)
        overlapped = sum(c.time_s or 0.0 for c in self.collectives if not c.exposed)
        return on_path + max(0.0, overlapped - self.compute_s)

    @property
    def step_s(self) -> float | None:
        e = self.exposed_comm_s
        return None if e is None else self.compute_s + self.bubble_s + e

    def to_dict(self) -> dict[str, Any]:
        return {"layout": self.layout.to_dict(), "global_batch_tokens": self.global_batch_tokens,
                "seq_len_tokens": self.seq_len, "micro_batches": self.micro_batches,
                "step_flops": self.step_flops, "mfu": self.mfu, "compute_s": self.compute_s,
                "bubble_s": self.bubble_s, "exposed_comm_s": self.exposed_comm_s,
                "step_s": self.step_s, "collectives": [c.to_dict() for c in self.collectives],
                "thresholds": [t.to_dict() for t in self.thresholds],
                "memory": self.memory.to_dict()}


def _link(chip: Any, span: int) -> tuple[str, float | None]:
    """(link name, B/s) of a group spanning ``span`` consecutive ranks."""
    if span <= scale_up_domain(chip):
        return "scale-up", chip.intra_node_bytes_per_s
    return "network", chip.inter_node_bytes_per_s


def _spans(lay: Layout) -> dict[str, int]:
    """Consecutive ranks each group spans (tp innermost, then cp, ep, fsdp, dp, pp)."""
    return {"tp": lay.tp, "cp": lay.tp * lay.cp, "ep": lay.tp * lay.cp * lay.ep,
            "fsdp": lay.tp * lay.cp * lay.fsdp, "dp": lay.tp * lay.cp * lay.fsdp * lay.dp,
            "pp": lay.chips}


def _collectives(cfg: ModelConfig, chip: Any, lay: Layout, seq_len: int,
                 m: int) -> list[Collective]:
    """Every transfer of one training step on one device (see the module docstring)."""
    h, sp = cfg.hidden_size, _spans(lay)
    layers = cfg.num_layers / lay.pp
    micro_tokens = lay.micro_batch * seq_len / lay.cp
    p = param_counts(cfg)
    experts = expert_params(cfg)
    dense_shard = BF16 * (p.all - experts) / (lay.tp * lay.pp)
    out: list[Collective] = []

    def add(strategy: str, kind: str, count: float, nbytes: float, factor: float, exposed: bool,
            formula: str) -> None:
        name, bw = _link(chip, sp[strategy])
        out.append(Collective(strategy, kind, count, nbytes, factor, name, bw, exposed, formula))

    if lay.tp > 1:
        add("tp", "all-reduce", 4 * layers * m, BF16 * micro_tokens * h, 2.0, True,
            "4 per layer per micro-batch (2 forward, 2 backward) of [micro-batch, seq/cp, "
            "d_model] bf16")
    if lay.cp > 1:
        kv = cfg.kv_elements_per_token_layer * BF16 * lay.micro_batch * seq_len / lay.tp
        add("cp", "all-gather K,V", 3 * layers * m, kv, 1.0, False,
            "per layer per micro-batch: K,V gathered forward and backward, dK,dV "
            "reduce-scattered")
    if lay.ep > 1:
        n_moe = len(cfg.moe_layers) / lay.pp
        add("ep", "all-to-all", 4 * n_moe * m,
            BF16 * micro_tokens * cfg.num_experts_per_tok * h / lay.tp, (lay.ep - 1) / lay.ep,
            True, "dispatch + combine, forward + backward, per MoE layer per micro-batch: "
            "top-k copies of [tokens, d_model]")
    if lay.pp > 1:
        add("pp", "send/recv", 2 * m, BF16 * micro_tokens * h / lay.tp, 1.0, True,
            "activations forward, gradients backward, per micro-batch per stage boundary")
    if lay.fsdp > 1:
        add("fsdp", "all-gather weights", 2 * m, dense_shard, 1.0, False,
            "ZeRO-3: dense weights gathered for forward and backward of every micro-batch")
        add("fsdp", "reduce-scatter grads", 1, dense_shard, 1.0, False,
            "ZeRO-3: dense gradients reduce-scattered once per step")
    if lay.dp > 1:
        add("dp", "all-reduce grads", 1, dense_shard / lay.fsdp, 2.0, False,
            "DDP: gradients of the dense parameters held, once per step")
    if experts and lay.data_parallel // lay.ep > 1:
        add("dp", "all-reduce expert grads", 1, BF16 * experts / (lay.tp * lay.pp * lay.ep),
            2.0, False, "expert gradients over the ranks holding the same experts")
    return out


def _thresholds(cfg: ModelConfig, chip: Any, peak: float, lay: Layout, seq_len: int,
                m: int) -> list[Threshold]:
    """The compute-bound condition of each strategy (docs/estimate.md derives each); ``peak``
    is the FLOP/s the compute runs at (C = dense peak × MFU), W the group's link B/s."""
    sp = _spans(lay)
    p = param_counts(cfg)
    h = cfg.hidden_size
    per_layer = p.blocks_active / cfg.num_layers
    tokens_rank = m * lay.micro_batch * seq_len

    def bw(strategy: str, span: int | None = None) -> float | None:
        return _link(chip, sp[strategy] if span is None else span)[1]

    def ratio(b: float | None) -> float | None:
        return None if b is None else peak / b

    out = []
    r = ratio(bw("dp", max(sp["dp"], 2 * sp["fsdp"])))
    out.append(Threshold("dp", "tokens per data-parallel rank per step",
                         None if r is None else 2 / 3 * r, tokens_rank if lay.dp > 1 else None,
                         False, "all-reduce 2·2P/W <= compute 6·P·t/C  =>  t >= (2/3)·C/W"))
    r = ratio(bw("fsdp", max(sp["fsdp"], 2 * lay.tp * lay.cp)))
    out.append(Threshold("fsdp", "tokens per micro-batch per rank",
                         r, lay.micro_batch * seq_len if lay.fsdp > 1 else None, False,
                         "2 all-gathers + 1 reduce-scatter 3·2P/W <= 6·P·t/C  =>  t >= C/W"))
    b = bw("tp", max(lay.tp, 2))
    out.append(Threshold("tp", "tensor-parallel degree", None if b is None else
                         6 * per_layer * b / (16 * h * peak), lay.tp if lay.tp > 1 else None, True,
                         "4 all-reduces 4·2·2h/W per token per layer <= 6·P_layer/(tp·C)  =>  "
                         "tp <= 6·P_layer·W / (16·h·C)"))
    b = bw("cp", max(sp["cp"], 2 * lay.tp))
    out.append(Threshold("cp", "context-parallel degree", None if b is None else
                         6 * per_layer * b / (3 * cfg.kv_elements_per_token_layer * BF16 * peak),
                         lay.cp if lay.cp > 1 else None, True,
                         "3 K,V transfers 3·e_kv·2·S/(tp·W) per layer <= 6·P_layer·S/(cp·tp·C)"
                         "  =>  cp <= 6·P_layer·W / (6·e_kv·C)"))
    if cfg.is_moe:
        r = ratio(bw("ep", max(sp["ep"], 2 * sp["cp"])))
        out.append(Threshold("ep", "expert d_ff", None if r is None else 4 / 9 * r,
                             cfg.expert_intermediate_size if lay.ep > 1 else None, False,
                             "4 all-to-alls 4·k·2h/W per token per MoE layer <= expert compute "
                             "6·k·3·h·d_ff_e/C  =>  d_ff_e >= (4/9)·C/W"))
    out.append(Threshold("pp", "micro-batches per step (bubble <= 10 %)",
                         10 * (lay.pp - 1) if lay.pp > 1 else None, m if lay.pp > 1 else None,
                         False, "bubble (pp-1)/m <= 0.1  =>  m >= 10·(pp-1)"))
    return out


def plan_layout(cfg: ModelConfig, chip: Any, layout: Layout, *, peak_flops_per_s: float,
                global_batch_tokens: float, seq_len: int, mfu: float = 1.0,
                recompute: Recompute = "selective",
                hbm_utilization: float = 0.95) -> ParallelPlan:
    """The step of ``cfg`` under ``layout`` on ``chip``: ``global_batch_tokens`` tokens per
    step in sequences of ``seq_len``; compute at ``mfu`` × peak (1.0: the floor).

    Raises:
        UsageError: a layout that cannot hold the model, or fewer sequences per data-parallel
            rank than one micro-batch.
    """
    layout.check(cfg)
    if global_batch_tokens <= 0 or not 0 < mfu <= 1:
        raise UsageError(f"--global-batch-tokens must be positive and --mfu in (0, 1], got "
                         f"{global_batch_tokens} and {mfu}")
    seqs_per_rank = global_batch_tokens / seq_len / layout.data_parallel
    m = int(seqs_per_rank // layout.micro_batch)
    if m < 1:
        raise UsageError(
            f"--global-batch-tokens {global_batch_tokens:,.0f} is {global_batch_tokens / seq_len:g}"
            f" sequences of {seq_len}: fewer than one micro-batch of {layout.micro_batch} for each "
            f"of the dp x fsdp = {layout.data_parallel} data-parallel ranks")
    step_flops = flops_per_token(cfg, seq_len).train * global_batch_tokens
    compute = step_flops / (layout.chips * peak_flops_per_s * mfu)
    mem = training_memory(cfg, layout, seq_len=seq_len, hbm_bytes=float(chip.hbm_bytes),
                          hbm_utilization=hbm_utilization, recompute=recompute)
    return ParallelPlan(
        layout=layout, global_batch_tokens=global_batch_tokens, seq_len=seq_len,
        micro_batches=m, step_flops=step_flops, compute_s=compute,
        bubble_s=(layout.pp - 1) / m * compute,
        collectives=tuple(_collectives(cfg, chip, layout, seq_len, m)),
        thresholds=tuple(_thresholds(cfg, chip, peak_flops_per_s * mfu, layout, seq_len, m)),
        memory=mem, mfu=mfu,
    )


def _candidates(cfg: ModelConfig, chip: Any, chips: int) -> list[Layout]:
    """Layouts tried by :func:`search_layouts`: tp a power of two within the scale-up domain
    dividing the heads, pp dividing the layers, ep (MoE) dividing the experts, the remaining
    ranks all fsdp or all dp; cp 1, micro-batch 1."""
    out = []
    domain = scale_up_domain(chip)
    tps = [t for t in (1, 2, 4, 8, 16, 32, 64) if t <= domain and cfg.num_heads % t == 0]
    for tp in tps:
        for pp in range(1, min(cfg.num_layers, chips) + 1):
            if chips % (tp * pp) or cfg.num_layers % pp:
                continue
            rest = chips // (tp * pp)
            eps = [e for e in range(1, rest + 1) if cfg.is_moe and rest % e == 0
                   and cfg.num_experts % e == 0] or [1]
            for ep in eps:
                out.append(Layout(tp=tp, pp=pp, fsdp=rest, ep=ep))
                if rest > 1:
                    out.append(Layout(tp=tp, pp=pp, dp=rest, ep=ep))
    return out


def search_layouts(cfg: ModelConfig, chip: Any, chips: int, *, peak_flops_per_s: float,
                   global_batch_tokens: float, seq_len: int, mfu: float = 1.0,
                   recompute: Recompute = "selective",
                   hbm_utilization: float = 0.95) -> tuple[list[ParallelPlan], int, int]:
    """Every candidate layout of ``chips`` chips (:func:`_candidates`) that fits in memory,
    fastest step first (unknown step times last), and how many candidates were tried and how
    many did not fit or had too small a batch (counted, never silently dropped).

    Raises:
        UsageError: ``chips`` not positive.
    """
    if chips < 1:
        raise UsageError(f"--chips must be positive, got {chips}")
    fitting, tried, rejected = [], 0, 0
    for lay in _candidates(cfg, chip, chips):
        tried += 1
        try:
            plan = plan_layout(cfg, chip, lay, peak_flops_per_s=peak_flops_per_s,
                               global_batch_tokens=global_batch_tokens, seq_len=seq_len,
                               mfu=mfu, recompute=recompute, hbm_utilization=hbm_utilization)
        except UsageError:
            rejected += 1
            continue
        if plan.memory.fits:
            fitting.append(plan)
        else:
            rejected += 1
    fitting.sort(key=lambda p: (p.step_s is None, p.step_s or 0.0, p.layout.tp * p.layout.pp))
    return fitting, tried, rejected
