"""Model FLOPs accounting for decoder-only transformers, and MFU / HFU.

Reads a Hugging Face-style ``config.json`` into a :class:`ModelConfig`
(:mod:`traceroof.model_config`, re-exported here), counts its parameters
exactly (:func:`param_counts`), turns them into FLOPs per token and per step
(:func:`flops_per_token`, :func:`model_flops_per_step`) and divides by time and peak to give
MFU / HFU (:func:`mfu`, :func:`hfu`). Everything here is a pure function of its inputs.

Conventions (docs/mfu.md has the derivations and the sources):

* **N**, the accounting parameter count, is every weight and bias of every linear layer in the
  transformer blocks (attention projections, MLP or experts, MoE router) plus the token
  embedding and, when untied, the LM head. Normalisation weights and learned position tables do
  no matmul work and are left out of N (they are in :attr:`ParamCounts.all`, the number
  ``sum(p.numel())`` gives). For the reference 7B this is the textbook N = 6,738,149,376
  (Llama-2-7B's ``numel`` total is 6,738,415,616: the 266,240 RMSNorm weights).
* **Forward FLOPs per token** = 2·N_active (Kaplan et al. 2020, §2.1; PaLM, Chowdhery et al.
  2022, App. B). The input embedding is a lookup, not a matmul, so for an *untied* model 2N
  overstates the matmul work by 2·V·d (1.9 % on the 7B); we keep 2N because that is the
  definition MFU figures are quoted with, and expose :attr:`FlopsPerToken.matmul_forward`
  (= 2·(N − V·d_model) untied) for the exact count.
* **Attention term**: QKᵀ and A·V each cost 2·d_attn FLOPs per (query, key) pair per layer
  (d_attn = heads·head_dim), i.e. 4·d_attn per pair (Hoffmann et al. 2022, App. F). A token that
  sees S keys costs 4·L·S·d_attn. Over a causal sequence of length S the exact number of unmasked
  pairs is S(S+1)/2 (BC-25), not S² (PaLM's 12·L·H·Q·T counts S²; pass ``causal=False`` for it).
* **Training** = 3 × forward (backward = 2 × forward): 6N + attention.
* **Crossover context**: the S at which one token's attention FLOPs (4·L·S·d_attn, every key
  visible, as in decode) equal the blocks' own linear FLOPs (2·N_blocks, embedding and LM head
  excluded): S = N_blocks / (2·L·d_attn). Reference 7B: 6,476,005,376 / (2·32·4096) = 24,704.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal

from .errors import UsageError
from .model_config import ModelConfig, ModelConfigError, load_model_config

log = logging.getLogger(__name__)

__all__ = [
    "ModelConfigError",
    "ModelConfig",
    "load_model_config",
    "LayerParams",
    "ParamCounts",
    "param_counts",
    "FlopsPerToken",
    "flops_per_token",
    "attention_pairs",
    "attention_flops_per_token",
    "crossover_context_len",
    "ModelFlops",
    "model_flops_breakdown",
    "model_flops_per_step",
    "Peak",
    "peak_from_chip",
    "Utilization",
    "Inconsistency",
    "mfu",
    "hfu",
]


# --------------------------------------------------------------------------------------------
# Parameters
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerParams:
    """Parameters of one transformer block.

    ``attention``: Q, K, V, O weights (+ biases). ``mlp``: the dense MLP, or all routed experts
    + shared experts + router (+ shared-expert gate). ``mlp_active``: what one token uses:
    top-k experts + shared experts + router. ``norm``: normalisation weights (and biases).
    """

    attention: int
    mlp: int
    mlp_active: int
    norm: int

    @property
    def total(self) -> int:
        """Accounting parameters (norms excluded)."""
        return self.attention + self.mlp

    @property
    def active(self) -> int:
        """Accounting parameters one token uses (MoE: top-k experts)."""
        return self.attention + self.mlp_active


@dataclass(frozen=True)
class ParamCounts:
    """Exact parameter counts of a :class:`ModelConfig`.

    ``total`` is N, the accounting count behind 2N/6N (linear layers of the blocks + token
    embedding + untied LM head); ``all`` adds norms and learned position tables and equals
    ``sum(p.numel() for p in model.parameters())`` in transformers.
    """

    layers: tuple[LayerParams, ...]
    embedding: int  # token embedding, V·d
    unembedding: int  # LM head, V·d when untied, 0 when tied
    position_embedding: int  # learned absolute positions (GPT-2), 0 for RoPE models
    final_norm: int

    @property
    def blocks(self) -> int:
        """Accounting parameters of all blocks (non-embedding N)."""
        return sum(x.total for x in self.layers)

    @property
    def blocks_active(self) -> int:
        return sum(x.active for x in self.layers)

    @property
    def norms(self) -> int:
        return sum(x.norm for x in self.layers) + self.final_norm

    @property
    def total(self) -> int:
        """N: blocks + token embedding + untied LM head (norms excluded)."""
        return self.blocks + self.embedding + self.unembedding

    @property
    def active(self) -> int:
        """N_active: what one token touches (= total for a dense model)."""
        return self.blocks_active + self.embedding + self.unembedding

    @property
    def non_embedding(self) -> int:
        return self.blocks

    @property
    def all(self) -> int:
        """Every stored parameter (norms and position tables included)."""
        return self.total + self.norms + self.position_embedding

    @property
    def all_active(self) -> int:
        """Every parameter one token's forward pass reads (MoE: inactive experts left out)."""
        return self.active + self.norms + self.position_embedding

    @property
    def per_layer(self) -> int | None:
        """Accounting parameters of one block when all blocks are alike, else None."""
        sizes = {x.total for x in self.layers}
        return sizes.pop() if len(sizes) == 1 else None

    def to_dict(self) -> dict[str, int | None]:
        return {
            "total": self.total, "active": self.active, "per_layer": self.per_layer,
            "non_embedding": self.non_embedding, "embedding": self.embedding,
            "unembedding": self.unembedding, "position_embedding": self.position_embedding,
            "norms": self.norms, "all": self.all,
        }


def mlp_params(d: int, ff: int, gated: bool, bias: bool) -> int:
    """Parameters of one MLP of width ``d`` and hidden width ``ff``: 3·d·ff gated (gate, up,
    down) or 2·d·ff, plus (2 or 1)·ff + d biases when ``bias``."""
    mats = 3 if gated else 2
    p = mats * d * ff
    if bias:
        p += (2 if gated else 1) * ff + d
    return p


def _mla_attention_params(cfg: ModelConfig) -> tuple[int, int]:
    """(projection parameters, latent RMSNorm weights) of one multi-head latent attention
    block (DeepSeek-V2, arXiv:2405.04434 §2.1; the transformers ``DeepseekV2Attention``):
    queries d·H·d_qk, or d·r_q + r_q·H·d_qk through a latent of rank r_q (with an r_q norm);
    ``kv_a`` d·(r_kv + d_rope); ``kv_b`` r_kv·H·(d_nope + d_v) (with an r_kv norm); output
    H·d_v·d. d_qk = d_nope + d_rope = ``head_dim``."""
    d, h, rank = cfg.hidden_size, cfg.num_heads, cfg.kv_lora_rank
    nope = cfg.head_dim - cfg.qk_rope_head_dim
    q = (d * cfg.q_lora_rank + cfg.q_lora_rank * cfg.d_attn) if cfg.q_lora_rank else d * cfg.d_attn
    kv = d * (rank + cfg.qk_rope_head_dim) + rank * h * (nope + (cfg.v_head_dim or cfg.head_dim))
    return q + kv + cfg.d_v * d, rank + cfg.q_lora_rank


def param_counts(cfg: ModelConfig) -> ParamCounts:
    """Count the parameters of ``cfg`` exactly.

    Per block: Q d·d_attn, K and V d·d_kv each, O d_attn·d (+ biases where configured); gated MLP
    3·d·d_ff (gate, up, down), standard MLP 2·d·d_ff; MoE: E experts of 3·d·d_ff_e, router d·E,
    shared experts, and the top-k active; norms d (RMSNorm) or 2d (LayerNorm) × 2 per block.

    Reference 7B: 4·4096² + 3·4096·11008 = 67,108,864 + 135,266,304 = 202,375,168 per block;
    N = 32·202,375,168 + 2·32,000·4,096 = 6,738,149,376.
    """
    d, dk, da = cfg.hidden_size, cfg.d_kv, cfg.d_attn
    gated = cfg.mlp_type == "gated"
    attn = d * da + 2 * d * dk + da * d
    if cfg.qkv_bias:
        attn += da + 2 * dk
    if cfg.out_bias:
        attn += d
    norm_width = 2 * d if cfg.norm_type == "layernorm" else d
    norm = 2 * norm_width + (2 * cfg.head_dim if cfg.qk_norm else 0)
    if cfg.is_mla:
        attn, latent_norms = _mla_attention_params(cfg)
        norm += latent_norms
    dense_mlp = mlp_params(d, cfg.intermediate_size, gated, cfg.mlp_bias)
    moe = set(cfg.moe_layers) if cfg.num_experts else set()
    layers = []
    for i in range(cfg.num_layers):
        if i in moe:
            expert = mlp_params(d, cfg.expert_intermediate_size, True, cfg.mlp_bias)
            router = d * cfg.num_experts
            shared = (
                mlp_params(d, cfg.shared_expert_intermediate_size, True, cfg.mlp_bias)
                if cfg.shared_expert_intermediate_size else 0
            ) + (d if cfg.shared_expert_gate else 0)
            mlp = cfg.num_experts * expert + router + shared
            mlp_active = cfg.num_experts_per_tok * expert + router + shared
        else:
            mlp = mlp_active = dense_mlp
        layers.append(LayerParams(attn, mlp, mlp_active, norm))
    emb = cfg.vocab_size * d
    return ParamCounts(
        layers=tuple(layers), embedding=emb, unembedding=0 if cfg.tie_word_embeddings else emb,
        position_embedding=cfg.position_embedding_size * d, final_norm=norm_width,
    )


# --------------------------------------------------------------------------------------------
# FLOPs
# --------------------------------------------------------------------------------------------


def attention_pairs(q_len: int, kv_len: int | None = None, *, causal: bool = True,
                    window: int | None = None) -> int:
    """Number of unmasked (query, key) pairs in one head of one sequence.

    Causal masks are bottom-right aligned (query i of ``q_len`` sits at absolute position
    ``kv_len − q_len + i`` and sees keys 0..that position), which is what decode, chunked prefill
    and FlashAttention ≥ 2.1 use. ``window`` (sliding-window attention) caps each query at its
    last ``window`` keys, itself included. Exact: q_len = kv_len = S causal gives S(S+1)/2;
    q_len = 1 gives kv_len (BC-25: a decode token is not halved).

    Raises:
        UsageError: non-positive lengths, or kv_len < q_len under a causal mask.
    """
    kv = q_len if kv_len is None else kv_len
    if q_len <= 0 or kv <= 0:
        raise UsageError(f"attention lengths must be positive, got q_len={q_len}, kv_len={kv}")
    if not causal:
        return q_len * (kv if window is None else min(kv, window))
    if kv < q_len:
        raise UsageError(f"causal attention needs kv_len >= q_len, got {kv} < {q_len}")

    def prefix(n: int) -> int:  # Σ_{x=1..n} min(x, W)
        if window is None or n <= window:
            return n * (n + 1) // 2
        return window * (window + 1) // 2 + (n - window) * window

    return prefix(kv) - prefix(kv - q_len)


def _attention_forward_flops(cfg: ModelConfig, q_len: int, kv_len: int, causal: bool) -> int:
    """Forward attention-matmul FLOPs of one sequence: Σ_layers 2·(d_attn + d_v)·pairs (QKᵀ
    2·d_attn, A·V 2·d_v per pair; = 4·d_attn when values are as wide as keys)."""
    total = 0
    for layer in range(cfg.num_layers):
        total += 2 * (cfg.d_attn + cfg.d_v) * attention_pairs(q_len, kv_len, causal=causal,
                                                  window=cfg.window_for_layer(layer))
    return total


def attention_flops_per_token(cfg: ModelConfig, context_len: int) -> int:
    """Forward attention FLOPs of one token that attends to ``context_len`` keys.

    4·L·d_attn·S (2·d_attn for QKᵀ plus 2·d_attn for A·V per key per layer), S capped by a
    sliding window. This is a decode token at position S; averaged over a causal sequence of
    length S the figure is 4·L·d_attn·(S+1)/2 (see :func:`attention_pairs`).
    """
    return _attention_forward_flops(cfg, 1, context_len, causal=True)


def crossover_context_len(cfg: ModelConfig) -> float:
    """Context length S at which a token's attention FLOPs equal its blocks' linear FLOPs.

    2·N_blocks,active = 4·L·S·d_attn ⇒ S = N_blocks,active / (2·L·d_attn). Embedding and LM head
    are outside the blocks and not counted; every key visible (no causal halving: a decode
    token at position S; with values of another width (MLA) 2·d_attn becomes d_attn + d_v).
    Reference 7B: 6,476,005,376 / (2·32·4096) = 202,375,168 / 8192 =
    24,704; GQA-8: 177,209,344 / 8192 = 21,632. Sliding windows are ignored here (a windowed
    model's attention term stops growing at the window).
    """
    p = param_counts(cfg)
    return p.blocks_active / (cfg.num_layers * (cfg.d_attn + cfg.d_v))


@dataclass(frozen=True)
class FlopsPerToken:
    """FLOPs per token (FLOP/token), forward and training, split linear / attention.

    ``linear_forward`` = 2·N_active (the textbook figure, token embedding included);
    ``matmul_forward`` = the matmuls actually run (lookup excluded, LM head included);
    ``attention_forward`` = averaged over a causal (or full) sequence of ``seq_len``.
    """

    linear_forward: float
    matmul_forward: float
    attention_forward: float
    seq_len: int | None
    causal: bool

    @property
    def forward(self) -> float:
        return self.linear_forward + self.attention_forward

    @property
    def linear_train(self) -> float:
        return 3 * self.linear_forward

    @property
    def train(self) -> float:
        return 3 * self.forward


def flops_per_token(cfg: ModelConfig, seq_len: int | None = None, *,
                    causal: bool = True) -> FlopsPerToken:
    """FLOPs per token of ``cfg`` (2N forward, 6N training, plus attention at ``seq_len``).

    Sources: Kaplan et al. 2020 §2.1 (C ≈ 2N forward, 6N training); PaLM App. B.
    """
    p = param_counts(cfg)
    linear = 2.0 * p.active
    matmul = 2.0 * (p.blocks_active + cfg.vocab_size * cfg.hidden_size)
    attn = 0.0
    if seq_len is not None:
        attn = _attention_forward_flops(cfg, seq_len, seq_len, causal) / seq_len
    return FlopsPerToken(linear, matmul, attn, seq_len, causal)


Mode = Literal["train", "infer"]


@dataclass(frozen=True)
class ModelFlops:
    """Model FLOPs of one step, with the formula that produced them.

    ``linear`` = (6 train | 2 infer)·N_active·tokens; ``attention`` = (3 | 1)·sequences ·
    Σ_layers 4·d_attn·pairs(q_len, kv_len); ``total`` = linear + attention.
    """

    total: float
    linear: float
    attention: float
    mode: Mode
    tokens_per_step: float
    n_params: int  # N_active used
    seq_len: int | None
    kv_len: int | None
    causal: bool
    formula: str

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in (
            "total", "linear", "attention", "mode", "tokens_per_step", "n_params", "seq_len",
            "kv_len", "causal", "formula")}


def model_flops_breakdown(cfg: ModelConfig, tokens_per_step: float, mode: Mode = "train",
                          seq_len: int | None = None, causal: bool = True, *,
                          kv_len: int | None = None) -> ModelFlops:
    """Model FLOPs of one step (PaLM's MFU numerator), split into linear and attention.

    Args:
        tokens_per_step: tokens processed per step over all devices (global batch · seq).
        mode: ``train`` (forward + backward, 3× forward) or ``infer`` (forward only).
        seq_len: query tokens per sequence (training/prefill sequence length, or the chunk
            length). ``None`` with ``kv_len=None`` omits the attention term.
        causal: causal mask (exact pair count, BC-25). ``False`` reproduces PaLM's
            6N + 12·L·H·Q·T, which counts the full square.
        kv_len: keys each sequence attends over (default ``seq_len``). For decode, pass
            ``kv_len`` alone: each token is one sequence of q_len 1 seeing ``kv_len`` keys.

    Raises:
        UsageError: a non-positive count, an unknown mode, kv_len < seq_len under causal.
    """
    if mode not in ("train", "infer"):
        raise UsageError(f"mode must be 'train' or 'infer', got {mode!r}")
    if not tokens_per_step or tokens_per_step <= 0:
        raise UsageError(f"tokens_per_step must be positive, got {tokens_per_step!r}")
    p = param_counts(cfg)
    n = p.active
    mult = 3 if mode == "train" else 1
    linear = 2.0 * mult * n * tokens_per_step
    attention = 0.0
    q_len = kv = None
    lin_txt = f"{2 * mult}·N·tokens (N{'_active' if cfg.is_moe else ''}={n:,}, " \
              f"tokens={tokens_per_step:,.0f})"
    if seq_len is None and kv_len is None:
        formula = f"{lin_txt}; no attention term (sequence length not given)"
    else:
        q_len = seq_len if seq_len is not None else 1
        kv = kv_len if kv_len is not None else q_len
        sequences = tokens_per_step / q_len
        per_seq = _attention_forward_flops(cfg, q_len, kv, causal)
        attention = float(mult * sequences * per_seq)
        pairs = "S(S+1)/2" if causal and q_len == kv else (
            "q·kv" if not causal else "causal pairs, bottom-right")
        formula = (f"{lin_txt} + {mult}·4·L·d_attn·{pairs}·sequences (L={cfg.num_layers}, "
                   f"d_attn={cfg.d_attn}, q_len={q_len}, kv_len={kv}, "
                   f"{'causal' if causal else 'full'} mask"
                   f"{', sliding window ' + str(cfg.sliding_window) if cfg.sliding_window else ''})")
    return ModelFlops(linear + attention, linear, attention, mode, float(tokens_per_step), n,
                      q_len, kv, causal, formula)


def model_flops_per_step(cfg: ModelConfig, tokens_per_step: float, mode: Mode = "train",
                         seq_len: int | None = None, causal: bool = True, *,
                         kv_len: int | None = None) -> float:
    """Model FLOPs of one step: ``model_flops_breakdown(...).total`` (see there)."""
    return model_flops_breakdown(cfg, tokens_per_step, mode, seq_len, causal,
                                 kv_len=kv_len).total


# --------------------------------------------------------------------------------------------
# MFU / HFU
# --------------------------------------------------------------------------------------------


# MFU/HFU live in traceroof.mfu; re-exported here for convenience.
from .mfu import Inconsistency, Peak, Utilization, hfu, mfu, peak_from_chip  # noqa: E402,F401
