"""Model FLOPs accounting (traceroof.model): parameter counts, FLOPs per token, MFU/HFU.

Every expected number is either a textbook figure from issue 5 / DESIGN §7 with its arithmetic
in a comment, a published ``sum(p.numel())`` of a real checkpoint, or counted independently by
building the model in torch (parameters) and running torch's FlopCounterMode (FLOPs).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from traceroof.chips import get_chip
from traceroof.errors import InputNotFoundError, TraceroofError, UsageError
from traceroof.model import (
    Inconsistency,
    ModelConfig,
    ModelConfigError,
    Peak,
    Utilization,
    attention_flops_per_token,
    attention_pairs,
    crossover_context_len,
    flops_per_token,
    hfu,
    load_model_config,
    mfu,
    model_flops_breakdown,
    model_flops_per_step,
    param_counts,
    peak_from_chip,
)

MODELS = Path(__file__).resolve().parent.parent / "fixtures" / "models"


@pytest.fixture(scope="module")
def mixtral() -> ModelConfig:
    return load_model_config(MODELS / "mixtral-8x7b.json")


# ------------------------------------------------------------------------------------------
# Config loading
# ------------------------------------------------------------------------------------------


def test_reference_7b_config_fields(ref7b: ModelConfig) -> None:
    assert (ref7b.num_layers, ref7b.hidden_size, ref7b.num_heads, ref7b.num_kv_heads) == (
        32, 4096, 32, 32)
    assert ref7b.head_dim == 128  # hidden / heads = 4096 / 32
    assert ref7b.d_attn == 4096 and ref7b.d_kv == 4096
    assert ref7b.intermediate_size == 11008 and ref7b.vocab_size == 32000
    assert ref7b.tie_word_embeddings is False
    assert ref7b.mlp_type == "gated" and ref7b.norm_type == "rmsnorm"
    assert not (ref7b.qkv_bias or ref7b.out_bias or ref7b.mlp_bias)
    assert ref7b.name == "llama2-7b" and ref7b.source.endswith("llama2-7b.json")
    assert ref7b.assumptions == ()
    assert not ref7b.is_moe


def test_gpt2_names_and_defaults() -> None:
    cfg = load_model_config(MODELS / "gpt2.json")
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads) == (12, 768, 12)
    assert cfg.intermediate_size == 4 * 768  # n_inner null means 4·n_embd
    assert cfg.mlp_type == "standard" and cfg.norm_type == "layernorm"
    assert cfg.qkv_bias and cfg.out_bias and cfg.mlp_bias
    assert cfg.tie_word_embeddings is True  # GPT-2 ties wte and lm_head; no key in the file
    assert cfg.position_embedding_size == 1024


def test_missing_required_key_names_key_and_file(tmp_path: Path) -> None:
    raw = json.loads((MODELS / "llama2-7b.json").read_text())
    del raw["num_hidden_layers"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ModelConfigError) as info:
        load_model_config(path)
    msg = str(info.value)
    assert "num_hidden_layers" in msg and str(path) in msg and "n_layer" in msg
    assert isinstance(info.value, UsageError) and isinstance(info.value, TraceroofError)
    assert info.value.exit_code == 2


@pytest.mark.parametrize("key", ["hidden_size", "num_attention_heads", "vocab_size",
                                 "intermediate_size"])
def test_each_required_key(key: str) -> None:
    raw = json.loads((MODELS / "llama2-7b.json").read_text())
    del raw[key]
    with pytest.raises(ModelConfigError, match=key):
        load_model_config(raw, name="my-config")


def test_bad_files(tmp_path: Path) -> None:
    with pytest.raises(InputNotFoundError, match="nope.json"):
        load_model_config(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"num_hidden_layers": 32,\n "hidden_size": }')
    with pytest.raises(ModelConfigError, match=r"bad.json: not valid JSON at line 2"):
        load_model_config(bad)
    arr = tmp_path / "arr.json"
    arr.write_text("[1, 2]")
    with pytest.raises(ModelConfigError, match="expected a JSON object"):
        load_model_config(arr)


def test_bad_values() -> None:
    base = json.loads((MODELS / "llama2-7b.json").read_text())
    with pytest.raises(ModelConfigError, match="num_key_value_heads=5 must divide"):
        load_model_config({**base, "num_key_value_heads": 5})
    with pytest.raises(ModelConfigError, match="num_key_value_heads=0 must divide"):
        load_model_config({**base, "num_key_value_heads": 0})
    with pytest.raises(ModelConfigError, match="'hidden_size' must be a non-negative integer"):
        load_model_config({**base, "hidden_size": "4096"})
    # MLA needs its head widths (issue 18: MLA is accounted for, no longer refused)
    with pytest.raises(ModelConfigError, match="missing required key 'qk_nope_head_dim'"):
        load_model_config({**base, "kv_lora_rank": 512})
    with pytest.raises(ModelConfigError, match="mlp_type"):
        load_model_config({**base, "mlp_type": "weird"})


def test_directory_and_text_config(tmp_path: Path) -> None:
    raw = json.loads((MODELS / "llama2-7b.json").read_text())
    (tmp_path / "my-model").mkdir()
    (tmp_path / "my-model" / "config.json").write_text(json.dumps(raw))
    cfg = load_model_config(tmp_path / "my-model")
    assert cfg.name == "my-model"
    wrapped = load_model_config({"model_type": "llava", "text_config": raw})
    assert param_counts(wrapped).total == 6_738_149_376


def test_unknown_family_records_assumptions() -> None:
    raw = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
           "intermediate_size": 128, "vocab_size": 100}
    cfg = load_model_config(raw)
    assert cfg.mlp_type == "gated" and cfg.tie_word_embeddings is True
    assert any("gated" in a for a in cfg.assumptions)
    assert any("tie_word_embeddings" in a for a in cfg.assumptions)
    assert load_model_config({**raw, "mlp_type": "standard"}).mlp_type == "standard"


# ------------------------------------------------------------------------------------------
# Parameter counts
# ------------------------------------------------------------------------------------------


def test_reference_7b_parameters(ref7b: ModelConfig) -> None:
    p = param_counts(ref7b)
    # attention: Q, K, V, O = 4·d² = 4·4096² = 67,108,864
    # MLP (SwiGLU gate, up, down) = 3·d·d_ff = 3·4096·11008 = 135,266,304
    assert p.layers[0].attention == 67_108_864
    assert p.layers[0].mlp == 135_266_304
    assert p.per_layer == 202_375_168  # 67,108,864 + 135,266,304
    # embedding and untied LM head: V·d = 32000·4096 = 131,072,000 each
    assert p.embedding == p.unembedding == 131_072_000
    # N = 32·202,375,168 + 2·131,072,000 = 6,476,005,376 + 262,144,000
    assert p.non_embedding == 6_476_005_376
    assert p.total == 6_738_149_376
    assert p.active == p.total
    # RMSNorm weights: 2 per block + final = (2·32 + 1)·4096 = 266,240, outside N
    assert p.norms == 266_240
    assert p.all == 6_738_415_616  # Llama-2-7B's published sum(numel)


def test_gqa8_parameters(gqa8: ModelConfig) -> None:
    p = param_counts(gqa8)
    # Q and O: 2·4096² = 33,554,432; K and V: 2·4096·(8·128) = 8,388,608
    assert p.layers[0].attention == 41_943_040
    assert p.per_layer == 177_209_344  # 41,943,040 + 135,266,304
    # N = 32·177,209,344 + 262,144,000 = 5,670,699,008 + 262,144,000
    assert p.total == 5_932_843_008


def test_mixtral_active_parameters(mixtral: ModelConfig) -> None:
    """BC-27: MoE FLOPs use the active parameters (top-k experts), memory uses all experts."""
    assert mixtral.is_moe and mixtral.num_experts == 8 and mixtral.num_experts_per_tok == 2
    assert mixtral.expert_intermediate_size == 14336
    p = param_counts(mixtral)
    attn = 2 * 4096 * 4096 + 2 * 4096 * 1024  # Q, O + K, V (8 KV heads) = 41,943,040
    expert = 3 * 4096 * 14336  # 176,160,768
    router = 4096 * 8  # 32,768
    assert p.layers[0].attention == attn == 41_943_040
    assert p.per_layer == attn + 8 * expert + router == 1_451_261_952
    assert p.layers[0].active == attn + 2 * expert + router == 394_297_344
    # total: 32·1,451,261,952 + 2·131,072,000
    assert p.total == 46_702_526_464
    # active: 32·394,297,344 + 2·131,072,000 = 12,617,515,008 + 262,144,000
    assert p.active == 12_879_659_008
    assert p.all == 46_702_792_704  # Mixtral-8x7B's published sum(numel) (46.7 B)
    assert flops_per_token(mixtral).linear_forward == 2 * 12_879_659_008


def test_tied_embedding_counts() -> None:
    gpt2 = param_counts(load_model_config(MODELS / "gpt2.json"))
    assert gpt2.unembedding == 0 and gpt2.embedding == 50257 * 768
    # per block: c_attn 768·2304+2304, c_proj 768²+768, c_fc 768·3072+3072, c_proj 3072·768+768
    assert gpt2.per_layer == 1_771_776 + 590_592 + 2_362_368 + 2_360_064 == 7_084_800
    assert gpt2.position_embedding == 1024 * 768
    assert gpt2.norms == 12 * 2 * 1536 + 1536  # LayerNorm weight + bias
    assert gpt2.all == 124_439_808  # GPT-2 small's published sum(numel)
    llama1b = param_counts(load_model_config(MODELS / "llama3.2-1b.json"))
    assert llama1b.unembedding == 0
    assert llama1b.all == 1_235_814_400  # Llama-3.2-1B's published sum(numel)


def test_moe_shared_experts_and_layer_placement() -> None:
    """DeepSeek-MoE style: first k layers dense, shared experts, moe_intermediate_size."""
    d, ff, eff = 64, 256, 32
    cfg = load_model_config({
        "model_type": "deepseek", "num_hidden_layers": 4, "hidden_size": d,
        "num_attention_heads": 4, "intermediate_size": ff, "moe_intermediate_size": eff,
        "n_routed_experts": 16, "num_experts_per_tok": 4, "n_shared_experts": 2,
        "first_k_dense_replace": 1, "vocab_size": 1000, "tie_word_embeddings": False,
    })
    assert cfg.moe_layers == (1, 2, 3)
    p = param_counts(cfg)
    attn = 4 * d * d
    expert = 3 * d * eff
    shared = 3 * d * (2 * eff)
    assert p.layers[0].total == attn + 3 * d * ff
    assert p.layers[1].total == attn + 16 * expert + d * 16 + shared
    assert p.layers[1].active == attn + 4 * expert + d * 16 + shared
    assert p.per_layer is None
    assert p.active == p.layers[0].total + 3 * p.layers[1].active + 2 * 1000 * d


def test_qwen2_moe_style() -> None:
    """Qwen2-MoE style: qkv bias, shared expert with its sigmoid gate, sparse step, mlp-only."""
    d = 32
    cfg = load_model_config({
        "model_type": "qwen2_moe", "num_hidden_layers": 4, "hidden_size": d,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
        "moe_intermediate_size": 16, "num_experts": 8, "num_experts_per_tok": 2,
        "shared_expert_intermediate_size": 64, "decoder_sparse_step": 1,
        "mlp_only_layers": [3], "vocab_size": 500, "tie_word_embeddings": False,
    })
    assert cfg.moe_layers == (0, 1, 2) and cfg.qkv_bias and not cfg.out_bias
    p = param_counts(cfg)
    attn = d * d + 2 * d * 16 + d * d + (d + 2 * 16)  # + q, k, v biases
    moe_active = 2 * 3 * d * 16 + d * 8 + 3 * d * 64 + d  # experts + router + shared + gate
    assert p.layers[0].active == attn + moe_active
    assert p.layers[3].total == attn + 3 * d * 128


# An independent count: build the model in torch the way transformers does and sum numel.


class _MLP(nn.Module):
    def __init__(self, d: int, ff: int, gated: bool, bias: bool) -> None:
        super().__init__()
        self.gated = gated
        self.up = nn.Linear(d, ff, bias=bias)
        self.gate = nn.Linear(d, ff, bias=bias) if gated else None
        self.down = nn.Linear(ff, d, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(x)
        h = torch.nn.functional.silu(self.gate(x)) * h if self.gate is not None else \
            torch.nn.functional.gelu(h)
        return self.down(h)


class _Block(nn.Module):
    def __init__(self, c: ModelConfig, moe: bool) -> None:
        super().__init__()
        d, hd = c.hidden_size, c.head_dim
        self.c = c
        self.q = nn.Linear(d, c.num_heads * hd, bias=c.qkv_bias)
        self.k = nn.Linear(d, c.num_kv_heads * hd, bias=c.qkv_bias)
        self.v = nn.Linear(d, c.num_kv_heads * hd, bias=c.qkv_bias)
        self.o = nn.Linear(c.num_heads * hd, d, bias=c.out_bias)
        norm = (lambda n: nn.LayerNorm(n)) if c.norm_type == "layernorm" else \
            (lambda n: nn.RMSNorm(n))
        self.n1, self.n2 = norm(d), norm(d)
        self.qk = nn.ModuleList([nn.RMSNorm(hd), nn.RMSNorm(hd)]) if c.qk_norm else None
        if moe:
            self.experts = nn.ModuleList(
                _MLP(d, c.expert_intermediate_size, True, c.mlp_bias)
                for _ in range(c.num_experts))
            self.router = nn.Linear(d, c.num_experts, bias=False)
            self.shared = _MLP(d, c.shared_expert_intermediate_size, True, c.mlp_bias) \
                if c.shared_expert_intermediate_size else None
            self.shared_gate = nn.Linear(d, 1, bias=False) if c.shared_expert_gate else None
        else:
            self.mlp = _MLP(d, c.intermediate_size, c.mlp_type == "gated", c.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # dense blocks only
        c = self.c
        b, s, _ = x.shape
        h = self.n1(x)
        q = self.q(h).view(b, s, c.num_heads, c.head_dim).transpose(1, 2)
        k = self.k(h).view(b, s, c.num_kv_heads, c.head_dim).transpose(1, 2)
        v = self.v(h).view(b, s, c.num_kv_heads, c.head_dim).transpose(1, 2)
        rep = c.num_heads // c.num_kv_heads
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        scores = q @ k.transpose(-1, -2) / math.sqrt(c.head_dim)  # [b, h, s, d] @ [b, h, d, s]
        mask = torch.ones(s, s, dtype=torch.bool).triu(1)
        attn = scores.masked_fill(mask, float("-inf")).softmax(-1) @ v  # [b, h, s, s] @ [.., d]
        x = x + self.o(attn.transpose(1, 2).reshape(b, s, -1))
        return x + self.mlp(self.n2(x))


class _Model(nn.Module):
    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        self.emb = nn.Embedding(c.vocab_size, c.hidden_size)
        self.pos = nn.Embedding(c.position_embedding_size, c.hidden_size) \
            if c.position_embedding_size else None
        self.blocks = nn.ModuleList(_Block(c, i in c.moe_layers) for i in range(c.num_layers))
        self.norm = nn.LayerNorm(c.hidden_size) if c.norm_type == "layernorm" else \
            nn.RMSNorm(c.hidden_size)
        self.head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        if c.tie_word_embeddings:
            self.head.weight = self.emb.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x))


def _numel(cfg: ModelConfig) -> int:
    with torch.device("meta"):
        model = _Model(cfg)
    return sum(p.numel() for p in model.parameters())  # shared tensors counted once


@pytest.mark.parametrize("name", ["llama2-7b", "llama2-7b-gqa8", "mixtral-8x7b", "gpt2",
                                  "llama3.2-1b"])
def test_fixture_counts_match_torch(name: str) -> None:
    cfg = load_model_config(MODELS / f"{name}.json")
    assert param_counts(cfg).all == _numel(cfg)


@settings(max_examples=40, deadline=None)
@given(
    layers=st.integers(1, 4), heads=st.sampled_from([1, 2, 4, 8]), group=st.sampled_from([1, 2, 4]),
    head_dim=st.sampled_from([8, 16]), ff=st.integers(1, 96), vocab=st.integers(1, 300),
    model_type=st.sampled_from(["llama", "gpt2", "qwen2", "qwen3", "mixtral", "qwen2_moe"]),
    tied=st.booleans(), attention_bias=st.booleans(), mlp_bias=st.booleans(),
)
def test_counts_match_torch_for_random_configs(layers: int, heads: int, group: int,
                                               head_dim: int, ff: int, vocab: int,
                                               model_type: str, tied: bool,
                                               attention_bias: bool, mlp_bias: bool) -> None:
    kv = max(1, heads // group)
    raw = {"model_type": model_type, "num_hidden_layers": layers, "hidden_size": 24,
           "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": head_dim,
           "intermediate_size": ff, "vocab_size": vocab, "tie_word_embeddings": tied,
           "attention_bias": attention_bias, "mlp_bias": mlp_bias, "n_positions": 7}
    if model_type in ("mixtral", "qwen2_moe"):
        raw |= {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 5,
                "shared_expert_intermediate_size": 6 if model_type == "qwen2_moe" else 0}
    if model_type == "gpt2":
        raw["num_key_value_heads"] = heads  # GPT-2 is MHA
    cfg = load_model_config(raw)
    p = param_counts(cfg)
    assert p.all == _numel(cfg)
    assert p.all == p.total + p.norms + p.position_embedding


# ------------------------------------------------------------------------------------------
# FLOPs
# ------------------------------------------------------------------------------------------


def test_reference_7b_flops_per_token(ref7b: ModelConfig) -> None:
    f = flops_per_token(ref7b)
    assert f.linear_forward == 2 * 6_738_149_376 == 13_476_298_752
    assert round(f.linear_forward / 1e9, 2) == 13.48  # "2N = 13.48 GFLOP per token"
    assert f.linear_train == 6 * 6_738_149_376
    # matmuls actually run: blocks + LM head; the embedding lookup is not a matmul
    assert f.matmul_forward == 2 * (6_476_005_376 + 131_072_000)
    assert f.attention_forward == 0 and f.forward == f.linear_forward


def test_crossover_context_length(ref7b: ModelConfig, gqa8: ModelConfig) -> None:
    # Attention per token at context S: 4·L·S·d_attn (QKᵀ and A·V, every key visible).
    # Linear per token, blocks only: 2·N_blocks. Equal at S = N_blocks / (2·L·d_attn).
    # 7B: 6,476,005,376 / (2·32·4096) = 6,476,005,376 / 262,144 = 24,704 exactly
    #     (= per-layer 202,375,168 / 8192).
    assert crossover_context_len(ref7b) == 24_704
    assert attention_flops_per_token(ref7b, 24_704) == 2 * param_counts(ref7b).non_embedding
    # GQA-8: 32·177,209,344 / 262,144 = 177,209,344 / 8192 = 21,632 (d_attn unchanged: GQA
    # shrinks K and V, not the number of query heads)
    assert crossover_context_len(gqa8) == 21_632
    # Other conventions do not give the textbook figure: with the embeddings included,
    # 2N / (4·L·d_attn) = 13,476,298,752 / 524,288 = 25,703.6.
    assert 2 * 6_738_149_376 / (4 * 32 * 4096) != 24_704


def test_attention_pairs() -> None:
    assert attention_pairs(4096, causal=False) == 4096 * 4096
    assert attention_pairs(4096) == 4096 * 4097 // 2  # S(S+1)/2, exact (BC-25)
    assert attention_pairs(1, 4096) == 4096  # decode token: all 4096 keys, not halved
    assert attention_pairs(3, 10) == 8 + 9 + 10  # chunked prefill, bottom-right aligned
    assert attention_pairs(10, window=4) == 1 + 2 + 3 + 4 * 7  # sliding window of 4
    assert attention_pairs(2, 10, window=4) == 8
    with pytest.raises(UsageError):
        attention_pairs(10, 5)
    with pytest.raises(UsageError):
        attention_pairs(0)


def test_bc25_causal_attention_halved(ref7b: ModelConfig) -> None:
    """BC-25: a causal sequence counts S(S+1)/2 (q, k) pairs, not S²."""
    s, tokens = 16384, 16384
    full = model_flops_breakdown(ref7b, tokens, "infer", seq_len=s, causal=False)
    causal = model_flops_breakdown(ref7b, tokens, "infer", seq_len=s, causal=True)
    # one sequence: 4·d_attn·pairs per layer
    assert full.attention == 32 * 4 * 4096 * s * s
    assert causal.attention == 32 * 4 * 4096 * s * (s + 1) // 2
    assert causal.attention / full.attention == pytest.approx(0.5, rel=1e-4)
    assert causal.linear == full.linear == 2 * 6_738_149_376 * tokens
    # The BC-25 kernel repro (B=1, H=32, S=16384, D=128): one layer's attention, non-causal
    # 4·B·H·S²·D = 4.398e12 FLOP; causal ≈ half.
    assert full.attention / 32 == pytest.approx(4.398e12, rel=1e-3)
    # decode (q_len 1, kv_len 4096): 4·H·D·4096 per layer, not halved
    dec = model_flops_breakdown(ref7b, 1, "infer", kv_len=4096)
    assert dec.attention == 32 * 4 * 32 * 128 * 4096
    assert "causal" in causal.formula and "S(S+1)/2" in causal.formula


def test_palm_formula_reproduced_when_not_causal(ref7b: ModelConfig) -> None:
    """PaLM App. B: training FLOPs per token = 6N + 12·L·H·Q·T (full attention square)."""
    t, batch = 2048, 8
    got = model_flops_per_step(ref7b, batch * t, "train", seq_len=t, causal=False)
    n, L, H, Q = 6_738_149_376, 32, 32, 128
    assert got == batch * t * (6 * n + 12 * L * H * Q * t)
    assert model_flops_per_step(ref7b, batch * t, "train") == 6 * n * batch * t
    assert model_flops_per_step(ref7b, 100, "infer") == 2 * n * 100


def test_model_flops_train_is_three_forward(ref7b: ModelConfig) -> None:
    fwd = model_flops_breakdown(ref7b, 8192, "infer", seq_len=4096)
    trn = model_flops_breakdown(ref7b, 8192, "train", seq_len=4096)
    assert trn.total == 3 * fwd.total and trn.attention == 3 * fwd.attention
    assert trn.n_params == 6_738_149_376 and trn.mode == "train"
    per_tok = flops_per_token(ref7b, 4096)
    assert per_tok.attention_forward == 32 * 4 * 4096 * 4097 / 2  # 4·L·d_attn·(S+1)/2
    assert fwd.total == pytest.approx(8192 * per_tok.forward, rel=1e-12)
    assert trn.to_dict()["formula"] == trn.formula
    with pytest.raises(UsageError):
        model_flops_per_step(ref7b, 0)
    with pytest.raises(UsageError):
        model_flops_per_step(ref7b, 10, "eval")  # type: ignore[arg-type]


def test_moe_model_flops_use_active_parameters(mixtral: ModelConfig) -> None:
    assert model_flops_per_step(mixtral, 1000, "train") == 6 * 12_879_659_008 * 1000
    assert "N_active=12,879,659,008" in model_flops_breakdown(mixtral, 1000).formula


def test_sliding_window_caps_attention() -> None:
    raw = json.loads((MODELS / "llama2-7b-gqa8.json").read_text())
    cfg = load_model_config({**raw, "model_type": "mistral", "sliding_window": 1024})
    assert attention_flops_per_token(cfg, 8192) == 32 * 4 * 4096 * 1024
    no_window = load_model_config({**raw, "sliding_window": 1024, "use_sliding_window": False})
    assert no_window.sliding_window is None
    # per-layer types (transformers' layer_types): only the sliding layers are capped
    mixed = load_model_config({**raw, "sliding_window": 1024,
                               "layer_types": ["sliding_attention", "full_attention"] * 16})
    assert mixed.sliding_window_layers == tuple(range(0, 32, 2))
    assert attention_flops_per_token(mixed, 8192) == 4 * 4096 * (16 * 1024 + 16 * 8192)


@pytest.mark.parametrize("tied", [False, True])
def test_flops_match_torch_flop_counter(tied: bool) -> None:
    """Run a tiny model under torch's FlopCounterMode and compare with our accounting.

    The explicit attention matmuls run the full S×S square (masking happens after), so they
    match ``causal=False``; the embedding lookup does no FLOPs, so the counter sees
    2·(N − V·d) per token when untied and exactly 2N when tied.
    """
    raw = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
           "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96,
           "vocab_size": 100, "tie_word_embeddings": tied}
    cfg = load_model_config(raw)
    torch.manual_seed(0)
    model = _Model(cfg)
    b, s = 2, 16
    ids = torch.randint(0, 100, (b, s))
    with FlopCounterMode(display=False) as fwd_counter:
        model(ids)
    lookup = 0 if tied else 2 * 100 * 64 * b * s
    ours = model_flops_breakdown(cfg, b * s, "infer", seq_len=s, causal=False)
    assert fwd_counter.get_total_flops() == ours.total - lookup
    assert fwd_counter.get_total_flops() == b * s * flops_per_token(cfg).matmul_forward \
        + ours.attention
    with FlopCounterMode(display=False) as train_counter:
        model(ids).sum().backward()
    ours_train = model_flops_breakdown(cfg, b * s, "train", seq_len=s, causal=False)
    assert train_counter.get_total_flops() == ours_train.total - 3 * lookup


# ------------------------------------------------------------------------------------------
# MFU / HFU
# ------------------------------------------------------------------------------------------


def _h100_peak() -> Peak:
    peak = peak_from_chip(get_chip("h100"), "bf16")
    assert peak is not None
    return peak


def test_bc29_dense_peak_mfu() -> None:
    """BC-29: 480 TFLOP/s achieved on an H100 is 48.5 % of the dense 989, not 24.3 %."""
    peak = _h100_peak()
    assert round(peak.flops_per_s / 1e12) == 989 and peak.dense
    step_ns = 2_000_000_000  # 2 s steps
    flops = 480e12 * 2.0  # FLOPs per step such that achieved = 480 TFLOP/s on one device
    u = mfu(flops, step_ns, peak)
    assert isinstance(u, Utilization)
    assert u.achieved_flops_per_s == pytest.approx(480e12)
    assert round(u.percent, 1) == 48.5  # 480 / 989.4 = 0.4851
    assert "peak=989 TFLOP/s bf16 dense" in u.describe()
    assert "MFU 48.5 %" in u.describe()
    assert "NVIDIA H100 SXM5 80GB" in u.describe() and "nv-h100-ds" in u.describe()
    d = u.to_dict()
    assert d["peak_flops_per_s"] == peak.flops_per_s and d["peak_dtype"] == "bf16"
    # the sparse headline figure would have given the wrong 24.3 %
    assert round(100 * 480e12 / 1979e12, 1) == 24.3


def test_mfu_over_100_percent_is_an_inconsistency() -> None:
    """BC-29 / BC-31: MFU above 100 % is never a result; the suspects are named."""
    # 480 TFLOP/s against the A100's 312 (e.g. the wrong chip picked): 153.8 %
    r = mfu(480e12, 1_000_000_000, 312e12, peak_dtype="bf16", peak_source="A100 datasheet",
            flops_formula="6·N·tokens")
    assert isinstance(r, Inconsistency)
    assert r.what == "MFU" and r.value == pytest.approx(480 / 312) and r.limit == 1.0
    text = r.describe()
    assert "153.8 %" in text
    assert "peak taken" in text and "312 TFLOP/s bf16 dense" in text and "A100 datasheet" in text
    assert "FLOP formula" in text and "6·N·tokens" in text
    assert "clock" in text and "1000.000 ms" in text
    assert r.to_dict()["inputs"]["peak_flops_per_s"] == 312e12
    h = hfu(2e15, 1_000_000_000, 989e12)
    assert isinstance(h, Inconsistency) and h.what == "HFU"
    assert "op table" in h.describe()


def test_peak_from_chip_without_that_dtype() -> None:
    assert peak_from_chip(get_chip("a100"), "fp8") is None  # Ampere has no fp8 tensor path
    assert peak_from_chip(get_chip("a100"), "bfloat16").dtype == "bf16"


def test_mfu_exactly_at_peak_is_a_result() -> None:
    assert isinstance(mfu(989e12, 1e9, 989e12), Utilization)


def test_mfu_n_devices_and_hfu() -> None:
    # 8 devices, one 1 s step of 8·400 TFLOP: 400 TFLOP/s each, 40.4 % of 989
    u = mfu(8 * 400e12, 1e9, 989e12, n_devices=8, peak_dtype="bf16")
    assert isinstance(u, Utilization)
    assert u.achieved_flops_per_s == pytest.approx(400e12)
    assert u.value == pytest.approx(400 / 989)
    h = hfu(3.6e14, 5e8, 989e12)  # 720 TFLOP/s
    assert isinstance(h, Utilization) and h.kind == "HFU"
    assert h.value == pytest.approx(720 / 989)
    assert h.flops_formula == "sum of op-table FLOPs"


def test_mfu_unknown_peak_is_unknown_not_a_fallback() -> None:
    """BC-31: no peak → MFU unknown, never another chip's peak."""
    u = mfu(1e15, 1e9, None)
    assert isinstance(u, Utilization) and u.value is None and u.percent is None
    assert "MFU unknown" in u.describe() and "--peak" in u.describe()
    assert u.to_dict()["peak_flops_per_s"] is None


def test_mfu_rejects_bad_inputs() -> None:
    for bad in [dict(step_time_ns=0), dict(step_time_ns=-5), dict(n_devices=0),
                dict(peak_flops_per_s=0.0), dict(model_flops_per_step=-1.0)]:
        args = dict(model_flops_per_step=1e12, step_time_ns=1e9, peak_flops_per_s=1e15,
                    n_devices=1) | bad
        with pytest.raises(UsageError):
            mfu(**args)


def test_mfu_from_a_model_config(ref7b: ModelConfig) -> None:
    """End to end: 7B training, 8 × H100, global batch 1M tokens at 4K context, 9 s steps."""
    tokens, s = 256 * 4096, 4096
    step = model_flops_breakdown(ref7b, tokens, "train", seq_len=s)
    # 6N·tokens + 3·4·L·d_attn·S(S+1)/2·(tokens/S)
    expected = 6 * 6_738_149_376 * tokens + 3 * 4 * 32 * 4096 * (s * (s + 1) // 2) * 256
    assert step.total == expected
    u = mfu(step.total, 9_000_000_000, _h100_peak(), n_devices=8, flops_formula=step.formula)
    assert isinstance(u, Utilization)
    assert u.value == pytest.approx(expected / 9 / 8 / _h100_peak().flops_per_s)
    assert 0.6 < u.value < 0.7
