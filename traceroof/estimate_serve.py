"""Serving plans for ``traceroof estimate --serve``: prefill time for a prompt, the per-token
decode time at context position S across a batch sweep (the latency–throughput curve), the
largest batch within a time-per-output-token target, how many sequences a KV budget holds,
and the cost per million tokens at a price per chip-hour.

Formulas (docs/estimate.md, "Serving"; the JAX scaling book, "All About Transformer
Inference"; Chen, "Transformer Inference Arithmetic", 2022):

* decode step at batch B, position S, on a group of ``tp`` chips:
  t(B) = max(bytes(B) / (tp·HBM bandwidth), FLOPs(B) / (tp·peak)), with
  bytes(B) = weights read (:func:`traceroof.estimate.weights_read_bytes`, weight dtype) +
  B × KV cache of one sequence at S, and FLOPs(B) = B·(2·N_active + 4·L·d_attn·S) (a decode
  token sees all S keys: :func:`traceroof.model.attention_flops_per_token`);
* tokens/s per user = 1 / t(B); per chip = B / (t(B)·tp);
* prefill of B prompts of P tokens: max(B·P·(2N_active + attention averaged over the causal
  prompt) / (tp·peak), (weights read + B × KV of P) / (tp·bandwidth));
* cost per million output tokens = price per chip-hour × tp / 3600 / (B / t(B)) × 1e6.

Tensor-parallel communication and kernel launch overheads are not counted: these are floors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .errors import UsageError
from .estimate import kv_bytes_per_sequence, weights_read_bytes
from .model import ModelConfig, attention_flops_per_token, flops_per_token, param_counts

__all__ = ["DecodePoint", "ServingPlan", "decode_point", "serving_plan", "sweep_batches"]


@dataclass(frozen=True)
class DecodePoint:
    """One decode step at ``batch`` sequences: ``time_s`` (the floor), its bytes and FLOPs,
    which one bounds it, tokens/s per user and per chip, and the cost per million tokens
    (None without a price)."""

    batch: int
    time_s: float
    bytes_read: float
    flops: float
    bound: str
    tokens_per_s_per_user: float
    tokens_per_s_per_chip: float
    cost_per_million_tokens_usd: float | None

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in (
            "batch", "time_s", "bytes_read", "flops", "bound", "tokens_per_s_per_user",
            "tokens_per_s_per_chip", "cost_per_million_tokens_usd")}


@dataclass(frozen=True)
class _Chip:
    """The three numbers of a ``tp``-chip serving group: FLOP/s, B/s, bytes (one chip) and tp."""

    peak_flops_per_s: float
    hbm_bytes_per_s: float
    hbm_bytes: float
    tp: int


def decode_point(cfg: ModelConfig, batch: int, position: int, *, bytes_per_param: float,
                 kv_dtype: str, peak_flops_per_s: float, hbm_bytes_per_s: float, tp: int = 1,
                 price_per_chip_hour_usd: float | None = None) -> DecodePoint:
    """The decode step floor of ``batch`` sequences at context ``position`` (module docstring).

    Raises:
        UsageError: non-positive batch, position or tp.
    """
    if batch < 1 or position < 1 or tp < 1:
        raise UsageError(f"batch, position and --tp must be positive, got {batch}, {position}, "
                         f"{tp}")
    p = param_counts(cfg)
    nbytes = weights_read_bytes(cfg, p, batch, bytes_per_param) + \
        batch * kv_bytes_per_sequence(cfg, position, kv_dtype)
    flops = batch * (2.0 * p.active + attention_flops_per_token(cfg, position))
    t_mem = nbytes / (tp * hbm_bytes_per_s)
    t_flop = flops / (tp * peak_flops_per_s)
    t = max(t_mem, t_flop)
    per_s = batch / t
    cost = None
    if price_per_chip_hour_usd is not None:
        cost = price_per_chip_hour_usd * tp / 3600 / per_s * 1e6
    return DecodePoint(batch, t, nbytes, flops, "memory" if t_mem >= t_flop else "compute",
                       1 / t, per_s / tp, cost)


def sweep_batches(limit: int) -> list[int]:
    """Powers of two up to ``limit``, and ``limit`` itself: [1, 2, 4, ..., limit]."""
    out, b = [], 1
    while b < limit:
        out.append(b)
        b *= 2
    return out + [limit] if limit >= 1 else []


@dataclass(frozen=True)
class ServingPlan:
    """Serving ``model`` at context ``position`` on a ``tp``-chip group. Units in the names;
    ``max_batch_within_tpot`` is None without a target (0 when even batch 1 misses it)."""

    position: int
    prompt_tokens: int
    tp: int
    weight_dtype: str
    kv_dtype: str
    prefill_s: float
    prefill_bound: str
    prefill_flops: float
    prefill_bytes: float
    kv_bytes_per_sequence: float
    kv_budget_bytes: float
    kv_budget_source: str
    max_concurrent_sequences: int
    sweep: tuple[DecodePoint, ...]
    tpot_target_s: float | None
    max_batch_within_tpot: int | None
    at_max_batch: DecodePoint | None
    price_per_chip_hour_usd: float | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "position_tokens": self.position, "prompt_tokens": self.prompt_tokens, "tp": self.tp,
            "weight_dtype": self.weight_dtype, "kv_dtype": self.kv_dtype,
            "prefill_s": self.prefill_s, "prefill_bound": self.prefill_bound,
            "prefill_flops": self.prefill_flops, "prefill_bytes": self.prefill_bytes,
            "kv_bytes_per_sequence": self.kv_bytes_per_sequence,
            "kv_budget_bytes": self.kv_budget_bytes, "kv_budget_source": self.kv_budget_source,
            "max_concurrent_sequences": self.max_concurrent_sequences,
            "sweep": [d.to_dict() for d in self.sweep], "tpot_target_s": self.tpot_target_s,
            "max_batch_within_tpot": self.max_batch_within_tpot,
            "at_max_batch": None if self.at_max_batch is None else self.at_max_batch.to_dict(),
            "price_per_chip_hour_usd": self.price_per_chip_hour_usd,
        }


def _largest_batch(fn: Any, limit: int, target_s: float) -> int:
    """The largest batch in [1, limit] whose decode time ``fn(b).time_s`` ≤ ``target_s``
    (t(B) never decreases with B, so a bisection finds it); 0 when batch 1 misses it."""
    if limit < 1 or fn(1).time_s > target_s:
        return 0
    lo, hi = 1, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fn(mid).time_s <= target_s:
            lo = mid
        else:
            hi = mid - 1
    return lo


def serving_plan(cfg: ModelConfig, *, position: int, prompt_tokens: int, bytes_per_param: float,
                 weight_dtype: str, kv_dtype: str, peak_flops_per_s: float,
                 hbm_bytes_per_s: float, hbm_bytes: float, tp: int = 1,
                 hbm_utilization: float = 0.95, kv_budget_bytes: float | None = None,
                 tpot_target_s: float | None = None,
                 price_per_chip_hour_usd: float | None = None) -> ServingPlan:
    """Prefill, the decode batch sweep up to the KV-budget concurrency, the largest batch
    within ``tpot_target_s`` and the costs, for ``cfg`` on ``tp`` chips (module docstring).
    The KV budget is ``kv_budget_bytes`` (all ``tp`` chips together) or
    ``hbm_utilization`` × tp × HBM − weights.

    Raises:
        UsageError: non-positive lengths or tp, a non-positive target, a negative price.
    """
    if position < 1 or prompt_tokens < 1 or tp < 1:
        raise UsageError(f"--seq, --prompt-tokens and --tp must be positive, got {position}, "
                         f"{prompt_tokens}, {tp}")
    if tpot_target_s is not None and tpot_target_s <= 0:
        raise UsageError(f"--tpot-ms must be positive, got {tpot_target_s * 1e3:g}")
    if price_per_chip_hour_usd is not None and price_per_chip_hour_usd < 0:
        raise UsageError("--price-per-chip-hour must be >= 0 (US dollars)")
    p = param_counts(cfg)
    weights = p.all * bytes_per_param
    kv_seq = kv_bytes_per_sequence(cfg, position, kv_dtype)
    if kv_budget_bytes is None:
        budget = hbm_utilization * tp * hbm_bytes - weights
        source = (f"{hbm_utilization:.0%} of {tp} x {hbm_bytes / 1e9:.1f} GB HBM minus "
                  f"{weights / 1e9:.2f} GB weights")
    else:
        budget, source = float(kv_budget_bytes), "given (--kv-budget-gb)"
    concurrency = max(0, math.floor(budget / kv_seq))

    def at(b: int) -> DecodePoint:
        return decode_point(cfg, b, position, bytes_per_param=bytes_per_param, kv_dtype=kv_dtype,
                            peak_flops_per_s=peak_flops_per_s, hbm_bytes_per_s=hbm_bytes_per_s,
                            tp=tp, price_per_chip_hour_usd=price_per_chip_hour_usd)

    pf_flops = prompt_tokens * flops_per_token(cfg, prompt_tokens).forward
    pf_bytes = weights_read_bytes(cfg, p, prompt_tokens, bytes_per_param) + \
        kv_bytes_per_sequence(cfg, prompt_tokens, kv_dtype)
    t_c, t_m = pf_flops / (tp * peak_flops_per_s), pf_bytes / (tp * hbm_bytes_per_s)
    best = None
    if tpot_target_s is not None:
        best = _largest_batch(at, concurrency, tpot_target_s)
    return ServingPlan(
        position=position, prompt_tokens=prompt_tokens, tp=tp, weight_dtype=weight_dtype,
        kv_dtype=kv_dtype, prefill_s=max(t_c, t_m), prefill_bound="compute" if t_c >= t_m
        else "memory", prefill_flops=pf_flops, prefill_bytes=pf_bytes, kv_bytes_per_sequence=kv_seq,
        kv_budget_bytes=budget, kv_budget_source=source, max_concurrent_sequences=concurrency,
        sweep=tuple(at(b) for b in sweep_batches(concurrency)), tpot_target_s=tpot_target_s,
        max_batch_within_tpot=best, at_max_batch=at(best) if best else None,
        price_per_chip_hour_usd=price_per_chip_hour_usd,
    )
