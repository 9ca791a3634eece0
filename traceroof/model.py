"""Model FLOPs accounting for decoder-only transformers, and MFU / HFU.

Reads a Hugging Face-style ``config.json`` into a :class:`ModelConfig`, counts its parameters
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

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from .errors import InputNotFoundError, UsageError

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


class ModelConfigError(UsageError):
    """A model config that cannot be read or describes something we cannot account for.

    The message names the file and the key (exit code 2, like any usage error).
    """


# --------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------

# Families whose MLP is the 2-matrix (up, down) kind with a non-gated activation.
_STANDARD_MLP_TYPES = frozenset(
    {"gpt2", "gpt_neox", "gptj", "gpt_bigcode", "opt", "bloom", "falcon", "phi", "starcoder2",
     "bert", "roberta", "mpt", "codegen"}
)
# Families whose MLP is gated (SwiGLU / GeGLU: gate, up, down).
_GATED_MLP_TYPES = frozenset(
    {"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2",
     "gemma3_text", "deepseek", "olmo", "olmo2", "olmoe", "phi3", "phimoe", "granite",
     "granitemoe", "cohere", "internlm2", "yi", "baichuan", "exaone", "glm", "stablelm"}
)
# Families that use LayerNorm (weight + bias) rather than RMSNorm (weight only).
_LAYERNORM_TYPES = frozenset(
    {"gpt2", "gpt_neox", "gptj", "gpt_bigcode", "opt", "bloom", "falcon", "phi", "starcoder2",
     "mpt", "codegen", "stablelm"}
)
# Families with every linear layer biased (GPT-2 Conv1D, GPT-NeoX, ...).
_ALL_BIAS_TYPES = frozenset(
    {"gpt2", "gpt_neox", "gptj", "gpt_bigcode", "opt", "bloom", "phi", "starcoder2", "codegen"}
)
# Families with learned absolute position embeddings and their table size key.
_LEARNED_POSITION_TYPES = {"gpt2": "n_positions", "gpt_bigcode": "n_positions"}
# Families whose q/k/v projections have biases but o_proj does not.
_QKV_BIAS_TYPES = frozenset({"qwen2", "qwen2_moe"})
# tie_word_embeddings defaults when the key is absent (the model class's default in transformers).
_UNTIED_BY_DEFAULT = frozenset(
    {"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "deepseek",
     "olmo", "olmo2", "olmoe", "phi3", "phimoe", "gpt_neox", "falcon", "internlm2"}
)
_TIED_BY_DEFAULT = frozenset({"gpt2", "gpt_bigcode", "gemma", "gemma2", "gemma3_text", "opt",
                              "bloom"})

_ALIASES: dict[str, tuple[str, ...]] = {
    "num_hidden_layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    "hidden_size": ("hidden_size", "n_embd", "d_model", "dim"),
    "num_attention_heads": ("num_attention_heads", "n_head", "num_heads", "n_heads"),
    "vocab_size": ("vocab_size", "padded_vocab_size"),
    "intermediate_size": ("intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size"),
    "num_key_value_heads": ("num_key_value_heads", "n_kv_heads", "num_kv_heads",
                            "multi_query_group_num"),
}


@dataclass(frozen=True)
class ModelConfig:
    """A decoder-only transformer, as far as FLOPs and bytes are concerned.

    Shapes: ``hidden_size`` = d_model; the attention width d_attn = ``num_heads · head_dim``
    (not always d_model: Gemma, Qwen3); KV width = ``num_kv_heads · head_dim`` (GQA/MQA).
    ``intermediate_size`` is d_ff of the dense MLP; ``expert_intermediate_size`` that of one
    routed expert. ``moe_layers`` lists the layer indices whose MLP is a mixture of experts.
    ``assumptions`` records every default we filled in for a key the file did not state.
    """

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = False
    name: str = "model"
    model_type: str = ""
    mlp_type: Literal["gated", "standard"] = "gated"
    qkv_bias: bool = False
    out_bias: bool = False
    mlp_bias: bool = False
    norm_type: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    qk_norm: bool = False
    position_embedding_size: int = 0  # rows of a learned absolute position table (GPT-2)
    num_experts: int = 0  # routed experts per MoE layer; 0 = dense
    num_experts_per_tok: int = 0
    expert_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0  # all shared experts together; 0 = none
    shared_expert_gate: bool = False  # Qwen2-MoE's sigmoid gate on the shared expert (d → 1)
    moe_layers: tuple[int, ...] = ()
    sliding_window: int | None = None
    sliding_window_layers: tuple[int, ...] = ()
    source: str | None = None
    assumptions: tuple[str, ...] = ()

    @property
    def d_attn(self) -> int:
        """Attention width: query heads × head_dim."""
        return self.num_heads * self.head_dim

    @property
    def d_kv(self) -> int:
        """Width of K (and of V): KV heads × head_dim."""
        return self.num_kv_heads * self.head_dim

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0 and bool(self.moe_layers)

    def window_for_layer(self, layer: int) -> int | None:
        """The sliding-window size that applies to ``layer`` (None = full attention)."""
        if self.sliding_window is not None and layer in self.sliding_window_layers:
            return self.sliding_window
        return None


def _first(raw: Mapping[str, Any], key: str) -> tuple[str | None, Any]:
    for k in _ALIASES.get(key, (key,)):
        if k in raw and raw[k] is not None:
            return k, raw[k]
    return None, None


def _int(raw: Mapping[str, Any], key: str, where: str, *, required: bool = True,
         default: int | None = None) -> int | None:
    found, value = _first(raw, key)
    if found is None:
        if required:
            names = _ALIASES.get(key, (key,))
            also = f" (also accepted: {', '.join(names[1:])})" if len(names) > 1 else ""
            raise ModelConfigError(f"{where}: missing required key {key!r}{also}")
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) \
            or int(value) < 0:
        raise ModelConfigError(
            f"{where}: key {found!r} must be a non-negative integer, got {value!r}"
        )
    return int(value)


def _req(raw: Mapping[str, Any], key: str, where: str) -> int:
    value = _int(raw, key, where)
    if value is None:  # pragma: no cover - _int raises for a missing required key
        raise ModelConfigError(f"{where}: missing required key {key!r}")
    return value


def load_model_config(path_or_dict: str | os.PathLike[str] | Mapping[str, Any], *,
                      name: str | None = None) -> ModelConfig:
    """Read a Hugging Face-style ``config.json`` (a path, or the already-parsed dict).

    Understood keys: ``num_hidden_layers``, ``hidden_size``, ``num_attention_heads``,
    ``num_key_value_heads`` (default = heads), ``head_dim`` (default hidden/heads),
    ``intermediate_size``, ``vocab_size``, ``tie_word_embeddings``, ``model_type``,
    ``hidden_act``, ``mlp_type``, ``attention_bias``, ``mlp_bias``, MoE keys
    (``num_local_experts`` / ``n_routed_experts`` / ``num_experts``, ``num_experts_per_tok``,
    ``moe_intermediate_size``, ``n_shared_experts``, ``shared_expert_intermediate_size``,
    ``first_k_dense_replace``, ``moe_layer_freq``, ``decoder_sparse_step``,
    ``mlp_only_layers``), ``sliding_window`` / ``use_sliding_window``, GPT-2 names
    (``n_layer``, ``n_embd``, ``n_head``, ``n_inner``, ``n_positions``) and a nested
    ``text_config`` (multimodal wrappers). Unknown keys are ignored.

    Raises:
        InputNotFoundError: the path does not exist.
        ModelConfigError: not JSON, not an object, a required key missing or of the wrong type,
            or an architecture we cannot account for (multi-head latent attention); the message
            names the file and the key.
    """
    if isinstance(path_or_dict, Mapping):
        raw: Mapping[str, Any] = path_or_dict
        where = name or "model config"
        source = None
    else:
        p = Path(path_or_dict)
        where = str(p)
        source = str(p)
        if p.is_dir():
            p = p / "config.json"
            where = source = str(p)
        if not p.exists():
            raise InputNotFoundError(f"{where}: model config not found")
        try:
            raw = json.loads(p.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ModelConfigError(
                f"{where}: not valid JSON at line {e.lineno} column {e.colno}: {e.msg}"
            ) from None
        except UnicodeDecodeError as e:
            raise ModelConfigError(f"{where}: not UTF-8 text (byte {e.start})") from None
        if name is None:
            name = p.parent.name if p.name == "config.json" and p.parent.name else p.stem
    if not isinstance(raw, Mapping):
        raise ModelConfigError(f"{where}: expected a JSON object, got {type(raw).__name__}")
    if _first(raw, "num_hidden_layers")[0] is None and isinstance(raw.get("text_config"), Mapping):
        outer_type = raw.get("model_type")
        raw = {**raw["text_config"]}
        raw.setdefault("model_type", outer_type)
        where = f"{where} (text_config)"
    return _parse(raw, where, name or str(raw.get("_name_or_path") or raw.get("model_type")
                                          or "model"), source)


def _parse(raw: Mapping[str, Any], where: str, name: str, source: str | None) -> ModelConfig:
    notes: list[str] = []
    model_type = str(raw.get("model_type") or "").lower()

    if raw.get("kv_lora_rank") or raw.get("q_lora_rank"):
        raise ModelConfigError(
            f"{where}: multi-head latent attention (kv_lora_rank, DeepSeek-V2/V3) is not "
            "supported by the config-based accounting; pass --model-flops-per-step instead"
        )

    layers = _req(raw, "num_hidden_layers", where)
    d = _req(raw, "hidden_size", where)
    heads = _req(raw, "num_attention_heads", where)
    vocab = _req(raw, "vocab_size", where)
    if layers == 0 or d == 0 or heads == 0 or vocab == 0:
        raise ModelConfigError(
            f"{where}: num_hidden_layers, hidden_size, num_attention_heads and vocab_size must "
            "be positive"
        )
    kv_given = _int(raw, "num_key_value_heads", where, required=False)
    kv_heads = heads if kv_given is None else kv_given
    if raw.get("multi_query") is True and _first(raw, "num_key_value_heads")[0] is None:
        kv_heads = 1  # GPT-BigCode / Falcon-7B multi-query attention
    if kv_heads == 0 or heads % kv_heads:
        raise ModelConfigError(
            f"{where}: num_key_value_heads={kv_heads} must divide num_attention_heads={heads}"
        )
    head_dim = _int(raw, "head_dim", where, required=False)
    if head_dim is None:
        if d % heads:
            raise ModelConfigError(
                f"{where}: hidden_size={d} is not divisible by num_attention_heads={heads}; "
                "add 'head_dim'"
            )
        head_dim = d // heads

    # MLP shape and kind.
    mlp_type_raw = str(raw.get("mlp_type") or "").lower()
    act = str(raw.get("hidden_act") or raw.get("activation_function") or "").lower()
    mlp_type: Literal["gated", "standard"]
    if mlp_type_raw:
        if mlp_type_raw in ("gated", "swiglu", "geglu", "glu", "gated_mlp"):
            mlp_type = "gated"
        elif mlp_type_raw in ("standard", "mlp", "dense", "gelu", "relu", "plain"):
            mlp_type = "standard"
        else:
            raise ModelConfigError(
                f"{where}: key 'mlp_type' must be 'gated' or 'standard', got {mlp_type_raw!r}"
            )
    elif model_type in _STANDARD_MLP_TYPES:
        mlp_type = "standard"
    elif model_type in _GATED_MLP_TYPES:
        mlp_type = "gated"
    elif act in ("silu", "swish", "swiglu", "geglu"):
        mlp_type = "gated"
        notes.append(f"model_type {model_type or '(none)'!r} unknown: gated MLP (3 matrices) "
                     f"assumed from hidden_act={act!r}")
    else:
        mlp_type = "gated"
        notes.append(f"model_type {model_type or '(none)'!r} and hidden_act {act or '(none)'!r} "
                     "do not say the MLP kind: gated (3 matrices) assumed; set 'mlp_type'")

    ff = _int(raw, "intermediate_size", where, required=False)
    if ff is None:
        if model_type in ("gpt2", "gpt_bigcode", "gptj", "codegen") or (
            mlp_type == "standard" and "n_inner" in raw
        ):
            ff = 4 * d  # GPT-2: n_inner=None means 4·n_embd
        elif "moe_intermediate_size" not in raw or not _moe_count(raw):
            _int(raw, "intermediate_size", where)  # raises: missing required key
    # Biases.
    all_bias = model_type in _ALL_BIAS_TYPES
    attn_bias = bool(raw.get("attention_bias", False))
    qkv_bias = all_bias or attn_bias or model_type in _QKV_BIAS_TYPES or bool(raw.get("qkv_bias"))
    out_bias = all_bias or attn_bias
    if model_type == "falcon":
        qkv_bias = out_bias = bool(raw.get("bias", False))
    mlp_bias = all_bias or bool(raw.get("mlp_bias", False))
    norm_type: Literal["rmsnorm", "layernorm"] = (
        "layernorm" if model_type in _LAYERNORM_TYPES else "rmsnorm"
    )
    qk_norm = model_type in ("qwen3", "qwen3_moe", "olmo2", "gemma3_text") or bool(
        raw.get("qk_norm") or raw.get("use_qk_norm")
    )
    pos_key = _LEARNED_POSITION_TYPES.get(model_type)
    pos_size = 0
    if pos_key is not None:
        pos_size = _int(raw, pos_key, where, required=False) or _int(
            raw, "max_position_embeddings", where, required=False, default=0) or 0

    # Tied embeddings.
    if "tie_word_embeddings" in raw and raw["tie_word_embeddings"] is not None:
        tied = bool(raw["tie_word_embeddings"])
    elif model_type in _UNTIED_BY_DEFAULT:
        tied = False
    elif model_type in _TIED_BY_DEFAULT:
        tied = True
    else:
        tied = True
        notes.append("tie_word_embeddings absent: tied assumed (the transformers default)")

    # Mixture of experts.
    n_exp = _moe_count(raw)
    top_k = exp_ff = shared_ff = 0
    shared_gate = False
    moe_layers: tuple[int, ...] = ()
    if n_exp:
        top_k = _int(raw, "num_experts_per_tok", where) or 0
        if top_k == 0 or top_k > n_exp:
            raise ModelConfigError(
                f"{where}: num_experts_per_tok={top_k} must be between 1 and the {n_exp} experts"
            )
        exp_ff = _int(raw, "moe_intermediate_size", where, required=False) or ff or 0
        if not exp_ff:
            raise ModelConfigError(f"{where}: missing required key 'moe_intermediate_size'")
        if raw.get("shared_expert_intermediate_size"):
            shared_ff = _int(raw, "shared_expert_intermediate_size", where) or 0
            shared_gate = model_type == "qwen2_moe"
        elif raw.get("n_shared_experts"):
            shared_ff = (_int(raw, "n_shared_experts", where) or 0) * exp_ff
        first_dense = _int(raw, "first_k_dense_replace", where, required=False, default=0) or 0
        freq = _int(raw, "moe_layer_freq", where, required=False, default=1) or 1
        step = _int(raw, "decoder_sparse_step", where, required=False, default=1) or 1
        only_mlp = {int(i) for i in (raw.get("mlp_only_layers") or [])}
        moe_layers = tuple(
            i for i in range(layers)
            if i >= first_dense and i % freq == 0 and (i + 1) % step == 0 and i not in only_mlp
        )
        if len(moe_layers) < layers and not ff:
            ff = _int(raw, "intermediate_size", where)  # dense layers need their own d_ff
    if ff is None:
        ff = exp_ff

    # Sliding-window attention.
    window = raw.get("sliding_window")
    window_layers: tuple[int, ...] = ()
    if isinstance(window, int) and not isinstance(window, bool) and window > 0 \
            and raw.get("use_sliding_window", True) is not False:
        layer_types = raw.get("layer_types")
        pattern = raw.get("sliding_window_pattern")
        if isinstance(layer_types, list) and len(layer_types) == layers:
            window_layers = tuple(i for i, t in enumerate(layer_types)
                                  if str(t) == "sliding_attention")
        elif model_type == "gemma2":  # local and global layers alternate, local first
            window_layers = tuple(range(0, layers, 2))
        elif isinstance(pattern, int) and pattern > 1:  # Gemma 3: every pattern-th is global
            window_layers = tuple(i for i in range(layers) if (i + 1) % pattern)
        else:
            start = int(raw.get("max_window_layers") or 0) if model_type.startswith("qwen") else 0
            window_layers = tuple(range(start, layers))
    else:
        window = None

    return ModelConfig(
        num_layers=layers, hidden_size=d, num_heads=heads, num_kv_heads=kv_heads,
        head_dim=head_dim, intermediate_size=ff, vocab_size=vocab, tie_word_embeddings=tied,
        name=name, model_type=model_type, mlp_type=mlp_type, qkv_bias=qkv_bias,
        out_bias=out_bias, mlp_bias=mlp_bias, norm_type=norm_type, qk_norm=qk_norm,
        position_embedding_size=pos_size, num_experts=n_exp, num_experts_per_tok=top_k,
        expert_intermediate_size=exp_ff, shared_expert_intermediate_size=shared_ff,
        shared_expert_gate=shared_gate, moe_layers=moe_layers, sliding_window=window,
        sliding_window_layers=window_layers, source=source, assumptions=tuple(notes),
    )


def _moe_count(raw: Mapping[str, Any]) -> int:
    for k in ("num_local_experts", "n_routed_experts", "num_experts"):
        v = raw.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return 0


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


def _mlp_params(d: int, ff: int, gated: bool, bias: bool) -> int:
    mats = 3 if gated else 2
    p = mats * d * ff
    if bias:
        p += (2 if gated else 1) * ff + d
    return p


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
    dense_mlp = _mlp_params(d, cfg.intermediate_size, gated, cfg.mlp_bias)
    moe = set(cfg.moe_layers) if cfg.num_experts else set()
    layers = []
    for i in range(cfg.num_layers):
        if i in moe:
            expert = _mlp_params(d, cfg.expert_intermediate_size, True, cfg.mlp_bias)
            router = d * cfg.num_experts
            shared = (
                _mlp_params(d, cfg.shared_expert_intermediate_size, True, cfg.mlp_bias)
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
    """Forward attention-matmul FLOPs of one sequence: Σ_layers 4·d_attn·pairs (QKᵀ and A·V)."""
    total = 0
    for layer in range(cfg.num_layers):
        total += 4 * cfg.d_attn * attention_pairs(q_len, kv_len, causal=causal,
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
    token at position S). Reference 7B: 6,476,005,376 / (2·32·4096) = 202,375,168 / 8192 =
    24,704; GQA-8: 177,209,344 / 8192 = 21,632. Sliding windows are ignored here (a windowed
    model's attention term stops growing at the window).
    """
    p = param_counts(cfg)
    return p.blocks_active / (2 * cfg.num_layers * cfg.d_attn)


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
