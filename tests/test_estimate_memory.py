"""Memory, itemized (traceroof.estimate_memory, issue 18 item 2) against hand arithmetic:
16 B per parameter of mixed-precision Adam with its split, Korthikanti et al.'s activations
per token per layer (34h + 5aS for GPT-style with dropout, checked on GPT-2 small), the three
recompute modes, logits, the per-device share under a layout, and inference memory."""

from __future__ import annotations

import pytest
from conftest import MODELS

from traceroof.errors import UsageError
from traceroof.estimate_memory import (
    Layout,
    activation_bytes_per_token_layer,
    expert_params,
    inference_memory,
    training_memory,
)
from traceroof.model import load_model_config

ALL_7B = 6_738_415_616  # every stored parameter of the reference 7B (norms included)


def test_gpt_style_is_korthikanti_34h_plus_5as() -> None:
    gpt2 = load_model_config(MODELS / "gpt2.json")  # h 768, 12 heads, d_ff 4h, no GQA
    # Korthikanti et al. 2022 eq. 1, per token per layer: 34·h + 5·a·S = 34·768 + 5·12·1024
    # = 26,112 + 61,440 = 87,552 B
    assert activation_bytes_per_token_layer(gpt2, 1024, "none", dropout=True) == 87_552
    # selective recomputation drops 5aS: 34·768 = 26,112
    assert activation_bytes_per_token_layer(gpt2, 1024, "selective", dropout=True) == 26_112
    # full recomputation keeps the layer input: 2h = 1,536
    assert activation_bytes_per_token_layer(gpt2, 1024, "full") == 1_536


def test_activations_7b_and_gqa(ref7b, gqa8) -> None:
    # no dropout; selective: attention 2·(h + d_attn + 2·d_kv + d_v) = 2·5·4096 = 40,960,
    # MLP 2·(h + 3·d_ff) = 2·(4096 + 33,024) = 74,240, norms 2·2·4096 = 16,384: 131,584 B
    assert activation_bytes_per_token_layer(ref7b, 4096, "selective") == 131_584
    # none adds the softmax output 2·a·S = 2·32·4096 = 262,144: 393,728 B
    assert activation_bytes_per_token_layer(ref7b, 4096, "none") == 131_584 + 262_144
    # GQA-8: K and V 1024 wide: attention 2·(4096 + 4096 + 2·1024 + 4096) = 28,672: 119,296
    assert activation_bytes_per_token_layer(gqa8, 4096, "selective") == 119_296


def test_activations_moe_and_mla() -> None:
    mix = load_model_config(MODELS / "mixtral-8x7b.json")
    # attention 28,672 (GQA-8) + MLP 2·(4096 + 3·2·14,336) = 180,224 (top-2 experts) + 16,384
    assert activation_bytes_per_token_layer(mix, 4096, "selective") == 225_280
    ds = load_model_config(MODELS / "deepseek-v2-lite.json")
    # MLA: Q 16·192 = 3072, K up-projected 3072, V 16·128 = 2048, O input 2048:
    # 2·(2048 + 3072 + 3072 + 2048 + 2048) = 24,576; MLP 2·(2048 + 3·(6·1408 + 2816)) = 71,680;
    # norms 8,192: 104,448
    assert activation_bytes_per_token_layer(ds, 4096, "selective") == 104_448


def test_training_memory_7b_one_device(ref7b) -> None:
    m = training_memory(ref7b, Layout(), seq_len=4096, hbm_bytes=80e9, recompute="selective")
    # 16 B per parameter: 2 weights + 2 gradients + 12 optimizer (4 master + 8 Adam m, v)
    assert m.weights_bytes == 2 * ALL_7B and m.gradients_bytes == 2 * ALL_7B
    assert m.optimizer_bytes == 12 * ALL_7B
    assert m.master_weights_bytes == 4 * ALL_7B and m.adam_moments_bytes == 8 * ALL_7B
    assert m.state_bytes == 16 * ALL_7B == 107_814_649_856
    # activations: 131,584 B · 4,096 tokens · 32 layers = 17,246,978,048
    assert m.activations_bytes["selective"] == 17_246_978_048
    assert m.activations_bytes["full"] == 8_192 * 4096 * 32
    # logits 4·V per token: 4·32,000·4,096 = 524,288,000
    assert m.logits_bytes == 524_288_000
    # total 107,814,649,856 + 17,246,978,048 + 524,288,000 = 125,585,915,904 > 76e9 usable
    assert m.total_bytes == 125_585_915_904
    assert m.usable_bytes == 0.95 * 80e9 and not m.fits


def test_training_memory_70b_layout() -> None:
    m70 = load_model_config(MODELS / "llama3-70b.json")
    lay = Layout(tp=8, pp=4, fsdp=32)
    m = training_memory(m70, lay, seq_len=8192, hbm_bytes=80e9)
    # weights: 2 B · 70,553,706,496 / (8·4·32) = 2 · 68,900,104 = 137,800,208
    assert m.weights_bytes == 2 * 68_900_104
    # activations: 274,432 B per token per layer / tp 8 = 34,304 · 8,192 tokens · 20 layers per
    # stage · 4 micro-batches in flight (1F1B first stage) = 22,481,469,440
    assert activation_bytes_per_token_layer(m70, 8192, "selective") == 274_432
    assert m.activations_bytes["selective"] == 22_481_469_440
    assert m.fits and any("1F1B" in n for n in m.notes)


def test_moe_experts_split_over_ep() -> None:
    mix = load_model_config(MODELS / "mixtral-8x7b.json")
    # experts: 32 layers · 8 · 3·4096·14,336 = 45,097,156,608; the rest 1,605,636,096
    assert expert_params(mix) == 45_097_156_608
    m = training_memory(mix, Layout(fsdp=8, ep=8), seq_len=4096, hbm_bytes=80e9)
    # dense / fsdp 8 + experts / ep 8 = 200,704,512 + 5,637,144,576 = 5,837,849,088 held
    assert m.weights_bytes == 2 * 5_837_849_088


def test_inference_memory_70b_tp8() -> None:
    m70 = load_model_config(MODELS / "llama3-70b.json")
    # KV per sequence at 8,192: 80 layers · 2 · 1,024 · 2 B · 8,192 = 2,684,354,560
    kv = 80 * 2 * 1024 * 2 * 8192
    m = inference_memory(m70, weight_bytes=2 * 70_553_706_496, kv_bytes_per_sequence=kv,
                         batch=4, seq_len=8192, hbm_bytes=80e9, tp=8)
    assert m.weights_bytes == 17_638_426_624  # 141,107,412,992 / 8
    assert m.kv_cache_bytes == 4 * 335_544_320  # the 8 KV heads split over tp 8
    assert m.logits_bytes == 2 * 128_256 * 4
    assert m.fits


def test_bad_layouts(ref7b) -> None:
    with pytest.raises(UsageError, match="--tp 3 must divide the 32 attention heads"):
        training_memory(ref7b, Layout(tp=3), seq_len=4096, hbm_bytes=80e9)
    with pytest.raises(UsageError, match="--ep 2 needs a mixture-of-experts model"):
        training_memory(ref7b, Layout(ep=2, fsdp=2), seq_len=4096, hbm_bytes=80e9)
    with pytest.raises(UsageError, match="--recompute must be one of"):
        activation_bytes_per_token_layer(ref7b, 4096, "some")  # type: ignore[arg-type]


def test_activation_formula_against_torch_saved_tensors() -> None:
    """Independent oracle: the bytes autograd saves for backward in an eager bf16 GPT-style
    block (LayerNorm, separate Q/K/V projections, softmax attention, GELU MLP), counted with
    ``torch.autograd.graph.saved_tensors_hooks`` (each storage once, parameters left out)."""
    import torch  # a test dependency (the CPU build)

    nn, F = torch.nn, torch.nn.functional
    h, a, ff, S, B = 64, 4, 256, 32, 2
    cfg = load_model_config({"model_type": "gpt2", "n_layer": 1, "n_embd": h, "n_head": a,
                             "n_inner": ff, "vocab_size": 100, "n_positions": S})

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
            self.q, self.k, self.v, self.o = (nn.Linear(h, h) for _ in range(4))
            self.fc1, self.fc2 = nn.Linear(h, ff), nn.Linear(ff, h)

        def forward(self, x):
            y = self.ln1(x)
            q, k, v = (p(y).view(B, S, a, h // a).transpose(1, 2) for p in (self.q, self.k, self.v))
            att = torch.softmax(q @ k.transpose(-1, -2) * (h // a) ** -0.5, dim=-1)
            x = x + self.o((att @ v).transpose(1, 2).reshape(B, S, h))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    block = Block().to(torch.bfloat16)
    params = {p.untyped_storage().data_ptr() for p in block.parameters()}
    saved: dict[int, int] = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            saved[st.data_ptr()] = st.nbytes()
        return t

    x = torch.randn(B, S, h, dtype=torch.bfloat16, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        block(x)
    per_token = sum(saved.values()) / (B * S)
    # formula, no recomputation: 2·(h + d_attn + 2·d_kv + d_v) + 2·a·S + 2·(h + 2·ff) + 4h
    # = 2·5·64 + 2·4·32 + 2·(64 + 512) + 256 = 640 + 256 + 1152 + 256 = 2,304 B
    formula = activation_bytes_per_token_layer(cfg, S, "none")
    assert formula == 2_304
    # torch saves exactly that plus each LayerNorm's mean and rstd (bf16): 2 norms · 2 · 2 B
    assert per_token == formula + 8
