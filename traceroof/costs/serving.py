"""Serving kernels (vLLM, SGLang, FlashAttention-2): fused activations, fused norm + fp8
quantization, fp8 / fp4 scaled GEMMs and the FlashAttention-2 custom ops, plus the serving ops
whose recorded arguments can never give a cost (:func:`register_uncosted`).

Shapes are read at the positions of each op's schema (vLLM ``csrc/torch_bindings.cpp``,
flash-attn ``flash_attn/flash_attn_interface.py`` ``torch.library.custom_op`` wrappers, 2.6+).
Bytes are compulsory HBM traffic: each operand read once, each result written once at its
dtype width (``fp4x2`` / ``uint8`` packed fp4: one byte per two values; block scales counted
as the tensors they are). Where the sequence lengths or the KV cache a kernel reads are not
recorded, FLOPs are unknown (``None``) and bytes are given only when every tensor the kernel
reads is recorded in full (an exact count, never a guess).
"""

from __future__ import annotations

from .args import OpArgs, Tensor, total_bytes
from .attention import attention_flops, attention_pairs
from .matmul import batched_mnk
from .registry import OpCost, register_cost, register_uncosted

# --------------------------------------------------------------------------- activations

#: FLOPs per output element of vLLM's gated activations ``act(x[..., :d]) · x[..., d:]``: the
#: activation's count in :mod:`.elementwise` (silu 4, gelu 5, gelu tanh form 9) + 1 multiply.
GATED_ACT_FLOPS = {"_C::silu_and_mul": 5, "_C::mul_and_silu": 5, "_C::gelu_and_mul": 6,
                   "_C::gelu_tanh_and_mul": 10}


@register_cost(*GATED_ACT_FLOPS, kind="elementwise")
def gated_activation(a: OpArgs) -> OpCost | None:
    """vLLM ``_C::silu_and_mul(Tensor! out [..., d], Tensor input [..., 2·d])`` (and
    ``mul_and_silu``, ``gelu_and_mul``, ``gelu_tanh_and_mul``): ``out = act(x1) · x2``.

    FLOPs ``numel(out) × c`` (:data:`GATED_ACT_FLOPS`); reads ``input``, writes ``out``.
    ``None`` unless ``input``'s last dim is twice ``out``'s.
    """
    out, x = a.tensor(0), a.tensor(1)
    if out is None or x is None or x.shape[:-1] != out.shape[:-1] or x.shape[-1] != 2 * out.shape[-1]:
        return None
    c = GATED_ACT_FLOPS[a.op.split(".", 1)[0]]
    return OpCost(float(c * out.numel), total_bytes([x]), total_bytes([out]), "elementwise", x.dtype)


# --------------------------------------------------------------------------- norm + quant

#: FLOPs per element: RMS norm with weight 4 (:mod:`.norm` ``_C::rms_norm``), the residual
#: add 1, the fp8 quantization 3 (scale, clamp twice: :mod:`.memory` ``static_scaled_fp8_quant``).
RMS_NORM_FLOPS = 4
QUANT_FLOPS = 3


@register_cost("_C::rms_norm_static_fp8_quant", kind="norm")
def rms_norm_static_fp8_quant(a: OpArgs) -> OpCost | None:
    """vLLM ``rms_norm_static_fp8_quant(Tensor! result [*, d] fp8, Tensor input [*, d],
    Tensor weight [d], Tensor scale [1], float eps)``: FLOPs ``N·(4 + 3)``; reads input,
    weight, scale; writes the fp8 result."""
    out, x, w, s = (a.tensor(i) for i in range(4))
    if out is None or x is None:
        return None
    flops = x.numel * (RMS_NORM_FLOPS + QUANT_FLOPS)
    return OpCost(float(flops), total_bytes([x, w, s]), total_bytes([out]), "norm", x.dtype)


@register_cost("_C::fused_add_rms_norm_static_fp8_quant", kind="norm")
def fused_add_rms_norm_static_fp8_quant(a: OpArgs) -> OpCost | None:
    """vLLM ``fused_add_rms_norm_static_fp8_quant(Tensor! result [*, d] fp8, Tensor input
    [*, d], Tensor! residual [*, d], Tensor weight [d], Tensor scale [1], float eps)``:
    ``residual += input; result = quant(rms_norm(residual))``. FLOPs ``N·(1 + 4 + 3)``;
    reads input, residual, weight, scale; writes result and residual."""
    out, x, r, w, s = (a.tensor(i) for i in range(5))
    if out is None or x is None or r is None:
        return None
    flops = x.numel * (1 + RMS_NORM_FLOPS + QUANT_FLOPS)
    return OpCost(float(flops), total_bytes([x, r, w, s]), total_bytes([out, r]), "norm", x.dtype)


@register_cost("_C::dynamic_per_token_scaled_fp8_quant", kind="elementwise")
def per_token_fp8_quant(a: OpArgs) -> OpCost | None:
    """vLLM ``dynamic_per_token_scaled_fp8_quant(Tensor! result [t, d] fp8, Tensor input
    [t, d], Tensor! scale [t, 1], Tensor? scale_ub)``: 3 FLOPs per element (as the static
    quant); reads the input twice (the per-token absmax, then the quantization, as the
    dynamic per-tensor op) and ``scale_ub``; writes the result and the scales."""
    out, x, scale, ub = (a.tensor(i) for i in range(4))
    if out is None or x is None:
        return None
    return OpCost(float(QUANT_FLOPS * x.numel), total_bytes([x, x, ub]), total_bytes([out, scale]),
                  "elementwise", x.dtype)


@register_cost("_C::scaled_fp4_quant", kind="elementwise")
def scaled_fp4_quant(a: OpArgs) -> OpCost | None:
    """vLLM ``scaled_fp4_quant(Tensor! output [m, n/2] uint8, Tensor input [m, n], Tensor!
    output_scale, Tensor input_scale)`` (NVFP4: two fp4 values per byte, one fp8 scale per
    16 values): 3 FLOPs per input element (scale, clamp twice, as fp8 quantization) + the
    block absmax, counted as 1; reads input twice (absmax, then quantize: the dynamic
    convention) and the global scale; writes the packed output and the block scales."""
    out, x, oscale, iscale = (a.tensor(i) for i in range(4))
    if out is None or x is None or out.numel * 2 != x.numel:
        return None
    return OpCost(float((QUANT_FLOPS + 1) * x.numel), total_bytes([x, x, iscale]),
                  total_bytes([out, oscale]), "elementwise", x.dtype)


# --------------------------------------------------------------------------- scaled GEMMs


def gemm_dtype(x: str | None, w: str | None) -> str | None:
    """The compute dtype (peak key) of a GEMM of operands at dtypes ``x`` and ``w``:
    ``fp4`` when both are packed fp4 (``fp4x2``; the vLLM fp4 op, whose operands are
    ``uint8``, says ``fp4`` itself), ``fp8`` when either is fp8 (a mixed fp8 × fp4 MMA runs at the fp8 rate: NVIDIA Blackwell
    ``tcgen05.mma`` kind ``f8f6f4``), else ``x``."""
    if x == "fp4x2" and w == "fp4x2":
        return "fp4"
    if "fp8" in (x, w):
        return "fp8"
    return x


@register_cost("_C::cutlass_scaled_mm", kind="matmul")
def cutlass_scaled_mm(a: OpArgs) -> OpCost | None:
    """vLLM ``cutlass_scaled_mm(Tensor! out [m, n], Tensor a [m, k], Tensor b [k, n],
    Tensor a_scales, Tensor b_scales, Tensor? bias)``: ``2·m·n·k`` FLOPs (torch
    ``mm_flop``) at ``a``'s dtype (fp8 or int8: that peak); reads a, b, the scales and the
    bias, writes ``out``. ``b`` may be recorded ``[n, k]`` (its untransposed storage)."""
    out, x, w = a.tensor(0), a.tensor(1), a.tensor(2)
    if out is None or x is None or w is None or x.ndim != 2 or out.ndim != 2 or w.ndim != 2:
        return None
    (m, k), n = x.shape, out.shape[1]
    if out.shape[0] != m or w.shape not in ((k, n), (n, k)):
        return None
    reads = [x, w, a.tensor(3), a.tensor(4), a.tensor(5)]
    return OpCost(float(2 * m * n * k), total_bytes(reads), out.nbytes, "matmul", gemm_dtype(x.dtype, w.dtype))


@register_cost("_C::cutlass_scaled_fp4_mm", kind="matmul")
def cutlass_scaled_fp4_mm(a: OpArgs) -> OpCost | None:
    """vLLM ``cutlass_scaled_fp4_mm(Tensor! out [m, n], Tensor a [m, k/2] uint8, Tensor b
    [n, k/2] uint8, Tensor block_scale_a, Tensor block_scale_b, Tensor alpha)`` (NVFP4, two
    values per byte along ``k``): ``2·m·n·k`` FLOPs with ``k = 2 × a.shape[1]``, at the fp4
    peak; reads a, b, both block scales and alpha, writes ``out``."""
    out, x, w = a.tensor(0), a.tensor(1), a.tensor(2)
    if out is None or x is None or w is None or x.ndim != 2 or w.ndim != 2 or out.ndim != 2:
        return None
    (m, k_half), (n, k2) = x.shape, w.shape
    if k2 != k_half or out.shape != (m, n):
        return None
    reads = [x, w, a.tensor(3), a.tensor(4), a.tensor(5)]
    return OpCost(float(2 * m * n * 2 * k_half), total_bytes(reads), out.nbytes, "matmul", "fp4",
                  "fp4 packed two per byte: k = 2 x the recorded dim")


@register_cost("aten::_grouped_mm", "aten::_scaled_grouped_mm", kind="matmul")
def grouped_mm(a: OpArgs) -> OpCost | None:
    """``_grouped_mm(self, mat2, offs?, bias?, out_dtype?)`` and ``_scaled_grouped_mm(self,
    mat2, scale_a, scale_b, offs?, bias?, scale_result?, out_dtype?, use_fast_accum)``
    (CUTLASS / cuBLASLt grouped GEMMs, the MoE experts of torchtitan): with ``self [G, m, k]``
    and ``mat2 [G, k, n]`` (no ``offs``) ``2·G·m·n·k`` FLOPs (torch ``bmm_flop``), reads both
    (+ scales, bias), writes ``[G, m, n]`` at ``out_dtype`` (else ``self``'s for the
    unscaled op; the scaled op's result dtype is unknown unless recorded). The 2-D forms split
    a dim by the *values* of ``offs``, which Kineto does not record: ``None`` (unknown). The
    compute dtype is :func:`gemm_dtype` (fp8 operands: the fp8 peak)."""
    x, w = a.tensor(0), a.tensor(1)
    gmnk = batched_mnk(x, w)
    if gmnk is None:
        return None
    g, m, n, k = gmnk
    scaled = a.op.startswith("aten::_scaled_grouped_mm")
    out_dtype = a.scalar_type(7 if scaled else 4) or (None if scaled else x.dtype)
    extra = [a.tensor(i) for i in ((2, 3, 5, 6) if scaled else (3,))]
    return OpCost(float(2 * g * m * n * k), total_bytes([x, w, *extra]), Tensor((g, m, n), out_dtype).nbytes,
                  "matmul", gemm_dtype(x.dtype, w.dtype))


# --------------------------------------------------------------------------- FlashAttention-2
# flash_attn/flash_attn_interface.py (2.6+) registers its kernels as torch custom ops, so
# Kineto records them with their shapes: q [b, s_q, h_q, d], k/v [b, s_k, h_kv, d]; varlen
# q [total_q, h_q, d] with cu_seqlens [b + 1] and the max_seqlen scalars. Causal is
# bottom-right aligned (flash-attn >= 2.1); window_size_left/right narrow each row.


def _fa_cost(q: Tensor, k: Tensor, v: Tensor, pairs_per_head: int | None, b: int,
             backward: bool, extra_reads: list[Tensor | None], lse: Tensor, note: str) -> OpCost:
    h_q, d, d_v = q.shape[-2], q.shape[-1], v.shape[-1]
    flops = None if pairs_per_head is None else float(attention_flops(b, h_q, pairs_per_head, d, d_v, backward))
    out = Tensor((*q.shape[:-1], d_v), q.dtype)
    if backward:  # reads dout, q, k, v, out, lse; writes dq, dk, dv
        reads, writes = total_bytes([*extra_reads, q, k, v]), total_bytes([q, k, v])
    else:
        reads, writes = total_bytes([q, k, v, *extra_reads]), total_bytes([out, lse])
    return OpCost(flops, reads, writes, "attention", q.dtype, note)


def _gqa_ok(q: Tensor, k: Tensor, v: Tensor) -> bool:
    h_q, h_kv = q.shape[-2], k.shape[-2]
    return (q.shape[-1] == k.shape[-1] and k.shape[:-1] == v.shape[:-1] and h_kv > 0
            and h_q % h_kv == 0)


def _window(a: OpArgs, left: int, right: int, causal: int) -> dict:
    return {"causal": bool(a.flag(causal, False)), "bottom_right": True,
            "window_left": a.integer(left), "window_right": a.integer(right)}


@register_cost("flash_attn::_flash_attn_forward", "flash_attn::_flash_attn_backward", kind="attention")
def flash_attn(a: OpArgs) -> OpCost | None:
    """flash-attn 2 ``_flash_attn_forward(q [b, s_q, h_q, d], k [b, s_k, h_kv, d], v, dropout_p,
    softmax_scale, causal, window_size_left, window_size_right, softcap, alibi_slopes,
    return_softmax)`` and ``_flash_attn_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv,
    dropout_p, softmax_scale, causal, window_size_left, window_size_right, ...)``.

    FLOPs ``2·b·h_q·P·(d + d_v)`` forward, ``2·b·h_q·P·(3·d + 2·d_v)`` backward over the
    ``P`` unmasked (query, key) pairs (bottom-right causal, windows; :mod:`.attention`;
    = torch ``sdpa_flop_count`` when not causal). Bytes: q, k, v read, out and the fp32
    logsumexp ``[b, h_q, s_q]`` written; backward reads dout, q, k, v, out, lse, writes dq, dk, dv.
    """
    bwd = a.op.startswith("flash_attn::_flash_attn_backward")
    off = 1 if bwd else 0
    q, k, v = a.tensor(off), a.tensor(off + 1), a.tensor(off + 2)
    if q is None or k is None or v is None or not (q.ndim == k.ndim == v.ndim == 4) or not _gqa_ok(q, k, v):
        return None
    if q.shape[0] != k.shape[0]:
        return None
    b, s_q, h_q, _ = q.shape
    pos = (12, 13, 11) if bwd else (6, 7, 5)
    pairs = attention_pairs(s_q, k.shape[1], **_window(a, *pos))
    lse = Tensor((b, h_q, s_q), "fp32")
    extra = [a.tensor(0), a.tensor(4), a.tensor(5)] if bwd else []
    return _fa_cost(q, k, v, pairs, b, bwd, extra, lse, "" if pairs == s_q * k.shape[1] else
                    f"{pairs} of {s_q * k.shape[1]} (q, k) pairs per head")


@register_cost("flash_attn::_flash_attn_varlen_forward", "flash_attn::_flash_attn_varlen_backward",
               kind="attention")
def flash_attn_varlen(a: OpArgs) -> OpCost | None:
    """flash-attn 2 ``_flash_attn_varlen_forward(q [t_q, h_q, d], k [t_k, h_kv, d], v,
    cu_seqlens_q [b+1], cu_seqlens_k [b+1], max_seqlen_q, max_seqlen_k, dropout_p,
    softmax_scale, causal, window_size_left, window_size_right, softcap, alibi_slopes,
    return_softmax, block_table, leftpad_k, seqused_k)``; the backward takes ``dout, q, k, v,
    out, softmax_lse, dq, dk, dv`` first, then the same from ``cu_seqlens_q`` (position 9).

    The per-sequence lengths are the *values* of ``cu_seqlens``, which Kineto does not record.
    FLOPs are exact (as :func:`flash_attn`, per sequence) only when the lengths follow from
    what is recorded: one sequence (``b = 1``), or every sequence at the maximum
    (``t_q = b·max_seqlen_q`` and ``t_k = b·max_seqlen_k``); otherwise ``None``. Bytes are
    exact whenever the kernel reads whole tensors (q, k, v read, out and the fp32 logsumexp
    ``[h_q, t_q]`` written), so such an op is costed by bytes alone. A paged KV cache
    (``block_table`` recorded) or ``seqused_k`` / ``leftpad_k`` (the kernel reads only part
    of k, v) leaves the op unknown.
    """
    bwd = a.op.startswith("flash_attn::_flash_attn_varlen_backward")
    off, base = (1, 9) if bwd else (0, 3)
    q, k, v = a.tensor(off), a.tensor(off + 1), a.tensor(off + 2)
    cu_q, cu_k = a.tensor(base), a.tensor(base + 1)
    if q is None or k is None or v is None or cu_q is None or cu_k is None:
        return None
    if not (q.ndim == k.ndim == v.ndim == 3) or not _gqa_ok(q, k, v) or cu_q.ndim != 1 or cu_q.shape != cu_k.shape:
        return None
    if not bwd and any(a.tensor(i) is not None for i in (15, 16, 17)):
        return None  # paged KV / partial reads: what the kernel reads is not recorded
    b = cu_q.shape[0] - 1
    (t_q, h_q, _), t_k = q.shape, k.shape[0]
    max_q, max_k = a.integer(base + 2), a.integer(base + 3)
    pos = (base + 7, base + 8, base + 6)
    if b == 1:
        lens: tuple[int, int] | None = (t_q, t_k)
    elif b >= 1 and max_q and max_k and t_q == b * max_q and t_k == b * max_k:
        lens = (max_q, max_k)
    else:
        lens = None
    pairs = None if lens is None else b * attention_pairs(*lens, **_window(a, *pos))
    note = "varlen: per-sequence lengths not recorded, FLOPs unknown (costed by bytes)" if lens is None else ""
    extra = [a.tensor(0), a.tensor(4), a.tensor(5)] if bwd else []
    return _fa_cost(q, k, v, pairs, 1, bwd, extra, Tensor((h_q, t_q), "fp32"), note)


# --------------------------------------------------------------------------- vLLM paged attention


@register_cost("_C::paged_attention_v1", "_C::paged_attention_v2", kind="attention")
def paged_attention(a: OpArgs) -> OpCost | None:
    """vLLM decode attention over a paged KV cache: ``paged_attention_v1(out [b, h_q, d],
    query [b, h_q, d], key_cache [blocks, h_kv, d/x, block, x], value_cache [blocks, h_kv, d,
    block], num_kv_heads, scale, block_tables [b, max_blocks], seq_lens [b], block_size,
    max_seq_len, ...)``; ``v2`` has ``exp_sums, max_logits, tmp_out`` after ``out`` (query at 4).

    The KV length of each sequence is a *value* of ``seq_lens`` (not recorded); for one
    sequence (``b = 1``) it is the recorded ``max_seq_len``, so ``s_k = max_seq_len`` and, one
    query seeing every key, FLOPs ``2·h_q·s_k·(d + d)`` (:mod:`.attention`). Bytes: the query,
    the ``s_k`` tokens' keys and values at the cache dtype (``h_kv·d`` each), ``seq_lens`` and the
    block-table row read, ``out`` written. ``None`` for ``b > 1`` (the reason is registered)."""
    q_pos = 4 if a.op.startswith("_C::paged_attention_v2") else 1
    out, q, kc, vc = a.tensor(0), a.tensor(q_pos), a.tensor(q_pos + 1), a.tensor(q_pos + 2)
    h_kv, s_k = a.integer(q_pos + 3), a.integer(q_pos + 8)
    if out is None or q is None or kc is None or vc is None or q.ndim != 3 or not h_kv or not s_k:
        return None
    b, h_q, d = q.shape
    if b != 1 or h_q % h_kv or kc.dtype is None:
        return None
    kv = Tensor((2, s_k, h_kv, d), kc.dtype)
    reads = total_bytes([q, kv, a.tensor(q_pos + 6), a.tensor(q_pos + 5)])
    flops = attention_flops(1, h_q, attention_pairs(1, s_k), d, d)
    return OpCost(float(flops), reads, out.nbytes, "attention", q.dtype,
                  f"one sequence: s_k = max_seq_len = {s_k}")


# --------------------------------------------------------------------------- never costed

register_uncosted(
    "vllm::unified_attention_with_output", "vllm::unified_attention",
    why="KV lengths not recorded (the paged KV cache is looked up by layer name)",
)
register_uncosted(
    "_C::paged_attention_v1", "_C::paged_attention_v2",
    why="KV lengths not recorded (seq_lens values) for more than one sequence",
)
register_uncosted(
    "aten::_grouped_mm", "aten::_scaled_grouped_mm",
    why="grouped over the values of offs, which are not recorded",
)
register_uncosted(
    "flash_attn::_flash_attn_varlen_forward",
    why="paged KV cache or seqused_k: the KV lengths it reads are not recorded",
)
