"""The conventions docs/costs.md's "Definitions" table states, checked against torch's
``FlopCounterMode`` where torch has a formula (same shapes, same op), and by hand where it has
none (torch counts 0 for norms, pointwise ops and copies)."""

from __future__ import annotations

import pytest
import torch  # the test extra installs it (CPU build): a missing torch fails, it is not skipped
from torch.utils.flop_counter import FlopCounterMode

from traceroof.costs import cost_of

aten = torch.ops.aten


def fcm(fn) -> int:
    with FlopCounterMode(display=False) as m:
        fn()
    return m.get_total_flops()


def test_addmm_does_not_count_the_bias_add_like_torch():
    m, k, n = 8, 32, 64
    bias, x, w = torch.randn(n), torch.randn(m, k), torch.randn(k, n)
    c = cost_of("aten::addmm", [[n], [m, k], [k, n], [], []], ["float"] * 3 + ["Scalar"] * 2, ["", "", "", "1", "1"])
    assert c.flops == fcm(lambda: torch.addmm(bias, x, w)) == 2 * m * n * k  # 32,768; TraceLens adds m·n
    # the bias is still read: (n + m·k + k·n) · 4 bytes
    assert c.bytes_read == (n + m * k + k * n) * 4


def test_causal_attention_counts_its_pairs_where_torch_counts_the_square():
    b, h, s, d = 1, 2, 16, 8
    q, k, v = (torch.randn(b, h, s, d, device="meta") for _ in range(3))
    torch_flops = fcm(lambda: aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True))
    assert torch_flops == 4 * b * h * s * s * d  # 16,384: torch ignores is_causal
    c = cost_of("aten::_scaled_dot_product_flash_attention", [[b, h, s, d]] * 3 + [[], [], [], []],
                ["float"] * 3 + ["Scalar", "Scalar", "Scalar", ""], ["", "", "", "0.", "True", "False", ""])
    assert c.flops == 4 * b * h * (s * (s + 1) // 2) * d == 8704  # 136 of 256 (q, k) pairs
    # without the causal flag the two agree
    c_full = cost_of("aten::_scaled_dot_product_flash_attention", [[b, h, s, d]] * 3 + [[], [], [], []],
                     ["float"] * 3 + ["Scalar", "Scalar", "Scalar", ""], ["", "", "", "0.", "False", "False", ""])
    assert c_full.flops == fcm(lambda: aten._scaled_dot_product_flash_attention(q, k, v, 0.0, False))


@pytest.mark.parametrize("mask", [[True, True, True], [False, True, True], [True, False, False]])
def test_conv_backward_honours_output_mask_like_torch(mask):
    x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
    go = torch.randn(2, 4, 8, 8)
    want = fcm(lambda: aten.convolution_backward(go, x, w, [4], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, mask))
    dims = [[2, 4, 8, 8], [2, 3, 8, 8], [4, 3, 3, 3], [], [], [], [], [], [], [], []]
    types = ["float"] * 3 + ["ScalarList"] * 4 + ["Scalar", "ScalarList", "Scalar", "ScalarList"]
    conc = ["", "", "", "[4]", "[1, 1]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1", str(mask)]
    c = cost_of("aten::convolution_backward", dims, types, conc)
    # one forward = 2 · (2·4·8·8 outputs) · (3·3·3 taps) = 27,648; one per requested gradient
    n_grads = int(mask[0]) + int(mask[1])
    assert c.flops == want == n_grads * 27_648


def test_where_torch_has_no_formula_traceroof_counts_by_hand():
    M, N = 8, 64
    x = torch.randn(M, N)
    # torch counts 0 for all of these (no formula registered)
    assert fcm(lambda: aten.native_layer_norm(x, [N], torch.randn(N), torch.randn(N), 1e-5)) == 0
    assert fcm(lambda: torch.nn.functional.silu(x)) == 0
    ln = cost_of("aten::native_layer_norm", [[M, N], [], [N], [N], []], ["float", "ScalarList", "float", "float", "Scalar"],
                 ["", f"[{N}]", "", "", "1e-05"])
    assert ln.flops == 8 * M * N  # mean 1 + variance 3 + normalise 2 + weight 1 + bias 1 per element
    assert cost_of("aten::silu", [[M, N]], ["float"], [""]).flops == 4 * M * N  # neg, exp, add, div
    # a cast does no arithmetic: 0 FLOPs (XLA's convert counts 1 per element); each side at its width
    cp = cost_of("aten::copy_", [[M, N], [M, N], []], ["c10::BFloat16", "float", "Scalar"], ["", "", "False"])
    assert (cp.flops, cp.bytes_read, cp.bytes_written) == (0.0, M * N * 4, M * N * 2)
    # an in-place op writes self at self's dtype (bf16), not the wider input's (TraceLens: fp32)
    add = cost_of("aten::add_", [[M, N], [M, N], []], ["c10::BFloat16", "float", "Scalar"], ["", "", "1"])
    assert (add.flops, add.bytes_read, add.bytes_written) == (M * N, M * N * (2 + 4), M * N * 2)
