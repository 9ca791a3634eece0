"""Triton (Inductor) kernel costs, bytes-only roofline times and the per-kernel cost split
(issue 14 items 2 and 6). Oracles: hand arithmetic in comments, the raw JSON of the real
traces, the roofline formula expected = bytes / HBM bandwidth."""

from __future__ import annotations

import math

import polars as pl
from conftest import load_json, real
from tracegen import Kernel, TraceBuilder

from traceroof import analyze, get_chip, read_trace
from traceroof.costing import compute_costs
from traceroof.costs import cost_of, is_data_movement_kernel
from traceroof.costs.args import OpArgs
from traceroof.costs.triton import fused_ops, iterations

BF = "c10::BFloat16"
B200 = ("TraceLens", "tests", "traces", "b200", "eager_trace.json.gz")
COMPILE = ("TraceLens", "tests", "traces", "torch_compile_triton", "trace.json.gz")
HTA_TRITON = ("HolisticTraceAnalysis", "tests", "data", "triton_example", "triton_example.json.gz")


# --- formulas ------------------------------------------------------------------------------


def test_fused_ops_reads_op_names_with_underscores():
    assert fused_ops("triton_poi_fused__unsafe_view_add_3") == ["_unsafe_view", "add"]
    assert fused_ops("triton_poi_fused_add_bitwise_and_bitwise_not_bitwise_or_ge_lt_mul_sub_0") == [
        "add", "bitwise_and", "bitwise_not", "bitwise_or", "ge", "lt", "mul", "sub"]
    assert fused_ops("triton_red_fused_add_mean_mul_pow_rsqrt_0") == ["add", "mean", "mul", "pow", "rsqrt"]
    # no op in the name, or a custom op (vLLM's moe_forward): unknown
    assert fused_ops("triton_poi_fused_0") is None
    assert fused_ops("triton_poi_fused_constant_pad_nd_moe_forward_0") is None


def test_b200_pointwise_launcher_record():
    # the B200 eager trace's only Triton launch: three [888] buffers (int32, int64, bool), six Scalars
    c = cost_of("triton_poi_fused_add_bitwise_and_bitwise_not_bitwise_or_ge_lt_mul_sub_0",
                [[888], [888], [888], [], [], [], [], [], []],
                ["int", "long int", "bool"] + ["Scalar"] * 6,
                ["", "", "", "0", "25136", "201088", "201088", "0", "888"])
    assert c.bytes_read == 888 * (4 + 8) == 10_656      # int32 + int64 read
    assert c.bytes_written == 888 * 1 == 888            # the bool out_ptr (last buffer)
    # xnumel = 888 (last Scalar) x 8 named ops of 1 FLOP each
    assert c.flops == 888 * 8 == 7_104


def test_compile_reduction_and_pointwise_launcher_records():
    # torch_compile_triton: RMS norm reduction, xnumel 32768 rows x r0_numel 2048
    c = cost_of("triton_red_fused_add_mean_mul_pow_rsqrt_0", [[8, 4096, 2048], [2048], [8, 4096, 2048], [], []],
                [BF, BF, BF, "Scalar", "Scalar"], ["", "", "", "32768", "2048"])
    # add 1 + mean 1 + mul 1 + pow 1 + rsqrt 1 = 5 per element of 32768 x 2048
    assert c.flops == 5 * 32768 * 2048 == 335_544_320
    assert c.bytes_read == (8 * 4096 * 2048 + 2048) * 2 == 134_221_824
    assert c.bytes_written == 8 * 4096 * 2048 * 2 == 134_217_728
    # SwiGLU: _unsafe_view 0 + mul 1 + silu 4 over xnumel 268435456
    c = cost_of("triton_poi_fused__unsafe_view_mul_silu_2", [[8, 4096, 8192], [32768, 8192], []],
                [BF, BF, "Scalar"], ["", "", "268435456"])
    assert c.flops == 5 * 268_435_456 == 1_342_177_280
    assert c.bytes_read == c.bytes_written == 8 * 4096 * 8192 * 2 == 536_870_912


def test_shape_only_record_and_unknown_flops():
    # no Scalars: a pointwise kernel writes the broadcast of its inputs: 4096² x (add 1 + mul 1)
    c = cost_of("triton_poi_fused_add_mul_0", [[4096, 4096], [4096, 4096]], [BF, BF])
    assert c.flops == 2 * 4096 * 4096 == 33_554_432
    assert c.bytes == 3 * 4096 * 4096 * 2
    # an unknown op in the name: bytes kept, FLOPs unknown (None, never 0)
    c = cost_of("triton_poi_fused_constant_pad_nd_moe_forward_0", [[64, 128], [64, 130], []],
                [BF, BF, "Scalar"], ["", "", "8320"])
    assert c.flops is None
    assert c.bytes_read == 64 * 128 * 2 and c.bytes_written == 64 * 130 * 2
    # a reduction record without its size Scalars: the domain is unknown, so are its FLOPs
    c = cost_of("triton_red_fused_sum_0", [[1024, 512]], [BF])
    assert c.flops is None and c.bytes_read == 1024 * 512 * 2


# --- the launch record: grid x XBLOCK covers the recorded xnumel ---------------------------


def _launches(parts: tuple[str, ...]) -> list[tuple[dict, dict]]:
    """(cpu_op args, kernel args) of every Triton launch with an XBLOCK kwarg in a raw trace."""
    ev = load_json(real(*parts))["traceEvents"]
    kern = {e["args"]["External id"]: e["args"] for e in ev
            if e.get("cat") == "kernel" and "External id" in e.get("args", {})}
    return [(e["args"], kern[e["args"]["External id"]]) for e in ev
            if e.get("cat") == "cpu_op" and e.get("args", {}).get("kernel_backend") == "triton"
            and "XBLOCK=" in e["args"].get("kernel_kwargs", "")]


def test_grid_times_xblock_covers_the_recorded_xnumel():
    checked = 0
    for parts in (B200, COMPILE):
        for op, k in _launches(parts):
            kw = dict(kv.split("=") for kv in op["kernel_kwargs"].split(","))
            scalars = [c for c, t in zip(op["Concrete Inputs"], op["Input type"]) if t == "Scalar"]
            # xnumel: the last Scalar of a pointwise kernel, the one before r0_numel of a reduction
            red = op["kernel_name"].startswith(("triton_red_", "triton_per_"))
            xnumel = int(scalars[-2] if red else scalars[-1])
            assert k["grid"][0] == math.ceil(xnumel / int(kw["XBLOCK"])), op["kernel_name"]
            # the costing reads the same domain from the record (x r0_numel for a reduction)
            a = OpArgs(op["kernel_name"], op["Input Dims"], op["Input type"], op["Concrete Inputs"])
            r0 = int(scalars[-1]) if red else 1
            assert iterations(a, "reduction" if red else "elementwise") == xnumel * r0
            checked += 1
    # B200: 1 launch (grid 56 = ceil(888 / 16)); torch_compile_triton: 4 kernels
    assert checked == 5


# --- on the real traces: Triton kernels costed, coverage before -> after -------------------


def _triton_share(parts: tuple[str, ...]) -> float:
    """Share of device time (kernels, copies, fills) in Triton kernels, from the raw JSON."""
    ev = load_json(real(*parts))["traceEvents"]
    dev = [e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and e.get("ph") == "X"]
    tri = sum(float(e["dur"]) for e in dev if e["name"].startswith("triton_"))
    return tri / sum(float(e["dur"]) for e in dev)


def test_triton_traces_fully_costed():
    # before (828a40f): torch_compile_triton 93.3 %, HTA triton_example 0.0 % costed: the
    # Triton kernels' bytes were dropped for lack of FLOPs
    for parts, before in ((COMPILE, 0.933), (HTA_TRITON, 0.0)):
        ops, cov = compute_costs(read_trace(real(*parts)))
        tri = ops.filter(pl.col("name").str.starts_with("triton_"))
        assert tri.height > 0 and tri["bytes"].null_count() == 0 and tri["flops"].null_count() == 0
        # what was missing before is exactly the Triton kernels' time
        assert abs(before + _triton_share(parts) - 1.0) < 1e-3
        assert cov.costed_share == 1.0
        assert cov.bytes_only_ns == 0  # every one of these names only known ops


def test_compile_trace_flops_are_xnumel_times_named_ops():
    ops, _ = compute_costs(read_trace(real(*COMPILE)))
    per = {op["kernel_name"]: op for op, _ in _launches(COMPILE)}
    got = dict(ops.filter(pl.col("name").is_in(list(per))).select("name", "flops").iter_rows())
    # triton_poi_fused__unsafe_view_add_3: xnumel 67108864 x add 1
    assert got["triton_poi_fused__unsafe_view_add_3"] == 67_108_864
    # triton_red_fused__unsafe_view_add_mean_mul_pow_rsqrt_1: 32768 x 2048 x 5
    assert got["triton_red_fused__unsafe_view_add_mean_mul_pow_rsqrt_1"] == 32768 * 2048 * 5


# --- bytes alone: a roofline time, bound memory, FLOPs unknown -----------------------------


def _bytes_only_trace(tmp_path):
    b = TraceBuilder()
    # 1 MiB in + 1 MiB out, bf16 [524288]; moe_forward is no known op: FLOPs unknown
    b.op("triton_poi_fused_moe_forward_0", [[524288], [524288], []], [BF, BF, "Scalar"],
         [Kernel("triton_poi_fused_moe_forward_0", 10_000)], ["", "", "524288"])
    return b.write(tmp_path / "t.json")


def test_bytes_only_op_gets_a_memory_bound_roofline_time(tmp_path):
    r = analyze(read_trace(_bytes_only_trace(tmp_path)), "h100")
    row = r.ops.filter(pl.col("name") == "triton_poi_fused_moe_forward_0").row(0, named=True)
    assert row["flops"] is None and row["bytes"] == 2 * 524288 * 2
    bw = get_chip("h100").hbm_bytes_per_s
    # expected = bytes / HBM bandwidth
    assert math.isclose(row["expected_ns"], 2 * 524288 * 2 / bw * 1e9)
    assert row["bound"] == "memory" and row["compute_ns"] is None
    cov = r.coverage
    assert cov.costed_share == 1.0 and cov.bytes_only_share == 1.0


def test_coverage_line_says_bytes_alone(tmp_path):
    from traceroof.render.sections import header  # noqa: PLC0415
    r = analyze(read_trace(_bytes_only_trace(tmp_path)), "h100")
    line = dict(header(r))["cost coverage"]
    assert "100.0 % of it by bytes alone" in line


# --- the per-kernel split: a transpose kernel of a conv does none of its FLOPs -------------


def _conv_trace(tmp_path):
    b = TraceBuilder()
    # Falconsai ViT patch embedding (test_costs.py): 924,844,032 FLOPs, 3,588,096 bytes
    b.op("aten::cudnn_convolution", [[4, 3, 224, 224], [768, 3, 16, 16], [], [], [], [], [], [], []],
         [BF, BF, "ScalarList", "ScalarList", "ScalarList", "Scalar", "Scalar", "Scalar", "Scalar"],
         [Kernel("void cudnn::engines_precompiled::nchwToNhwcKernel<__nv_bfloat16>", 2_000),
          Kernel("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc", 6_000),
          Kernel("void cudnn::engines_precompiled::nhwcToNchwKernel<__nv_bfloat16>", 2_000)],
         ["", "", "[0, 0]", "[16, 16]", "[1, 1]", "1", "False", "False", "True"])
    return b.write(tmp_path / "conv.json")


def test_transpose_kernels_of_a_conv_get_bytes_and_no_flops(tmp_path):
    ops, cov = compute_costs(read_trace(_conv_trace(tmp_path)))
    by = {n: (f, b) for n, f, b in ops.select("name", "flops", "bytes").iter_rows()}
    total_b = (4 * 3 * 224 * 224 + 768 * 3 * 16 * 16 + 4 * 768 * 14 * 14) * 2   # 3,588,096
    for n, (f, b) in by.items():
        if is_data_movement_kernel(n):
            assert f == 0.0                                   # no FLOPs, a known zero
            assert math.isclose(b, total_b * 2_000 / 10_000)  # bytes by duration: 2 of 10 µs
        else:
            assert f == 924_844_032                           # the GEMM does all the conv's FLOPs
            assert math.isclose(b, total_b * 6_000 / 10_000)
    assert sum(f for f, _ in by.values()) == 924_844_032  # FLOPs sum to the op's
    assert math.isclose(sum(b for _, b in by.values()), total_b)
    assert cov.split_ops == 1


def test_group_by_kernel_ranks_the_transposes_without_flops(tmp_path):
    r = analyze(read_trace(_conv_trace(tmp_path)), "h100", group_by="kernel")
    rows = {lbl: fl for lbl, fl in r.ranking.select("label", "flops").iter_rows()}
    assert rows["void cudnn::engines_precompiled::nchwToNhwcKernel<__nv_bfloat16>"] == 0.0
    assert rows["sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc"] == 924_844_032


def test_ranking_row_of_a_bytes_only_kernel_has_null_flops(tmp_path):
    r = analyze(read_trace(_bytes_only_trace(tmp_path)), "h100")
    row = r.ranking.filter(pl.col("label") == "triton_poi_fused_moe_forward_0").row(0, named=True)
    # unknown FLOPs stay null in the ranking (a sum over no known value is no 0)
    assert row["flops"] is None and row["intensity"] is None
    assert row["bytes"] == 2 * 524288 * 2 and row["costed"] == 1.0
