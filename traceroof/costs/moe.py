"""Fused mixture-of-experts (MoE) ops: vLLM / SGLang ``fused_experts`` and the Triton
``fused_moe_kernel`` launch, and the MoE ops whose arguments carry no expert weights.

A gated expert MLP (SwiGLU; Shazeer 2020, "GLU Variants Improve Transformer") on a token
``x [d]``: ``h = act(x·W_gateᵀ) ⊙ (x·W_upᵀ)`` with ``W_gate, W_up [d_ff, d]`` (vLLM stores
both as one ``w1 [E, 2·d_ff, d]``), then ``y = h·W_downᵀ`` with ``w2 [E, d, d_ff]``. Each of
the ``T`` tokens visits ``topk`` experts, so the matmul FLOPs (2 per multiply-add, torch
``mm_flop``) are::

    2·T·topk·(d·2·d_ff + d_ff·d) = 6·T·topk·d·d_ff      # gated (w1 has 2·d_ff rows)
    2·T·topk·(d·d_ff + d_ff·d)   = 4·T·topk·d·d_ff      # ungated (w1 has d_ff rows)

(the activation, the routing weights' multiply and the top-k sum are elementwise and not
counted, as the bias add of ``addmm``). Padding rows of the block-aligned token order are
not work and not counted.

Bytes (compulsory traffic): the hidden states, the routing ids and weights read, the
output ``[T, d]`` written, and the weights of the experts used. Which experts receive a
token is not recorded: the convention is ``min(E, T·topk)`` experts (every expert that can
receive a token does; exact for a decode step whose ``T·topk`` choices are distinct and for
a batch that reaches every expert, an over-count otherwise). The intermediate activations
(``[T, topk, 2·d_ff]``, written and re-read between the two GEMMs) are not counted: a
fused kernel keeps them on chip.
"""

from __future__ import annotations

from .args import OpArgs, Tensor, total_bytes
from .registry import OpCost, register_cost, register_uncosted


def moe_flops(tokens: int, topk: int, d: int, w1_rows: int, d_ff: int) -> int:
    """``2·T·topk·(d·w1_rows + d_ff·d)``: the two expert GEMMs of ``T`` tokens routed to
    ``topk`` experts each; ``w1_rows`` is ``2·d_ff`` for a gated MLP, ``d_ff`` otherwise."""
    return 2 * tokens * topk * (d * w1_rows + d_ff * d)


def experts_read(num_experts: int, routed: int) -> int:
    """Experts whose weights are read: ``min(E, T·topk)`` (module docstring)."""
    return min(num_experts, routed)


def _expert_slice(w: Tensor, n: int) -> Tensor:
    """``n`` experts' slices of an ``[E, ...]`` weight."""
    return Tensor((n, *w.shape[1:]), w.dtype)


@register_cost("vllm::outplace_fused_experts", "vllm::inplace_fused_experts",
               "sglang::outplace_fused_experts", "sglang::inplace_fused_experts", kind="matmul")
def fused_experts(a: OpArgs) -> OpCost | None:
    """``fused_experts(hidden_states [T, d], w1 [E, 2·d_ff | d_ff, d], w2 [E, d, d_ff],
    topk_weights [T, topk], topk_ids [T, topk], ...)`` (vLLM
    ``model_executor/layers/fused_moe/fused_moe.py``; SGLang's copy). FLOPs
    :func:`moe_flops`; bytes as the module docstring (``min(E, T·topk)`` experts' w1 and w2).
    Compute dtype: fp8 when the weights are fp8 (w8a8: the activations are quantized too),
    else the hidden states'. ``None`` when the shapes do not chain (packed int4 weights,
    whose ``d`` is halved, included). In-place variants write the output over ``hidden_states``.
    """
    x, w1, w2, tw, ids = (a.tensor(i) for i in range(5))
    if x is None or w1 is None or w2 is None or ids is None:
        return None
    if x.ndim != 2 or w1.ndim != 3 or w2.ndim != 3 or ids.ndim != 2 or ids.shape[0] != x.shape[0]:
        return None
    (t, d), (e, rows, d1), (e2, d2, d_ff) = x.shape, w1.shape, w2.shape
    if not (d == d1 == d2 and e == e2 and rows in (d_ff, 2 * d_ff)):
        return None
    topk = ids.shape[1]
    n = experts_read(e, t * topk)
    reads = total_bytes([x, tw, ids, _expert_slice(w1, n), _expert_slice(w2, n)])
    dtype = "fp8" if w1.dtype == "fp8" else x.dtype
    gated = "gated" if rows == 2 * d_ff else "ungated"
    note = f"MoE {gated}: {t} tokens x top-{topk} of {e} experts; weights of {n} experts read (min(E, T*topk))"
    return OpCost(float(moe_flops(t, topk, d, rows, d_ff)), reads, x.nbytes, "matmul", dtype, note)


@register_cost("fused_moe_kernel", "fused_moe_kernel_gptq_awq", kind="matmul")
def fused_moe_kernel(a: OpArgs) -> OpCost | None:
    """vLLM's Triton ``fused_moe_kernel(a_ptr, b_ptr, c_ptr, ...)`` launch record: one of the
    two expert GEMMs, ``A [M, K]`` (the tokens, or ``[M·topk, K]`` the first GEMM's
    activations), ``B [E, N, K]`` (the experts' weights), ``C [M, topk, N]`` (one row per
    (token, expert) pair). FLOPs ``2·numel(C)·K``: each of ``C``'s elements is a ``K``-long
    dot product (padding rows excluded). Bytes: A read, C written, and ``min(E, M·topk)``
    experts' ``[N, K]`` slices of B (module docstring). Compute dtype: fp8 for fp8 weights,
    else A's. ``None`` unless ``B``'s ``N`` and ``K`` match ``C`` and ``A``.
    """
    x, w, c = a.tensor(0), a.tensor(1), a.tensor(2)
    if x is None or w is None or c is None or w.ndim != 3 or c.ndim != 3 or x.ndim != 2:
        return None
    (e, n, k), (m, topk, n2) = w.shape, c.shape
    if n != n2 or x.shape[1] != k or x.shape[0] not in (m, m * topk):
        return None
    slices = _expert_slice(w, experts_read(e, m * topk))
    dtype = "fp8" if w.dtype == "fp8" else x.dtype
    return OpCost(float(2 * c.numel * k), total_bytes([x, slices]), c.nbytes, "matmul", dtype,
                  f"MoE GEMM: {m} x top-{topk} rows of {e} experts")


@register_cost("_moe_C::moe_sum", kind="reduction")
def moe_sum(a: OpArgs) -> OpCost | None:
    """vLLM ``moe_sum(Tensor input [T, topk, d], Tensor! output [T, d])``: the ``topk``
    experts' outputs of each token added, ``(topk − 1)·T·d`` FLOPs; reads input, writes output."""
    x, out = a.tensor(0), a.tensor(1)
    if x is None or out is None or x.ndim != 3 or out.shape != (x.shape[0], x.shape[2]):
        return None
    t, k, d = x.shape
    return OpCost(float((k - 1) * t * d), total_bytes([x]), out.nbytes, "reduction", x.dtype)


#: FLOPs per router logit of ``topk_softmax``: the softmax's 5 (:mod:`.reduction`: max,
#: subtract, exp, sum, divide); the top-k selection's compares are not counted.
SOFTMAX_FLOPS = 5


@register_cost("_moe_C::topk_softmax", kind="reduction")
def topk_softmax(a: OpArgs) -> OpCost | None:
    """vLLM ``topk_softmax(Tensor! topk_weights [T, k], Tensor! topk_indices [T, k], Tensor!
    token_expert_indices [T, k], Tensor gating_output [T, E])``: a softmax over the ``E``
    router logits of each token (``5·T·E`` FLOPs, as ``aten::_softmax``) and the top-k
    selection (compares, not counted); reads the logits, writes the three ``[T, k]`` results."""
    w, idx, tok, logits = (a.tensor(i) for i in range(4))
    if w is None or idx is None or logits is None or logits.ndim != 2 or w.shape[0] != logits.shape[0]:
        return None
    return OpCost(float(SOFTMAX_FLOPS * logits.numel), total_bytes([logits]), total_bytes([w, idx, tok]),
                  "reduction", logits.dtype)


register_uncosted(
    "vllm::moe_forward", "vllm::moe_forward_shared",
    why="no expert weights recorded (the layer's weights are looked up by name)",
)
