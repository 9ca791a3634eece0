"""Reading a Hugging Face-style ``config.json`` into a :class:`ModelConfig`: the shape of a
decoder-only transformer as far as FLOPs and bytes are concerned (dense or MoE, GQA/MQA,
sliding windows, tied embeddings), with every default we filled in recorded as an
assumption. :mod:`traceroof.model` counts its parameters and FLOPs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from .errors import InputNotFoundError, UsageError

__all__ = ["ModelConfig", "ModelConfigError", "load_model_config"]


class ModelConfigError(UsageError):
    """A model config that cannot be read or describes something we cannot account for.

    The message names the file and the key (exit code 2, like any usage error).
    """


# Families whose MLP is the 2-matrix (up, down) kind with a non-gated activation.
_STANDARD_MLP_TYPES = frozenset(
    {"gpt2", "gpt_neox", "gptj", "gpt_bigcode", "opt", "bloom", "falcon", "phi", "starcoder2",
     "bert", "roberta", "mpt", "codegen"}
)
# Families whose MLP is gated (SwiGLU / GeGLU: gate, up, down).
_GATED_MLP_TYPES = frozenset(
    {"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2",
     "gemma3_text", "deepseek", "olmo", "olmo2", "olmoe", "phi3", "phimoe", "granite",
     "granitemoe", "cohere", "internlm2", "yi", "baichuan", "exaone", "glm", "stablelm",
     "deepseek_v2", "deepseek_v3"}
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
     "olmo", "olmo2", "olmoe", "phi3", "phimoe", "gpt_neox", "falcon", "internlm2", "deepseek_v2",
     "deepseek_v3"}
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
    # multi-head latent attention (DeepSeek-V2/V3); kv_lora_rank 0 = ordinary attention.
    # head_dim is then the query/key head width, qk_nope_head_dim + qk_rope_head_dim.
    kv_lora_rank: int = 0  # width of the compressed KV latent c_KV, cached per token and layer
    q_lora_rank: int = 0  # width of the compressed query latent (0 = queries not compressed)
    qk_rope_head_dim: int = 0  # decoupled RoPE key width, shared by the heads, cached too
    v_head_dim: int = 0  # value head width when it differs from head_dim (0 = head_dim)
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
    def d_v(self) -> int:
        """Width of the attention values over all query heads: heads × v_head_dim (= d_attn
        unless the config gives a different ``v_head_dim``, as MLA does)."""
        return self.num_heads * (self.v_head_dim or self.head_dim)

    @property
    def is_mla(self) -> bool:
        """Multi-head latent attention (DeepSeek-V2/V3): the KV cache holds a latent."""
        return self.kv_lora_rank > 0

    @property
    def kv_elements_per_token_layer(self) -> int:
        """Elements one token adds to one layer's KV cache: 2·kv_heads·head_dim (K and V), or
        for MLA kv_lora_rank + qk_rope_head_dim (the latent c_KV and the shared RoPE key;
        DeepSeek-V2 paper, arXiv:2405.04434, §2.1.2-2.1.3 and Table 1)."""
        if self.is_mla:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.d_kv

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
    ``mlp_only_layers``), ``sliding_window`` / ``use_sliding_window``, multi-head latent
    attention (``kv_lora_rank``, ``q_lora_rank``, ``qk_nope_head_dim``, ``qk_rope_head_dim``,
    ``v_head_dim``), GPT-2 names
    (``n_layer``, ``n_embd``, ``n_head``, ``n_inner``, ``n_positions``) and a nested
    ``text_config`` (multimodal wrappers). Unknown keys are ignored.

    Raises:
        InputNotFoundError: the path does not exist.
        ModelConfigError: not JSON, not an object, a required key missing or of the wrong type,
            or an MLA config (``kv_lora_rank``) without ``qk_nope_head_dim`` /
            ``qk_rope_head_dim``; the message names the file and the key.
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
    """A :class:`ModelConfig` from a config dict (``where`` names it in errors); each aspect
    is read by its own helper, in the order their errors and assumptions are reported."""
    notes: list[str] = []
    model_type = str(raw.get("model_type") or "").lower()
    layers, d, heads, vocab, kv_heads, head_dim = _attention_shape(raw, where)
    mlp_type = _mlp_kind(raw, model_type, where, notes)
    ff = _dense_ff(raw, model_type, mlp_type, d, where)
    shape = _biases_and_norms(raw, model_type, where)
    tied = _tied(raw, model_type, notes)
    moe, ff = _mixture_of_experts(raw, model_type, layers, ff, where)
    if ff is None:
        ff = moe["expert_intermediate_size"]
    window, window_layers = _sliding_window(raw, model_type, layers)
    mla = _latent_attention(raw, where)
    if mla:
        head_dim = mla.pop("head_dim")
    return ModelConfig(
        num_layers=layers, hidden_size=d, num_heads=heads, num_kv_heads=kv_heads,
        head_dim=head_dim, intermediate_size=ff, vocab_size=vocab, tie_word_embeddings=tied,
        name=name, model_type=model_type, mlp_type=mlp_type, **shape, **moe,
        sliding_window=window, sliding_window_layers=window_layers, source=source,
        assumptions=tuple(notes), **mla,
    )


def _latent_attention(raw: Mapping[str, Any], where: str) -> dict[str, int]:
    """The MLA fields (and the query/key ``head_dim`` = qk_nope_head_dim + qk_rope_head_dim)
    of a DeepSeek-V2/V3 config; empty for ordinary attention. Raises ModelConfigError when
    ``kv_lora_rank`` is given without the head widths it needs."""
    if not raw.get("kv_lora_rank"):
        if raw.get("q_lora_rank"):
            raise ModelConfigError(f"{where}: q_lora_rank without kv_lora_rank: multi-head "
                                   "latent attention needs kv_lora_rank")
        return {}
    rank = _req(raw, "kv_lora_rank", where)
    nope = _req(raw, "qk_nope_head_dim", where)
    rope = _req(raw, "qk_rope_head_dim", where)
    v = _int(raw, "v_head_dim", where, required=False) or nope
    q_rank = _int(raw, "q_lora_rank", where, required=False) or 0
    return {"kv_lora_rank": rank, "q_lora_rank": q_rank, "qk_rope_head_dim": rope,
            "v_head_dim": v, "head_dim": nope + rope}


def _attention_shape(raw: Mapping[str, Any], where: str) -> tuple[int, int, int, int, int, int]:
    """(layers, d_model, heads, vocab, kv_heads, head_dim); raises ModelConfigError for MLA,
    a missing or zero size, kv heads that do not divide the heads, or no head_dim."""
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
    return layers, d, heads, vocab, kv_heads, head_dim


def _mlp_kind(raw: Mapping[str, Any], model_type: str, where: str,
              notes: list[str]) -> Literal["gated", "standard"]:
    """``gated`` (3 matrices) or ``standard`` (2): ``mlp_type``, else the family, else
    ``hidden_act``; an assumption is added to ``notes`` when neither says."""
    mlp_type_raw = str(raw.get("mlp_type") or "").lower()
    act = str(raw.get("hidden_act") or raw.get("activation_function") or "").lower()
    if mlp_type_raw:
        if mlp_type_raw in ("gated", "swiglu", "geglu", "glu", "gated_mlp"):
            return "gated"
        if mlp_type_raw in ("standard", "mlp", "dense", "gelu", "relu", "plain"):
            return "standard"
        raise ModelConfigError(
            f"{where}: key 'mlp_type' must be 'gated' or 'standard', got {mlp_type_raw!r}"
        )
    if model_type in _STANDARD_MLP_TYPES:
        return "standard"
    if model_type in _GATED_MLP_TYPES:
        return "gated"
    if act in ("silu", "swish", "swiglu", "geglu"):
        notes.append(f"model_type {model_type or '(none)'!r} unknown: gated MLP (3 matrices) "
                     f"assumed from hidden_act={act!r}")
        return "gated"
    notes.append(f"model_type {model_type or '(none)'!r} and hidden_act {act or '(none)'!r} "
                 "do not say the MLP kind: gated (3 matrices) assumed; set 'mlp_type'")
    return "gated"


def _dense_ff(raw: Mapping[str, Any], model_type: str, mlp_type: str, d: int,
              where: str) -> int | None:
    """d_ff of the dense MLP; ``None`` for a MoE config that gives only the experts' d_ff.
    Raises ModelConfigError when it is required and missing."""
    ff = _int(raw, "intermediate_size", where, required=False)
    if ff is None:
        if model_type in ("gpt2", "gpt_bigcode", "gptj", "codegen") or (
            mlp_type == "standard" and "n_inner" in raw
        ):
            ff = 4 * d  # GPT-2: n_inner=None means 4·n_embd
        elif "moe_intermediate_size" not in raw or not _moe_count(raw):
            _int(raw, "intermediate_size", where)  # raises: missing required key
    return ff


def _biases_and_norms(raw: Mapping[str, Any], model_type: str, where: str) -> dict[str, Any]:
    """The :class:`ModelConfig` fields ``qkv_bias, out_bias, mlp_bias, norm_type, qk_norm,
    position_embedding_size`` from the family and the config's flags."""
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
    return {"qkv_bias": qkv_bias, "out_bias": out_bias, "mlp_bias": mlp_bias,
            "norm_type": norm_type, "qk_norm": qk_norm, "position_embedding_size": pos_size}


def _tied(raw: Mapping[str, Any], model_type: str, notes: list[str]) -> bool:
    """Whether the LM head shares the token embedding (the family's default when absent)."""
    if "tie_word_embeddings" in raw and raw["tie_word_embeddings"] is not None:
        return bool(raw["tie_word_embeddings"])
    if model_type in _UNTIED_BY_DEFAULT:
        return False
    if model_type in _TIED_BY_DEFAULT:
        return True
    notes.append("tie_word_embeddings absent: tied assumed (the transformers default)")
    return True


def _mixture_of_experts(raw: Mapping[str, Any], model_type: str, layers: int, ff: int | None,
                        where: str) -> tuple[dict[str, Any], int | None]:
    """The MoE fields of :class:`ModelConfig` (``num_experts`` 0 for a dense model) and the
    dense d_ff (read now when some layers stay dense and it was not given)."""
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
        moe_layers = _moe_layer_indices(raw, layers, where)
        if len(moe_layers) < layers and not ff:
            ff = _int(raw, "intermediate_size", where)  # dense layers need their own d_ff
    return {"num_experts": n_exp, "num_experts_per_tok": top_k,
            "expert_intermediate_size": exp_ff, "shared_expert_intermediate_size": shared_ff,
            "shared_expert_gate": shared_gate, "moe_layers": moe_layers}, ff


def _moe_layer_indices(raw: Mapping[str, Any], layers: int, where: str) -> tuple[int, ...]:
    """Indices of the MoE layers (``first_k_dense_replace``, ``moe_layer_freq``,
    ``decoder_sparse_step``, ``mlp_only_layers``)."""
    first_dense = _int(raw, "first_k_dense_replace", where, required=False, default=0) or 0
    freq = _int(raw, "moe_layer_freq", where, required=False, default=1) or 1
    step = _int(raw, "decoder_sparse_step", where, required=False, default=1) or 1
    only_mlp = {int(i) for i in (raw.get("mlp_only_layers") or [])}
    return tuple(
        i for i in range(layers)
        if i >= first_dense and i % freq == 0 and (i + 1) % step == 0 and i not in only_mlp
    )


def _sliding_window(raw: Mapping[str, Any], model_type: str,
                    layers: int) -> tuple[int | None, tuple[int, ...]]:
    """(window size or None, the layers that use it)."""
    window = raw.get("sliding_window")
    if not (isinstance(window, int) and not isinstance(window, bool) and window > 0
            and raw.get("use_sliding_window", True) is not False):
        return None, ()
    layer_types = raw.get("layer_types")
    pattern = raw.get("sliding_window_pattern")
    if isinstance(layer_types, list) and len(layer_types) == layers:
        return window, tuple(i for i, t in enumerate(layer_types) if str(t) == "sliding_attention")
    if model_type == "gemma2":  # local and global layers alternate, local first
        return window, tuple(range(0, layers, 2))
    if isinstance(pattern, int) and pattern > 1:  # Gemma 3: every pattern-th is global
        return window, tuple(i for i in range(layers) if (i + 1) % pattern)
    start = int(raw.get("max_window_layers") or 0) if model_type.startswith("qwen") else 0
    return window, tuple(range(start, layers))


def _moe_count(raw: Mapping[str, Any]) -> int:
    for k in ("num_local_experts", "n_routed_experts", "num_experts"):
        v = raw.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return 0
