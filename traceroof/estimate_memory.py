"""Where the memory goes, itemized, for ``traceroof estimate``: training state (weights,
gradients, optimizer), activations (with no, selective or full checkpointing), logits, and the
inference footprint (weights, KV cache, activations), per device under a parallel
:class:`Layout`, and whether it fits.

Sources and conventions (docs/estimate.md, "Memory"):

* Mixed-precision Adam keeps 16 bytes per parameter: bf16 weights 2, bf16 gradients 2, and
  12 of optimizer state (fp32 master weights 4, Adam m 4, v 4): ZeRO, Rajbhandari et al.
  2020, arXiv:1910.02054, §3.1.
* Activations per token and layer follow Korthikanti et al. 2022, "Reducing Activation
  Recomputation in Large Transformer Models" (arXiv:2205.05198), §4: with 2-byte activations
  and dropout, 34·h + 5·a·S bytes per token per layer (h = d_model, a = heads, S = sequence),
  written here term by term so that GQA, gated MLPs, MoE and models without dropout come out
  of the same sum (:func:`activation_bytes_per_token_layer`). Selective recomputation drops
  the 5·a·S attention-score term; full recomputation keeps only the layer input, 2·h.
  Tensor parallelism with sequence parallelism divides all of it by tp (their eq. 5).
* The logits the loss needs: 4·V bytes per token (fp32, Korthikanti §4.3, "4sbv").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from .errors import UsageError
from .model import ModelConfig, ParamCounts, mlp_params, param_counts

__all__ = [
    "Layout", "Recompute", "RECOMPUTE_MODES", "activation_bytes_per_token_layer",
    "expert_params", "TrainingMemory", "training_memory", "InferenceMemory", "inference_memory",
    "WEIGHT_BYTES", "GRADIENT_BYTES", "OPTIMIZER_BYTES", "LOGIT_BYTES_PER_VOCAB",
]

Recompute = Literal["none", "selective", "full"]
RECOMPUTE_MODES: tuple[str, ...] = ("none", "selective", "full")
#: bytes per parameter of mixed-precision Adam (ZeRO §3.1): bf16 weight, bf16 gradient,
#: fp32 master weight + Adam m + Adam v
WEIGHT_BYTES, GRADIENT_BYTES, OPTIMIZER_BYTES = 2, 2, 12
#: fp32 logits per token and vocabulary entry (Korthikanti et al. 2022 §4.3)
LOGIT_BYTES_PER_VOCAB = 4
#: activation bytes per element (bf16)
ACT_BYTES = 2


@dataclass(frozen=True)
class Layout:
    """A parallel layout: tensor (``tp``), pipeline (``pp``), context (``cp``), replicated data
    (``dp``, plain DDP), sharded data (``fsdp``, ZeRO-3: weights, gradients and optimizer state
    sharded) and expert (``ep``) parallel degrees. Chips = tp·pp·cp·dp·fsdp; ``ep`` is carved out
    of the dp·fsdp data-parallel ranks (it must divide their product and the expert count).
    ``micro_batch`` is sequences per micro-batch per data-parallel rank."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    fsdp: int = 1
    ep: int = 1
    cp: int = 1
    micro_batch: int = 1

    @property
    def chips(self) -> int:
        return self.tp * self.pp * self.cp * self.dp * self.fsdp

    @property
    def data_parallel(self) -> int:
        """Ranks that each take a different part of the global batch: dp·fsdp."""
        return self.dp * self.fsdp

    def describe(self) -> str:
        parts = [f"{k}={getattr(self, k)}" for k in ("tp", "pp", "cp", "dp", "fsdp", "ep")
                 if getattr(self, k) > 1]
        return " ".join(parts) or "1 chip (no parallelism)"

    def check(self, cfg: ModelConfig) -> None:
        """Raises UsageError naming the option when the layout cannot hold ``cfg``."""
        for k in ("tp", "pp", "dp", "fsdp", "ep", "cp", "micro_batch"):
            if getattr(self, k) < 1:
                raise UsageError(f"--{k.replace('_', '-')} must be a positive count, got "
                                 f"{getattr(self, k)}")
        if cfg.num_heads % self.tp:
            raise UsageError(f"--tp {self.tp} must divide the {cfg.num_heads} attention heads")
        if self.pp > cfg.num_layers:
            raise UsageError(f"--pp {self.pp} is more stages than the {cfg.num_layers} layers")
        if self.ep > 1:
            if not cfg.is_moe:
                raise UsageError(f"--ep {self.ep} needs a mixture-of-experts model")
            if cfg.num_experts % self.ep or self.data_parallel % self.ep:
                raise UsageError(f"--ep {self.ep} must divide the {cfg.num_experts} experts and "
                                 f"the dp x fsdp = {self.data_parallel} data-parallel ranks")

    def to_dict(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in ("tp", "pp", "cp", "dp", "fsdp", "ep",
                                              "micro_batch")} | {"chips": self.chips}


def expert_params(cfg: ModelConfig) -> int:
    """Parameters of the routed experts (all MoE layers): moe layers × E × 3·d·d_ff_expert."""
    if not cfg.is_moe:
        return 0
    one = mlp_params(cfg.hidden_size, cfg.expert_intermediate_size, True, cfg.mlp_bias)
    return len(cfg.moe_layers) * cfg.num_experts * one


def activation_bytes_per_token_layer(cfg: ModelConfig, seq_len: int,
                                     recompute: Recompute = "none", *,
                                     dropout: bool = False) -> float:
    """Activation bytes one token leaves for the backward pass in one layer (bf16, no
    parallelism), Korthikanti et al. 2022 §4.1 written term by term:

    * attention: QKV input 2h, Q 2·d_attn, K and V 2·d_kv each (MLA: the up-projected K
      2·d_attn and V 2·d_v), output-projection input 2·d_v, + h dropout mask;
    * scores (``recompute="none"`` only): softmax output 2·a·S, + dropout mask a·S and
      dropout output 2·a·S;
    * MLP: input 2h, + 2·d_ff per stored hidden tensor (gated: gate, up and their product, 3;
      standard: the activation's input and output, 2; MoE: top-k experts + shared experts),
      + h dropout mask;
    * the two norms' inputs 2·2h.

    GPT-style (MHA, d_ff = 4h, dropout): 11h + 5aS + 19h + 4h = 34h + 5aS, their eq. 1.
    ``recompute="full"`` keeps only the layer input, 2h.

    Raises:
        UsageError: ``recompute`` not none/selective/full, non-positive ``seq_len``.
    """
    if recompute not in RECOMPUTE_MODES:
        raise UsageError(f"--recompute must be one of {', '.join(RECOMPUTE_MODES)}, got "
                         f"{recompute!r}")
    if seq_len <= 0:
        raise UsageError(f"sequence length must be positive, got {seq_len}")
    b, h = ACT_BYTES, cfg.hidden_size
    if recompute == "full":
        return float(b * h)
    mask = h if dropout else 0
    k_width, v_width = (cfg.d_attn, cfg.d_v) if cfg.is_mla else (cfg.d_kv, cfg.d_kv)
    attention = b * (h + cfg.d_attn + k_width + v_width + cfg.d_v) + mask
    scores = 0
    if recompute == "none":
        window = max((cfg.window_for_layer(i) or seq_len) for i in range(cfg.num_layers))
        keys = min(seq_len, window)
        scores = cfg.num_heads * keys * (b + ((1 + b) if dropout else 0))
    gated = cfg.mlp_type == "gated"
    if cfg.is_moe:
        hidden = 3 * (cfg.num_experts_per_tok * cfg.expert_intermediate_size
                      + cfg.shared_expert_intermediate_size)
    else:
        hidden = (3 if gated else 2) * cfg.intermediate_size
    mlp = b * (h + hidden) + mask
    norms = 2 * b * h
    return float(attention + scores + mlp + norms)


@dataclass(frozen=True)
class TrainingMemory:
    """Training memory of one device, in bytes (``_bytes``), itemized. ``activations_bytes``
    maps each recompute mode to the activations the device holds for it; ``total_bytes``
    uses ``recompute``. ``usable_bytes`` = HBM × utilization; ``fits`` compares the two."""

    layout: Layout
    recompute: str
    seq_len: int
    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    master_weights_bytes: float
    adam_moments_bytes: float
    activation_per_token_layer_bytes: dict[str, float]
    activations_bytes: dict[str, float]
    recompute_buffer_bytes: float
    logits_bytes: float
    tokens_in_flight: float
    layers_per_stage: float
    usable_bytes: float
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def state_bytes(self) -> float:
        return self.weights_bytes + self.gradients_bytes + self.optimizer_bytes

    @property
    def total_bytes(self) -> float:
        extra = self.recompute_buffer_bytes if self.recompute == "full" else 0.0
        return self.state_bytes + self.activations_bytes[self.recompute] + extra + self.logits_bytes

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.usable_bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            "layout": self.layout.to_dict(), "recompute": self.recompute,
            "seq_len_tokens": self.seq_len, "weights_bytes": self.weights_bytes,
            "gradients_bytes": self.gradients_bytes, "optimizer_bytes": self.optimizer_bytes,
            "master_weights_bytes": self.master_weights_bytes,
            "adam_moments_bytes": self.adam_moments_bytes,
            "activation_per_token_layer_bytes": dict(self.activation_per_token_layer_bytes),
            "activations_bytes": dict(self.activations_bytes),
            "recompute_buffer_bytes": self.recompute_buffer_bytes,
            "logits_bytes": self.logits_bytes, "tokens_in_flight": self.tokens_in_flight,
            "layers_per_stage": self.layers_per_stage, "total_bytes": self.total_bytes,
            "usable_bytes": self.usable_bytes, "fits": self.fits, "notes": list(self.notes),
        }


def _state_params_per_device(cfg: ModelConfig, p: ParamCounts, lay: Layout) -> float:
    """Parameters one device keeps state for: dense ones / (tp·pp·fsdp), routed experts /
    (tp·pp·ep) (experts are split over the ep ranks and not sharded further by FSDP)."""
    experts = expert_params(cfg)
    dense = p.all - experts
    return dense / (lay.tp * lay.pp * lay.fsdp) + experts / (lay.tp * lay.pp * lay.ep)


def training_memory(cfg: ModelConfig, layout: Layout, *, seq_len: int, hbm_bytes: float,
                    hbm_utilization: float = 0.95, recompute: Recompute = "selective",
                    dropout: bool = False) -> TrainingMemory:
    """Per-device training memory of ``cfg`` under ``layout`` with ``seq_len``-token
    sequences, ``layout.micro_batch`` sequences per micro-batch.

    State: 2 + 2 + 12 bytes per parameter held (:func:`_state_params_per_device`).
    Activations: per token per layer (:func:`activation_bytes_per_token_layer`) / tp
    (sequence parallel) × micro-batch tokens / cp × L/pp layers × the micro-batches a 1F1B
    first stage holds (pp of them; Korthikanti §4.2.3: the first stage holds L layers' worth).
    Full recomputation also needs one layer's full activations while it recomputes
    (``recompute_buffer_bytes``). Logits: 4·V / tp bytes per token of one micro-batch.

    Raises:
        UsageError: a layout that cannot hold the model (:meth:`Layout.check`), a bad mode.
    """
    layout.check(cfg)
    if seq_len % layout.cp:
        raise UsageError(f"--cp {layout.cp} must divide the sequence length --seq {seq_len}")
    p = param_counts(cfg)
    held = _state_params_per_device(cfg, p, layout)
    micro_tokens = layout.micro_batch * seq_len / layout.cp
    in_flight = layout.pp if layout.pp > 1 else 1
    layers = cfg.num_layers / layout.pp
    per_tok = {m: activation_bytes_per_token_layer(cfg, seq_len, m, dropout=dropout)  # type: ignore[arg-type]
               for m in RECOMPUTE_MODES}
    acts = {m: v / layout.tp * micro_tokens * layers * in_flight for m, v in per_tok.items()}
    notes = []
    if layout.pp > 1:
        notes.append(f"1F1B pipeline: the first stage holds {layout.pp} micro-batches of "
                     f"{layers:g} layers; embedding and LM head assumed spread evenly over stages")
    return TrainingMemory(
        layout=layout, recompute=recompute, seq_len=seq_len,
        weights_bytes=WEIGHT_BYTES * held, gradients_bytes=GRADIENT_BYTES * held,
        optimizer_bytes=OPTIMIZER_BYTES * held, master_weights_bytes=4 * held,
        adam_moments_bytes=8 * held, activation_per_token_layer_bytes=per_tok,
        activations_bytes=acts,
        recompute_buffer_bytes=per_tok["none"] / layout.tp * micro_tokens,
        logits_bytes=LOGIT_BYTES_PER_VOCAB * cfg.vocab_size / layout.tp * micro_tokens,
        tokens_in_flight=micro_tokens * in_flight, layers_per_stage=layers,
        usable_bytes=hbm_utilization * hbm_bytes, notes=tuple(notes),
    )


@dataclass(frozen=True)
class InferenceMemory:
    """Serving memory of one device of a ``tp``-wide group, in bytes: weights, KV cache of
    ``batch`` sequences of ``seq_len`` tokens, the activations of one layer for a prefill
    chunk of ``prefill_tokens``, and the last token's bf16 logits per sequence."""

    tp: int
    batch: int
    seq_len: int
    weights_bytes: float
    kv_cache_bytes: float
    activations_bytes: float
    logits_bytes: float
    usable_bytes: float

    @property
    def total_bytes(self) -> float:
        return self.weights_bytes + self.kv_cache_bytes + self.activations_bytes + \
            self.logits_bytes

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.usable_bytes

    def to_dict(self) -> dict[str, Any]:
        return {"tp": self.tp, "batch": self.batch, "seq_len_tokens": self.seq_len,
                "weights_bytes": self.weights_bytes, "kv_cache_bytes": self.kv_cache_bytes,
                "activations_bytes": self.activations_bytes, "logits_bytes": self.logits_bytes,
                "total_bytes": self.total_bytes, "usable_bytes": self.usable_bytes,
                "fits": self.fits}


def inference_memory(cfg: ModelConfig, *, weight_bytes: float, kv_bytes_per_sequence: float,
                     batch: int, seq_len: int, hbm_bytes: float, tp: int = 1,
                     prefill_tokens: int | None = None,
                     hbm_utilization: float = 0.95) -> InferenceMemory:
    """Per-device serving memory: weights / tp; KV cache batch × per sequence / min(tp,
    kv_heads) (a KV head is not split, so heads beyond kv_heads are replicated; MLA's latent
    is replicated on every device); one layer's selective-recompute activations
    (:func:`activation_bytes_per_token_layer`) for ``prefill_tokens`` (default batch ×
    seq_len) / tp, since inference keeps nothing across layers; logits 2·V per sequence.

    Raises:
        UsageError: non-positive counts.
    """
    if batch <= 0 or seq_len <= 0 or tp <= 0:
        raise UsageError(f"batch, sequence length and --tp must be positive, got {batch}, "
                         f"{seq_len}, {tp}")
    kv_split = 1 if cfg.is_mla else math.gcd(tp, cfg.num_kv_heads)
    chunk = prefill_tokens if prefill_tokens is not None else batch * seq_len
    act = activation_bytes_per_token_layer(cfg, seq_len, "selective") * chunk / tp
    return InferenceMemory(
        tp=tp, batch=batch, seq_len=seq_len, weights_bytes=weight_bytes / tp,
        kv_cache_bytes=batch * kv_bytes_per_sequence / kv_split, activations_bytes=act,
        logits_bytes=float(ACT_BYTES * cfg.vocab_size * batch),
        usable_bytes=hbm_utilization * hbm_bytes,
    )
