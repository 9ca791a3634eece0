"""``traceroof estimate`` numbers (traceroof.estimate) against the textbook figures of issue 5.

Reference 7B = Llama-2-7B shape (L=32, d_model=4096, 32 heads, d_head=128, d_ff=11008,
V=32000, untied, no biases), on H100 SXM (989.4 TFLOP/s dense bf16, 3.35 TB/s, 80 GB) and
A100 SXM4 80 GB (312 TFLOP/s, 2.039 TB/s, 80 GB), taken from the chip database
(``get_chip("h100")``, ``get_chip("a100")``). Each assertion carries its arithmetic.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from traceroof.chips import get_chip
from traceroof.errors import UsageError
from traceroof.estimate import (
    Estimate,
    estimate,
    kv_bytes_per_sequence,
    kv_bytes_per_token,
    max_concurrent_sequences,
)
from traceroof.model import ModelConfig, load_model_config
from traceroof.render.estimate import render_estimate

MODELS = Path(__file__).resolve().parent.parent / "fixtures" / "models"
KIB, GIB = 2**10, 2**30


@pytest.fixture(scope="module")
def h100() -> Any:
    return get_chip("h100")


@pytest.fixture(scope="module")
def a100() -> Any:
    return get_chip("a100")


@pytest.fixture(scope="module")
def e7b(ref7b: ModelConfig, h100: Any) -> Estimate:
    return estimate(ref7b, h100, seq_len=4096)


def test_chip_figures(h100: Any, a100: Any) -> None:
    assert (h100.hbm_bytes, h100.hbm_bytes_per_s, h100.peak("bf16")) == (80e9, 3.35e12, 989.4e12)
    assert (a100.hbm_bytes, a100.hbm_bytes_per_s, a100.peak("bf16")) == (80e9, 2.039e12, 312e12)
    assert h100.name == "NVIDIA H100 SXM5 80GB" and a100.name == "NVIDIA A100 SXM4 80GB"


def test_chip_by_name(ref7b: ModelConfig) -> None:
    e = estimate(ref7b, "h100-sxm")
    assert e.chip == "NVIDIA H100 SXM5 80GB" and e.max_concurrent_sequences == 29
    assert e.peak.source and "nv-h100-ds" in e.peak.source


def test_parameters_and_weight_bytes(e7b: Estimate) -> None:
    assert e7b.params.total == 6_738_149_376
    assert e7b.params.per_layer == 202_375_168
    # weight bytes: every stored parameter (norms too) × 2 B = 6,738,415,616·2 = 13,476,831,232
    assert e7b.weight_bytes == 13_476_831_232
    assert round(e7b.weight_bytes / 1e9, 1) == 13.5  # "13.5 GB bf16 weights"
    assert e7b.active_weight_bytes == e7b.weight_bytes  # dense: a token reads every weight


def test_flops_per_token(e7b: Estimate) -> None:
    assert e7b.flops.linear_forward == 2 * 6_738_149_376
    assert round(e7b.flops.linear_forward / 1e9, 2) == 13.48  # "2N = 13.48 GFLOP per token"
    assert e7b.flops.linear_train == 6 * 6_738_149_376
    # attention at S=4096, causal average: 4·L·d_attn·(S+1)/2 = 4·32·4096·4097/2
    assert e7b.flops.attention_forward == 4 * 32 * 4096 * 4097 / 2
    assert e7b.flops.train == 3 * e7b.flops.forward


def test_crossover(e7b: Estimate, gqa8: ModelConfig, h100: Any) -> None:
    # S = N_blocks / (2·L·d_attn) = 6,476,005,376 / 262,144 = 24,704
    assert e7b.crossover_context_len == 24_704
    # GQA-8: 5,670,699,008 / 262,144 = 21,632
    assert estimate(gqa8, h100).crossover_context_len == 21_632


def test_training_memory(e7b: Estimate) -> None:
    # 16 B/param (bf16 weight 2 + bf16 grad 2 + fp32 master 4 + Adam m 4 + v 4)
    # 6,738,415,616 · 16 = 107,814,649,856 B; also 6,738,149,376·16 = 107.81e9: "107.8 GB"
    assert e7b.training_memory_bytes == 16 * 6_738_415_616
    assert round(e7b.training_memory_bytes / 1e9, 1) == 107.8
    assert round(16 * e7b.params.total / 1e9, 1) == 107.8


def test_kv_cache(ref7b: ModelConfig, gqa8: ModelConfig, e7b: Estimate) -> None:
    # 2 (K, V) · L · kv_heads · head_dim · 2 B = 2·32·32·128·2 = 524,288 B = 512 KiB
    assert kv_bytes_per_token(ref7b) == e7b.kv_bytes_per_token == 512 * KIB
    # GQA-8: 2·32·8·128·2 = 131,072 B = 128 KiB
    assert kv_bytes_per_token(gqa8) == 128 * KIB
    # per 4K sequence: 4096 · 512 KiB = 2 GiB (MHA), 0.5 GiB (GQA-8)
    assert e7b.kv_bytes_per_sequence == kv_bytes_per_sequence(ref7b, 4096) == 2 * GIB
    assert kv_bytes_per_sequence(gqa8, 4096) == GIB // 2
    assert kv_bytes_per_token(ref7b, "fp8") == 256 * KIB


def test_concurrent_sequences_in_62_5_gb(e7b: Estimate, gqa8: ModelConfig, h100: Any) -> None:
    # KV budget = 95 % of 80e9 − weights = 76e9 − 13,476,831,232 = 62,523,168,768 B: "62.5 GB"
    assert e7b.kv_budget_bytes == 0.95 * 80e9 - 13_476_831_232
    assert round(e7b.kv_budget_bytes / 1e9, 1) == 62.5
    # MHA: 62,523,168,768 / 2 GiB = 29.11 → 29 sequences of 4K tokens
    assert e7b.max_concurrent_sequences == 29
    # GQA-8 in the same 62.5 GB: 62.5e9 / 0.5 GiB = 116.4 → 116 (the textbook figure holds the
    # budget fixed and shrinks the KV cache 4×)
    assert max_concurrent_sequences(62.5e9, kv_bytes_per_sequence(gqa8, 4096)) == 116
    assert estimate(gqa8, h100, kv_budget_bytes=62.5e9).max_concurrent_sequences == 116
    # With the GQA-8 model's own (smaller) weights the budget is 76e9 − 11,866,218,496
    # = 64,133,781,504 B and 119 sequences fit.
    own = estimate(gqa8, h100)
    assert own.kv_budget_bytes == 0.95 * 80e9 - 2 * (5_932_843_008 + 266_240)
    assert own.max_concurrent_sequences == 119


def test_ridge_and_critical_batch(e7b: Estimate, ref7b: ModelConfig, a100: Any) -> None:
    # ridge = peak / bandwidth: 989.4e12 / 3.35e12 = 295.3; 312e12 / 2.039e12 = 153.0
    assert round(e7b.ridge_point) == 295
    ea = estimate(ref7b, a100)
    assert round(ea.ridge_point) == 153
    # critical decode batch = ridge · weight bytes / (2·N) ≈ ridge for bf16 (2 B per param)
    assert round(e7b.critical_batch) == 295
    assert round(ea.critical_batch) == 153


def test_decode_floor(e7b: Estimate, ref7b: ModelConfig, a100: Any) -> None:
    # 13,476,831,232 B / 3.35e12 B/s = 4.023 ms; / 2.039e12 = 6.610 ms
    assert e7b.decode_floor_s == pytest.approx(13_476_831_232 / 3.35e12)
    assert round(e7b.decode_floor_s * 1e3, 1) == 4.0
    assert round(estimate(ref7b, a100).decode_floor_s * 1e3, 1) == 6.6
    # batch 1 at 4K context also reads the 2 GiB KV cache: (13.48e9 + 2.147e9) / 3.35e12
    assert e7b.decode_step_floor_s == pytest.approx((13_476_831_232 + 2 * GIB) / 3.35e12)


def test_prefill(e7b: Estimate) -> None:
    # FLOPs: 4096 · (2N + 4·L·d_attn·4097/2); bytes: weights + KV written (2 GiB)
    flops = 4096 * (2 * 6_738_149_376 + 4 * 32 * 4096 * 4097 / 2)
    assert e7b.prefill_flops == pytest.approx(flops)
    assert e7b.prefill_bytes == 13_476_831_232 + 2 * GIB
    assert e7b.prefill_intensity == pytest.approx(flops / (13_476_831_232 + 2 * GIB))
    assert e7b.prefill_intensity > e7b.ridge_point  # prefill is compute-bound
    assert e7b.prefill_floor_s == pytest.approx(flops / 989.4e12)


def test_moe_estimate(h100: Any) -> None:
    """BC-27: memory counts all experts, FLOPs and batch-1 decode the active ones."""
    mix = load_model_config(MODELS / "mixtral-8x7b.json")
    e = estimate(mix, h100)
    assert e.params.active == 12_879_659_008
    assert e.flops.linear_forward == 2 * 12_879_659_008
    assert e.weight_bytes == 2 * 46_702_792_704
    # one token reads attention, embeddings, norms, router and 2 of 8 experts per layer:
    # all − 32 layers · 6 idle experts · 3·4096·14336 params, × 2 B
    idle = 32 * 6 * 3 * 4096 * 14336
    assert e.active_weight_bytes == pytest.approx(2 * (46_702_792_704 - idle))
    assert e.decode_floor_s == pytest.approx(e.active_weight_bytes / 3.35e12)
    # critical batch: weights are read once per step, but each token uses only N_active
    assert e.critical_batch == pytest.approx(e.ridge_point * e.weight_bytes
                                             / (2 * 12_879_659_008))
    assert e.kv_budget_bytes < 0 and e.max_concurrent_sequences == 0
    assert any("MoE" in n for n in e.notes)
    assert any("do not fit" in n for n in e.notes)  # 93.4 GB of bf16 weights on 80 GB


def test_fp8_and_bad_inputs(ref7b: ModelConfig, h100: Any, a100: Any) -> None:
    e = estimate(ref7b, h100, dtype="fp8", kv_dtype="bf16")
    assert e.weight_bytes == 6_738_415_616 and e.kv_bytes_per_token == 512 * KIB
    assert round(e.peak.flops_per_s / 1e12) == 1979 and e.peak.dtype == "fp8"
    with pytest.raises(UsageError, match="no dense fp8 peak"):
        estimate(ref7b, a100, dtype="fp8")
    with pytest.raises(UsageError):
        estimate(ref7b, h100, seq_len=0)
    with pytest.raises(UsageError):
        estimate(ref7b, h100, dtype="int3")


def test_render_formats(e7b: Estimate) -> None:
    table = render_estimate(e7b, "table")
    for text in ("6,738,149,376", "202,375,168", "13.48 GB", "13.48 GFLOP/token",
                 "24,704 tokens", "107.81 GB", "512 KiB", "2 GiB", "62.52 GB", "4.02 ms",
                 "295.3 FLOP/byte", "peak=989 TFLOP/s bf16 dense"):
        assert text in table, text
    md = render_estimate(e7b, "markdown")
    assert md.startswith("### Estimate: llama2-7b on ")
    assert "| max concurrent sequences (S=4,096) | 29 |" in md
    data = json.loads(render_estimate(e7b, "json"))
    assert data["params"]["total"] == 6_738_149_376
    assert data["crossover_context_len_tokens"] == 24_704
    assert data["max_concurrent_sequences"] == 29
    assert data["kv_bytes_per_token"] == 524_288
    assert data["peak_dtype"] == "bf16" and data["peak_dense"] is True
    assert data["estimate_schema_version"] == 1
    with pytest.raises(UsageError, match="unknown format"):
        render_estimate(e7b, "html")  # type: ignore[arg-type]
