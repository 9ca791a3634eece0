"""traceroof.costs against torch itself (CPU): FLOPs from torch's own FlopCounterMode, and
argument positions from torch's own op schemas.

Each case runs real torch ops on small random tensors twice: once under
``torch.utils.flop_counter.FlopCounterMode`` (the oracle) and once under
``torch.profiler`` with ``record_shapes=True``, exported as a Kineto trace. Our formulas are
then applied to the ``Input Dims`` / ``Input type`` / ``Concrete Inputs`` the profiler
recorded, so the test covers what a real trace carries, not hand-typed shapes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional
from torch.profiler import ProfilerActivity, profile  # noqa: E402
from torch.utils import flop_counter  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from traceroof.costs import cost_of, dtype_of, formula_for  # noqa: E402
from traceroof.costs.args import dtype_of_scalar_type  # noqa: E402

torch.manual_seed(0)


def _recorded_ops(fn: Callable[[], object], tmp_path: Path) -> list[dict]:
    """Run ``fn`` under the profiler and return the recorded cpu_op events (Kineto JSON)."""
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        fn()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    return [e for e in events if e.get("cat") == "cpu_op"]


def _torch_counts(fn: Callable[[], object]) -> dict[str, int]:
    with FlopCounterMode(display=False) as fc:
        fn()
    return {str(k).replace("aten.", "aten::"): int(v) for k, v in fc.get_flop_counts()["Global"].items()}


def _ours(events: list[dict], name: str) -> list[float]:
    out = []
    for e in events:
        if e["name"] != name:
            continue
        a = e["args"]
        c = cost_of(name, a.get("Input Dims"), a.get("Input type"), a.get("Concrete Inputs"))
        assert c is not None, f"no cost for {name} {a.get('Input Dims')} {a.get('Concrete Inputs')}"
        assert c.flops is not None and c.bytes is not None
        out.append(c.flops)
    assert out, f"the profiler recorded no {name}"
    return out


def r(*shape: int, grad: bool = False) -> torch.Tensor:
    return torch.randn(*shape, requires_grad=grad)


# (id, callable, the ops whose recorded calls must sum to torch's count for the op torch counts)
MATMUL_CASES = [
    ("mm", lambda: torch.mm(r(4, 5), r(5, 6)), ["aten::mm"]),
    ("bmm", lambda: torch.bmm(r(3, 4, 5), r(3, 5, 7)), ["aten::bmm"]),
    ("addmm", lambda: torch.addmm(r(6), r(4, 5), r(5, 6)), ["aten::addmm"]),
    ("addmm_2d_bias", lambda: torch.addmm(r(4, 6), r(4, 5), r(5, 6), beta=0.5, alpha=2.0), ["aten::addmm"]),
    ("baddbmm", lambda: torch.baddbmm(r(3, 4, 7), r(3, 4, 5), r(3, 5, 7)), ["aten::baddbmm"]),
    ("matmul_3d_2d", lambda: torch.matmul(r(2, 3, 5), r(5, 4)), ["aten::mm", "aten::matmul"]),
    ("matmul_4d_3d", lambda: torch.matmul(r(2, 3, 4, 5), r(3, 5, 6)), ["aten::bmm", "aten::matmul"]),
    ("matmul_1d_2d", lambda: torch.matmul(r(5), r(5, 6)), ["aten::matmul"]),
    ("linear_bias", lambda: F.linear(r(2, 3, 8), r(16, 8), r(16)), ["aten::addmm", "aten::linear"]),
    ("linear_nobias", lambda: F.linear(r(2, 3, 8), r(16, 8)), ["aten::linear"]),
]


@pytest.mark.parametrize("fn,names", [c[1:] for c in MATMUL_CASES], ids=[c[0] for c in MATMUL_CASES])
def test_matmul_flops_equal_flop_counter(fn, names, tmp_path):
    counts = _torch_counts(fn)
    total = sum(counts.values())
    assert total > 0
    events = _recorded_ops(fn, tmp_path)
    for name in names:
        ours = _ours(events, name)
        # composites (matmul, linear) are one call covering everything torch counted
        assert sum(ours) == total, (name, ours, counts)


CONV_CASES = [
    ("conv1d_stride_pad_dil", lambda: F.conv1d(r(2, 4, 17), r(6, 4, 3), r(6), stride=2, padding=1, dilation=2)),
    ("conv2d_groups", lambda: F.conv2d(r(2, 4, 9, 11), r(6, 2, 3, 3), stride=2, padding=1, groups=2)),
    ("conv2d_depthwise", lambda: F.conv2d(r(1, 8, 10, 10), r(8, 1, 5, 5), r(8), padding=2, groups=8)),
    ("conv2d_rect", lambda: F.conv2d(r(3, 3, 16, 12), r(5, 3, 4, 2), stride=(3, 2), padding=(0, 1))),
    ("conv3d", lambda: F.conv3d(r(1, 2, 5, 6, 7), r(4, 2, 3, 3, 3), stride=(1, 2, 1), padding=1)),
    ("conv_transpose1d", lambda: F.conv_transpose1d(r(2, 4, 7), r(4, 3, 3), stride=2, output_padding=1)),
    ("conv_transpose2d_groups", lambda: F.conv_transpose2d(r(1, 4, 5, 6), r(4, 3, 3, 3), r(6), stride=2,
                                                            padding=1, output_padding=1, groups=2)),
    ("conv_transpose3d", lambda: F.conv_transpose3d(r(1, 2, 3, 4, 5), r(2, 3, 2, 2, 2), stride=2)),
]


@pytest.mark.parametrize("fn", [c[1] for c in CONV_CASES], ids=[c[0] for c in CONV_CASES])
def test_conv_forward_flops_equal_flop_counter(fn, tmp_path):
    counts = _torch_counts(fn)
    assert set(counts) == {"aten::convolution"}
    events = _recorded_ops(fn, tmp_path)
    # every layer of the dispatch the profiler recorded gives torch's number
    names = {e["name"] for e in events if formula_for(e["name"]) is not None
             and ("conv" in e["name"])}
    assert "aten::convolution" in names and "aten::_convolution" in names
    for name in names:
        assert _ours(events, name) == [counts["aten::convolution"]], name


def test_conv_output_bytes_match_the_real_output(tmp_path):
    x, w = r(2, 3, 15, 15), r(5, 3, 3, 3)
    y = F.conv2d(x, w, stride=2, padding=1, dilation=2)
    events = _recorded_ops(lambda: F.conv2d(x, w, stride=2, padding=1, dilation=2), tmp_path)
    e = next(e for e in events if e["name"] == "aten::convolution")
    c = cost_of(e["name"], e["args"]["Input Dims"], e["args"]["Input type"], e["args"]["Concrete Inputs"])
    assert c.bytes_written == y.numel() * 4  # the derived output shape is torch's
    assert c.bytes_read == (x.numel() + w.numel()) * 4


CONV_BACKWARD_CASES = [
    ("conv2d_all_grads", lambda: F.conv2d(r(2, 4, 9, 9, grad=True), r(6, 4, 3, 3, grad=True), r(6, grad=True),
                                          stride=2, padding=1).sum().backward()),
    ("conv2d_weight_grad_only", lambda: F.conv2d(r(2, 4, 9, 9), r(6, 4, 3, 3, grad=True), stride=1,
                                                 padding=1).sum().backward()),
    ("conv1d_dilated", lambda: F.conv1d(r(3, 2, 20, grad=True), r(4, 2, 5, grad=True), dilation=3)
     .sum().backward()),
    ("conv_transpose2d", lambda: F.conv_transpose2d(r(1, 4, 5, 5, grad=True), r(4, 3, 3, 3, grad=True),
                                                    stride=2, output_padding=1).sum().backward()),
]


@pytest.mark.parametrize("fn", [c[1] for c in CONV_BACKWARD_CASES], ids=[c[0] for c in CONV_BACKWARD_CASES])
def test_conv_backward_flops_equal_flop_counter(fn, tmp_path):
    counts = _torch_counts(fn)
    events = _recorded_ops(fn, tmp_path)
    assert _ours(events, "aten::convolution_backward") == [counts["aten::convolution_backward"]]
    assert _ours(events, "aten::convolution") == [counts["aten::convolution"]]


def test_grouped_conv_backward_counts_each_gradient_as_one_forward(tmp_path):
    """torch counts grad_weight of a grouped conv with the full c_in (groups× too much);
    we count what the kernel does: grad_input + grad_weight = 2 forwards."""

    def fn():
        F.conv2d(r(2, 4, 9, 9, grad=True), r(6, 2, 3, 3, grad=True), stride=2, padding=1,
                 groups=2).sum().backward()

    counts = _torch_counts(fn)
    events = _recorded_ops(fn, tmp_path)
    fwd = counts["aten::convolution"]
    assert fwd == 10800  # 2·(2·6·5·5)·(2·3·3)
    assert _ours(events, "aten::convolution_backward") == [2 * fwd]


def test_scaled_dot_product_attention_on_cpu(tmp_path):
    """BC-24: on CPU SDPA runs ``_scaled_dot_product_flash_attention_for_cpu``; we cost it and
    the SDPA op around it as 4·b·h·s²·d (torch's ``sdpa_flop_count`` for the same shapes)."""
    q, k, v = r(1, 12, 64, 64), r(1, 12, 64, 64), r(1, 12, 64, 64)
    events = _recorded_ops(lambda: F.scaled_dot_product_attention(q, k, v), tmp_path)
    expected = flop_counter.sdpa_flop_count(q.shape, k.shape, v.shape)
    assert expected == 12_582_912  # 4·1·12·64²·64
    assert _ours(events, "aten::scaled_dot_product_attention") == [expected]
    assert _ours(events, "aten::_scaled_dot_product_flash_attention_for_cpu") == [expected]


def test_sdpa_causal_on_cpu_counts_the_lower_triangle(tmp_path):
    q = r(2, 4, 32, 16)
    events = _recorded_ops(lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True), tmp_path)
    # 4·b·h·d · s(s+1)/2 = 4·2·4·16·528
    assert _ours(events, "aten::_scaled_dot_product_flash_attention_for_cpu") == [4 * 2 * 4 * 16 * 528]


@pytest.mark.parametrize(
    "q,k,v",
    [
        ((2, 8, 128, 64), (2, 8, 256, 64), (2, 8, 256, 64)),
        ((1, 32, 100, 128), (1, 8, 300, 128), (1, 8, 300, 96)),  # GQA, d_v != d
    ],
)
def test_attention_formulas_equal_torch_sdpa_formulas(q, k, v):
    """The [b, h, s, d] ops against torch's ``sdpa_flop_count``/``sdpa_backward_flop_count``."""
    fwd = flop_counter.sdpa_flop_count(q, k, v)
    bwd = flop_counter.sdpa_backward_flop_count(q[:3] + (v[3],), q, k, v)
    bf = "c10::BFloat16"
    c = cost_of("aten::_scaled_dot_product_efficient_attention", [list(q), list(k), list(v), [], [], [], []],
                [bf] * 3 + ["", "Scalar", "Scalar", "Scalar"], ["", "", "", "", "True", "0.", "False"])
    assert c.flops == fwd
    go = list(q[:3]) + [v[3]]
    lse = list(q[:3])
    c = cost_of("aten::_scaled_dot_product_flash_attention_backward",
                [go, list(q), list(k), list(v), go, lse] + [[]] * 9,
                [bf] * 5 + ["float"] + [""] * 9, None)
    assert c.flops == bwd
    assert bwd / fwd == pytest.approx((3 * q[3] + 2 * v[3]) / (q[3] + v[3]))

    # the dense [b, s, h, d] flash op, read with the layout real traces show (see
    # test_costs.py::test_flash_attention_records_are_b_s_h_d)
    dims = [[q[0], q[2], q[1], q[3]], [k[0], k[2], k[1], k[3]], [v[0], v[2], v[1], v[3]]]
    c = cost_of("aten::_flash_attention_forward", dims + [[]] * 8, [bf] * 3 + [""] * 8,
                ["", "", "", "", "", str(q[2]), str(k[2]), "0.", "False", "False", ""])
    assert c.flops == fwd


def test_varlen_flash_attention_equals_torch_formula():
    """Variable-length flash attention ([total, h, d] + cum_seq offsets) against torch's
    ``_flash_attention_forward_flop``/``_backward_flop`` with real offsets of equal lengths
    (the trace does not record the offsets' values; equal lengths is what we assume)."""
    b, h_q, h_kv, d, s_q, s_k = 3, 8, 2, 64, 100, 200
    q = torch.empty(b * s_q, h_q, d)
    k = v = torch.empty(b * s_k, h_kv, d)
    cq, ck = torch.arange(0, b * s_q + 1, s_q), torch.arange(0, b * s_k + 1, s_k)
    fwd = flop_counter._flash_attention_forward_flop(q, k, v, cq, ck, s_q, s_k)
    bwd = flop_counter._flash_attention_backward_flop(q, q, k, v, q, None, cq, ck, s_q, s_k)
    assert fwd == b * 4 * h_q * s_q * s_k * d
    bf = "c10::BFloat16"
    dims = [list(q.shape), list(k.shape), list(v.shape), [b + 1], [b + 1]]
    types = [bf] * 3 + ["int", "int", "Scalar", "Scalar", "Scalar", "Scalar"]
    conc = ["", "", "", "", "", str(s_q), str(s_k), "0.", "False"]
    c = cost_of("aten::_flash_attention_forward", dims + [[]] * 4, types, conc)
    assert c.flops == fwd and "varlen" in c.note
    dims = [list(q.shape)] + dims[:3] + [list(q.shape), [h_q, b * s_q], [b + 1], [b + 1]]
    types = [bf] * 5 + ["float", "int", "int", "Scalar", "Scalar", "Scalar", "Scalar"]
    conc = [""] * 8 + [str(s_q), str(s_k), "0.", "False"]
    c = cost_of("aten::_flash_attention_backward", dims + [[], [], [], [], []], types, conc)
    assert c.flops == bwd == 2.5 * fwd


def test_scalar_type_codes_match_torch(tmp_path):
    """``dtype=`` arguments are recorded as c10::ScalarType codes; the tensors' ``Input type``
    as C++ names. Both must map to the same dtype name for every torch dtype."""
    dtypes = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
              torch.float32, torch.float64, torch.bool, torch.bfloat16, torch.float8_e5m2,
              torch.float8_e4m3fn, torch.float8_e5m2fnuz, torch.float8_e4m3fnuz,
              torch.complex64, torch.complex128]

    def fn():
        for d in dtypes:
            torch.zeros(3, dtype=d)

    events = _recorded_ops(fn, tmp_path)
    empties = [e for e in events if e["name"] == "aten::empty"]
    zeros = [e for e in events if e["name"] == "aten::zero_"]
    assert len(empties) == len(zeros) == len(dtypes)
    for d, e, z in zip(dtypes, empties, zeros):
        from_code = dtype_of_scalar_type(e["args"]["Concrete Inputs"][1])
        from_type = dtype_of(z["args"]["Input type"][0])
        assert from_code is not None and from_code == from_type, (d, from_code, from_type)
        c = cost_of("aten::zero_", z["args"]["Input Dims"], z["args"]["Input type"])
        assert c.bytes_written == 3 * torch.empty(0, dtype=d).element_size()
        assert c.bytes_read == 0 and c.flops == 0


def test_casts_read_and_write_at_each_sides_width(tmp_path):
    x = r(4, 8)

    def fn():
        x.to(torch.bfloat16)
        x.to(torch.float64)

    events = _recorded_ops(fn, tmp_path)
    for name in ("aten::to", "aten::_to_copy", "aten::copy_"):
        costs = [cost_of(name, e["args"]["Input Dims"], e["args"]["Input type"], e["args"]["Concrete Inputs"])
                 for e in events if e["name"] == name]
        assert [(c.bytes_read, c.bytes_written, c.flops) for c in costs] == [(128, 64, 0), (128, 256, 0)], name


def test_reductions_and_softmax_output_shapes(tmp_path):
    x = r(4, 6, 8)

    def fn():
        x.sum(dim=(0, 2))
        x.mean(dim=-1, keepdim=True)
        x.amax(dim=1)
        torch.softmax(x, dim=-1)
        torch.arange(3, 50, 4)

    events = _recorded_ops(fn, tmp_path)

    def cost(name):
        e = next(e for e in events if e["name"] == name)
        return cost_of(name, e["args"]["Input Dims"], e["args"]["Input type"], e["args"]["Concrete Inputs"])

    assert cost("aten::sum").bytes_written == 6 * 4
    assert cost("aten::mean").bytes_written == 4 * 6 * 4
    assert cost("aten::amax").bytes_written == 4 * 8 * 4
    assert (cost("aten::_softmax").flops, cost("aten::_softmax").bytes_written) == (5 * 192, 192 * 4)
    assert cost("aten::arange").bytes_written == torch.arange(3, 50, 4).numel() * 8 == 12 * 8


def test_pooling_output_shapes_match_torch(tmp_path):
    x = r(2, 3, 15, 16)
    y, _ = F.max_pool2d(x, 3, 2, 1, ceil_mode=True, return_indices=True)
    z = F.avg_pool2d(x, (2, 3), stride=(2, 2))
    events = _recorded_ops(lambda: (F.max_pool2d(x, 3, 2, 1, ceil_mode=True, return_indices=True),
                                    F.avg_pool2d(x, (2, 3), stride=(2, 2))), tmp_path)
    e = next(e for e in events if e["name"] == "aten::max_pool2d_with_indices")
    c = cost_of(e["name"], e["args"]["Input Dims"], e["args"]["Input type"], e["args"]["Concrete Inputs"])
    assert c.bytes_written == y.numel() * (4 + 8) and c.flops == y.numel() * 9
    e = next(e for e in events if e["name"] == "aten::avg_pool2d")
    c = cost_of(e["name"], e["args"]["Input Dims"], e["args"]["Input type"], e["args"]["Concrete Inputs"])
    assert c.bytes_written == z.numel() * 4 and c.flops == z.numel() * 7


# --- argument positions against torch's schemas ------------------------------------------------


def _schema_args(op: str) -> list[str]:
    packet = getattr(torch.ops.aten, op.split("::")[1])
    overload = "default" if "default" in packet.overloads() else packet.overloads()[0]
    return [a.name for a in getattr(packet, overload)._schema.arguments]


CONV_FIELDS = {"bias": ("bias",), "stride": ("stride",), "padding": ("padding",),
               "dilation": ("dilation",), "groups": ("groups",), "transposed": ("transposed",),
               "output_padding": ("output_padding",), "allow_tf32": ("allow_tf32",),
               "kernel_size": ("kernel_size",)}


@pytest.mark.parametrize("op", [
    "aten::convolution", "aten::_convolution", "aten::conv1d", "aten::conv2d", "aten::conv3d",
    "aten::conv_transpose1d", "aten::conv_transpose2d", "aten::conv_transpose3d", "aten::cudnn_convolution",
    "aten::cudnn_convolution_transpose", "aten::miopen_convolution", "aten::miopen_depthwise_convolution",
    "aten::miopen_convolution_transpose", "aten::mkldnn_convolution", "aten::_slow_conv2d_forward",
    "aten::slow_conv_dilated2d", "aten::slow_conv_transpose2d", "aten::cudnn_convolution_relu",
    "aten::convolution_overrideable", "aten::_conv_depthwise2d", "aten::slow_conv3d_forward",
])
def test_conv_layouts_match_torch_schemas(op):
    names = _schema_args(op)
    lay = formula_for(op).layout
    for field, schema_names in CONV_FIELDS.items():
        pos = getattr(lay, field)
        if isinstance(pos, bool) or pos is None:
            assert not any(n in names for n in schema_names) or field in ("transposed", "groups",
                                                                           "dilation", "bias"), (op, field)
            continue
        assert names[pos] in schema_names, (op, field, pos, names)


ATTN_FIELDS = {"q": ("query",), "k": ("key",), "v": ("value",), "grad_out": ("grad_out", "grad_out_"),
               "out": ("out",), "lse": ("logsumexp",), "mask": ("attn_mask", "attn_bias", "bias"),
               "is_causal": ("is_causal",), "mask_type": ("custom_mask_type",),
               "cum_q": ("cum_seq_q", "cu_seqlens_q"), "cum_k": ("cum_seq_k", "cu_seqlens_k"),
               "window_left": ("window_size_left",), "window_right": ("window_size_right",),
               "window": ("window_size",), "lse_out": ("compute_log_sumexp",), "enable_gqa": ("enable_gqa",)}


@pytest.mark.parametrize("op", [
    "aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention",
    "aten::_scaled_dot_product_flash_attention_backward", "aten::_flash_attention_forward",
    "aten::_flash_attention_backward", "aten::_scaled_dot_product_efficient_attention",
    "aten::_scaled_dot_product_efficient_attention_backward", "aten::_efficient_attention_forward",
    "aten::_efficient_attention_backward", "aten::_scaled_dot_product_cudnn_attention",
    "aten::_scaled_dot_product_cudnn_attention_backward", "aten::_cudnn_attention_forward",
    "aten::_cudnn_attention_backward", "aten::_scaled_dot_product_flash_attention_for_cpu",
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
    "aten::_scaled_dot_product_fused_attention_overrideable",
    "aten::_scaled_dot_product_fused_attention_overrideable_backward",
])
def test_attention_layouts_match_torch_schemas(op):
    names = _schema_args(op)
    lay = formula_for(op).layout
    for field, schema_names in ATTN_FIELDS.items():
        pos = getattr(lay, field)
        if pos is None or isinstance(pos, bool):
            continue
        assert names[pos] in schema_names, (op, field, pos, names)
    # every flag the schema has that changes the count is read
    for must, field in (("is_causal", "is_causal"), ("custom_mask_type", "mask_type"),
                        ("window_size_left", "window_left")):
        if must in names:
            assert getattr(lay, field) is not None, (op, must)


def test_norm_and_optimizer_positions_match_torch_schemas():
    assert _schema_args("aten::native_layer_norm_backward")[7] == "output_mask"
    assert _schema_args("aten::native_batch_norm")[5] == "training"
    assert _schema_args("aten::native_batch_norm_backward")[9] == "output_mask"
    assert _schema_args("aten::native_group_norm")[6] == "group"
    assert _schema_args("aten::native_group_norm_backward")[9] == "output_mask"
    assert _schema_args("aten::_fused_rms_norm_backward")[5] == "output_mask"
    assert _schema_args("aten::convolution_backward")[7] == "transposed"
    assert _schema_args("aten::convolution_backward")[10] == "output_mask"
    assert _schema_args("aten::_fused_adam_")[11] == "amsgrad"
    assert _schema_args("aten::_scaled_mm")[6] == "out_dtype"
    assert _schema_args("aten::_to_copy")[1] == "dtype"
    assert _schema_args("aten::embedding_dense_backward")[2] == "num_weights"


def test_layer_norm_and_rms_norm_bytes_from_a_real_record(tmp_path):
    x, w, b = r(4, 10, 32), r(32), r(32)
    events = _recorded_ops(lambda: (F.layer_norm(x, (32,), w, b), F.rms_norm(x, (32,), w)), tmp_path)
    e = next(e for e in events if e["name"] == "aten::native_layer_norm")
    c = cost_of(e["name"], e["args"]["Input Dims"], e["args"]["Input type"], e["args"]["Concrete Inputs"])
    n, rows = 4 * 10 * 32, 40
    assert c.flops == n * 8  # 6 + weight + bias
    assert c.bytes_read == (n + 64) * 4
    assert c.bytes_written == (n + 2 * rows) * 4  # y, mean, rstd
    assert math.isclose(c.bytes, (2 * n + 64 + 80) * 4)


def test_every_registered_aten_name_is_a_real_torch_op():
    from traceroof.costs import registered_ops

    missing = [n for n in registered_ops() if n.startswith("aten::") and not hasattr(torch.ops.aten, n[6:])]
    assert missing == []
