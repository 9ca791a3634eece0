"""Normalization layers: layer norm, RMS norm, batch norm, group norm, forward and backward.

Shape convention: input ``x`` with ``N = numel(x)`` elements in ``M`` groups (rows for
layer/RMS norm, ``c`` channels for batch norm, ``b·g`` groups for group norm); the
statistics (mean, rstd) are ``[M]`` in the accumulation dtype (fp32; fp64 for fp64 input).

torch's flop counter has no formula for these (they are memory-bound); the FLOPs here count
the arithmetic of the textbook formulas, one FLOP per add, multiply or rsqrt, per element:

* layer/group norm forward: mean 1 + variance 3 + normalize 2 = 6, plus 1 for the weight
  and 1 for the bias when present;
* RMS norm forward: square-and-sum 2 + scale 1 = 3, plus 1 for the weight;
* batch norm forward: training 6 (statistics over ``b·h·w`` per channel), eval 2, plus the
  affine 1 + 1;
* backward: grad_input 10 (recompute x̂ 2, dy·w 1, the two row sums 3, combine 4; RMS 7),
  grad_weight 2 (dy·x̂ and the sum), grad_bias 1 (the sum), as ``output_mask`` asks.

Bytes: every input (x, weight, bias, statistics) read once; every output (y, statistics,
running stats, gradients) written once.
"""

from __future__ import annotations

import math

from .args import OpArgs, Tensor, total_bytes
from .registry import OpCost, register_cost

LN_FWD_PER_ELEM = 6
RMS_FWD_PER_ELEM = 3
BN_TRAIN_FWD_PER_ELEM = 6
BN_EVAL_FWD_PER_ELEM = 2
GRAD_INPUT_PER_ELEM = 10
RMS_GRAD_INPUT_PER_ELEM = 7
GRAD_WEIGHT_PER_ELEM = 2
GRAD_BIAS_PER_ELEM = 1


def _acc(dtype: str | None) -> str | None:
    """Accumulation dtype of the statistics (torch ``acc_type``)."""
    if dtype is None:
        return None
    return "fp64" if dtype == "fp64" else "fp32"


def _rows(x: Tensor, normalized: list[int] | None, weight: Tensor | None) -> int:
    """Number of rows a layer/RMS norm normalizes (``numel / prod(normalized_shape)``)."""
    if normalized:
        inner = math.prod(normalized)
    elif weight is not None:
        inner = weight.numel
    else:
        inner = x.shape[-1] if x.ndim else 1
    return x.numel // inner if inner else 0


def _mask(a: OpArgs, i: int | None, n: int, default: list[bool]) -> list[bool]:
    m = a.bool_list(i) if i is not None else None
    return (m + [False] * n)[:n] if m is not None else default


def _cost(flops: float, reads: list, writes: list, dtype: str | None, note: str = "") -> OpCost:
    return OpCost(float(flops), total_bytes(reads), total_bytes(writes), "norm", dtype, note)


@register_cost("aten::native_layer_norm", "aten::layer_norm", kind="norm")
def layer_norm(a: OpArgs) -> OpCost | None:
    """``native_layer_norm(input [*, *normalized_shape], normalized_shape, weight?, bias?, eps)
    -> (y, mean [M], rstd [M])``; ``layer_norm`` (composite) returns only ``y``.

    FLOPs ``N·(6 + [weight] + [bias])``; bytes read x, weight, bias; write y (+ mean, rstd).
    """
    x, w, b = a.tensor(0), a.tensor(2), a.tensor(3)
    if x is None:
        return None
    m = _rows(x, a.int_list(1), w)
    flops = x.numel * (LN_FWD_PER_ELEM + (w is not None) + (b is not None))
    writes = [x]
    if a.op.endswith("native_layer_norm"):
        writes += [Tensor((m,), _acc(x.dtype))] * 2
    return _cost(flops, [x, w, b], writes, x.dtype)


@register_cost("aten::native_layer_norm_backward", kind="norm")
def layer_norm_backward(a: OpArgs) -> OpCost | None:
    """``native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight?, bias?,
    output_mask[3]) -> (grad_input, grad_weight, grad_bias)``.

    FLOPs ``N·(10·gi + 2·gw + 1·gb)``; reads grad_out, input, mean, rstd, weight; writes the
    requested gradients (grad_weight/grad_bias have the weight's shape).
    """
    g, x, mean, rstd, w, b = (a.tensor(i) for i in (0, 1, 3, 4, 5, 6))
    if g is None or x is None:
        return None
    gi, gw, gb = _mask(a, 7, 3, [True, w is not None, b is not None])
    gw, gb = gw and w is not None, gb and b is not None
    flops = x.numel * (GRAD_INPUT_PER_ELEM * gi + GRAD_WEIGHT_PER_ELEM * gw + GRAD_BIAS_PER_ELEM * gb)
    reads = [g, x, mean, rstd, w]
    writes = [x if gi else None, w if gw else None, b if gb else None]
    return _cost(flops, reads, writes, x.dtype)


@register_cost("aten::_fused_rms_norm", "aten::rms_norm", kind="norm")
def rms_norm(a: OpArgs) -> OpCost | None:
    """``_fused_rms_norm(input, normalized_shape, weight?, eps) -> (y, rstd [M])``;
    ``rms_norm`` returns only ``y``.

    FLOPs ``N·(3 + [weight])``; bytes read x, weight; write y (+ rstd).
    """
    x, w = a.tensor(0), a.tensor(2)
    if x is None:
        return None
    flops = x.numel * (RMS_FWD_PER_ELEM + (w is not None))
    writes = [x]
    if a.op.endswith("_fused_rms_norm"):
        writes.append(Tensor((_rows(x, a.int_list(1), w),), _acc(x.dtype)))
    return _cost(flops, [x, w], writes, x.dtype)


@register_cost("aten::_fused_rms_norm_backward", kind="norm")
def rms_norm_backward(a: OpArgs) -> OpCost | None:
    """``_fused_rms_norm_backward(grad_out, input, normalized_shape, rstd, weight?,
    output_mask[2]) -> (grad_input, grad_weight)``.

    FLOPs ``N·(7·gi + 2·gw)``; reads grad_out, input, rstd, weight; writes the gradients.
    """
    g, x, rstd, w = a.tensor(0), a.tensor(1), a.tensor(3), a.tensor(4)
    if g is None or x is None:
        return None
    gi, gw = _mask(a, 5, 2, [True, w is not None])
    gw = gw and w is not None
    flops = x.numel * (RMS_GRAD_INPUT_PER_ELEM * gi + GRAD_WEIGHT_PER_ELEM * gw)
    return _cost(flops, [g, x, rstd, w], [x if gi else None, w if gw else None], x.dtype)


@register_cost(
    "aten::native_batch_norm", "aten::batch_norm", "aten::cudnn_batch_norm",
    "aten::miopen_batch_norm", "aten::_native_batch_norm_legit",
    "aten::_native_batch_norm_legit_no_training", "aten::_batch_norm_impl_index",
    kind="norm",
)
def batch_norm(a: OpArgs) -> OpCost | None:
    """``native_batch_norm(input [b, c, *], weight? [c], bias? [c], running_mean? [c],
    running_var? [c], training, momentum, eps) -> (y, save_mean [c], save_invstd [c])``.

    The cuDNN/MIOpen variants and ``_native_batch_norm_legit`` share the positions;
    ``_native_batch_norm_legit_no_training`` has no ``training`` flag (eval).
    FLOPs ``N·(6 training | 2 eval + [weight] + [bias])``. Bytes: read x, weight, bias and
    the running stats; write y, and in training the saved stats and updated running stats.
    """
    x = a.tensor(0)
    if x is None or x.ndim < 2:
        return None
    w, b, rm, rv = (a.tensor(i) for i in (1, 2, 3, 4))
    if a.op.endswith("_no_training"):
        training = False
    else:
        training = a.flag(5)
        if training is None:
            training = a.flag(3)  # _native_batch_norm_legit.no_stats(input, w, b, training, ...)
    note = ""
    if training is None:
        training, note = True, "training flag not recorded: training assumed"
    per = BN_TRAIN_FWD_PER_ELEM if training else BN_EVAL_FWD_PER_ELEM
    flops = x.numel * (per + (w is not None) + (b is not None))
    c = x.shape[1]
    writes: list[Tensor | None] = [x]
    if training:
        writes += [Tensor((c,), _acc(x.dtype))] * 2 + [rm, rv]
    return _cost(flops, [x, w, b, rm, rv], writes, x.dtype, note)


def _bn_backward(g: Tensor | None, x: Tensor | None, w: Tensor | None, stats: list[Tensor | None],
                 mask: list[bool]) -> OpCost | None:
    if g is None or x is None or x.ndim < 2:
        return None
    gi, gw, gb = mask
    c = x.shape[1]
    wshape = w if w is not None else Tensor((c,), x.dtype)
    flops = x.numel * (GRAD_INPUT_PER_ELEM * gi + GRAD_WEIGHT_PER_ELEM * gw + GRAD_BIAS_PER_ELEM * gb)
    reads = [g, x, w, *stats]
    writes = [x if gi else None, wshape if gw else None, wshape if gb else None]
    return _cost(flops, reads, writes, x.dtype)


@register_cost("aten::native_batch_norm_backward", "aten::batch_norm_backward", kind="norm")
def batch_norm_backward(a: OpArgs) -> OpCost | None:
    """``native_batch_norm_backward(grad_out, input, weight?, running_mean?, running_var?,
    save_mean?, save_invstd?, train, eps, output_mask[3])`` (``batch_norm_backward`` has the
    same positions plus ``reserve``).

    FLOPs ``N·(10·gi + 2·gw + 1·gb)``; reads grad_out, input, weight and the statistics.
    """
    stats = [a.tensor(i) for i in (3, 4, 5, 6)]
    mask = _mask(a, 9, 3, [True, True, True])
    return _bn_backward(a.tensor(0), a.tensor(1), a.tensor(2), stats, mask)


@register_cost("aten::cudnn_batch_norm_backward", "aten::miopen_batch_norm_backward", kind="norm")
def vendor_batch_norm_backward(a: OpArgs) -> OpCost | None:
    """``cudnn_batch_norm_backward(input, grad_output, weight, running_mean?, running_var?,
    save_mean?, save_var?, epsilon[, reserveSpace])`` (MIOpen: the same without reserve).

    Always computes all three gradients: FLOPs ``N·(10 + 2 + 1)``.
    """
    stats = [a.tensor(i) for i in (5, 6)]
    return _bn_backward(a.tensor(1), a.tensor(0), a.tensor(2), stats, [True, True, True])


@register_cost("aten::native_group_norm", "aten::group_norm", kind="norm")
def group_norm(a: OpArgs) -> OpCost | None:
    """``native_group_norm(input [b, c, *], weight? [c], bias? [c], N, C, HxW, group, eps)
    -> (y, mean [b, g], rstd [b, g])``; ``group_norm(input, num_groups, weight?, bias?, eps,
    cudnn_enabled) -> y``.

    FLOPs ``N·(6 + [weight] + [bias])``; bytes read x, weight, bias; write y (+ mean, rstd).
    """
    x = a.tensor(0)
    if x is None:
        return None
    composite = a.op.endswith("::group_norm")
    w, b = (a.tensor(2), a.tensor(3)) if composite else (a.tensor(1), a.tensor(2))
    flops = x.numel * (LN_FWD_PER_ELEM + (w is not None) + (b is not None))
    writes: list[Tensor | None] = [x]
    groups = a.integer(6) if not composite else None
    if groups is not None and x.ndim:
        writes += [Tensor((x.shape[0], groups), _acc(x.dtype))] * 2
    return _cost(flops, [x, w, b], writes, x.dtype)


@register_cost("aten::native_group_norm_backward", kind="norm")
def group_norm_backward(a: OpArgs) -> OpCost | None:
    """``native_group_norm_backward(grad_out, input, mean [b, g], rstd [b, g], weight?, N, C,
    HxW, group, output_mask[3])``.

    FLOPs ``N·(10·gi + 2·gw + 1·gb)``; reads grad_out, input, mean, rstd, weight.
    """
    g, x, mean, rstd, w = (a.tensor(i) for i in (0, 1, 2, 3, 4))
    if g is None or x is None or x.ndim < 2:
        return None
    gi, gw, gb = _mask(a, 9, 3, [True, w is not None, w is not None])
    c = x.shape[1]
    wshape = w if w is not None else Tensor((c,), x.dtype)
    flops = x.numel * (GRAD_INPUT_PER_ELEM * gi + GRAD_WEIGHT_PER_ELEM * gw + GRAD_BIAS_PER_ELEM * gb)
    writes = [x if gi else None, wshape if gw else None, wshape if gb else None]
    return _cost(flops, [g, x, mean, rstd, w], writes, x.dtype)


@register_cost("_C::rms_norm", kind="norm")
def vllm_rms_norm(a: OpArgs) -> OpCost | None:
    """vLLM ``_C::rms_norm(Tensor! out, Tensor input [*, d], Tensor weight [d], float eps)``.

    FLOPs ``N·4``; reads input and weight, writes out.
    """
    out, x, w = a.tensor(0), a.tensor(1), a.tensor(2)
    if x is None:
        return None
    flops = x.numel * (RMS_FWD_PER_ELEM + 1)
    return _cost(flops, [x, w], [out if out is not None else x], x.dtype)


@register_cost("_C::fused_add_rms_norm", kind="norm")
def vllm_fused_add_rms_norm(a: OpArgs) -> OpCost | None:
    """vLLM ``_C::fused_add_rms_norm(Tensor! input [*, d], Tensor! residual [*, d],
    Tensor weight [d], float eps)``: ``residual += input; input = rms_norm(residual)``.

    FLOPs ``N·(1 + 4)``; reads input, residual, weight; writes input and residual.
    """
    x, r, w = a.tensor(0), a.tensor(1), a.tensor(2)
    if x is None or r is None:
        return None
    flops = x.numel * (1 + RMS_FWD_PER_ELEM + 1)
    return _cost(flops, [x, r, w], [x, r], x.dtype)
