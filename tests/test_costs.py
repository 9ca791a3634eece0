"""traceroof.costs: formulas by hand arithmetic, dtype and kind mapping, the registry's
contract, and robustness to odd input. FLOPs checked against torch itself live in
test_costs_torch.py; coverage of real traces in test_costs_coverage.py.

Shapes and argument lists below are copied from real Kineto records (the TraceLens h100 /
mi300 / b200 traces) unless marked synthetic.
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from traceroof.costs import (
    OpCost,
    cost_of,
    dtype_of,
    formula_for,
    itemsize,
    kind_of_kernel,
    kind_of_op,
    register_cost,
    registered_ops,
)
from traceroof.costs.attention import _sum_clamp, attention_pairs
from traceroof.errors import DuplicateFormulaError, UsageError
from traceroof.schema import KINDS

BF = "c10::BFloat16"


# --- matmul -----------------------------------------------------------------------------------


def test_mm_hand_arithmetic():
    c = cost_of("aten::mm", [[4, 5], [5, 6]], ["float", "float"])
    assert c.flops == 240  # 2*4*6*5
    assert c.bytes_read == (4 * 5 + 5 * 6) * 4
    assert c.bytes_written == 4 * 6 * 4
    assert (c.kind, c.dtype) == ("matmul", "fp32")
    assert "TF32" in c.note


def test_addmm_from_a_real_record():
    # bert-small: aten::addmm bias [512], x [141, 512], W [512, 512], beta=1, alpha=1
    c = cost_of("aten::addmm", [[512], [141, 512], [512, 512], [], []], [BF, BF, BF, "Scalar", "Scalar"],
                ["", "", "", "1", "1"])
    assert c.flops == 2 * 141 * 512 * 512 == 73_924_608
    assert c.bytes_read == (512 + 141 * 512 + 512 * 512) * 2 == 669_696
    assert c.bytes_written == 141 * 512 * 2 == 144_384
    assert c.bytes == 814_080
    assert (c.kind, c.dtype, c.note) == ("matmul", "bf16", "")


def test_addmm_beta_zero_does_not_read_the_bias():
    c = cost_of("aten::addmm", [[64], [8, 16], [16, 64], [], []], [BF, BF, BF, "Scalar", "Scalar"],
                ["", "", "", "0", "1"])
    assert c.bytes_read == (8 * 16 + 16 * 64) * 2


def test_mm_out_variant_writes_the_out_tensor():
    # torch_compile_triton trace: aten::mm recorded with its out= buffer
    c = cost_of("aten::mm", [[32768, 2048], [2048, 2048], [32768, 2048]], [BF, BF, BF], ["", "", ""])
    assert c.flops == 2 * 32768 * 2048 * 2048
    assert c.bytes_read == (32768 * 2048 + 2048 * 2048) * 2
    assert c.bytes_written == 32768 * 2048 * 2


def test_bmm_baddbmm_and_matmul_broadcast():
    assert cost_of("aten::bmm", [[1, 32, 1], [1, 1, 559]], ["float", "float"]).flops == 2 * 32 * 559 * 1
    c = cost_of("aten::baddbmm", [[8, 16, 32], [8, 16, 4], [8, 4, 32], [], []], [BF] * 3 + ["Scalar"] * 2,
                ["", "", "", "1", "1"])
    assert c.flops == 2 * 8 * 16 * 32 * 4
    assert c.bytes_read == (8 * 16 * 32 + 8 * 16 * 4 + 8 * 4 * 32) * 2
    # [2, 1, 4, 5] @ [3, 5, 6] broadcasts the batch to [2, 3]
    c = cost_of("aten::matmul", [[2, 1, 4, 5], [3, 5, 6]], ["float", "float"])
    assert c.flops == 2 * (2 * 3) * 4 * 6 * 5
    assert c.bytes_written == 2 * 3 * 4 * 6 * 4
    # [5] @ [5, 6] -> [6]
    assert cost_of("aten::matmul", [[5], [5, 6]], ["float", "float"]).flops == 60


def test_linear_folds_leading_dims():
    c = cost_of("aten::linear", [[2, 3, 8], [16, 8], [16]], [BF, BF, BF])
    assert c.flops == 2 * 6 * 16 * 8
    assert c.bytes_read == (48 + 128 + 16) * 2
    assert c.bytes_written == 6 * 16 * 2


def test_scaled_mm_fp8_with_bf16_output():
    # synthetic: _scaled_mm(a fp8 [16, 32], b fp8 [32, 64], scale_a, scale_b, None, None, bf16)
    fp8 = "c10::Float8_e4m3fn"
    c = cost_of("aten::_scaled_mm", [[16, 32], [32, 64], [], [], [], [], [], []],
                [fp8, fp8, "float", "float", "", "", "Scalar", "Scalar"],
                ["", "", "", "", "", "", "15", "False"])
    assert c.flops == 2 * 16 * 64 * 32 == 65_536
    assert c.dtype == "fp8"
    assert c.bytes_read == 16 * 32 + 32 * 64 + 4 + 4
    assert c.bytes_written == 16 * 64 * 2  # ScalarType 15 = bf16


# --- attention ----------------------------------------------------------------------------------


def test_bc24_cpu_flash_attention_is_costed_not_zero():
    # BC-24 synthetic repro: 4·B·H·S²·D = 4·1·12·64²·64
    c = cost_of("aten::_scaled_dot_product_flash_attention_for_cpu", [[1, 12, 64, 64]] * 3, ["float"] * 3)
    assert c.flops == 12_582_912
    assert c.kind == "attention"
    # read q, k, v; write out and the fp32 logsumexp [1, 12, 64]
    assert c.bytes_read == 3 * 1 * 12 * 64 * 64 * 4
    assert c.bytes_written == (1 * 12 * 64 * 64 + 1 * 12 * 64) * 4


def test_bc24_without_input_types_counts_flops_but_not_bytes():
    c = cost_of("aten::_scaled_dot_product_flash_attention_for_cpu", [[1, 12, 64, 64]] * 3, None)
    assert c.flops == 12_582_912
    assert c.bytes is None and c.dtype is None


def test_bc24_unknown_attention_variant_is_unknown_not_zero():
    assert cost_of("aten::my_custom_attn", [[1, 12, 64, 64]] * 3, ["float"] * 3) is None
    assert kind_of_op("aten::my_custom_attn") == "attention"  # its time is still attributed


def _flash(b, s_q, s_k, h_q, h_kv, d, causal, window=("", "")):
    """A ``aten::_flash_attention_forward`` record ([b, s, h, d] layout)."""
    dims = [[b, s_q, h_q, d], [b, s_k, h_kv, d], [b, s_k, h_kv, d]] + [[]] * 12
    types = [BF] * 3 + ["", "", "Scalar", "Scalar", "Scalar", "Scalar", "Scalar", "Scalar", "", "", "", ""]
    conc = ["", "", "", "", "", str(s_q), str(s_k), "0.", str(causal), "False", "0.125", *window, "", ""]
    return dims, types, conc


def test_bc25_causal_halves_the_attention_matmuls():
    # BC-25: B=1, H=32, S=16384, D=128 on an A100 (312 TFLOP/s bf16), 10 ms
    full = cost_of("aten::_flash_attention_forward", *_flash(1, 16384, 16384, 32, 32, 128, False))
    causal = cost_of("aten::_flash_attention_forward", *_flash(1, 16384, 16384, 32, 32, 128, True))
    assert full.flops == 4 * 32 * 16384**2 * 128 == 4_398_046_511_104
    # exact unmasked pairs: S(S+1)/2 per head
    assert causal.flops == 4 * 32 * 128 * (16384 * 16385 // 2) == 2_199_157_473_280
    assert causal.flops / full.flops == pytest.approx(0.5, abs=1 / 16384)
    assert round(causal.flops / 10e-3 / 312e12, 3) == 0.705  # 70.5 % of peak, not 141 %
    assert "causal (bottom-right)" in causal.note
    assert causal.bytes == full.bytes  # the mask changes work, not traffic


def test_bc25_decode_step_bottom_right_is_not_halved():
    # q_len = 1, kv_len = 4096, causal, bottom-right (FlashAttention): the one query sees all keys
    c = cost_of("aten::_flash_attention_forward", *_flash(1, 1, 4096, 32, 32, 128, True))
    assert c.flops == 4 * 32 * 128 * 4096 == 67_108_864


def test_causal_alignment_top_left_vs_bottom_right():
    # _efficient_attention_forward: custom_mask_type 1 = top-left, 2 = bottom-right
    dims = [[1, 1, 32, 128], [1, 4096, 32, 128], [1, 4096, 32, 128]] + [[]] * 11
    types = [BF] * 3 + [""] * 3 + ["Scalar"] * 5 + [""] * 3

    def conc(mask_type):
        return ["", "", "", "", "", "", "1", "4096", "0.", str(mask_type), "True", "", "", ""]

    top_left = cost_of("aten::_efficient_attention_forward", dims, types, conc(1))
    bottom_right = cost_of("aten::_efficient_attention_forward", dims, types, conc(2))
    none = cost_of("aten::_efficient_attention_forward", dims, types, conc(0))
    assert top_left.flops == 4 * 32 * 128 * 1  # query 0 sees key 0 only
    assert bottom_right.flops == none.flops == 4 * 32 * 128 * 4096
    # torch SDPA's is_causal is top-left: s_q=3, s_k=5 -> rows see 1, 2, 3 keys
    sdpa = cost_of("aten::scaled_dot_product_attention",
                   [[2, 4, 3, 16], [2, 4, 5, 16], [2, 4, 5, 16], [], [], [], [], []],
                   ["float"] * 3 + ["", "Scalar", "Scalar", "", "Scalar"], ["", "", "", "", "0.", "True", "", "False"])
    assert sdpa.flops == 4 * 2 * 4 * 16 * (1 + 2 + 3)


def test_gqa_counts_query_heads_and_reads_the_smaller_kv():
    c = cost_of("aten::_flash_attention_forward", *_flash(1, 2048, 2048, 32, 8, 128, False))
    assert c.flops == 4 * 32 * 2048**2 * 128 == 68_719_476_736
    q = 2048 * 32 * 128 * 2
    kv = 2048 * 8 * 128 * 2
    assert c.bytes_read == q + 2 * kv == 25_165_824
    assert c.bytes_written == q + 32 * 2048 * 4  # out + fp32 logsumexp
    assert "GQA" in c.note


def test_sliding_window():
    # causal, window_size_left=2 over 5 tokens: rows see 1, 2, 3, 3, 3 keys
    c = cost_of("aten::_flash_attention_forward", *_flash(1, 5, 5, 1, 1, 8, True, ("2", "0")))
    assert c.flops == 4 * 8 * 12


def test_flash_backward_is_two_and_a_half_forwards():
    # bert-small shapes: [1, 141, 8, 64]; backward recomputes QKᵀ: 5 matmuls vs 2
    fwd = cost_of("aten::_flash_attention_forward", *_flash(1, 141, 141, 8, 8, 64, False))
    assert fwd.flops == 4 * 8 * 141**2 * 64 == 40_716_288
    t = [1, 141, 8, 64]
    bwd = cost_of("aten::_flash_attention_backward",
                  [t, t, t, t, t, [1, 8, 141]] + [[]] * 11,
                  [BF] * 5 + ["float"] + ["", "", "Scalar", "Scalar", "Scalar", "Scalar", "", "", "Scalar", "", ""],
                  [""] * 8 + ["141", "141", "0.", "False", "", "", "0.125", "", ""])
    assert bwd.flops == 2.5 * fwd.flops == 101_790_720
    n = 141 * 8 * 64 * 2
    assert bwd.bytes_read == 5 * n + 8 * 141 * 4  # grad_out, q, k, v, out, lse
    assert bwd.bytes_written == 3 * n  # dq, dk, dv


def test_real_causal_flash_record():
    # Qwen1.5-0.5B: aten::_flash_attention_forward [16, 559, 16, 64], is_causal=True
    c = cost_of("aten::_flash_attention_forward", *_flash(16, 559, 559, 16, 16, 64, True))
    assert c.flops == 4 * 16 * 16 * 64 * (559 * 560 // 2) == 10_257_694_720


def test_attention_pairs_examples():
    assert attention_pairs(4, 4) == 16
    assert attention_pairs(4, 4, causal=True) == 10
    assert attention_pairs(3, 5, causal=True) == 6
    assert attention_pairs(3, 5, causal=True, bottom_right=True) == 12
    assert attention_pairs(5, 3, causal=True, bottom_right=True) == 6  # first 2 rows see nothing
    assert attention_pairs(6, 6, window_left=1, window_right=1) == 16  # a band of width 3


@settings(max_examples=300, deadline=None)
@given(
    s_q=st.integers(1, 40), s_k=st.integers(1, 40), causal=st.booleans(), bottom_right=st.booleans(),
    wl=st.one_of(st.none(), st.integers(-1, 12)), wr=st.one_of(st.none(), st.integers(-1, 12)),
)
def test_attention_pairs_equals_brute_force(s_q, s_k, causal, bottom_right, wl, wr):
    o = s_k - s_q if bottom_right else 0
    left = None if wl is None or wl < 0 else wl
    right = None if wr is None or wr < 0 else wr
    if causal:
        right = 0 if right is None else min(right, 0)
    brute = sum(
        1
        for i in range(s_q)
        for j in range(s_k)
        if (left is None or j >= i + o - left) and (right is None or j <= i + o + right)
    )
    assert attention_pairs(s_q, s_k, causal=causal, bottom_right=bottom_right,
                           window_left=wl, window_right=wr) == brute


@given(start=st.integers(-50, 50), n=st.integers(0, 60), lo=st.integers(-20, 20), span=st.integers(0, 40))
def test_sum_clamp_equals_brute_force(start, n, lo, span):
    hi = lo + span
    assert _sum_clamp(start, n, lo, hi) == sum(min(max(start + i, lo), hi) for i in range(n))


# --- convolution ---------------------------------------------------------------------------------


def test_cudnn_convolution_patch_embedding():
    # Falconsai ViT: aten::cudnn_convolution x [4, 3, 224, 224], w [768, 3, 16, 16], stride 16
    c = cost_of("aten::cudnn_convolution", [[4, 3, 224, 224], [768, 3, 16, 16], [], [], [], [], [], [], []],
                [BF, BF, "ScalarList", "ScalarList", "ScalarList", "Scalar", "Scalar", "Scalar", "Scalar"],
                ["", "", "[0, 0]", "[16, 16]", "[1, 1]", "1", "False", "False", "True"])
    # out [4, 768, 14, 14]; 2·numel(out)·(3·16·16)
    assert c.flops == 2 * 4 * 768 * 14 * 14 * 768 == 924_844_032
    assert c.bytes_read == (4 * 3 * 224 * 224 + 768 * 3 * 16 * 16) * 2 == 2_383_872
    assert c.bytes_written == 4 * 768 * 14 * 14 * 2 == 1_204_224
    assert (c.kind, c.dtype) == ("conv", "bf16")


def test_miopen_convolution_resnet_stem():
    # resnet18 on MI300: x [512, 3, 224, 224], w [64, 3, 7, 7], padding 3, stride 2 -> [512, 64, 112, 112]
    c = cost_of("aten::miopen_convolution", [[512, 3, 224, 224], [64, 3, 7, 7], [], [], [], [], [], [], []],
                [BF, BF, "", "ScalarList", "ScalarList", "ScalarList", "Scalar", "Scalar", "Scalar"],
                ["", "", "", "[3, 3]", "[2, 2]", "[1, 1]", "1", "False", "False"])
    assert c.flops == 2 * 512 * 64 * 112 * 112 * 3 * 7 * 7 == 120_846_286_848
    assert c.bytes_written == 512 * 64 * 112 * 112 * 2


RESNET_CONV_BWD = (
    [[512, 512, 7, 7], [512, 512, 7, 7], [512, 512, 3, 3], [], [], [], [], [], [], [], []],
    [BF, BF, BF, "ScalarList", "ScalarList", "ScalarList", "ScalarList", "Scalar", "ScalarList", "Scalar",
     "ScalarList"],
)


def test_convolution_backward_uses_the_recorded_output_mask():
    dims, types = RESNET_CONV_BWD
    conc = ["", "", "", "[0]", "[1, 1]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1", "[True, True, False]"]
    c = cost_of("aten::convolution_backward", dims, types, conc)
    fwd = 2 * (512 * 512 * 7 * 7) * (512 * 3 * 3)
    assert fwd == 118_380_036_096
    assert c.flops == 2 * fwd  # grad_input + grad_weight
    g = 512 * 512 * 7 * 7 * 2
    w = 512 * 512 * 3 * 3 * 2
    assert c.bytes_read == g + w + g  # grad_out, weight (for grad_input), input (for grad_weight)
    assert c.bytes_written == g + w  # grad_input, grad_weight
    only_w = cost_of("aten::convolution_backward", dims, types, conc[:-1] + ["[False, True, True]"])
    assert only_w.flops == fwd
    assert only_w.bytes_written == w + 512 * 2  # grad_weight + grad_bias [512]


def test_conv_without_concrete_inputs():
    # traces before PyTorch 2.4: no stride/padding -> forward output shape unknown -> None
    dims, types = RESNET_CONV_BWD
    assert cost_of("aten::miopen_convolution", [[1, 3, 8, 8], [4, 3, 3, 3], [], [], [], [], [], [], []],
                   ["float", "float", "", "ScalarList", "ScalarList", "ScalarList", "Scalar", "Scalar", "Scalar"],
                   None) is None
    c = cost_of("aten::convolution_backward", dims, types, None)
    assert c.flops == 2 * 118_380_036_096 and "output_mask not recorded" in c.note


def test_fp32_cudnn_convolution_with_allow_tf32_is_tf32():
    dims = [[1, 3, 8, 8], [4, 3, 3, 3], [], [], [], [], [], [], []]
    types = ["float", "float", "ScalarList", "ScalarList", "ScalarList", "Scalar", "Scalar", "Scalar", "Scalar"]
    c = cost_of("aten::cudnn_convolution", dims, types, ["", "", "[1, 1]", "[1, 1]", "[1, 1]", "1", "False",
                                                          "False", "True"])
    assert c.dtype == "tf32" and c.flops == 2 * 4 * 8 * 8 * 27
    c = cost_of("aten::cudnn_convolution", dims, types, ["", "", "[1, 1]", "[1, 1]", "[1, 1]", "1", "False",
                                                          "False", "False"])
    assert c.dtype == "fp32"


# --- norms ----------------------------------------------------------------------------------------


def test_layer_norm_from_a_real_record():
    # bert-small: native_layer_norm x [1, 141, 512] bf16, weight/bias [512]
    c = cost_of("aten::native_layer_norm", [[1, 141, 512], [], [512], [512], []],
                [BF, "ScalarList", BF, BF, "Scalar"], ["", "[512]", "", "", "9.9999999999999998e-13"])
    n = 141 * 512
    assert c.flops == n * (6 + 1 + 1)
    assert c.bytes_read == (n + 512 + 512) * 2 == 146_432
    assert c.bytes_written == n * 2 + 2 * 141 * 4 == 145_512  # y + fp32 mean, rstd
    assert c.kind == "norm"


def test_batch_norm_training_and_backward_from_real_records():
    # resnet18 stem: native_batch_norm [512, 64, 112, 112] bf16 training
    x = 512 * 64 * 112 * 112
    c = cost_of("aten::native_batch_norm", [[512, 64, 112, 112], [64], [64], [64], [64], [], [], []],
                [BF] * 5 + ["Scalar"] * 3, ["", "", "", "", "", "True", "0.1", "1e-05"])
    assert c.flops == x * (6 + 2)
    assert c.bytes_read == (x + 4 * 64) * 2
    assert c.bytes_written == x * 2 + 2 * 64 * 4 + 2 * 64 * 2  # y, saved stats, running stats
    ev = cost_of("aten::native_batch_norm", [[512, 64, 112, 112], [64], [64], [64], [64], [], [], []],
                 [BF] * 5 + ["Scalar"] * 3, ["", "", "", "", "", "False", "0.1", "1e-05"])
    assert ev.flops == x * (2 + 2) and ev.bytes_written == x * 2
    # normalization_layer_test: miopen_batch_norm_backward computes all three gradients
    c = cost_of("aten::miopen_batch_norm_backward",
                [[1, 128, 32, 32], [1, 128, 32, 32], [128], [], [], [128], [128], []],
                ["float", "float", "float", "", "", "float", "float", "Scalar"], [""] * 7 + ["1e-05"])
    n = 128 * 32 * 32
    assert c.flops == n * (10 + 2 + 1)
    assert c.bytes_read == (2 * n + 3 * 128) * 4
    assert c.bytes_written == (n + 2 * 128) * 4


def test_rms_norm_and_group_norm():
    c = cost_of("aten::_fused_rms_norm", [[8, 16, 32, 32], [], [32, 32], []],
                ["float", "ScalarList", "float", ""], ["", "[32, 32]", "", ""])
    n = 8 * 16 * 32 * 32
    assert c.flops == n * 4
    assert c.bytes_written == (n + 8 * 16) * 4  # y + rstd per row
    c = cost_of("aten::native_group_norm", [[8, 16, 32, 32], [16], [16], [], [], [], [], []],
                ["float", "float", "float", "Scalar", "Scalar", "Scalar", "Scalar", "Scalar"],
                ["", "", "", "8", "16", "1024", "4", "1e-05"])
    assert c.flops == n * 8
    assert c.bytes_written == (n + 2 * 8 * 4) * 4  # y + mean, rstd [8, 4]


# --- elementwise, memory, reductions, Triton ---------------------------------------------------------


def test_bc26_triton_pointwise_bytes():
    # BC-26 synthetic: two bf16 [4096, 4096] inputs, one output of the same shape
    c = cost_of("triton_poi_fused_add_mul_0", [[4096, 4096], [4096, 4096]], [BF, BF])
    assert c.bytes == 3 * 4096**2 * 2 == 100_663_296
    # the named ops add (1) and mul (1) over the 4096² broadcast output (tests/test_costs_triton.py)
    assert c.flops == 2 * 4096**2 == 33_554_432
    assert c.kind == "elementwise"
    assert round(c.bytes / 50e-6 / 3.35e12, 2) == 0.60  # ~2.0 TB/s of ~3.35 TB/s
    assert cost_of("triton_red_fused_add_mean_0", None, None) is None  # no shapes: unmodeled
    assert kind_of_op("triton_red_fused_add_mean_0") == "reduction"


def test_triton_launcher_record_counts_each_buffer_once():
    # torch_compile_triton trace: in/out buffers plus xnumel
    c = cost_of("triton_poi_fused__unsafe_view_add_3", [[8, 4096, 2048], [8, 4096, 2048], [32768, 2048], []],
                [BF, BF, BF, "Scalar"], ["", "", "", "67108864"])
    assert c.bytes == 3 * 67108864 * 2
    c = cost_of("triton_red_fused_add_mean_mul_pow_rsqrt_0", [[8, 4096, 2048], [2048], [8, 4096, 2048], [], []],
                [BF, BF, BF, "Scalar", "Scalar"], ["", "", "", "32768", "2048"])
    assert c.bytes == (2 * 67108864 + 2048) * 2 and c.kind == "reduction"


def test_binary_elementwise_broadcast_and_inplace():
    # Falconsai: aten::add x [4, 197, 768] + pos [1, 197, 768]
    c = cost_of("aten::add", [[4, 197, 768], [1, 197, 768], []], [BF, BF, "Scalar"], ["", "", "1"])
    assert c.flops == 4 * 197 * 768
    assert c.bytes_read == (4 + 1) * 197 * 768 * 2
    assert c.bytes_written == 4 * 197 * 768 * 2
    # alpha != 1 is a multiply-add
    assert cost_of("aten::add", [[10], [10], []], ["float", "float", "Scalar"], ["", "", "0.5"]).flops == 20
    # in place: writes self only
    c = cost_of("aten::add_", [[4, 768, 14, 14], [1, 768, 1, 1], []], [BF, BF, "Scalar"], ["", "", "1"])
    assert c.bytes_written == 4 * 768 * 14 * 14 * 2
    assert c.bytes_read == (4 * 768 * 14 * 14 + 768) * 2


def test_comparison_writes_bool_and_type_promotion():
    c = cost_of("aten::eq", [[1, 141], []], ["long int", "Scalar"], ["", "1"])
    assert (c.bytes_read, c.bytes_written, c.dtype) == (141 * 8, 141, "int64")
    # float tensor times a 0-dim double tensor stays float (Qwen trace)
    c = cost_of("aten::mul", [[1, 559, 64], []], ["float", "double"], ["", ""])
    assert c.bytes_written == 559 * 64 * 4 and c.bytes_read == 559 * 64 * 4 + 8


def test_activations_and_backward():
    n = 4 * 197 * 3072
    c = cost_of("aten::gelu", [[4, 197, 3072], []], [BF, ""], ["", ""])
    assert (c.flops, c.bytes_read, c.bytes_written) == (5 * n, 2 * n, 2 * n)
    assert cost_of("aten::silu", [[16, 559, 2816]], [BF], [""]).flops == 4 * 16 * 559 * 2816
    c = cost_of("aten::threshold_backward", [[512, 512, 7, 7], [512, 512, 7, 7], []], [BF, BF, "Scalar"],
                ["", "", "0"])
    m = 512 * 512 * 49
    assert (c.flops, c.bytes_read, c.bytes_written) == (m, 4 * m, 2 * m)


def test_casts_and_copies_count_each_side_at_its_width():
    c = cost_of("aten::copy_", [[1, 1, 559], [1, 1, 559], []], ["float", "long int", "Scalar"], ["", "", "False"])
    assert (c.flops, c.bytes_read, c.bytes_written) == (0, 559 * 8, 559 * 4)
    assert "cast int64 -> fp32" in c.note
    c = cost_of("aten::_to_copy", [[4, 8], [], [], [], [], [], []], [BF, "Scalar", "", "", "", "Scalar", ""],
                ["", "6", "", "", "", "False", ""])
    assert (c.bytes_read, c.bytes_written) == (64, 128)


def test_fill_and_zero_only_write():
    c = cost_of("aten::fill_", [[888, 3072], []], [BF, "Scalar"], ["", "0."])
    assert (c.flops, c.bytes_read, c.bytes_written) == (0, 0, 888 * 3072 * 2)
    assert cost_of("aten::zero_", [[3, 4]], [BF], [""]).bytes == 24


def test_gathers_read_only_what_they_gather():
    # bert-small: index_select(word_embeddings [30522, 512], 0, ids [141])
    c = cost_of("aten::index_select", [[30522, 512], [], [141]], [BF, "Scalar", "long int"], ["", "0", ""])
    assert c.bytes_read == 141 * 8 + 141 * 512 * 2
    assert c.bytes_written == 141 * 512 * 2
    c = cost_of("aten::embedding_dense_backward", [[4, 141, 512], [4, 141], [], [], []],
                [BF, "long int", "Scalar", "Scalar", "Scalar"], ["", "", "30522", "-1", "False"])
    assert c.flops == 4 * 141 * 512
    assert c.bytes_written == 30522 * 512 * 2


def test_reductions_softmax_and_pooling():
    c = cost_of("aten::mean", [[512, 512, 7, 7], [], [], []], [BF, "ScalarList", "Scalar", ""],
                ["", "[-1, -2]", "True", ""])
    assert (c.flops, c.bytes_written) == (512 * 512 * 49, 512 * 512 * 2)
    c = cost_of("aten::_softmax", [[8, 12, 128, 128], [], []], [BF, "Scalar", "Scalar"], ["", "-1", "True"])
    n = 8 * 12 * 128 * 128
    assert (c.flops, c.bytes_read, c.bytes_written) == (5 * n, 2 * n, 4 * n)  # half_to_float
    # resnet18: max_pool2d_with_indices 3x3 / 2, pad 1: [512, 64, 112, 112] -> [512, 64, 56, 56]
    c = cost_of("aten::max_pool2d_with_indices", [[512, 64, 112, 112], [], [], [], [], []],
                [BF, "ScalarList", "ScalarList", "ScalarList", "ScalarList", "Scalar"],
                ["", "[3, 3]", "[2, 2]", "[1, 1]", "[1, 1]", "False"])
    out = 512 * 64 * 56 * 56
    assert c.flops == out * 9
    assert c.bytes_written == out * (2 + 8)  # values + int64 indices


def test_foreach_and_fused_adam():
    lists = [[[1024, 1024], [1024]], [[1024, 1024], [1024]], []]
    c = cost_of("aten::_foreach_add_", lists, ["TensorList", "TensorList", "Scalar"], ["", "", "-0.001"])
    n = 1024 * 1024 + 1024
    assert c.flops == 2 * n  # alpha = -0.001 -> multiply-add
    assert c.bytes is None  # Kineto records no Tensor[] dtypes
    c = cost_of("aten::_foreach_add_", lists, ["TensorList", "TensorList", "Scalar"], ["", "", "-0.001"],
                tensorlist_dtype="fp32")
    assert (c.bytes_read, c.bytes_written) == (2 * n * 4, n * 4)
    adam_dims = [[[4096, 4096], [4096]]] * 6 + [[]] * 9
    adam_types = ["TensorList"] * 6 + ["Scalar"] * 7 + ["", ""]
    conc = [""] * 6 + ["0.001", "0.9", "0.999", "0.01", "1e-08", "False", "False", "", ""]
    c = cost_of("aten::_fused_adamw_", adam_dims, adam_types, conc, tensorlist_dtype="fp32")
    m = 4096 * 4096 + 4096
    assert c.flops == 14 * m
    assert (c.bytes_read, c.bytes_written) == (4 * m * 4, 3 * m * 4)  # p, g, m, v in; p, m, v out


def test_cat_needs_a_tensorlist_dtype_for_bytes():
    dims = [[[4, 1, 768], [4, 196, 768]], []]
    c = cost_of("aten::cat", dims, ["TensorList", "Scalar"], ["", "1"])
    assert c.flops == 0 and c.bytes is None
    c = cost_of("aten::cat", dims, ["TensorList", "Scalar"], ["", "1"], tensorlist_dtype="bf16")
    assert c.bytes == 2 * 4 * 197 * 768 * 2


# --- dtypes and kinds ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "torch_type,dtype,size",
    [("c10::BFloat16", "bf16", 2), ("c10::Half", "fp16", 2), ("float", "fp32", 4), ("double", "fp64", 8),
     ("c10::Float8_e4m3fn", "fp8", 1), ("c10::Float8_e5m2", "fp8", 1), ("signed char", "int8", 1),
     ("c10::qint8", "int8", 1), ("long int", "int64", 8), ("int", "int32", 4), ("bool", "bool", 1),
     ("unsigned char", "uint8", 1), ("short int", "int16", 2), ("c10::complex<float>", "complex64", 8)],
)
def test_dtype_of(torch_type, dtype, size):
    assert dtype_of(torch_type) == dtype
    assert itemsize(dtype) == size


def test_dtype_of_non_tensors_and_itemsize_of_nonsense():
    assert [dtype_of(t) for t in ("Scalar", "ScalarList", "TensorList", "", None, "c10::Mystery")] == [None] * 6
    with pytest.raises(UsageError, match="unknown dtype 'fp7'.*bf16"):
        itemsize("fp7")


REAL_KERNELS = [
    ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8>"
     "(cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8::Params)", "matmul"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_"
     "kernel__5x_cublas", "matmul"),
    ("nvjet_tst_64x64_64x16_2x1_2cta_v_bz_bias_TNT", "matmul"),
    ("Cijk_Ailk_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT32x32x128_MI16x16x1_SN_LDSB1_AFC1_AFEM1_AFEM1_ASEM1_CLR1",
     "matmul"),
    ("volta_sgemm_128x64_nt", "matmul"),
    ("void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 2, 2, false, false, "
     "cublasGemvParams<cublasGemvTensorStridedBatched<float const>, float> >(...)", "matmul"),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "collective"),
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "collective"),
    ("nccldevkernel_reducescatter_sum_bf16_ring_ll", "collective"),
    ("void (anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16, 16>(c10::BFloat16*, unsigned long)",
     "collective"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, "
     "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, at::detail::Array<char*, 3>)",
     "elementwise"),
    ("void at::native::vectorized_elementwise_kernel<4, fbgemm_gpu::_float_to_hfp8_gpu(at::Tensor const&, long, "
     "long, double)::{lambda(float)#1}, at::detail::Array<char*, 2> >(...)", "elementwise"),
    ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)"
     "::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}>(...)", "elementwise"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::NormTwoOps<float, float, "
     "float>, unsigned int, float, 4> >(at::native::ReduceOp<float, at::native::NormTwoOps<float, float, float>, "
     "unsigned int, float, 4>)", "reduction"),
    ("void (anonymous namespace)::softmax_warp_forward<float, float, float, 10, true, false>(float*, float const*, "
     "int, int, int, bool const*, int, bool)", "reduction"),
    ("void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, "
     "cutlass::bfloat16_t, pytorch_flash::Flash_kernel_traits<64, 128, 128, 4, cutlass::bfloat16_t> >, false, "
     "false, false, false, false, true, false, false>(pytorch_flash::Flash_fwd_params)", "attention"),
    ("fmhaSm100aKernel_QkvE4m3OBfloat16H64PagedKvCausalP16VarSeqQ128Kv128PersistentContext", "attention"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>(int, float, "
     "c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, c10::BFloat16*)", "norm"),
    ("std::enable_if<(((8)>(0)))&&vllm::_typeConvert<c10::BFloat16>::exists, void>::type "
     "vllm::fused_add_rms_norm_kernel<c10::BFloat16, 8>(c10::BFloat16*, long, c10::BFloat16*, "
     "c10::BFloat16 const*, float, int, int)", "norm"),
    ("MIOpenBatchNormFwdTrainSpatialMeanVariance", "norm"),
    ("sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16_stage4_"
     "warpsize2x2x1_g1_tensor16x8x8_alignc4_execute_kernel_cudnn", "conv"),
    ("void cudnn::winograd_nonfused::winogradForwardData4x4<float, float>(cudnn::winograd_nonfused::"
     "WinogradDataParams<float, float>)", "conv"),
    ("igemm_fwd_gtcx3_nhwc_bf16_bx0_ex1_bt128x64x32_wt32x32x8_ws1x1_wr1x2_ta1x16x1x1_1x2x4x32_tb1x8x1x1_1x4x1x64",
     "conv"),
    ("void cutlass__5x_cudnn::Kernel<cutlass_tensorop_bf16_s16816fprop_optimized_bf16_256x64_32x4_nhwc_align8>"
     "(cutlass_tensorop_bf16_s16816fprop_optimized_bf16_256x64_32x4_nhwc_align8::Params)", "conv"),
    ("triton_poi_fused_add_cos_sin_0", "elementwise"),
    ("triton_red_fused_add_mean_mul_pow_rsqrt_0", "reduction"),
    ("Memcpy HtoD (Host -> Device)", "memcpy"),
    ("Memset (Device)", "memset"),
    ("void moe::dev::routing::routingIndicesHistogramKernel<moe::dev::routing::routingRenormalize::KernelParams"
     "<__nv_bfloat16, __nv_bfloat16, 128, false, true> >(moe::dev::routing::routingRenormalize::KernelParams)",
     "other"),
]


@pytest.mark.parametrize("name,kind", REAL_KERNELS, ids=[k[0][:40] for k in REAL_KERNELS])
def test_kind_of_kernel_on_real_names(name, kind):
    assert kind_of_kernel(name) == kind


def test_kind_of_op():
    assert kind_of_op("aten::addmm") == "matmul"
    assert kind_of_op("aten::_efficient_attention_backward") == "attention"
    assert kind_of_op("aten::cudnn_convolution") == "conv"
    assert kind_of_op("aten::native_layer_norm_backward") == "norm"
    assert kind_of_op("aten::_foreach_mul_") == "elementwise"
    assert kind_of_op("aten::_softmax") == "reduction"
    assert kind_of_op("triton_poi_fused_mul_0") == "elementwise"
    assert kind_of_op("record_param_comms") == "collective"
    assert kind_of_op("nccl:all_reduce") == "collective"
    assert kind_of_op("xformers::flash_attention_fwd") == "attention"
    assert kind_of_op("aten::normal_") == "elementwise"  # not "norm"
    assert kind_of_op("fbgemm::asynchronous_complete_cumsum") == "reduction"  # not matmul
    assert kind_of_op("ProfilerStep#3") is None


# --- the registry ------------------------------------------------------------------------------------


def test_duplicate_registration_raises_and_adds_nothing():
    with pytest.raises(DuplicateFormulaError, match="aten::mm"):
        register_cost("test::fresh_op", "aten::mm", kind="matmul")(lambda a: None)
    assert formula_for("test::fresh_op") is None  # atomic: the fresh name was not added
    with pytest.raises(DuplicateFormulaError):
        register_cost("test::twice", "test::twice")(lambda a: None)
    with pytest.raises(DuplicateFormulaError):
        register_cost("triton_poi_*")(lambda a: None)


def test_register_cost_validates_kind():
    with pytest.raises(UsageError, match="kind 'gemm'"):
        register_cost("test::bad_kind", kind="gemm")


def test_every_registered_formula_is_documented_and_has_a_known_kind():
    names = registered_ops()
    assert len(names) > 300
    for name in names:
        fn = formula_for(name.rstrip("*") + ("x" if name.endswith("*") else ""))
        assert fn is not None and fn.__doc__ and len(fn.__doc__) > 40, name
        kind = kind_of_op(name.rstrip("*") + ("x" if name.endswith("*") else ""))
        assert kind in KINDS, name


def test_overload_names_resolve_to_the_base_op():
    c = cost_of("aten::mm.default", [[4, 5], [5, 6]], ["float", "float"])
    assert c.flops == 240


def test_json_text_arguments_are_accepted():
    # the host table stores the raw JSON text of Input Dims / Input type / Concrete Inputs
    c = cost_of("aten::mm", json.dumps([[4, 5], [5, 6]]), json.dumps(["float", "float"]), json.dumps(["", ""]))
    assert c.flops == 240


@pytest.mark.parametrize(
    "dims,types,concrete",
    [
        ([[2, 3], [4, 5]], ["float", "float"], None),  # inner dims do not match
        ([[2, 3]], ["float"], None),  # missing operand
        ([[-1, 3], [3, 4]], ["float", "float"], None),  # negative size
        ([["a", 3], [3, 4]], ["float", "float"], None),
        ("not json", "[", None),
        ([], [], []),
        ([[2, 3], [3, 4]], ["float"], ["", ""]),  # types shorter than dims
    ],
)
def test_odd_shapes_give_none_not_an_exception(dims, types, concrete):
    assert cost_of("aten::mm", dims, types, concrete) is None


_junk = st.recursive(
    st.one_of(st.integers(-3, 70), st.text(max_size=4), st.none(), st.booleans(), st.floats(allow_nan=True)),
    lambda c: st.lists(c, max_size=4),
    max_leaves=12,
)


@settings(max_examples=40, deadline=None)
@given(dims=st.lists(_junk, max_size=8), types=st.lists(st.sampled_from(
    ["float", "c10::BFloat16", "long int", "Scalar", "ScalarList", "TensorList", "", "bool"]), max_size=8),
    concrete=st.one_of(st.none(), st.lists(st.sampled_from(["", "1", "-1", "0.", "True", "[1, 1]", "[]", "x"]),
                                           max_size=8)))
def test_no_registered_formula_raises_on_junk(dims, types, concrete):
    for name in registered_ops():
        op = name.rstrip("*") + ("x" if name.endswith("*") else "")
        c = cost_of(op, dims, types, concrete)
        if c is not None:
            assert isinstance(c, OpCost) and c.kind in KINDS
            for v in (c.flops, c.bytes_read, c.bytes_written):
                assert v is None or (v >= 0 and not math.isnan(v))


def test_varlen_attention_spreads_tokens_over_the_sequences():
    # efficient attention packs varlen batches as [1, total, h, d] with cu_seqlens [b + 1]
    dims = [[1, 300, 4, 32], [1, 300, 4, 32], [1, 300, 4, 32], [], [4], [4]] + [[]] * 8
    types = [BF] * 3 + ["", "int", "int"] + ["Scalar"] * 5 + [""] * 3
    conc = [""] * 6 + ["100", "100", "0.", "0", "True", "", "", ""]
    c = cost_of("aten::_efficient_attention_forward", dims, types, conc)
    assert c.flops == 4 * 4 * 32 * (3 * 100 * 100)  # 3 sequences of 100, not one of 300
    assert "varlen" in c.note


def test_docs_list_every_registered_op():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "costs.md").read_text()
    undocumented = [n for n in registered_ops() if f"`{n}`" not in doc]
    assert undocumented == [], "add these to docs/costs.md"


def test_registering_a_new_formula_is_seen_by_cached_lookups():
    dims, types = json.dumps([[3, 4]]), json.dumps(["float"])
    assert cost_of("test::late_op", dims, types) is None

    from traceroof.costs import registry

    @register_cost("test::late_op", kind="other")
    def late(a):
        """A formula registered after a lookup was cached: [n] -> 1 FLOP per element."""
        t = a.tensor(0)
        return OpCost(float(t.numel), t.nbytes, 0.0, "other", t.dtype)

    try:
        assert cost_of("test::late_op", dims, types).flops == 12
    finally:  # leave the registry as the package defines it
        del registry._EXACT["test::late_op"]
        registry._cost_of_text.cache_clear()
