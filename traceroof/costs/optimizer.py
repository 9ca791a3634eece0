"""Multi-tensor (``_foreach_*``) ops and the fused optimizer steps (``_fused_adam_``,
``_fused_adamw_``, ``_fused_sgd_``).

Shape convention: ``Tensor[]`` arguments are recorded 3-deep in ``Input Dims``
(``[[[1024, 1024], [1024]], [[1024, 1024], [1024]], []]``); ``N`` is the total number of
elements of the first list. Kineto records a ``Tensor[]``'s type as ``"TensorList"`` with no
element dtype, so bytes are known only when the caller passes ``tensorlist_dtype``; the
FLOPs are known either way.

FLOPs per element: binary/unary foreach 1 (add with ``alpha != 1`` 2), addcmul/addcdiv/lerp
3, norm 2; Adam/AdamW 14 (moment updates 3 + 4, bias-corrected denominator 3, update 3,
weight decay 1), +2 for AMSGrad (max, and the read of the max buffer); SGD with momentum 5
(weight decay 2, momentum 2, update 1), without 3.
Bytes: in-place lists are read and written, other lists read once, out-of-place results
written once.
"""

from __future__ import annotations

from dataclasses import dataclass

from .args import OpArgs, Tensor
from .registry import OpCost, register_cost


@dataclass(frozen=True)
class Foreach:
    """``flops`` per element; ``lists``: how many leading ``Tensor[]`` args are inputs;
    ``reads_self``: whether list 0 is read (``_foreach_zero_``/``_foreach_copy_`` do not)."""

    flops: float
    lists: int = 2
    reads_self: bool = True


def _elements(ts: list[Tensor]) -> int:
    return sum(t.numel for t in ts)


def _bytes(ts: list[Tensor]) -> float | None:
    if not ts:
        return 0.0
    b = [t.nbytes for t in ts]
    return None if any(x is None for x in b) else float(sum(b))  # type: ignore[arg-type]


def _sum(*xs: float | None) -> float | None:
    return None if any(x is None for x in xs) else float(sum(xs))  # type: ignore[arg-type]


def foreach_cost(a: OpArgs, spec: Foreach) -> OpCost | None:
    """Cost of a ``_foreach_*`` op read with ``spec``."""
    self_list = a.tensorlist(0)
    if not self_list:
        return None
    others = [a.tensorlist(i) or [] for i in range(1, spec.lists)]
    # Scalar/0-dim tensor operands (``_foreach_add_.Tensor``) are one element each: ignored
    n = _elements(self_list)
    flops = n * spec.flops
    if a.op.rstrip("_").endswith(("_add", "_sub")):
        alpha = a.number(2, 1.0)
        if alpha not in (1.0, -1.0) and others and others[0]:
            flops = n * 2
    reads = _sum(_bytes(self_list) if spec.reads_self else 0.0, *(_bytes(o) for o in others))
    writes = _bytes(self_list)
    note = "" if reads is not None else "Tensor[] dtypes not recorded: bytes unknown"
    kind = "elementwise"
    if "norm" in a.op:  # one 0-dim result per tensor
        kind, writes = "reduction", _bytes([Tensor((), t.dtype) for t in self_list])
    # in place, list 0 is written back; out of place, a new list of the same shapes
    dtype = self_list[0].dtype
    return OpCost(float(flops), reads, writes, kind, dtype, note)


def _register(spec: Foreach, names: str, *, inplace: bool = True) -> None:
    ops = []
    for name in names.split():
        ops.append(f"aten::_foreach_{name}")
        if inplace:
            ops.append(f"aten::_foreach_{name}_")

    def formula(a: OpArgs) -> OpCost | None:
        return foreach_cost(a, spec)

    formula.__doc__ = (
        f"Multi-tensor {', '.join(ops)}: {spec.flops:g} FLOP per element of list 0; "
        f"{spec.lists} leading Tensor[] inputs."
    )
    formula.__qualname__ = formula.__name__ = "foreach_" + names.split()[0]
    formula.spec = spec  # type: ignore[attr-defined]
    register_cost(*ops, kind="reduction" if "norm" in names else "elementwise")(formula)


_register(Foreach(1), "add sub mul div maximum minimum clamp_min clamp_max pow")
_register(Foreach(1, lists=1), "neg abs sqrt rsqrt exp log reciprocal sign sigmoid tanh erf "
          "floor ceil round trunc frac sin cos")
_register(Foreach(3, lists=3), "addcmul addcdiv lerp")
_register(Foreach(0, lists=2, reads_self=False), "copy_", inplace=False)
_register(Foreach(0, lists=1, reads_self=False), "zero_", inplace=False)
_register(Foreach(2, lists=1), "norm", inplace=False)


ADAM_PER_ELEM = 14
AMSGRAD_EXTRA_PER_ELEM = 2


@register_cost("aten::_fused_adam_", "aten::_fused_adamw_", "aten::_fused_adam", "aten::_fused_adamw",
               kind="elementwise")
def fused_adam(a: OpArgs) -> OpCost | None:
    """``_fused_adam_(self: Tensor[], grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs,
    state_steps, *, lr, beta1, beta2, weight_decay, eps, amsgrad, maximize, grad_scale?,
    found_inf?)``.

    ``14·N`` FLOPs (+``2·N`` with AMSGrad, ``amsgrad`` at position 11). Reads params, grads,
    both moments (and the max buffer); writes params and both moments (and the max buffer).
    """
    params, grads = a.tensorlist(0), a.tensorlist(1)
    if not params:
        return None
    amsgrad = bool(a.flag(11, False))
    n = _elements(params)
    flops = n * (ADAM_PER_ELEM + (AMSGRAD_EXTRA_PER_ELEM if amsgrad else 0))
    states = 2 + int(amsgrad)
    p_bytes = _bytes(params)
    g_bytes = _bytes(grads or params)
    reads = _sum(p_bytes, g_bytes, None if p_bytes is None else p_bytes * states)
    writes = _sum(p_bytes, None if p_bytes is None else p_bytes * states)
    note = "optimizer states assumed at the params' dtype"
    if reads is None:
        note = "Tensor[] dtypes not recorded: bytes unknown"
    return OpCost(float(flops), reads, writes, "elementwise", params[0].dtype, note)


@register_cost("aten::_fused_sgd_", "aten::_fused_sgd", kind="elementwise")
def fused_sgd(a: OpArgs) -> OpCost | None:
    """``_fused_sgd_(self: Tensor[], grads, momentum_buffer_list, *, weight_decay, momentum,
    lr, dampening, nesterov, maximize, is_first_step, grad_scale?, found_inf?)``.

    ``5·N`` FLOPs with momentum, ``3·N`` without. Reads params, grads (and momentum
    buffers); writes params (and momentum buffers).
    """
    params, grads, bufs = a.tensorlist(0), a.tensorlist(1), a.tensorlist(2)
    if not params:
        return None
    momentum = bool(bufs)
    n = _elements(params)
    flops = n * (5 if momentum else 3)
    p_bytes = _bytes(params)
    reads = _sum(p_bytes, _bytes(grads or params), _bytes(bufs or []))
    writes = _sum(p_bytes, _bytes(bufs or []))
    note = "" if reads is not None else "Tensor[] dtypes not recorded: bytes unknown"
    return OpCost(float(flops), reads, writes, "elementwise", params[0].dtype, note)
