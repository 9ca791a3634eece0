"""Training totals for ``traceroof estimate --tokens/--hours``: how many FLOPs a run on T tokens
costs, and how long it takes on N chips at a given MFU (and what it costs at a price per
chip-hour). Pure functions of the model's shape, the chip's dense peak and the user's MFU.

Formulas (docs/estimate.md, "Training totals"):

* total FLOPs C = 6·N_active·T + 3·T·a(S), where a(S) is the forward attention FLOPs per token
  averaged over a causal sequence of S tokens, 4·L·d_attn·(S+1)/2 for a dense model
  (:func:`traceroof.model.flops_per_token`; Kaplan et al. 2020 §2.1 for 6N, Hoffmann et al.
  2022 App. F for the attention term);
* cluster throughput = chips × dense peak (FLOP/s) × MFU (PaLM, Chowdhery et al. 2022 App. B:
  MFU counts model FLOPs, so the same C is the numerator);
* wall-clock = C / cluster throughput; chip-hours = chips × wall-clock / 3600 s;
  dollars = chip-hours × price per chip-hour;
* from ``hours`` back to tokens: T = hours · 3600 · throughput / (6·N_active + 3·a(S)).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import UsageError
from .model import ModelConfig, flops_per_token

__all__ = ["TrainingPlan", "training_plan", "SECONDS_PER_HOUR", "SECONDS_PER_DAY"]

SECONDS_PER_HOUR = 3600
SECONDS_PER_DAY = 86_400


@dataclass(frozen=True)
class TrainingPlan:
    """Totals of a training run. Units in the names: ``_flops`` FLOP, ``_s`` seconds,
    ``_per_s`` per second, ``_usd`` US dollars; ``tokens`` and ``chips`` are counts, ``mfu`` a
    fraction. ``cost_usd`` is None when no price was given (unknown, not zero)."""

    tokens: float
    seq_len: int
    chips: int
    mfu: float
    peak_flops_per_s: float
    linear_flops: float
    attention_flops: float
    train_flops_per_token: float
    cluster_flops_per_s: float
    wall_clock_s: float
    wall_clock_linear_only_s: float
    chip_hours: float
    price_per_chip_hour_usd: float | None
    cost_usd: float | None
    tokens_from: str

    @property
    def total_flops(self) -> float:
        """6·N_active·T + attention (FLOP)."""
        return self.linear_flops + self.attention_flops

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; every key carries its unit."""
        return {
            "tokens": self.tokens, "seq_len_tokens": self.seq_len, "chips": self.chips,
            "mfu": self.mfu, "peak_flops_per_s": self.peak_flops_per_s,
            "linear_flops": self.linear_flops, "attention_flops": self.attention_flops,
            "total_flops": self.total_flops, "train_flops_per_token": self.train_flops_per_token,
            "cluster_flops_per_s": self.cluster_flops_per_s, "wall_clock_s": self.wall_clock_s,
            "wall_clock_days": self.wall_clock_s / SECONDS_PER_DAY,
            "wall_clock_linear_only_s": self.wall_clock_linear_only_s,
            "chip_hours": self.chip_hours, "price_per_chip_hour_usd": self.price_per_chip_hour_usd,
            "cost_usd": self.cost_usd, "tokens_from": self.tokens_from,
        }


def training_plan(cfg: ModelConfig, peak_flops_per_s: float, *, chips: int, mfu: float,
                  seq_len: int, tokens: float | None = None, hours: float | None = None,
                  price_per_chip_hour_usd: float | None = None) -> TrainingPlan:
    """Total FLOPs, wall-clock, chip-hours and cost of training ``cfg`` on ``tokens`` tokens
    (or for ``hours`` hours, giving the tokens) on ``chips`` chips of ``peak_flops_per_s``
    dense peak each at ``mfu`` (a fraction: 0.40 = 40 %).

    70B-class example (L 80, d 8192, GQA-8, d_ff 28672, V 128256: N = 70,552,387,584) on
    15e12 tokens: 6·N·T = 6.35e24 FLOP; at 40 % of 8,960 × 459 TFLOP/s = 1.645e18 FLOP/s that
    is 3.86e6 s = 44.7 days for 6NT alone (the attention term at S adds 3·a(S) per token).

    Raises:
        UsageError: neither or both of ``tokens`` and ``hours``, a non-positive count,
            ``mfu`` outside (0, 1], a negative price.
    """
    if (tokens is None) == (hours is None):
        raise UsageError("training totals need exactly one of --tokens (a count) or --hours")
    if chips <= 0 or seq_len <= 0:
        raise UsageError(f"--chips and --seq must be positive, got {chips} and {seq_len}")
    if not 0 < mfu <= 1:
        raise UsageError(f"--mfu must be a fraction in (0, 1] (0.40 = 40 %), got {mfu}")
    if price_per_chip_hour_usd is not None and price_per_chip_hour_usd < 0:
        raise UsageError(f"--price-per-chip-hour must be >= 0 (US dollars), got "
                         f"{price_per_chip_hour_usd}")
    fpt = flops_per_token(cfg, seq_len, causal=True)
    cluster = chips * peak_flops_per_s * mfu
    if tokens is None:
        assert hours is not None
        if hours <= 0:
            raise UsageError(f"--hours must be positive, got {hours}")
        tokens = hours * SECONDS_PER_HOUR * cluster / fpt.train
        source = f"{hours:g} h x {cluster:.4g} FLOP/s / {fpt.train:.4g} FLOP per token"
    else:
        if tokens <= 0:
            raise UsageError(f"--tokens must be positive, got {tokens}")
        source = "given"
    linear = fpt.linear_train * tokens
    attention = 3 * fpt.attention_forward * tokens
    wall = (linear + attention) / cluster
    chip_hours = chips * wall / SECONDS_PER_HOUR
    cost = None if price_per_chip_hour_usd is None else chip_hours * price_per_chip_hour_usd
    return TrainingPlan(
        tokens=float(tokens), seq_len=seq_len, chips=chips, mfu=mfu,
        peak_flops_per_s=peak_flops_per_s, linear_flops=linear, attention_flops=attention,
        train_flops_per_token=fpt.train, cluster_flops_per_s=cluster, wall_clock_s=wall,
        wall_clock_linear_only_s=linear / cluster, chip_hours=chip_hours,
        price_per_chip_hour_usd=price_per_chip_hour_usd, cost_usd=cost, tokens_from=source,
    )
