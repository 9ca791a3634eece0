"""Matrix multiplies: mm, bmm, addmm, baddbmm, addbmm, matmul, linear, mv, dot, _scaled_mm.

FLOPs: a (m×k)·(k×n) product is 2·m·n·k (one multiply and one add per term; Kaplan et al.
2020, PaLM appendix B, torch ``flop_counter.mm_flop``). Like torch's flop counter, the
``beta·self`` add of addmm/baddbmm and the epilogue activation are not counted.
Bytes: each operand and the result once at its dtype width (compulsory traffic).

The backward of a matmul is not a separate op in a trace: autograd calls ``aten::mm``
twice (``grad @ Bᵀ`` and ``Aᵀ @ grad``), so it is costed by these same formulas.
"""

from __future__ import annotations

import math

from .args import OpArgs, Tensor, broadcast, total_bytes
from .registry import OpCost, register_cost


def matmul_flops(m: int, n: int, k: int, batch: int = 1) -> int:
    """FLOPs of ``batch`` products ``[m, k] @ [k, n]``: 2·batch·m·n·k (torch ``mm_flop``)."""
    return 2 * batch * m * n * k


def _note(dtype: str | None) -> str:
    return "fp32 matmul (runs as TF32 if allow_tf32 was set)" if dtype == "fp32" else ""


def _cost(
    flops: int,
    reads: list[Tensor | None],
    out_shape: tuple[int, ...],
    out_dtype: str | None,
    out: Tensor | None,
    dtype: str | None,
    note: str = "",
) -> OpCost:
    """OpCost of a product: reads once, the result written once (``out`` if recorded)."""
    written = out if out is not None else Tensor(out_shape, out_dtype)
    notes = "; ".join(x for x in (_note(dtype), note) if x)
    return OpCost(float(flops), total_bytes(reads), written.nbytes, "matmul", dtype, notes)


def _out_arg(a: OpArgs, first: int) -> Tensor | None:
    """The ``out=`` tensor of an ``.out`` overload: a tensor at or after ``first``."""
    for i in range(first, len(a)):
        t = a.tensor(i)
        if t is not None:
            return t
    return None


def _mm2(x: Tensor | None, w: Tensor | None) -> tuple[int, int, int] | None:
    if x is None or w is None or x.ndim != 2 or w.ndim != 2 or x.shape[1] != w.shape[0]:
        return None
    return x.shape[0], w.shape[1], x.shape[1]


@register_cost("aten::mm", "aten::_int_mm", kind="matmul")
def mm(a: OpArgs) -> OpCost | None:
    """``mm(self [m, k], mat2 [k, n]) -> [m, n]``: 2·m·n·k FLOPs.

    ``mm.dtype`` records the output ScalarType at position 2; ``mm.out`` the out tensor.
    ``_int_mm`` is int8×int8→int32 (counted as integer ops, dtype ``int8``).
    """
    x, w = a.tensor(0), a.tensor(1)
    mnk = _mm2(x, w)
    if mnk is None:
        return None
    m, n, k = mnk
    out_dtype = "int32" if a.op.endswith("_int_mm") else (a.scalar_type(2) or x.dtype)
    return _cost(matmul_flops(m, n, k), [x, w], (m, n), out_dtype, _out_arg(a, 2), x.dtype)


@register_cost("aten::addmm", "aten::_addmm_activation", kind="matmul")
def addmm(a: OpArgs) -> OpCost | None:
    """``addmm(self [n] | [m, n], mat1 [m, k], mat2 [k, n], beta, alpha) -> [m, n]``.

    2·m·n·k FLOPs (torch ``addmm_flop``: the bias add is not counted); bytes read the bias
    (unless ``beta == 0``), both matrices, and write the result.
    """
    bias, x, w = a.tensor(0), a.tensor(1), a.tensor(2)
    mnk = _mm2(x, w)
    if mnk is None:
        return None
    m, n, k = mnk
    # addmm.dtype(self, mat1, mat2, ScalarType out_dtype, beta, alpha[, out]) has 6 (7) args;
    # addmm(self, mat1, mat2, beta, alpha[, out]) has 5 (6, the last a tensor).
    with_dtype = a.op == "aten::addmm" and (len(a) >= 7 or (len(a) == 6 and not a.is_tensor(5)))
    if a.number(4 if with_dtype else 3) == 0.0:
        bias = None
    out_dtype = (a.scalar_type(3) if with_dtype else None) or x.dtype
    return _cost(matmul_flops(m, n, k), [bias, x, w], (m, n), out_dtype,
                 _out_arg(a, 6 if with_dtype else 5), x.dtype)


def batched_mnk(x: Tensor | None, w: Tensor | None) -> tuple[int, int, int, int] | None:
    """``(b, m, n, k)`` of a batched product ``x [b, m, k] @ w [b, k, n]`` (bmm, baddbmm,
    addbmm, the 3-D grouped GEMMs); None when either operand is missing or not 3-D, or the
    batch or inner dims disagree."""
    if x is None or w is None or x.ndim != 3 or w.ndim != 3:
        return None
    (b, m, k), (b2, k2, n) = x.shape, w.shape
    if b != b2 or k != k2:
        return None
    return b, m, n, k


@register_cost("aten::bmm", kind="matmul")
def bmm(a: OpArgs) -> OpCost | None:
    """``bmm(self [b, m, k], mat2 [b, k, n]) -> [b, m, n]``: 2·b·m·n·k FLOPs (torch ``bmm_flop``)."""
    x, w = a.tensor(0), a.tensor(1)
    bmnk = batched_mnk(x, w)
    if bmnk is None:
        return None
    b, m, n, k = bmnk
    out_dtype = a.scalar_type(2) or x.dtype
    return _cost(matmul_flops(m, n, k, b), [x, w], (b, m, n), out_dtype, _out_arg(a, 2), x.dtype)


@register_cost("aten::baddbmm", kind="matmul")
def baddbmm(a: OpArgs) -> OpCost | None:
    """``baddbmm(self, batch1 [b, m, k], batch2 [b, k, n], beta, alpha) -> [b, m, n]``.

    2·b·m·n·k FLOPs (torch ``baddbmm_flop``); ``self`` is read unless ``beta == 0``.
    """
    c, x, w = a.tensor(0), a.tensor(1), a.tensor(2)
    bmnk = batched_mnk(x, w)
    if bmnk is None:
        return None
    b, m, n, k = bmnk
    if a.number(3) == 0.0:
        c = None
    return _cost(matmul_flops(m, n, k, b), [c, x, w], (b, m, n), x.dtype, _out_arg(a, 5), x.dtype)


@register_cost("aten::addbmm", kind="matmul")
def addbmm(a: OpArgs) -> OpCost | None:
    """``addbmm(self [m, n], batch1 [b, m, k], batch2 [b, k, n]) -> [m, n]`` (sum over b).

    2·b·m·n·k FLOPs (the products; the reduction over ``b`` is the adds already counted).
    """
    c, x, w = a.tensor(0), a.tensor(1), a.tensor(2)
    bmnk = batched_mnk(x, w)
    if bmnk is None:
        return None
    b, m, n, k = bmnk
    if a.number(3) == 0.0:
        c = None
    return _cost(matmul_flops(m, n, k, b), [c, x, w], (m, n), x.dtype, _out_arg(a, 5), x.dtype)


def matmul_shapes(s1: tuple[int, ...], s2: tuple[int, ...]) -> tuple[int, int, int, int, tuple[int, ...]]:
    """``torch.matmul`` semantics: ``(batch, m, n, k, out_shape)`` for operands ``s1 @ s2``.

    1-D operands are promoted (``[k]`` → ``[1, k]`` on the left, ``[k, 1]`` on the right) and
    the promoted dim is dropped from the result; batch dims broadcast.

    Raises:
        ValueError: the shapes do not multiply.
    """
    if not s1 or not s2:
        raise ValueError("matmul of a 0-dim tensor")
    a = (1, *s1) if len(s1) == 1 else s1
    b = (*s2, 1) if len(s2) == 1 else s2
    m, k = a[-2], a[-1]
    k2, n = b[-2], b[-1]
    if k != k2:
        raise ValueError(f"matmul: inner dims {k} != {k2}")
    batch_shape = broadcast(a[:-2], b[:-2])
    out = list(batch_shape)
    if len(s1) > 1:
        out.append(m)
    if len(s2) > 1:
        out.append(n)
    return math.prod(batch_shape), m, n, k, tuple(out)


@register_cost("aten::matmul", kind="matmul")
def matmul(a: OpArgs) -> OpCost | None:
    """``matmul(self [..., m, k], other [..., k, n]) -> [..., m, n]`` with broadcasting.

    2·batch·m·n·k FLOPs; equals what torch counts for the mm/bmm it decomposes into.
    """
    x, w = a.tensor(0), a.tensor(1)
    if x is None or w is None:
        return None
    batch, m, n, k, out_shape = matmul_shapes(x.shape, w.shape)
    return _cost(matmul_flops(m, n, k, batch), [x, w], out_shape, x.dtype, _out_arg(a, 2), x.dtype)


@register_cost("aten::linear", kind="matmul")
def linear(a: OpArgs) -> OpCost | None:
    """``linear(input [..., k], weight [n, k], bias [n]?) -> [..., n]``: 2·M·n·k FLOPs,
    M = prod(input[:-1]) (equals torch's count for the addmm/mm it decomposes into)."""
    x, w, bias = a.tensor(0), a.tensor(1), a.tensor(2)
    if x is None or w is None or w.ndim != 2 or not x.ndim or x.shape[-1] != w.shape[1]:
        return None
    n, k = w.shape
    rows = math.prod(x.shape[:-1])
    return _cost(matmul_flops(rows, n, k), [x, w, bias], (*x.shape[:-1], n), x.dtype,
                 _out_arg(a, 3), x.dtype)


@register_cost("aten::mv", "aten::addmv", kind="matmul")
def mv(a: OpArgs) -> OpCost | None:
    """``mv(self [m, k], vec [k]) -> [m]``; ``addmv(self [m], mat [m, k], vec [k])``: 2·m·k FLOPs."""
    addmv = a.op.endswith("addmv")
    c, x, v = (a.tensor(0), a.tensor(1), a.tensor(2)) if addmv else (None, a.tensor(0), a.tensor(1))
    if x is None or v is None or x.ndim != 2 or v.ndim != 1 or x.shape[1] != v.shape[0]:
        return None
    m, k = x.shape
    return _cost(matmul_flops(m, 1, k), [c, x, v], (m,), x.dtype, _out_arg(a, 5 if addmv else 2),
                 x.dtype)


@register_cost("aten::dot", "aten::vdot", kind="matmul")
def dot(a: OpArgs) -> OpCost | None:
    """``dot(self [k], tensor [k]) -> []``: 2·k FLOPs."""
    x, y = a.tensor(0), a.tensor(1)
    if x is None or y is None or x.ndim != 1 or x.shape != y.shape:
        return None
    return _cost(matmul_flops(1, 1, x.shape[0]), [x, y], (), x.dtype, _out_arg(a, 2), x.dtype)


@register_cost("aten::_scaled_mm", kind="matmul")
def scaled_mm(a: OpArgs) -> OpCost | None:
    """``_scaled_mm(self [m, k] fp8, mat2 [k, n] fp8, scale_a, scale_b, bias?, scale_result?,
    out_dtype?, use_fast_accum) -> [m, n]``: 2·m·n·k FLOPs at fp8 (torch ``_scaled_mm_flop``).
    fp4 operands (``Float4_e2m1fn_x2``, two values per element along ``k``: ``self [m, k/2]``,
    ``mat2 [k/2, n]``) do ``2·m·n·k`` with ``k`` twice the recorded dim, at the fp4 peak
    (torch's counter reads the packed shapes: half of it); their result's dtype is the recorded
    ``out_dtype`` (the input's is no output dtype), else the written bytes are unknown.

    Bytes read both matrices, the scales and the bias; the result is written at
    ``out_dtype`` (recorded as a ScalarType at position 6), else at the input dtype.
    """
    x, w = a.tensor(0), a.tensor(1)
    mnk = _mm2(x, w)
    if mnk is None:
        return None
    m, n, k = mnk
    reads = [x, w, a.tensor(2), a.tensor(3), a.tensor(4), a.tensor(5)]
    out_dtype = a.scalar_type(6) or x.dtype
    if x.dtype == "fp4x2" and w.dtype == "fp4x2":  # two fp4 values per element along k
        return _cost(matmul_flops(m, n, 2 * k), reads, (m, n), a.scalar_type(6), _out_arg(a, 8), "fp4",
                     "fp4x2 packs two values per element along k: k = 2 x the recorded dim")
    return _cost(matmul_flops(m, n, k), reads, (m, n), out_dtype, _out_arg(a, 8), x.dtype)
