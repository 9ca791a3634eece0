"""Serving (traceroof.estimate_serve, issue 18 items 3 and 5) against hand arithmetic: the
decode step at position S, the batch sweep, the largest batch within a TPOT target, the
concurrency of a KV budget, the cost per million tokens, weight-only quantization (int4 weights,
bf16 compute) on any chip, KV dtype, MLA and sliding windows in the KV arithmetic."""

from __future__ import annotations

import json

import pytest
from conftest import MODELS

from traceroof.chips import get_chip
from traceroof.errors import UsageError
from traceroof.estimate import estimate, kv_bytes_per_sequence, kv_bytes_per_token
from traceroof.estimate_serve import decode_point, serving_plan, sweep_batches
from traceroof.model import attention_flops_per_token, load_model_config, param_counts

W7 = 13_476_831_232  # 6,738,415,616 params · 2 B
GIB = 2**30
H100 = dict(peak_flops_per_s=989.4e12, hbm_bytes_per_s=3.35e12)


def _plan(cfg, **kw):
    args = dict(position=4096, prompt_tokens=4096, bytes_per_param=2.0, weight_dtype="bf16",
                kv_dtype="bf16", hbm_bytes=80e9, **H100)
    return serving_plan(cfg, **{**args, **kw})


def test_decode_step_7b(ref7b) -> None:
    d = decode_point(ref7b, 1, 4096, bytes_per_param=2.0, kv_dtype="bf16", **H100)
    # bytes: weights 13,476,831,232 + KV of one 4K sequence 2 GiB = 15,624,314,880
    assert d.bytes_read == W7 + 2 * GIB
    # FLOPs: 2N + 4·L·d_attn·S = 13,476,298,752 + 4·32·4096·4096 = 15,623,782,400
    assert d.flops == 2 * 6_738_149_376 + 4 * 32 * 4096 * 4096 == 15_623_782_400
    # memory-bound: 15,624,314,880 / 3.35e12 = 4.664 ms (compute would take 15.8 µs)
    assert d.time_s == pytest.approx((W7 + 2 * GIB) / 3.35e12) and d.bound == "memory"
    assert round(d.time_s * 1e3, 3) == 4.664
    assert d.tokens_per_s_per_user == pytest.approx(1 / d.time_s)


def test_decode_turns_compute_bound_at_large_batch(ref7b) -> None:
    d = decode_point(ref7b, 1024, 1, bytes_per_param=2.0, kv_dtype="bf16", **H100)
    # FLOPs 1024·(2N + 4·32·4096·1) = 1024 · 13,476,823,040 → / 989.4e12 = 13.95 ms, above
    # the bytes (13,476,831,232 + 1024·524,288) / 3.35e12 = 4.18 ms
    assert d.flops == 1024 * (2 * 6_738_149_376 + 4 * 32 * 4096)
    assert d.bound == "compute"
    assert d.time_s == pytest.approx(1024 * 13_476_823_040 / 989.4e12)
    assert d.tokens_per_s_per_chip == pytest.approx(1024 / d.time_s)


def test_sweep_tpot_and_cost(ref7b) -> None:
    s = _plan(ref7b, tpot_target_s=0.020, price_per_chip_hour_usd=2.5)
    # KV budget 0.95·80e9 − 13,476,831,232 = 62,523,168,768 → floor(/2 GiB) = 29 sequences
    assert s.kv_budget_bytes == 0.95 * 80e9 - W7 and s.max_concurrent_sequences == 29
    assert [d.batch for d in s.sweep] == [1, 2, 4, 8, 16, 29]
    # t(B) = (W + B·2 GiB) / 3.35e12 <= 20 ms  ⇔  B <= (67e9 − W) / 2 GiB = 24.92  →  24
    assert s.max_batch_within_tpot == 24
    d = s.at_max_batch
    assert d is not None and d.time_s == pytest.approx((W7 + 24 * 2 * GIB) / 3.35e12)  # 19.41 ms
    # $2.5 per chip-hour / 3600 s / (24 / 19.408 ms tokens/s) · 1e6 = $0.5616 per M tokens
    assert d.cost_per_million_tokens_usd == pytest.approx(2.5 / 3600 / (24 / d.time_s) * 1e6)
    assert round(d.cost_per_million_tokens_usd, 4) == 0.5616
    # prefill of 4,096 tokens: compute-bound, 4096·(2N + 4·32·4096·4097/2) / 989.4e12
    assert s.prefill_bound == "compute"
    assert s.prefill_s == pytest.approx(4096 * (2 * 6_738_149_376 + 4 * 32 * 4096 * 4097 / 2)
                                        / 989.4e12)
    # a target batch 1 misses: 0, said, not a crash
    assert _plan(ref7b, tpot_target_s=0.001).max_batch_within_tpot == 0


def test_kv_budget_gives_concurrency(gqa8) -> None:
    # GQA-8: 0.5 GiB per 4K sequence; a 62.5 GB budget holds floor(62.5e9 / 2^29) = 116
    s = _plan(gqa8, kv_budget_bytes=62.5e9)
    assert s.kv_bytes_per_sequence == GIB // 2 and s.max_concurrent_sequences == 116
    assert s.sweep[-1].batch == 116


def test_int4_weights_with_bf16_compute_on_any_chip(ref7b) -> None:
    # today's refusal stays for a compute dtype the chip lacks, pointing to --weight-dtype
    with pytest.raises(UsageError, match="--weight-dtype int4"):
        estimate(ref7b, "h100", dtype="int4")
    for chip in ("h100", "a100", "tpu-v5p"):
        e = estimate(ref7b, chip, weight_dtype="int4")
        # 6,738,415,616 params · 0.5 B = 3,369,207,808 B; the peak stays bf16
        assert e.weight_bytes == 3_369_207_808 and e.peak.dtype == "bf16"
        assert e.decode_floor_s == pytest.approx(3_369_207_808 / get_chip(chip).hbm_bytes_per_s)
    # H100 batch 1 at 4K: (3,369,207,808 + 2 GiB) / 3.35e12 = 1.647 ms
    d = decode_point(ref7b, 1, 4096, bytes_per_param=0.5, kv_dtype="bf16", **H100)
    assert round(d.time_s * 1e3, 3) == 1.647
    # fp8 KV halves the cache: 256 KiB per token
    assert kv_bytes_per_token(ref7b, "fp8") == 256 * 1024


def test_mla_kv_cache() -> None:
    ds = load_model_config(MODELS / "deepseek-v2-lite.json")
    assert ds.is_mla and ds.head_dim == 192 and ds.d_v == 16 * 128
    p = param_counts(ds)
    # attention per layer: q 2048·16·192 = 6,291,456; kv_a 2048·(512+64) = 1,179,648;
    # kv_b 512·16·(128+128) = 2,097,152; o 16·128·2048 = 4,194,304: 13,762,560
    assert p.layers[0].attention == 13_762_560
    # N = 27·13,762,560 + dense layer 3·2048·10944 + 26·(64·3·2048·1408 + shared 3·2048·2816
    #     + router 2048·64) + 2·102,400·2048 = 15,706,357,760 (DeepSeek-V2-Lite: "15.7B")
    assert p.total == 15_706_357_760
    # KV cache per token: 27 layers · (512 + 64) · 2 B = 31,104 B (vs 2·27·16·192·2 = 331,776)
    assert kv_bytes_per_token(ds) == 31_104
    # attention FLOPs at position S: per layer 2·(d_qk + d_v) = 2·(3072 + 2048) per key
    assert attention_flops_per_token(ds, 100) == 27 * 2 * (3072 + 2048) * 100
    e = estimate(ds, "h100", weight_dtype="int4")
    assert any("latent" in n for n in e.notes)


def test_sliding_window_caps_kv() -> None:
    raw = json.loads((MODELS / "llama2-7b.json").read_text())
    swa = load_model_config({**raw, "model_type": "mistral", "sliding_window": 1024})
    # every layer keeps at most W = 1,024 tokens: 1,024 · 512 KiB = 512 MiB at any S >= W
    assert kv_bytes_per_sequence(swa, 8192) == 1024 * 512 * 1024
    d = decode_point(swa, 1, 8192, bytes_per_param=2.0, kv_dtype="bf16", **H100)
    assert d.bytes_read == W7 + 512 * 2**20
    assert d.flops == 2 * 6_738_149_376 + 4 * 32 * 4096 * 1024  # keys capped at the window


def test_moe_decode_reads_active_experts() -> None:
    mix = load_model_config(MODELS / "mixtral-8x7b.json")
    d = decode_point(mix, 1, 4096, bytes_per_param=2.0, kv_dtype="bf16", **H100)
    # one token: all weights − 32 layers · 6 idle experts · 3·4096·14336, × 2 B; + KV
    # 2·32·8·128·2 B · 4096 = 536,870,912
    active = 2 * (46_702_792_704 - 32 * 6 * 3 * 4096 * 14336)
    assert d.bytes_read == pytest.approx(active + 536_870_912)


def test_sweep_batches_and_bad_values(ref7b) -> None:
    assert sweep_batches(29) == [1, 2, 4, 8, 16, 29] and sweep_batches(1) == [1]
    assert sweep_batches(0) == []
    with pytest.raises(UsageError, match="--tpot-ms must be positive"):
        _plan(ref7b, tpot_target_s=-0.001)
    with pytest.raises(UsageError, match="batch, position and --tp must be positive"):
        decode_point(ref7b, 0, 4096, bytes_per_param=2.0, kv_dtype="bf16", **H100)


def test_mla_attention_flops_against_flop_counter() -> None:
    """Independent oracle: torch's FlopCounterMode on scaled_dot_product_attention with MLA's
    shapes (query/key heads of d_nope + d_rope = 192, value heads of 128)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from traceroof.model import model_flops_breakdown

    raw = json.loads((MODELS / "deepseek-v2-lite.json").read_text())
    ds = load_model_config({**raw, "num_hidden_layers": 1, "first_k_dense_replace": 0})
    B, H, S = 2, ds.num_heads, 64
    q = torch.randn(B, H, S, 192)
    k = torch.randn(B, H, S, 192)
    v = torch.randn(B, H, S, 128)
    with FlopCounterMode(display=False) as fc:
        torch.nn.functional.scaled_dot_product_attention(q, k, v)
    # ours, full mask: 2·(d_attn + d_v)·S² per sequence = 2·(16·192 + 16·128)·64² · 2 sequences
    ours = model_flops_breakdown(ds, B * S, "infer", seq_len=S, causal=False).attention
    assert ours == 2 * (16 * 192 + 16 * 128) * S * S * B
    assert ours == fc.get_total_flops()
