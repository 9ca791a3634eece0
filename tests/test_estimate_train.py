"""Training totals (traceroof.estimate_train, issue 18 item 1) against hand arithmetic.

70B-class = Llama-3-70B's shape (fixtures/models/llama3-70b.json): L 80, d 8192, 64 heads,
8 KV heads (d_kv 1024), d_ff 28672, V 128256, untied. Per layer
2·8192² + 2·8192·1024 + 3·8192·28672 = 134,217,728 + 16,777,216 + 704,643,072 = 855,638,016;
N = 80·855,638,016 + 2·128,256·8,192 = 68,451,041,280 + 2,101,346,304 = 70,552,387,584.
TPU v5p: 459 TFLOP/s dense bf16 (chip database).
"""

from __future__ import annotations

import pytest
from conftest import MODELS

from traceroof.chips import get_chip
from traceroof.errors import UsageError
from traceroof.estimate_train import training_plan
from traceroof.model import load_model_config, param_counts

N70 = 70_552_387_584
N7 = 6_738_149_376


@pytest.fixture(scope="module")
def m70():
    return load_model_config(MODELS / "llama3-70b.json")


def test_70b_parameter_count(m70) -> None:
    p = param_counts(m70)
    assert p.per_layer == 855_638_016
    assert p.total == N70


def test_70b_on_15t_tokens_issue_example(m70) -> None:
    peak = get_chip("tpu-v5p").peak("bf16")
    assert peak == 459e12
    t = training_plan(m70, peak, chips=8960, mfu=0.40, seq_len=8192, tokens=15e12)
    # 6·N·T = 6 · 70,552,387,584 · 15e12 = 6.3497e24 ≈ 6.35e24 FLOP
    assert t.linear_flops == 6 * N70 * 15e12
    assert round(t.linear_flops / 1e24, 2) == 6.35
    # cluster: 8,960 · 459e12 · 0.40 = 1.645056e18 FLOP/s
    assert t.cluster_flops_per_s == pytest.approx(1.645056e18)
    # 6.3497e24 / 1.645056e18 = 3,859,874 s = 44.67 days ("about 44.7 days")
    assert round(t.wall_clock_linear_only_s / 86_400, 1) == 44.7
    # attention at S=8192: 3 · 4·L·d_attn·(S+1)/2 = 3 · 4·80·8192·8193/2 = 3 · 10,738,728,960 = 32,216,186,880 per token
    assert t.attention_flops == pytest.approx(32_216_186_880 * 15e12)
    assert t.total_flops == pytest.approx((6 * N70 + 32_216_186_880) * 15e12)
    # with it: 455,530,512,384 · 15e12 / 1.645056e18 = 4,153,632 s = 48.1 days
    assert round(t.wall_clock_s / 86_400, 1) == 48.1
    # chip-hours = 8,960 · wall / 3,600
    assert t.chip_hours == pytest.approx(8960 * t.wall_clock_s / 3600)
    assert t.cost_usd is None  # no price: unknown, not $0


def test_price_and_hours_back_to_tokens(ref7b) -> None:
    peak = 989.4e12  # H100 SXM dense bf16
    t = training_plan(ref7b, peak, chips=1024, mfu=0.5, seq_len=4096, tokens=1e12,
                      price_per_chip_hour_usd=2.0)
    # per token: 6N + 3·4·32·4096·4097/2 = 40,428,896,256 + 3·1,074,003,968 = 43,650,908,160
    per_token = 6 * N7 + 3 * 4 * 32 * 4096 * 4097 / 2
    assert per_token == 43_650_908_160
    wall = per_token * 1e12 / (1024 * 989.4e12 * 0.5)  # = 86,169 s
    assert t.wall_clock_s == pytest.approx(wall)
    assert round(t.wall_clock_s) == 86_169
    assert t.chip_hours == pytest.approx(1024 * wall / 3600)  # 24,510 chip-h
    assert t.cost_usd == pytest.approx(2.0 * 1024 * wall / 3600)  # $49,021
    # --hours 24 gives T = 24·3600 · 1024·989.4e12·0.5 / 43,650,908,160 = 1.0027e12 tokens
    h = training_plan(ref7b, peak, chips=1024, mfu=0.5, seq_len=4096, hours=24)
    assert h.tokens == pytest.approx(24 * 3600 * 1024 * 989.4e12 * 0.5 / per_token)
    assert round(h.tokens / 1e12, 4) == 1.0027
    assert h.wall_clock_s == pytest.approx(24 * 3600)


def test_moe_uses_active_parameters() -> None:
    mix = load_model_config(MODELS / "mixtral-8x7b.json")
    t = training_plan(mix, 989.4e12, chips=64, mfu=0.4, seq_len=4096, tokens=1e9)
    # 6·N_active·T with N_active = 12,879,659,008 (2 of 8 experts), not all 46.7 B
    assert t.linear_flops == 6 * 12_879_659_008 * 1e9


@pytest.mark.parametrize("kw, match", [
    ({"tokens": 1e9, "hours": 1.0}, "exactly one of --tokens"),
    ({}, "exactly one of --tokens"),
    ({"tokens": 1e9, "mfu": 1.5}, "--mfu must be a fraction"),
    ({"tokens": 1e9, "price_per_chip_hour_usd": -1.0}, "--price-per-chip-hour must be >= 0"),
    ({"tokens": -5.0}, "--tokens must be positive"),
])
def test_bad_options(ref7b, kw, match) -> None:
    args = {"chips": 8, "mfu": 0.4, "seq_len": 4096, **kw}
    with pytest.raises(UsageError, match=match):
        training_plan(ref7b, 989.4e12, **args)
