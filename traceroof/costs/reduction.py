"""Reductions (sum, mean, amax, max, norm, var, all/any, argmax, cumsum), softmax and
log-softmax with their backward, and pooling with its backward.

Shape convention: ``x [*]`` reduced over ``dim`` (all dims when ``dim`` is ``None`` or
``[]``), ``keepdim`` keeps them as 1; softmax keeps the shape; pooling input
``[b, c, *spatial]`` or ``[c, *spatial]``.

FLOPs (one per add, multiply, compare or elementary function, per *input* element):
sum/mean/amax/max/all/argmax/prod/cumsum 1, norm 2 (square, add), var/std 4 (mean, sub,
square, add), logsumexp 4; softmax/log-softmax 5 (max, sub, exp, sum, div/log), their
backward 4; max pool ``k`` compares per output element (``k`` = window size), avg pool
``k + 1``; adaptive avg pool 1 per input element plus the divide per output element.
Bytes: the input read once, the output (values, and indices where returned) written once.
When the trace does not record ``dim`` (no ``Concrete Inputs``), a full reduction is assumed
(the output written is then a lower bound).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from .args import OpArgs, Tensor, total_bytes
from .registry import OpCost, register_cost


def reduced_shape(shape: tuple[int, ...], dims: list[int] | None, keepdim: bool) -> tuple[int, ...]:
    """Shape of ``x.sum(dims, keepdim)``: ``dims`` ``None`` or ``[]`` reduce every dim."""
    n = len(shape)
    if not dims:
        axes = set(range(n))
    else:
        axes = {d % n for d in dims} if n else set()
    if keepdim:
        return tuple(1 if i in axes else s for i, s in enumerate(shape))
    return tuple(s for i, s in enumerate(shape) if i not in axes)


@dataclass(frozen=True)
class Reduce:
    """Positions of ``dim`` and ``keepdim`` (``None``: not in the schema), FLOPs per input
    element, the result dtype rule (``same``, ``int64``, ``bool``, ``float``), whether an
    int64 index tensor is also returned, and the position of a ``dtype=`` ScalarType."""

    flops: float
    dim: int | None = 1
    keepdim: int | None = 2
    result: str = "same"
    indices: bool = False
    dtype_arg: int | None = None


def reduce_cost(a: OpArgs, spec: Reduce) -> OpCost | None:
    """Cost of a reduction read with ``spec``."""
    x = a.tensor(0)
    if x is None:
        return None
    note = ""
    dims: list[int] | None = None
    if spec.dim is not None and a.type(spec.dim) in ("ScalarList", "Scalar"):
        dims = a.int_list(spec.dim)
        if dims is None and not a.has_concrete:
            note = "reduced dims not recorded: full reduction assumed"
    keepdim = bool(a.flag(spec.keepdim, False)) if spec.keepdim is not None else False
    shape = reduced_shape(x.shape, dims, keepdim)
    dtype = x.dtype
    if spec.result == "int64":
        dtype = "int64"
    elif spec.result == "bool":
        dtype = "bool"
    elif spec.result == "float" and dtype not in ("fp16", "bf16", "fp32", "fp64"):
        dtype = "fp32"
    if spec.dtype_arg is not None:
        dtype = a.scalar_type(spec.dtype_arg) or dtype
    outs = [t for _, t in a.tensors(spec.keepdim + 1 if spec.keepdim is not None else 1)]
    if spec.dtype_arg is not None:
        outs = [t for _, t in a.tensors(spec.dtype_arg + 1)]
    written = outs or [Tensor(shape, dtype)] + ([Tensor(shape, "int64")] if spec.indices else [])
    return OpCost(float(x.numel * spec.flops), x.nbytes, total_bytes(written), "reduction",
                  x.dtype, note)


def _register(spec: Reduce, *names: str) -> None:
    def formula(a: OpArgs) -> OpCost | None:
        return reduce_cost(a, spec)

    formula.__doc__ = (
        f"Reduction {', '.join(names)}: {spec.flops:g} FLOP per input element; dim at "
        f"position {spec.dim}, keepdim at {spec.keepdim}; result {spec.result}."
    )
    formula.__qualname__ = formula.__name__ = "reduce_" + names[0].split("::")[-1]
    formula.spec = spec  # type: ignore[attr-defined]
    register_cost(*names, kind="reduction")(formula)


# sum.dim_IntList(self, dim, keepdim, *, dtype): dim=None / sum(self, *, dtype): everything
_register(Reduce(1, dtype_arg=3), "aten::sum", "aten::nansum", "aten::mean", "aten::nanmean")
_register(Reduce(1), "aten::amax", "aten::amin")
_register(Reduce(1, result="int64"), "aten::argmax", "aten::argmin")
_register(Reduce(1, result="bool"), "aten::all", "aten::any")
_register(Reduce(1, dtype_arg=3), "aten::prod")  # prod.dim_int(self, dim, keepdim, *, dtype)
_register(Reduce(2, dim=2, keepdim=3), "aten::norm", "aten::linalg_vector_norm")
_register(Reduce(4, dim=1, keepdim=3), "aten::var", "aten::std")
_register(Reduce(4), "aten::logsumexp")


@register_cost("aten::var_mean", "aten::std_mean", kind="reduction")
def var_mean(a: OpArgs) -> OpCost | None:
    """``var_mean.correction(self, dim?, *, correction?, keepdim) -> (var, mean)``: 4 FLOPs
    per input element; writes two reduced tensors."""
    cost = reduce_cost(a, Reduce(4, dim=1, keepdim=3))
    if cost is None or cost.bytes_written is None:
        return cost
    return OpCost(cost.flops, cost.bytes_read, 2 * cost.bytes_written, "reduction", cost.dtype, cost.note)


@register_cost("aten::max", "aten::min", kind="reduction")
def max_min(a: OpArgs) -> OpCost | None:
    """``max(self)`` (everything), ``max.dim(self, dim, keepdim) -> (values, indices)``, or
    ``max.other(self, other)`` (pointwise maximum): 1 FLOP per input element."""
    if a.tensor(1) is not None and len(a) == 2:
        from .elementwise import Pointwise, pointwise_cost

        return pointwise_cost(a, Pointwise(1, 2))
    if len(a) == 1:
        return reduce_cost(a, Reduce(1, dim=None, keepdim=None))
    return reduce_cost(a, Reduce(1, indices=True))


@register_cost("aten::cumsum", "aten::cumsum_", "aten::cumprod", "aten::cumprod_", "aten::logcumsumexp",
               kind="reduction")
def scan(a: OpArgs) -> OpCost | None:
    """``cumsum(self, dim, *, dtype) -> [self]`` (a scan): 1 FLOP per element; reads and
    writes the full tensor (at ``dtype`` when given)."""
    x = a.tensor(0)
    if x is None:
        return None
    out = a.tensor(3) or Tensor(x.shape, a.scalar_type(2) or x.dtype)
    return OpCost(float(x.numel), x.nbytes, out.nbytes, "reduction", x.dtype)


@register_cost("aten::_softmax", "aten::softmax", "aten::_log_softmax", "aten::log_softmax",
               "aten::_safe_softmax", kind="reduction")
def softmax(a: OpArgs) -> OpCost | None:
    """``_softmax(self, dim, half_to_float) -> [self]``; ``softmax.int(self, dim, dtype?)``.

    5 FLOPs per element (row max, subtract, exp, row sum, divide; log-softmax: log and
    subtract). Reads the input; writes the output at fp32 when ``half_to_float`` (or at the
    requested ``dtype``), else at the input dtype.
    """
    x = a.tensor(0)
    if x is None:
        return None
    dtype = x.dtype
    if a.op in ("aten::_softmax", "aten::_log_softmax") and a.flag(2):
        dtype = "fp32"
    elif a.op in ("aten::softmax", "aten::log_softmax", "aten::_safe_softmax"):
        dtype = a.scalar_type(2) or dtype
    out = a.tensor(3) or Tensor(x.shape, dtype)
    return OpCost(5.0 * x.numel, x.nbytes, out.nbytes, "reduction", x.dtype)


@register_cost("aten::_softmax_backward_data", "aten::_log_softmax_backward_data", kind="reduction")
def softmax_backward(a: OpArgs) -> OpCost | None:
    """``_softmax_backward_data(grad_output, output, dim, input_dtype) -> grad_input``.

    ``y·(g − Σ g·y)`` (log-softmax: ``g − exp(y)·Σ g``): 4 FLOPs per element. Reads
    grad_output and output; writes grad_input at ``input_dtype``.
    """
    g, y = a.tensor(0), a.tensor(1)
    if g is None or y is None:
        return None
    out = a.tensor(4) or Tensor(g.shape, a.scalar_type(3) or g.dtype)
    return OpCost(4.0 * g.numel, total_bytes([g, y]), out.nbytes, "reduction", g.dtype)


# --- pooling ---------------------------------------------------------------------------------


def pool_out_spatial(
    in_spatial: tuple[int, ...], kernel: list[int], stride: list[int], padding: list[int],
    dilation: list[int], ceil_mode: bool,
) -> tuple[int, ...]:
    """Output size of a max/avg pool (``pooling_output_shape`` in ATen's Pool.h)."""
    n = len(in_spatial)

    def ex(v: list[int], default: list[int]) -> list[int]:
        v = v or default
        return v * n if len(v) == 1 else v

    kernel = ex(kernel, [1])
    stride, padding, dilation = ex(stride, kernel), ex(padding, [0]), ex(dilation, [1])
    out = []
    for i in range(n):
        span = in_spatial[i] + 2 * padding[i] - dilation[i] * (kernel[i] - 1) - 1
        size = (span + (stride[i] - 1 if ceil_mode else 0)) // stride[i] + 1
        if ceil_mode and (size - 1) * stride[i] >= in_spatial[i] + padding[i]:
            size -= 1
        out.append(size)
    return tuple(out)


@dataclass(frozen=True)
class PoolLayout:
    """Positions of a pool op's arguments and what it computes."""

    kernel: int = 1
    stride: int = 2
    padding: int = 3
    dilation: int | None = 4
    ceil_mode: int = 5
    max: bool = True  # max (compare) or average (add)
    indices: bool = False


def _spatial_dims(op: str, x: Tensor) -> int:
    """1, 2 or 3 from the op name (``max_pool2d`` → 2); else all dims after ``[b, c]``."""
    m = re.search(r"pool(\d)d", op)
    return int(m.group(1)) if m else max(1, x.ndim - 2)


def _pool_out(a: OpArgs, x: Tensor, lay: PoolLayout) -> tuple[tuple[int, ...], int] | None:
    kernel = a.int_list(lay.kernel)
    if not kernel:
        return None
    n_sp = _spatial_dims(a.op, x)
    if n_sp > x.ndim or len(kernel) not in (1, n_sp):
        return None
    stride = a.int_list(lay.stride, [])
    padding = a.int_list(lay.padding, [0])
    dilation = a.int_list(lay.dilation, [1]) if lay.dilation is not None else [1]
    ceil = bool(a.flag(lay.ceil_mode, False))
    if stride is None or padding is None or dilation is None:
        return None
    out_sp = pool_out_spatial(x.shape[-n_sp:], kernel, stride, padding, dilation, ceil)
    window = math.prod(kernel * n_sp if len(kernel) == 1 else kernel)
    return x.shape[:-n_sp] + out_sp, window


def _register_pool(lay: PoolLayout, *names: str) -> None:
    def formula(a: OpArgs) -> OpCost | None:
        x = a.tensor(0)
        if x is None:
            return None
        res = _pool_out(a, x, lay)
        if res is None:
            return None
        out_shape, window = res
        out = Tensor(out_shape, x.dtype)
        flops = out.numel * (window if lay.max else window + 1)
        written = [out, Tensor(out_shape, "int64") if lay.indices else None]
        return OpCost(float(flops), x.nbytes, total_bytes(written), "reduction", x.dtype)

    formula.__doc__ = (
        f"Pooling {', '.join(names)}: input [b, c, *spatial]; output size from kernel/stride/"
        f"padding/dilation/ceil_mode; {'window compares' if lay.max else 'window adds + divide'}"
        " per output element."
    )
    formula.__qualname__ = formula.__name__ = names[0].split("::")[-1]
    formula.layout = lay  # type: ignore[attr-defined]
    register_cost(*names, kind="reduction")(formula)


_register_pool(PoolLayout(indices=True), "aten::max_pool2d_with_indices",
               "aten::max_pool3d_with_indices")
_register_pool(PoolLayout(), "aten::max_pool1d", "aten::max_pool2d", "aten::max_pool3d",
               "aten::mkldnn_max_pool2d", "aten::quantized_max_pool2d")
# avg_pool2d(self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
_register_pool(PoolLayout(dilation=None, ceil_mode=4, max=False), "aten::avg_pool1d",
               "aten::avg_pool2d", "aten::avg_pool3d")


@register_cost("aten::adaptive_avg_pool1d", "aten::adaptive_avg_pool2d", "aten::_adaptive_avg_pool2d",
               "aten::adaptive_avg_pool3d", "aten::_adaptive_avg_pool3d", "aten::adaptive_max_pool2d",
               "aten::adaptive_max_pool3d", kind="reduction")
def adaptive_pool(a: OpArgs) -> OpCost | None:
    """``adaptive_avg_pool2d(self [b, c, h, w], output_size [oh, ow]) -> [b, c, oh, ow]``.

    Each input element is added once (windows overlap only when the sizes do not divide;
    ignored): ``numel(x)`` FLOPs + one divide per output element. Max pools also return
    int64 indices.
    """
    x = a.tensor(0)
    size = a.int_list(1)
    if x is None or not size or len(size) > x.ndim:
        return None
    lead = x.shape[: x.ndim - len(size)]
    sizes = [x.shape[len(lead) + i] if s is None or s < 0 else s for i, s in enumerate(size)]
    out = Tensor(lead + tuple(sizes), x.dtype)
    written = [out, Tensor(out.shape, "int64") if "max" in a.op else None]
    return OpCost(float(x.numel + out.numel), x.nbytes, total_bytes(written), "reduction", x.dtype)


@register_cost("aten::max_pool2d_with_indices_backward", "aten::max_pool3d_with_indices_backward",
               kind="reduction")
def max_pool_backward(a: OpArgs) -> OpCost | None:
    """``max_pool2d_with_indices_backward(grad_output, self, kernel_size, stride, padding,
    dilation, ceil_mode, indices) -> grad_input [self]``.

    Scatters each gradient to its argmax: ``numel(grad_output)`` adds. Reads grad_output and
    the int64 indices; writes grad_input (zero-filled, so all of it).
    """
    g, x, idx = a.tensor(0), a.tensor(1), a.tensor(7)
    if g is None or x is None:
        return None
    out = a.tensor(8) or Tensor(x.shape, g.dtype)
    return OpCost(float(g.numel), total_bytes([g, idx]), out.nbytes, "reduction", g.dtype)


@register_cost("aten::avg_pool2d_backward", "aten::avg_pool3d_backward", kind="reduction")
def avg_pool_backward(a: OpArgs) -> OpCost | None:
    """``avg_pool2d_backward(grad_output, self, kernel_size, stride, padding, ceil_mode,
    count_include_pad, divisor_override) -> grad_input [self]``.

    Each gradient is divided once and added to ``k`` inputs: ``numel(grad_output)·(k + 1)``.
    """
    g, x = a.tensor(0), a.tensor(1)
    kernel = a.int_list(2)
    if g is None or x is None or not kernel:
        return None
    n_sp = _spatial_dims(a.op, x)
    window = math.prod(kernel * n_sp if len(kernel) == 1 else kernel)
    out = a.tensor(8) or Tensor(x.shape, g.dtype)
    return OpCost(float(g.numel * (window + 1)), g.nbytes, out.nbytes, "reduction", g.dtype)


@register_cost("aten::_adaptive_avg_pool2d_backward", "aten::_adaptive_avg_pool3d_backward",
               "aten::adaptive_max_pool2d_backward", "aten::adaptive_max_pool3d_backward",
               kind="reduction")
def adaptive_pool_backward(a: OpArgs) -> OpCost | None:
    """``_adaptive_avg_pool2d_backward(grad_output, self) -> grad_input [self]``:
    ``numel(self)`` FLOPs; reads grad_output (and max-pool indices), writes grad_input."""
    g, x = a.tensor(0), a.tensor(1)
    if g is None or x is None:
        return None
    idx = a.tensor(2) if "max" in a.op else None
    return OpCost(float(x.numel), total_bytes([g, idx]), Tensor(x.shape, g.dtype).nbytes,
                  "reduction", g.dtype)
