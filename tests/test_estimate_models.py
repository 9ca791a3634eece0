"""The four reference models of issue 18 through every per-model formula of the plans, the
inputs written out by hand: the reference 7B (L 32, d 4096, d_ff 11008, V 32000, untied), its
GQA-8 variant, the 70B-class model (L 80, d 8192, 64 heads, 8 KV heads, d_ff 28672,
V 128256) and the MoE (Mixtral: 8 experts, top 2). On an H100 SXM (989.4 TFLOP/s, 3.35 TB/s,
80 GB)."""

from __future__ import annotations

import math

import pytest
from conftest import MODELS

from traceroof.estimate import estimate
from traceroof.estimate_memory import (
    Layout,
    activation_bytes_per_token_layer,
    training_memory,
)
from traceroof.estimate_serve import decode_point
from traceroof.estimate_train import training_plan
from traceroof.model import load_model_config, param_counts

# (file, L, d_attn, N, N_active, all stored, KV bytes per token, selective activation bytes
#  per token per layer at S=4096, weight bytes one decode token reads)
MODELS_BY_HAND = [
    # 7B: per layer 4·4096² + 3·4096·11008 = 202,375,168; N = 32·that + 2·32000·4096;
    # norms 65·4096 = 266,240; KV 2·32·32·128·2; act 2·5·4096 + 2·(4096 + 3·11008) + 4·4096
    ("llama2-7b.json", 32, 4096, 6_738_149_376, 6_738_149_376, 6_738_415_616, 524_288, 131_584,
     2 * 6_738_415_616),
    # GQA-8: K, V 4096·1024: per layer 177,209,344; KV 2·32·8·128·2; attention acts 2·14,336
    ("llama2-7b-gqa8.json", 32, 4096, 5_932_843_008, 5_932_843_008, 5_933_109_248, 131_072,
     119_296, 2 * 5_933_109_248),
    # 70B: per layer 855,638,016; norms 161·8192 = 1,318,912; KV 2·80·8·128·2;
    # act 2·(8192 + 8192 + 2048 + 8192) + 2·(8192 + 3·28672) + 4·8192
    ("llama3-70b.json", 80, 8192, 70_552_387_584, 70_552_387_584, 70_553_706_496, 327_680,
     274_432, 2 * 70_553_706_496),
    # Mixtral: active = all − 32 layers · 6 idle experts · 3·4096·14336; KV 2·32·8·128·2;
    # act 28,672 + 2·(4096 + 3·2·14336) + 16,384
    ("mixtral-8x7b.json", 32, 4096, 46_702_526_464, 12_879_659_008, 46_702_792_704, 131_072,
     225_280, 2 * (46_702_792_704 - 32 * 6 * 3 * 4096 * 14336)),
]
S = 4096


@pytest.mark.parametrize("row", MODELS_BY_HAND, ids=[r[0] for r in MODELS_BY_HAND])
def test_every_formula_per_model(row) -> None:
    name, L, d_attn, n, n_active, n_all, kv_tok, act_sel, read_bytes = row
    cfg = load_model_config(MODELS / name)
    p = param_counts(cfg)
    assert (p.total, p.active, p.all) == (n, n_active, n_all)
    e = estimate(cfg, "h100", seq_len=S)
    assert e.kv_bytes_per_token == kv_tok
    # training FLOPs per token: 6·N_active + 3·4·L·d_attn·(S+1)/2
    t = training_plan(cfg, 989.4e12, chips=1, mfu=1.0, seq_len=S, tokens=1.0)
    assert t.train_flops_per_token == 6 * n_active + 3 * 4 * L * d_attn * (S + 1) / 2
    # memory: 16 B per stored parameter of state on one device, selective activations
    m = training_memory(cfg, Layout(), seq_len=S, hbm_bytes=80e9)
    assert m.state_bytes == 16 * n_all
    assert activation_bytes_per_token_layer(cfg, S, "selective") == act_sel
    assert m.activations_bytes["selective"] == act_sel * S * L
    # decode at batch 1, position S: (weights read + KV of S tokens) / 3.35e12 B/s
    d = decode_point(cfg, 1, S, bytes_per_param=2.0, kv_dtype="bf16",
                     peak_flops_per_s=989.4e12, hbm_bytes_per_s=3.35e12)
    assert d.bytes_read == pytest.approx(read_bytes + kv_tok * S)
    assert d.time_s == pytest.approx((read_bytes + kv_tok * S) / 3.35e12)
    # concurrency: floor((0.95 · 80e9 − 2·all) / (KV per token · S)), 0 when the weights
    # alone do not fit (70B: 141.1 GB; Mixtral: 93.4 GB)
    budget = 0.95 * 80e9 - 2 * n_all
    assert e.max_concurrent_sequences == max(0, math.floor(budget / (kv_tok * S)))
