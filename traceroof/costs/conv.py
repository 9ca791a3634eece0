"""Convolutions (1-D/2-D/3-D, grouped, dilated, strided, transposed) and their backward.

Shape convention: input ``[b, c_in, *spatial]`` (or unbatched ``[c_in, *spatial]``), weight
``[c_out, c_in/groups, *kernel]`` (transposed: ``[c_in, c_out/groups, *kernel]``).

FLOPs (torch ``flop_counter.conv_flop_count``; multiply + add per MAC, bias not counted):

* forward: ``2 · numel(out) · prod(weight[1:])`` = 2·b·c_out·prod(out_spatial)·(c_in/g)·prod(k);
* transposed forward: ``2 · numel(input) · prod(weight[1:])`` (one MAC per *input* point);
* backward: grad_input and grad_weight each cost one forward (``output_mask`` from
  ``Concrete Inputs``; both assumed when it is not recorded). torch counts grad_weight of a
  grouped convolution ``groups`` times too high (it uses the full ``c_in``); we count what
  the kernel computes.

Bytes: input, weight and bias read once, output written once (compulsory traffic).
Output spatial size: ``floor((in + 2·pad − dil·(k−1) − 1) / stride) + 1``;
transposed ``(in − 1)·stride − 2·pad + dil·(k−1) + output_padding + 1``.
Without the recorded stride/padding (traces older than PyTorch 2.4 have no ``Concrete
Inputs``) the forward output shape is unknown and the cost is ``None``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .args import OpArgs, Tensor, total_bytes
from .registry import OpCost, register_cost


@dataclass(frozen=True)
class ConvLayout:
    """Schema positions of a convolution op's arguments (``None``: not in this schema)."""

    bias: int | None
    stride: int | None
    padding: int | None
    dilation: int | None
    groups: int | None
    transposed: int | bool | None = False  # position of a bool arg, or a fixed value
    output_padding: int | None = None
    allow_tf32: int | None = None
    kernel_size: int | None = None


def conv_out_spatial(
    in_spatial: tuple[int, ...],
    kernel: tuple[int, ...],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    transposed: bool = False,
    output_padding: list[int] | None = None,
) -> tuple[int, ...]:
    """Output spatial size of a convolution (PyTorch ``conv_output_size`` / transposed)."""
    n = len(in_spatial)
    stride, padding, dilation = (_expand(v, n) for v in (stride, padding, dilation))
    output_padding = _expand(output_padding or [0], n)
    out = []
    for i in range(n):
        if transposed:
            size = (in_spatial[i] - 1) * stride[i] - 2 * padding[i] + dilation[i] * (kernel[i] - 1) \
                + output_padding[i] + 1
        else:
            size = (in_spatial[i] + 2 * padding[i] - dilation[i] * (kernel[i] - 1) - 1) // stride[i] + 1
        if size < 0:
            raise ValueError(f"negative conv output size {size}")
        out.append(size)
    return tuple(out)


def _expand(v: list[int], n: int) -> list[int]:
    if len(v) == n:
        return v
    if len(v) == 1:
        return v * n
    raise ValueError(f"expected {n} values, got {v}")


def conv_flops(x_shape: tuple[int, ...], w_shape: tuple[int, ...], out_shape: tuple[int, ...],
               transposed: bool = False) -> int:
    """Forward FLOPs: ``2·numel(out)·prod(w[1:])``, transposed ``2·numel(x)·prod(w[1:])``.

    Equals torch ``conv_flop_count`` (which counts one MAC = 2 FLOPs per weight tap per
    output point, or per input point for a transposed convolution).
    """
    points = math.prod(x_shape) if transposed else math.prod(out_shape)
    return 2 * points * math.prod(w_shape[1:])


def _dtype_note(a: OpArgs, x: Tensor, lay: ConvLayout) -> tuple[str | None, str]:
    if x.dtype != "fp32":
        return x.dtype, ""
    if lay.allow_tf32 is not None:
        if a.flag(lay.allow_tf32) is True:
            return "tf32", "fp32 convolution with allow_tf32=True: TF32 tensor cores"
        if a.flag(lay.allow_tf32) is False:
            return "fp32", ""
    return "fp32", "fp32 convolution (cuDNN runs it as TF32 unless allow_tf32 is off)"


def _forward(a: OpArgs, lay: ConvLayout) -> OpCost | None:
    x, w = a.tensor(0), a.tensor(1)
    if x is None or w is None or w.ndim < 3 or x.ndim not in (w.ndim, w.ndim - 1):
        return None
    bias = a.tensor(lay.bias) if lay.bias is not None else None
    transposed = lay.transposed if isinstance(lay.transposed, bool) else a.flag(lay.transposed)
    if transposed is None:
        return None
    kernel = w.shape[2:]
    stride = a.int_list(lay.stride) if lay.stride is not None else None
    padding = a.int_list(lay.padding) if lay.padding is not None else [0]
    dilation = a.int_list(lay.dilation) if lay.dilation is not None else [1]
    groups = a.integer(lay.groups) if lay.groups is not None else 1
    if stride is None or padding is None or dilation is None:
        return None  # not recorded: the output shape is unknown
    if not stride:  # an empty list means "default": 1 (and kernel_size for slow_conv*)
        stride = [1]
    if not padding:
        padding = [0]
    if not dilation:
        dilation = [1]
    out_pad = a.int_list(lay.output_padding, [0]) if lay.output_padding is not None else [0]
    batched = x.ndim == w.ndim
    in_sp = x.shape[2:] if batched else x.shape[1:]
    out_sp = conv_out_spatial(in_sp, kernel, stride, padding, dilation, transposed, out_pad or [0])
    if transposed:
        if groups is None:
            return None
        c_out = w.shape[1] * groups
    else:
        c_out = w.shape[0]
    out_shape = ((x.shape[0], c_out) if batched else (c_out,)) + out_sp
    flops = conv_flops(x.shape, w.shape, out_shape, transposed)
    dtype, note = _dtype_note(a, x, lay)
    out = Tensor(out_shape, x.dtype)
    return OpCost(float(flops), total_bytes([x, w, bias]), out.nbytes, "conv", dtype, note)


def _register_forward(lay: ConvLayout, *names: str) -> None:
    def formula(a: OpArgs) -> OpCost | None:
        return _forward(a, lay)

    formula.__doc__ = (
        f"Forward convolution {', '.join(names)}: input/weight at positions 0/1, {lay}. "
        "FLOPs and bytes as in the module docstring (torch ``conv_flop_count``)."
    )
    formula.__qualname__ = formula.__name__ = "conv_" + names[0].split("::")[-1].strip("_")
    formula.layout = lay  # type: ignore[attr-defined]  # checked against torch's schemas in tests
    register_cost(*names, kind="conv")(formula)


# aten::convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
_register_forward(
    ConvLayout(bias=2, stride=3, padding=4, dilation=5, transposed=6, output_padding=7, groups=8),
    "aten::convolution", "aten::convolution_overrideable",
)
_register_forward(
    ConvLayout(bias=2, stride=3, padding=4, dilation=5, transposed=6, output_padding=7, groups=8,
               allow_tf32=12),
    "aten::_convolution",
)
_register_forward(
    ConvLayout(bias=2, stride=3, padding=4, dilation=5, groups=6),
    "aten::conv1d", "aten::conv2d", "aten::conv3d",
    "aten::cudnn_convolution_relu", "aten::miopen_convolution_relu",
)
_register_forward(
    ConvLayout(bias=2, stride=3, padding=4, output_padding=5, groups=6, dilation=7, transposed=True),
    "aten::conv_transpose1d", "aten::conv_transpose2d", "aten::conv_transpose3d",
)
_register_forward(
    ConvLayout(bias=None, padding=2, stride=3, dilation=4, groups=5, allow_tf32=8),
    "aten::cudnn_convolution",
)
_register_forward(
    ConvLayout(bias=None, padding=2, output_padding=3, stride=4, dilation=5, groups=6,
               allow_tf32=9, transposed=True),
    "aten::cudnn_convolution_transpose",
)
_register_forward(
    ConvLayout(bias=2, padding=3, stride=4, dilation=5, groups=6),
    "aten::miopen_convolution", "aten::miopen_depthwise_convolution", "aten::mkldnn_convolution",
)
_register_forward(
    ConvLayout(bias=2, padding=3, output_padding=4, stride=5, dilation=6, groups=7, transposed=True),
    "aten::miopen_convolution_transpose",
)
_register_forward(
    ConvLayout(kernel_size=2, bias=3, stride=4, padding=5, dilation=None, groups=None),
    "aten::_slow_conv2d_forward", "aten::thnn_conv2d", "aten::slow_conv3d_forward",
)
_register_forward(
    ConvLayout(kernel_size=2, bias=3, stride=4, padding=5, dilation=6, groups=None),
    "aten::slow_conv_dilated2d", "aten::slow_conv_dilated3d", "aten::_conv_depthwise2d",
)
_register_forward(
    ConvLayout(kernel_size=2, bias=3, stride=4, padding=5, output_padding=6, dilation=7,
               groups=None, transposed=True),
    "aten::slow_conv_transpose2d", "aten::slow_conv_transpose3d",
)


def conv_backward_cost(
    grad_out: Tensor, x: Tensor, w: Tensor, transposed: bool, output_mask: list[bool]
) -> tuple[int, float | None, float | None]:
    """``(flops, bytes_read, bytes_written)`` of a convolution backward.

    grad_input (``output_mask[0]``) and grad_weight (``output_mask[1]``) each cost one
    forward: ``2·numel(grad_out)·prod(w[1:])`` (``2·numel(x)·prod(w[1:])`` when transposed).
    Reads grad_out, plus the weight for grad_input and the input for grad_weight; writes
    grad_input ``[x]``, grad_weight ``[w]`` and grad_bias ``[c_out]`` as masked.
    """
    fwd = conv_flops(x.shape, w.shape, grad_out.shape, transposed)
    gi, gw, gb = (list(output_mask) + [False, False, False])[:3]
    flops = fwd * (int(bool(gi)) + int(bool(gw)))
    reads = [grad_out, w if gi else None, x if gw else None]
    c_out = grad_out.shape[1] if grad_out.ndim == w.ndim else grad_out.shape[0]
    writes = [x if gi else None, w if gw else None, Tensor((c_out,), grad_out.dtype) if gb else None]
    return flops, total_bytes(reads), total_bytes(writes)


@register_cost("aten::convolution_backward", "aten::convolution_backward_overrideable", kind="conv")
def convolution_backward(a: OpArgs) -> OpCost | None:
    """``convolution_backward(grad_output [b, c_out, *out], input [b, c_in, *in], weight,
    bias_sizes, stride, padding, dilation, transposed, output_padding, groups, output_mask)``.

    ``..._overrideable`` has no ``bias_sizes`` (every later position is one less).
    FLOPs: one forward per requested gradient of input/weight (see :func:`conv_backward_cost`);
    equals torch ``conv_backward_flop`` for ``groups == 1``.
    """
    shift = -1 if a.op.endswith("_overrideable") else 0
    g, x, w = a.tensor(0), a.tensor(1), a.tensor(2)
    if g is None or x is None or w is None or w.ndim < 3:
        return None
    transposed = a.flag(7 + shift, False)
    mask = a.bool_list(10 + shift)
    note = ""
    if mask is None:
        mask = [True, True, False]
        note = "output_mask not recorded: grad_input and grad_weight assumed"
    flops, br, bw = conv_backward_cost(g, x, w, bool(transposed), mask)
    dtype = x.dtype
    if dtype == "fp32":
        note = "; ".join(s for s in (note, "fp32 convolution (TF32 if cuDNN allow_tf32)") if s)
    return OpCost(float(flops), br, bw, "conv", dtype, note)
