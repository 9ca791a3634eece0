"""Pointwise ops: unary/binary/ternary arithmetic, comparisons, activations and their
backward, dropout, and the elementwise losses.

Shape convention: inputs broadcast (NumPy rules) to the output; an ``out=`` tensor (a tensor
argument past the op's functional arity) is the output; an in-place op (``aten::add_``)
writes its ``self``.

FLOPs: ``numel(out) · c``, where ``c`` counts one FLOP per add, multiply, compare or
elementary function (exp, log, tanh, erf, sqrt, ...) in the op's textbook formula, e.g.
relu 1, add 1 (2 with ``alpha != 1``), sigmoid 4 (neg, exp, add, div), silu 4 (neg, exp, add,
div), gelu 5 (``x/2·(1 + erf(x/√2))``; the tanh form is 9, but Kineto does not record the
``approximate`` string). Integer and boolean ops are counted the same way. torch's flop
counter has no pointwise formulas; these ops are memory-bound, so the roofline rests on the
bytes: every input read once at its dtype width, the output written once (compulsory
traffic; in-place ops write what they read).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..dtypes import FLOATING
from .args import OpArgs, Tensor, broadcast, promote, total_bytes
from .registry import OpCost, register_cost


@dataclass(frozen=True)
class Pointwise:
    """How to read a pointwise op: ``flops`` per output element; tensors at positions below
    ``arity`` are inputs, at or after it ``out=`` tensors; ``result``: ``"promote"`` (type
    promotion), ``"float"`` (promotion, integers → fp32) or a fixed dtype (``"bool"``)."""

    flops: float
    arity: int
    result: str = "promote"


def result_dtype(inputs: list[Tensor], rule: str) -> str | None:
    """Result dtype of a pointwise op (a simplification of torch type promotion: dimensioned
    tensors decide; 0-dim tensors only lift integer results to floating)."""
    if rule not in ("promote", "float"):
        return rule
    dimensioned = [t.dtype for t in inputs if t.ndim]
    zero_dim = [t.dtype for t in inputs if not t.ndim]
    dtype = promote(dimensioned) or promote(zero_dim)
    if dtype is not None and dtype not in FLOATING:
        if rule == "float" or any(d in FLOATING for d in zero_dim):
            dtype = "fp32"
    return dtype


def pointwise_cost(a: OpArgs, spec: Pointwise, kind: str = "elementwise", note: str = "") -> OpCost | None:
    """Cost of a pointwise op read with ``spec`` (see :class:`Pointwise`)."""
    inputs = [t for _, t in a.tensors(0, spec.arity)]
    outs = [t for _, t in a.tensors(spec.arity)]
    if not inputs:
        return None
    inplace = a.op.endswith("_") and not a.op.endswith("__")
    self_t = a.tensor(0)
    if inplace and self_t is not None:
        written = [self_t]
        n = self_t.numel
    elif outs:
        written = outs
        n = outs[0].numel
    else:
        shape = broadcast(*(t.shape for t in inputs))
        out = Tensor(shape, result_dtype(inputs, spec.result))
        written = [out]
        n = out.numel
    flops = n * spec.flops
    compute = promote([t.dtype for t in inputs]) if spec.result == "bool" else written[0].dtype
    return OpCost(float(flops), total_bytes(inputs), total_bytes(written), kind, compute, note)


def _register(spec: Pointwise, names: str, *, inplace: bool = True, kind: str = "elementwise") -> None:
    """Register ``aten::<name>`` (and ``aten::<name>_`` when ``inplace``) for each name."""
    ops = []
    for name in names.split():
        ops.append(f"aten::{name}")
        if inplace:
            ops.append(f"aten::{name}_")

    def formula(a: OpArgs) -> OpCost | None:
        return pointwise_cost(a, spec, kind)

    formula.__doc__ = (
        f"Pointwise {', '.join(ops)}: {spec.flops:g} FLOP per output element; tensors before "
        f"position {spec.arity} are inputs (broadcast), later ones out=; result {spec.result}."
    )
    formula.__qualname__ = formula.__name__ = "pointwise_" + names.split()[0]
    formula.spec = spec  # type: ignore[attr-defined]
    register_cost(*ops, kind=kind)(formula)


# --- unary: f(x) ---------------------------------------------------------------------------
_register(Pointwise(1, 1), "abs neg relu reciprocal sqrt rsqrt exp exp2 expm1 log log2 log10 "
          "log1p sin cos tan sinh cosh tanh asin acos atan asinh acosh atanh erf erfc erfinv sign "
          "sgn floor ceil trunc frac square bitwise_not")
_register(Pointwise(1, 1), "positive", inplace=False)
_register(Pointwise(1, 1, "bool"), "logical_not")
_register(Pointwise(1, 1, "bool"), "isnan isinf isfinite isneginf isposinf signbit", inplace=False)
_register(Pointwise(1, 2), "round clamp_min clamp_max relu6")  # round.decimals, clamp_min(self, min)
_register(Pointwise(1, 2), "pow")  # pow(self, exponent): Tensor_Scalar or Tensor_Tensor
_register(Pointwise(2, 3), "clamp hardtanh threshold")  # clamp(self, min, max): compare twice
_register(Pointwise(2, 2), "leaky_relu")
_register(Pointwise(3, 3), "softplus", inplace=False)  # log1p(exp(beta·x))/beta
_register(Pointwise(4, 4), "elu celu selu")
_register(Pointwise(4, 1), "sigmoid silu")  # 1/(1+exp(-x)); x/(1+exp(-x))
_register(Pointwise(5, 2), "gelu")  # x/2·(1+erf(x/√2))
_register(Pointwise(5, 1), "mish hardswish hardsigmoid")
_register(Pointwise(3, 2), "logit")  # log(x/(1-x)) with the eps clamp
_register(Pointwise(3, 4), "nan_to_num")

# --- binary: f(x, y) -----------------------------------------------------------------------
_register(Pointwise(1, 2), "maximum minimum fmax fmin", inplace=False)
_register(Pointwise(1, 2), "mul remainder fmod copysign "
          "bitwise_and bitwise_or bitwise_xor bitwise_left_shift bitwise_right_shift")
_register(Pointwise(1, 2), "__and__ __or__ __xor__ __lshift__ __rshift__", inplace=False)
_register(Pointwise(1, 2, "float"), "div true_divide atan2 hypot xlogy")
_register(Pointwise(1, 2), "floor_divide")
_register(Pointwise(1, 2, "bool"), "eq ne lt le gt ge logical_and logical_or logical_xor "
          "greater greater_equal less less_equal not_equal")


@register_cost("aten::add", "aten::add_", "aten::sub", "aten::sub_", "aten::rsub", kind="elementwise")
def add(a: OpArgs) -> OpCost | None:
    """``add(self, other, alpha=1)``: ``self + alpha·other``, 1 FLOP per element (2 when
    ``alpha != 1``); sub/rsub likewise. Inputs broadcast; ``add_`` writes ``self``."""
    alpha = a.number(2, 1.0)
    return pointwise_cost(a, Pointwise(1 if alpha in (1.0, -1.0) else 2, 3))


# --- ternary -------------------------------------------------------------------------------
_register(Pointwise(1, 3), "where", inplace=False)  # select
_register(Pointwise(1, 3), "masked_fill")  # masked write
_register(Pointwise(3, 4), "addcmul addcdiv")  # self + value·t1·t2 (or t1/t2)
_register(Pointwise(3, 3), "lerp")  # self + weight·(end - self)

# --- activation backward: f(grad_output, self | result) ------------------------------------
_register(Pointwise(1, 3), "threshold_backward", inplace=False)  # grad · (x > t)
_register(Pointwise(2, 4), "hardtanh_backward leaky_relu_backward", inplace=False)
_register(Pointwise(3, 2), "sigmoid_backward tanh_backward", inplace=False)  # g·y·(1-y), g·(1-y²)
_register(Pointwise(6, 2), "silu_backward hardswish_backward hardsigmoid_backward mish_backward",
          inplace=False)  # sigmoid (4) and the product rule (2)
_register(Pointwise(8, 3), "gelu_backward", inplace=False)  # erf form: exp, erf, 6 arithmetic
_register(Pointwise(5, 4), "softplus_backward", inplace=False)
_register(Pointwise(4, 6), "elu_backward", inplace=False)
_register(Pointwise(2, 3), "native_dropout_backward", inplace=False)  # grad · mask · scale


@register_cost("aten::native_dropout", kind="elementwise")
def native_dropout(a: OpArgs) -> OpCost | None:
    """``native_dropout(input, p, train) -> (output [input], mask [input] bool)``.

    2 FLOPs per element (keep test, scale; the RNG's integer work is not counted); reads
    the input, writes the output and the boolean mask. In eval it is a copy.
    """
    x = a.tensor(0)
    if x is None:
        return None
    if a.flag(2) is False:
        return OpCost(0.0, x.nbytes, x.nbytes, "elementwise", x.dtype, "dropout in eval: a copy")
    mask = Tensor(x.shape, "bool")
    return OpCost(2.0 * x.numel, x.nbytes, total_bytes([x, mask]), "elementwise", x.dtype)


def _reduced(inputs: list[Tensor], reduction: int | None) -> tuple[tuple[int, ...], str]:
    shape = broadcast(*(t.shape for t in inputs))
    if reduction == 0:
        return shape, ""
    note = "" if reduction is not None else "reduction not recorded: mean assumed"
    return (), note


@register_cost("aten::mse_loss", "aten::l1_loss", "aten::smooth_l1_loss", "aten::huber_loss",
               kind="elementwise")
def pointwise_loss(a: OpArgs) -> OpCost | None:
    """``mse_loss(self, target, reduction=mean)``: ``(self - target)²`` then mean/sum.

    3 FLOPs per element (sub, square, accumulate); reads both inputs; writes a scalar
    (``reduction`` 1/2) or the elementwise loss (``reduction`` 0).
    """
    x, t = a.tensor(0), a.tensor(1)
    if x is None or t is None:
        return None
    out_shape, note = _reduced([x, t], a.integer(2))
    n = broadcast(x.shape, t.shape)
    flops = 3.0 * Tensor(n, None).numel
    out = a.tensor(3) or Tensor(out_shape, x.dtype)
    return OpCost(flops, total_bytes([x, t]), out.nbytes, "elementwise", x.dtype, note)


@register_cost("aten::mse_loss_backward", "aten::smooth_l1_loss_backward",
               "aten::huber_loss_backward", kind="elementwise")
def pointwise_loss_backward(a: OpArgs) -> OpCost | None:
    """``mse_loss_backward(grad_output, self, target, reduction) -> grad_input [self]``.

    3 FLOPs per element (sub, 2·scale, times grad); reads grad_output, self, target.
    """
    g, x, t = a.tensor(0), a.tensor(1), a.tensor(2)
    if x is None or t is None:
        return None
    outs = [o for _, o in a.tensors(4)]  # the .grad_input overload's out tensor
    out = outs[0] if outs else Tensor(broadcast(x.shape, t.shape), x.dtype)
    return OpCost(3.0 * out.numel, total_bytes([g, x, t]), out.nbytes, "elementwise", x.dtype)


@register_cost("aten::nll_loss_forward", "aten::nll_loss2d_forward", kind="elementwise")
def nll_loss_forward(a: OpArgs) -> OpCost | None:
    """``nll_loss_forward(self [n, c] log-probs, target [n], weight? [c], reduction,
    ignore_index) -> (output, total_weight)``.

    Gathers one value per sample: ``n`` FLOPs (the sum); reads target, the ``n`` gathered
    values (not all of ``self``) and weight; writes the loss (scalar, or ``[n]`` for
    ``reduction`` 0) and total_weight.
    """
    x, t, w = a.tensor(0), a.tensor(1), a.tensor(2)
    if x is None or t is None:
        return None
    n = t.numel
    gathered = Tensor((n,), x.dtype)
    out = Tensor(t.shape if a.integer(3) == 0 else (), x.dtype)
    return OpCost(float(n), total_bytes([t, gathered, w]), total_bytes([out, Tensor((), x.dtype)]),
                  "elementwise", x.dtype, "reads the gathered log-probabilities only")


@register_cost("aten::nll_loss_backward", "aten::nll_loss2d_backward", kind="elementwise")
def nll_loss_backward(a: OpArgs) -> OpCost | None:
    """``nll_loss_backward(grad_output, self [n, c], target [n], weight?, reduction,
    ignore_index, total_weight) -> grad_input [n, c]``.

    Writes all of grad_input (zero fill, then one value per sample): ``n`` FLOPs; reads
    grad_output, target, weight, total_weight.
    """
    g, x, t, w, tw = (a.tensor(i) for i in (0, 1, 2, 3, 6))
    if x is None or t is None:
        return None
    return OpCost(float(t.numel), total_bytes([g, t, w, tw]), x.nbytes, "elementwise", x.dtype)
