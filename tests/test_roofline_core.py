"""The roofline engine alone (DESIGN §6): expected time, bound, efficiency and gap of each op
against hand arithmetic, and against the formula over random FLOPs/bytes/peaks/bandwidths.

No trace is read: a small op table and a hand-made chip go straight into ``add_roofline``.
"""

from __future__ import annotations

import math

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from traceroof.chips import ChipSpec
from traceroof.roofline import add_roofline, rank_ops
from traceroof.schema import KIND

#: A made-up chip with round numbers: bf16/fp16 1 PFLOP/s, tf32 500 TFLOP/s, fp32 50 TFLOP/s,
#: 2 TB/s HBM, 400 GB/s scale-up and 50 GB/s scale-out links, a 2 µs kernel floor.
CHIP = ChipSpec(
    key="toy", name="Toy accelerator", vendor="nvidia",
    peak_flops_per_s={"bf16": 1e15, "fp16": 1e15, "tf32": 5e14, "fp32": 5e13},
    hbm_bytes=80e9, hbm_bytes_per_s=2e12,
    intra_node_bytes_per_s=400e9, inter_node_bytes_per_s=50e9, launch_overhead_ns=2000.0,
)

_COLUMNS = {
    "name": pl.String, "op": pl.String, "kind": KIND, "dtype": pl.String, "flops": pl.Float64,
    "bytes": pl.Float64, "dur_ns": pl.Int64, "comm_bytes": pl.Float64, "group_size": pl.Int32,
}


def table(rows: list[tuple]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=_COLUMNS, orient="row")


@pytest.fixture(scope="module")
def ops() -> pl.DataFrame:
    rows = [
        # name, op, kind, dtype, flops, bytes, dur_ns, comm_bytes, group_size
        ("gemm_bf16", "aten::mm", "matmul", "bf16", 1e12, 1e9, 2_000_000, None, None),
        ("vectorized_add", "aten::add", "elementwise", "bf16", 1e9, 4e9, 2_500_000, None, None),
        ("tiny_fill", "aten::fill_", "elementwise", "fp32", 1e6, 1e6, 3_000, None, None),
        ("mystery_kernel", None, "other", None, None, None, 10_000, None, None),
        ("ncclDevKernel_AllReduce_Sum_bf16", "nccl:all_reduce", "collective", "bf16",
         None, None, 5_000_000, 1e9, 8),
        ("ncclDevKernel_AllGather", "nccl:all_gather", "collective", "bf16",
         None, None, 30_000_000, 1e9, 16),
        ("sm80_xmma_gemm_tf32f32", "aten::mm", "matmul", "fp32", 1e12, 1e9, 4_000_000, None, None),
        ("gemm_fp8", "aten::_scaled_mm", "matmul", "fp8", 1e12, 1e9, 2_000_000, None, None),
        ("copy-start.4", "copy-start", "memcpy", "bf16", 0.0, 1e9, 700_000, None, None),
    ]
    return add_roofline(table(rows), CHIP).with_row_index("i")


def row(ops: pl.DataFrame, name: str) -> dict:
    return ops.filter(pl.col("name") == name).row(0, named=True)


def test_compute_bound_matmul(ops):
    r = row(ops, "gemm_bf16")
    # compute 1e12 FLOP / 1e15 FLOP/s = 1e-3 s = 1,000,000 ns; memory 1e9 B / 2e12 B/s = 500,000 ns
    assert r["peak_dtype"] == "bf16" and r["peak_flops_per_s"] == 1e15
    assert r["compute_ns"] == 1_000_000.0 and r["memory_ns"] == 500_000.0
    assert r["expected_ns"] == 1_000_000.0  # max of the two
    assert r["bound"] == "compute"
    assert r["efficiency"] == 0.5  # 1,000,000 / 2,000,000
    assert r["gap_ns"] == 1_000_000.0  # 2,000,000 − 1,000,000
    assert r["intensity"] == 1000.0  # 1e12 / 1e9 FLOP/byte


def test_memory_bound_elementwise_uses_the_fp32_vector_peak(ops):
    r = row(ops, "vectorized_add")
    # non-matrix op: fp32 vector peak 5e13; compute 1e9 / 5e13 = 2e-5 s = 20,000 ns
    # memory 4e9 / 2e12 = 2e-3 s = 2,000,000 ns
    assert r["peak_dtype"] == "fp32" and r["peak_flops_per_s"] == 5e13
    assert r["compute_ns"] == pytest.approx(20_000.0)
    assert r["expected_ns"] == 2_000_000.0
    assert r["bound"] == "memory"
    assert r["efficiency"] == 0.8  # 2,000,000 / 2,500,000
    assert r["gap_ns"] == 500_000.0
    assert r["intensity"] == 0.25


def test_latency_bound_below_the_kernel_floor(ops):
    r = row(ops, "tiny_fill")
    # memory 1e6 / 2e12 = 500 ns > compute 1e6 / 5e13 = 20 ns; 500 < floor 2000 and the
    # measured 3000 ≤ 2 × 2000: latency, not memory
    assert r["expected_ns"] == pytest.approx(500.0)
    assert r["bound"] == "latency"
    assert r["efficiency"] == pytest.approx(500 / 3000)
    assert r["gap_ns"] == pytest.approx(2500.0)


def test_unknown_costs_stay_null_never_zero(ops):
    r = row(ops, "mystery_kernel")
    assert r["expected_ns"] is None and r["gap_ns"] is None and r["efficiency"] is None
    assert r["compute_ns"] is None and r["memory_ns"] is None and r["intensity"] is None
    assert r["bound"] == "unknown"


def test_collective_over_the_scale_up_link(ops):
    r = row(ops, "ncclDevKernel_AllReduce_Sum_bf16")
    # all-reduce over 8: bus factor 2·7/8 = 1.75; 1.75 · 1e9 B / 400e9 B/s = 4.375e-3 s
    assert r["collective"] == "all_reduce"
    assert r["comm_ns"] == pytest.approx(4_375_000.0)
    assert r["expected_ns"] == pytest.approx(4_375_000.0)
    assert r["bound"] == "comm"
    assert r["efficiency"] == pytest.approx(0.875)  # 4.375 ms of 5 ms
    assert r["gap_ns"] == pytest.approx(625_000.0)


def test_collective_beyond_a_node_uses_the_scale_out_link(ops):
    r = row(ops, "ncclDevKernel_AllGather")
    # all-gather over 16 (> 8 per node): factor 15/16; 15/16 · 1e9 / 50e9 = 18.75e-3 s
    assert r["collective"] == "all_gather"
    assert r["comm_ns"] == pytest.approx(18_750_000.0)
    assert r["efficiency"] == pytest.approx(18.75 / 30)
    assert r["gap_ns"] == pytest.approx(11_250_000.0)


def test_fp32_matmul_named_tf32_takes_the_tf32_peak(ops):
    r = row(ops, "sm80_xmma_gemm_tf32f32")
    # 1e12 / 5e14 = 2e-3 s = 2,000,000 ns (the fp32 vector peak would give 20,000,000)
    assert r["peak_dtype"] == "tf32" and r["peak_flops_per_s"] == 5e14
    assert r["expected_ns"] == pytest.approx(2_000_000.0)
    assert r["efficiency"] == pytest.approx(0.5)


def test_a_dtype_without_a_peak_falls_back_to_fp16(ops):
    r = row(ops, "gemm_fp8")  # the toy chip has no fp8 peak
    assert r["peak_dtype"] == "fp16" and r["peak_flops_per_s"] == 1e15
    assert r["expected_ns"] == 1_000_000.0


def test_async_halves_expect_zero_and_all_of_their_time_is_gap(ops):
    r = row(ops, "copy-start.4")
    assert r["memory_ns"] == 500_000.0  # kept for reference
    assert r["expected_ns"] == 0.0 and r["efficiency"] == 0.0
    assert r["gap_ns"] == 700_000.0
    assert r["bound"] == "memory"


def test_row_order_and_count_are_kept(ops):
    assert ops["i"].to_list() == list(range(9))
    assert ops["name"][0] == "gemm_bf16" and ops["name"][8] == "copy-start.4"


def test_rank_ops_sums_gaps_of_costed_ops_only(ops):
    ranked = rank_ops(ops.drop("i"))
    mm = ranked.filter(pl.col("label") == "aten::mm").row(0, named=True)
    # gemm_bf16 gap 1,000,000 + the tf32 gemm gap 4,000,000 − 2,000,000
    assert mm["count"] == 2 and mm["gap_ns"] == pytest.approx(3_000_000.0)
    assert mm["measured_ns"] == 6_000_000
    assert mm["efficiency"] == pytest.approx(3_000_000 / 6_000_000)
    unknown = ranked.filter(pl.col("label") == "mystery_kernel").row(0, named=True)
    assert unknown["gap_ns"] is None and unknown["costed_count"] == 0
    assert ranked["label"][-1] == "mystery_kernel"  # uncosted groups sort last


# --------------------------------------------------------------------------- random roofs

_pos = st.floats(min_value=1.0, max_value=1e15, allow_nan=False, allow_infinity=False)


@settings(max_examples=200, deadline=None)
@given(
    flops=_pos,
    nbytes=st.floats(min_value=1.0, max_value=1e12),
    peak=st.floats(min_value=1e9, max_value=1e16),
    bw=st.floats(min_value=1e9, max_value=1e13),
    dur=st.integers(min_value=1, max_value=10**10),
)
def test_expected_time_is_the_larger_roof(flops, nbytes, peak, bw, dur):
    chip = ChipSpec(key="r", name="random", vendor="nvidia", peak_flops_per_s={"bf16": peak},
                    hbm_bytes=1e9, hbm_bytes_per_s=bw, launch_overhead_ns=0.0)
    r = add_roofline(table([("k", "aten::mm", "matmul", "bf16", flops, nbytes, dur, None, None)]),
                     chip).row(0, named=True)
    compute_ns = flops / peak * 1e9
    memory_ns = nbytes / bw * 1e9
    # the same arithmetic as the engine (IEEE doubles), and close to an independent order
    assert r["compute_ns"] == compute_ns and r["memory_ns"] == memory_ns
    assert math.isclose(r["expected_ns"], max(flops * 1e9 / peak, nbytes * 1e9 / bw), rel_tol=1e-12)
    assert r["expected_ns"] == max(compute_ns, memory_ns)
    assert r["bound"] == ("compute" if compute_ns >= memory_ns else "memory")
    assert r["efficiency"] == r["expected_ns"] / dur
    assert r["gap_ns"] == dur - r["expected_ns"]
    assert r["intensity"] == flops / nbytes
