"""``traceroof estimate``: first-principles numbers for a model on a chip.

:func:`estimate` returns an :class:`Estimate` (pure data);
:func:`traceroof.render.estimate.render_estimate` turns it into a terminal table, markdown or JSON. The numbers are the ones a performance engineer checks a
trace against: parameters, weight bytes, FLOPs per token, the attention/linear crossover, training
memory, KV cache, how many sequences fit, the batch-1 decode floor, the critical batch and the
prefill intensity. docs/estimate.md derives each one; the sources are Kaplan et al. 2020 (6N),
Chowdhery et al. 2022 App. B (MFU), the JAX scaling book ("All about transformer inference") and
Chen, "Transformer inference arithmetic" (kipply, 2022) for KV cache and decode floors.

Conventions:

* Weight bytes = every stored parameter (norms included) × bytes of ``dtype``.
* Usable HBM = ``hbm_utilization`` (default 0.95) × the chip's HBM: 5 % is left for the CUDA
  context, allocator fragmentation, workspaces and activations. The KV budget is usable HBM minus
  the weights: 0.95 × 80e9 − 13,476,831,232 = 62,523,168,768 B = "62.5 GB" for the reference 7B
  on an 80 GB H100. ``kv_budget_bytes`` overrides it.
* Decode floor (batch 1) = bytes one token's forward pass reads (all weights of a dense model;
  attention, embeddings and the top-k experts of a MoE) ÷ HBM bandwidth.
* Critical batch = the decode batch at which FLOPs per weight byte reach the ridge point:
  B* = ridge × weight bytes / (2 · N_active); = ridge for a dense bf16 model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .dtypes import dtype_name, weight_bytes_per_element
from .errors import UsageError
from .model import (
    FlopsPerToken,
    ModelConfig,
    ParamCounts,
    Peak,
    crossover_context_len,
    flops_per_token,
    mlp_params,
    param_counts,
    peak_from_chip,
)

__all__ = [
    "Estimate",
    "estimate",
    "weights_read_bytes",
    "kv_bytes_per_token",
    "kv_bytes_per_sequence",
    "max_concurrent_sequences",
    "TRAINING_BYTES_PER_PARAM",
    "DEFAULT_HBM_UTILIZATION",
    "ESTIMATE_SCHEMA_VERSION",
]

#: Mixed-precision Adam: bf16 weights 2 + bf16 grads 2 + fp32 master weights 4 + Adam m, v 8.
TRAINING_BYTES_PER_PARAM = 16
#: Fraction of HBM usable for weights + KV cache (the rest: CUDA context, workspaces, activations).
DEFAULT_HBM_UTILIZATION = 0.95
ESTIMATE_SCHEMA_VERSION = 1


def kv_bytes_per_token(cfg: ModelConfig, kv_dtype: str = "bf16") -> float:
    """KV-cache bytes one token adds: 2 (K and V) · L · kv_heads · head_dim · bytes; for
    multi-head latent attention L · (kv_lora_rank + qk_rope_head_dim) · bytes (the latent and
    the shared RoPE key, DeepSeek-V2 §2.1.3).

    Reference 7B: 2·32·32·128·2 = 524,288 B = 512 KiB; with 8 KV heads 131,072 B = 128 KiB;
    DeepSeek-V2-Lite 27·(512 + 64)·2 = 31,104 B.
    """
    return cfg.num_layers * cfg.kv_elements_per_token_layer * weight_bytes_per_element(kv_dtype)


def kv_bytes_per_sequence(cfg: ModelConfig, seq_len: int, kv_dtype: str = "bf16") -> float:
    """KV-cache bytes of one sequence of ``seq_len`` tokens (sliding-window layers keep W)."""
    if seq_len <= 0:
        raise UsageError(f"seq_len must be positive, got {seq_len}")
    per_layer_token = cfg.kv_elements_per_token_layer * weight_bytes_per_element(kv_dtype)
    tokens = sum(min(seq_len, cfg.window_for_layer(i) or seq_len) for i in range(cfg.num_layers))
    return per_layer_token * tokens


def max_concurrent_sequences(kv_budget_bytes: float, kv_bytes_per_seq: float) -> int:
    """How many whole sequences' KV caches fit in ``kv_budget_bytes`` (0 if none, or negative)."""
    if kv_bytes_per_seq <= 0:
        raise UsageError("KV bytes per sequence must be positive")
    return max(0, math.floor(kv_budget_bytes / kv_bytes_per_seq))


@dataclass(frozen=True)
class Estimate:
    """The first-principles numbers of ``model`` on ``chip``. Units are in the field names:
    ``_bytes`` bytes, ``_s`` seconds, ``flops_`` FLOP, ``_per_s`` per second; counts are plain.
    """

    model: str
    chip: str
    dtype: str
    kv_dtype: str
    weight_dtype: str
    seq_len: int
    batch: int
    params: ParamCounts
    flops: FlopsPerToken
    bytes_per_param: float
    weight_bytes: float
    active_weight_bytes: float
    crossover_context_len: float
    training_memory_bytes: float
    kv_bytes_per_token: float
    kv_bytes_per_sequence: float
    hbm_bytes: float
    hbm_utilization: float
    kv_budget_bytes: float
    kv_budget_source: str
    max_concurrent_sequences: int
    hbm_bytes_per_s: float
    peak: Peak
    ridge_point: float
    critical_batch: float
    decode_floor_s: float
    decode_step_floor_s: float
    prefill_flops: float
    prefill_bytes: float
    prefill_intensity: float
    prefill_floor_s: float
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict; every key carries its unit."""
        f = self.flops
        return {
            "estimate_schema_version": ESTIMATE_SCHEMA_VERSION,
            "model": self.model, "chip": self.chip, "dtype": self.dtype,
            "weight_dtype": self.weight_dtype, "kv_dtype": self.kv_dtype, "seq_len_tokens": self.seq_len, "batch": self.batch,
            "params": self.params.to_dict(),
            "bytes_per_param": self.bytes_per_param,
            "weight_bytes": self.weight_bytes,
            "active_weight_bytes": self.active_weight_bytes,
            "flops_per_token": {
                "linear_forward": f.linear_forward, "linear_train": f.linear_train,
                "matmul_forward": f.matmul_forward,
                "attention_forward_avg_causal": f.attention_forward,
                "forward": f.forward, "train": f.train,
            },
            "crossover_context_len_tokens": self.crossover_context_len,
            "training_bytes_per_param": TRAINING_BYTES_PER_PARAM,
            "training_memory_bytes": self.training_memory_bytes,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_bytes_per_sequence": self.kv_bytes_per_sequence,
            "hbm_bytes": self.hbm_bytes, "hbm_utilization": self.hbm_utilization,
            "kv_budget_bytes": self.kv_budget_bytes, "kv_budget_source": self.kv_budget_source,
            "max_concurrent_sequences": self.max_concurrent_sequences,
            "hbm_bytes_per_s": self.hbm_bytes_per_s,
            "peak_flops_per_s": self.peak.flops_per_s, "peak_dtype": self.peak.dtype,
            "peak_source": self.peak.source, "peak_dense": self.peak.dense,
            "ridge_point_flop_per_byte": self.ridge_point,
            "critical_batch_tokens": self.critical_batch,
            "decode_floor_s": self.decode_floor_s,
            "decode_step_floor_s": self.decode_step_floor_s,
            "prefill_flops": self.prefill_flops, "prefill_bytes": self.prefill_bytes,
            "prefill_intensity_flop_per_byte": self.prefill_intensity,
            "prefill_floor_s": self.prefill_floor_s,
            "notes": list(self.notes),
        }


def _resolve_chip(chip: Any) -> Any:
    if isinstance(chip, str):
        from .chips import get_chip  # the database may be absent in a minimal install

        return get_chip(chip)
    return chip


def _expected_experts(num_experts: int, top_k: int, tokens: float) -> float:
    """Distinct experts a MoE layer touches for ``tokens`` tokens under uniform routing."""
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)


def weights_read_bytes(cfg: ModelConfig, p: ParamCounts, tokens: float, bpp: float) -> float:
    """Weight bytes a forward pass over ``tokens`` tokens (one step) reads from HBM, at
    ``bpp`` bytes per parameter: every stored parameter for a dense model; for a MoE, all but
    the experts no token of the step picks (uniform routing: E·(1 − (1 − k/E)^tokens)
    distinct experts per layer)."""
    if not cfg.is_moe:
        return p.all * bpp
    expert = mlp_params(cfg.hidden_size, cfg.expert_intermediate_size, True, cfg.mlp_bias)
    idle = cfg.num_experts - _expected_experts(cfg.num_experts, cfg.num_experts_per_tok, tokens)
    return (p.all - len(cfg.moe_layers) * idle * expert) * bpp


def _peak(chip: Any, chip_name: str, dt: str) -> Peak:
    """The dense peak of ``dt`` on ``chip``. Raises UsageError when the chip has none."""
    peak = peak_from_chip(chip, dt)
    if peak is None:
        have = ", ".join(sorted(k for k, v in dict(chip.peak_flops_per_s).items() if v))
        raise UsageError(f"{chip_name} has no dense {dt} peak; choose --dtype from: {have} "
                         "(weight-only quantization: --weight-dtype int4 with --dtype bf16)")
    return peak


def _kv_budget(hbm: float, utilization: float, weight_bytes: float,
               given: float | None) -> tuple[float, str]:
    """(KV-cache budget in bytes, where it comes from): ``given``, or usable HBM minus the
    weights (negative when the weights alone do not fit)."""
    if given is not None:
        return float(given), "given"
    return utilization * hbm - weight_bytes, (
        f"{utilization:.0%} of {hbm / 1e9:.1f} GB HBM minus {weight_bytes / 1e9:.2f} GB weights")


def _architecture_notes(cfg: ModelConfig) -> list[str]:
    """What the numbers assume about a MoE or sliding-window model."""
    notes = []
    if cfg.is_moe:
        notes.append(f"MoE: {cfg.num_experts_per_tok} of {cfg.num_experts} experts active per "
                     "token; FLOPs use N_active, memory all experts; decode reads assume "
                     "uniform routing")
    if cfg.sliding_window:
        notes.append(f"sliding window {cfg.sliding_window}: KV cache per sequence and attention "
                     "FLOPs stop growing at the window")
    if cfg.is_mla:
        notes.append(f"multi-head latent attention: the KV cache holds the {cfg.kv_lora_rank}-wide "
                     f"latent + the {cfg.qk_rope_head_dim}-wide RoPE key per layer; attention "
                     "FLOPs are counted unabsorbed (per head, d_qk for QK^T and d_v for A·V)")
    return notes


def estimate(cfg: ModelConfig, chip: Any, *, seq_len: int = 4096, batch: int = 1,
             dtype: str = "bf16", kv_dtype: str | None = None, weight_dtype: str | None = None,
             hbm_utilization: float = DEFAULT_HBM_UTILIZATION,
             kv_budget_bytes: float | None = None) -> Estimate:
    """First-principles numbers of ``cfg`` on ``chip`` (a ChipSpec or a name for ``get_chip``).

    Args:
        seq_len: tokens per sequence (KV cache, concurrency, prefill, attention term).
        batch: sequences per step (decode step floor, prefill).
        dtype: compute dtype (``bf16``, ``fp16``, ``fp8``, ``int8``...): sets the peak taken,
            and the bytes per parameter unless ``weight_dtype`` is given.
        kv_dtype: KV-cache dtype, default ``dtype``.
        weight_dtype: dtype the weights are stored in (weight-only quantization: ``int4``,
            ``int8``, ``fp8`` weights dequantized to ``dtype`` for the matmuls), default
            ``dtype``. Sets the weight bytes (int4: 0.5 B per parameter) and nothing else.
        hbm_utilization: fraction of HBM usable for weights + KV cache (default 0.95).
        kv_budget_bytes: HBM for the KV cache; default usable HBM − weight bytes.

    Raises:
        UsageError: non-positive seq_len/batch, a dtype the chip has no peak for.
        UnknownChipError: ``chip`` is a name the database does not know.
    """
    if seq_len <= 0 or batch <= 0:
        raise UsageError(f"seq_len and batch must be positive, got seq_len={seq_len}, "
                         f"batch={batch}")
    if not 0 < hbm_utilization <= 1:
        raise UsageError(f"hbm_utilization must be in (0, 1], got {hbm_utilization}")
    chip = _resolve_chip(chip)
    dt = dtype_name(dtype)
    kdt = dtype_name(kv_dtype) if kv_dtype else dt
    wdt = dtype_name(weight_dtype) if weight_dtype else dt
    bpp = weight_bytes_per_element(wdt)
    weight_bytes_per_element(kdt)
    chip_name = str(getattr(chip, "name", chip))
    peak = _peak(chip, chip_name, dt)
    notes = list(cfg.assumptions)
    p = param_counts(cfg)
    fpt = flops_per_token(cfg, seq_len, causal=True)

    weight_bytes = p.all * bpp
    active_weight_bytes = weights_read_bytes(cfg, p, 1, bpp)
    kv_tok = kv_bytes_per_token(cfg, kdt)
    kv_seq = kv_bytes_per_sequence(cfg, seq_len, kdt)
    hbm = float(chip.hbm_bytes)
    bw = float(chip.hbm_bytes_per_s)
    budget, budget_src = _kv_budget(hbm, hbm_utilization, weight_bytes, kv_budget_bytes)
    if kv_budget_bytes is None and budget < 0:
        notes.append(f"the {wdt} weights ({weight_bytes / 1e9:.1f} GB) do not fit in "
                     f"{hbm_utilization:.0%} of one device's HBM: shard them")
    n_seq = max_concurrent_sequences(budget, kv_seq)

    ridge = float(chip.ridge_point(dt)) if hasattr(chip, "ridge_point") else peak.flops_per_s / bw
    critical = ridge * weight_bytes / (2.0 * p.active)
    decode_floor = active_weight_bytes / bw
    decode_step = (weights_read_bytes(cfg, p, batch, bpp) + batch * kv_seq) / bw

    prefill_tokens = batch * seq_len
    prefill_flops = prefill_tokens * fpt.forward
    prefill_bytes = weights_read_bytes(cfg, p, prefill_tokens, bpp) + batch * kv_seq
    prefill_intensity = prefill_flops / prefill_bytes
    prefill_floor = max(prefill_flops / peak.flops_per_s, prefill_bytes / bw)
    notes += _architecture_notes(cfg)
    return Estimate(
        model=cfg.name, chip=chip_name, dtype=dt, kv_dtype=kdt, weight_dtype=wdt,
        seq_len=seq_len, batch=batch,
        params=p, flops=fpt, bytes_per_param=bpp, weight_bytes=weight_bytes,
        active_weight_bytes=active_weight_bytes,
        crossover_context_len=crossover_context_len(cfg),
        training_memory_bytes=TRAINING_BYTES_PER_PARAM * p.all,
        kv_bytes_per_token=kv_tok, kv_bytes_per_sequence=kv_seq, hbm_bytes=hbm,
        hbm_utilization=hbm_utilization, kv_budget_bytes=budget, kv_budget_source=budget_src,
        max_concurrent_sequences=n_seq, hbm_bytes_per_s=bw, peak=peak, ridge_point=ridge,
        critical_batch=critical, decode_floor_s=decode_floor, decode_step_floor_s=decode_step,
        prefill_flops=prefill_flops, prefill_bytes=prefill_bytes,
        prefill_intensity=prefill_intensity, prefill_floor_s=prefill_floor, notes=tuple(notes),
    )
