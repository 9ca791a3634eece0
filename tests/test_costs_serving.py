"""Serving kernels (issue 14 item 3): collectives sized from their own Input Dims, the
FlashAttention-2 custom ops, fused MoE, vLLM activations / norm+quant / scaled fp8 and fp4
GEMMs, the fp8/fp4 peaks, and the reasons an op stays unknown.

Oracles: torch's ``FlopCounterMode`` / ``flop_counter`` formulas (sdpa, its backward, the
varlen flash formula with real offsets, mm) where torch has one; hand arithmetic in comments
otherwise; counts read from the raw B200 JSON for the real trace."""

from __future__ import annotations

import collections
from pathlib import Path

import polars as pl
import pytest
from conftest import load_json, real
from tracegen import Kernel, TraceBuilder

from traceroof import read_trace
from traceroof.chips import get_chip
from traceroof.costing import apply_costs
from traceroof.costs import collective_size, cost_of, kind_of_kernel, uncosted_reason
from traceroof.roofline import add_roofline, collective_type_expr
from traceroof.schema import OP_SCHEMA, conform

torch = pytest.importorskip("torch")
from torch.utils import flop_counter  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

BF = "c10::BFloat16"
F8 = "c10::Float8_e4m3fn"
B200 = ("TraceLens", "tests", "traces", "b200", "eager_trace.json.gz")


# --------------------------------------------------------------------------- collectives
def test_multimem_all_reduce_is_sized_from_its_input_dims():
    # [[2557440], [], []] bf16: 2,557,440 elements x 2 bytes; the group is a name (unrecorded)
    assert collective_size("symm_mem::multimem_all_reduce_", [[2557440], [], []], [BF, "", ""],
                           ["", "", ""]) == (2557440 * 2, None)
    # no dtype recorded: unknown, not 0
    assert collective_size("symm_mem::multimem_all_reduce_", [[2557440], [], []], ["", "", ""]) is None


def test_vllm_all_gather_takes_its_group_size_from_the_recorded_scalar():
    dims, types = [[4, 1024], [], [], []], [BF, "Scalar", "Scalar", ""]
    # the gathered output: 8 ranks x 4·1024 bf16 = 65,536 bytes
    assert collective_size("vllm::all_gather", dims, types, ["", "-1", "8", ""]) == (8 * 4 * 1024 * 2, 8)
    # without world_size the output size is unknown
    assert collective_size("vllm::all_gather", dims, types, ["", "-1", "", ""]) is None
    # reduce-scatter: the input is the buffer
    assert collective_size("vllm::reduce_scatter", dims, types, ["", "0", "4", ""]) == (4 * 1024 * 2, 4)
    assert collective_size("vllm::all_reduce", [[16, 2880], []], [BF, ""]) == (16 * 2880 * 2, None)
    # an all-gather into symmetric memory: group = numel(out) / numel(input) = 4
    assert collective_size("symm_mem::multimem_all_gather_out", [[8, 64], [], [32, 64]], [BF, "", BF]) == (
        32 * 64 * 2, 4)


def test_b200_multimem_all_reduce_is_a_sized_collective():
    path = real(*B200)
    raw = load_json(path)["traceEvents"]
    ops = {e["args"]["External id"]: e for e in raw
           if e.get("cat") == "cpu_op" and e["name"] == "symm_mem::multimem_all_reduce_"}
    kernels = [e for e in raw if e.get("cat") == "kernel" and e["args"].get("External id") in ops]
    # the buffer each op recorded, bf16: 2 bytes per element (from the raw JSON)
    want = {x: 2.0 * e["args"]["Input Dims"][0][0] for x, e in ops.items() if e["args"]["Input type"][0] == BF}
    assert len(want) == len(ops) and 2557440 * 2.0 in want.values()
    table, cov = apply_costs(read_trace(path))
    mm = table.filter(pl.col("op") == "symm_mem::multimem_all_reduce_")
    assert mm.height == len(kernels) == 73  # one kernel per op, counted from the raw JSON
    assert set(mm["kind"].cast(pl.String)) == {"collective"}
    assert set(mm["cost_source"]) == {"shapes"}
    # each op's kernels together carry its buffer once (2,557,440 x 2 bytes for most)
    per_op = dict(mm.group_by("external_id").agg(pl.col("comm_bytes").sum()).iter_rows())
    assert per_op == {x: want[x] for x in per_op}
    assert set(mm["group_size"]) == {8}  # the world size, assumed (the group is a name)
    assert cov.group_size_assumed_ns >= int(mm["dur_ns"].sum())
    assert "symm_mem::multimem_all_reduce_" not in cov.uncosted_ns
    roof = add_roofline(mm, get_chip("b200")).filter(pl.col("comm_bytes") == 5114880.0)
    # all-reduce ring factor 2·7/8 over NVLink5 900e9 B/s: 9,947 ns per call
    assert roof.height and roof["comm_ns"].unique().to_list() == [pytest.approx(2 * 7 / 8 * 5114880 / 900e9 * 1e9)]


def test_vllm_all_gather_in_a_built_trace_is_costed_at_the_link(tmp_path: Path):
    tb = TraceBuilder()
    tb.op("vllm::all_gather", [[4, 1024], [], [], []], [BF, "Scalar", "Scalar", ""],
          [Kernel("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 20_000)],
          ["", "-1", "8", ""])
    ops, cov = apply_costs(read_trace(tb.write(tmp_path / "ag.json.gz")))
    row = ops.filter(pl.col("kind") == "collective").row(0, named=True)
    assert (row["comm_bytes"], row["group_size"], row["cost_source"]) == (65536.0, 8, "shapes")
    assert cov.group_size_assumed_ns == 0  # recorded, not assumed
    r = add_roofline(ops.filter(pl.col("kind") == "collective"), get_chip("h100_sxm")).row(0, named=True)
    # all-gather (n-1)/n = 7/8 of 65,536 B over NVLink4 450e9 B/s = 127.4 ns
    assert r["comm_ns"] == pytest.approx(7 / 8 * 65536 / 450e9 * 1e9)


@pytest.mark.parametrize("dims,types,conc", [
    ([[-1]], [BF], None), ([["x"]], [BF], None), ("not json", "[", None), ([], [], []),
    ([[4, 8], [], [], []], [BF, "Scalar", "Scalar", ""], ["", "0", "0", ""]),  # world_size 0
    ([[0]], [BF], [""]),
])
def test_collective_sizes_never_raise_and_unknown_is_none(dims, types, conc):
    from traceroof.costs import registered_collectives

    for op in registered_collectives():
        got = collective_size(op, dims, types, conc)
        assert got is None or (got[0] >= 0 and (got[1] is None or got[1] >= 1)), (op, got)
    assert collective_size("vllm::all_gather", [[4, 8], [], [], []], [BF, "Scalar", "Scalar", ""],
                           ["", "0", "0", ""]) is None  # a group of 0 is no group size


@pytest.mark.parametrize("name", [
    "void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*, int*, long*)",
    "void deep_ep::intranode::notify_dispatch<8>(int const*, int*, int)",
    "void deep_ep::intranode::cached_notify_combine<8>(void**, int*, int, int)",
    "void deep_ep::internode_ll::combine<false, 7168>(void*, int*, int)",
])
def test_deepep_kernels_are_all_to_all_collectives(name: str):
    assert kind_of_kernel(name) == "collective"
    ctype = pl.DataFrame({"op": [None], "name": [name]}, schema={"op": pl.String, "name": pl.String})
    assert ctype.select(collective_type_expr()).item() == "all_to_all"


def test_every_sized_collective_is_kind_collective_by_name():
    """costing sizes only ops whose kind is collective: every op with a size function must
    be one by its name alone (costs.kinds), or its size would never be read."""
    from traceroof.costs import kind_of_op, registered_collectives

    ops = registered_collectives()
    assert {"symm_mem::multimem_all_reduce_", "vllm::all_reduce", "vllm::all_gather", "deep_ep::dispatch"} <= set(ops)
    assert [op for op in ops if kind_of_op(op) != "collective"] == []


def test_deepep_op_message_is_its_tokens():
    # x [128, 7168] bf16 once: 128·7168·2 = 1,835,008 bytes
    assert collective_size("deep_ep::dispatch", [[128, 7168], [128, 8]], [BF, "long int"]) == (1835008, None)


# --------------------------------------------------------------------------- uncosted reasons
def test_b200_uncosted_ops_say_why():
    _, cov = apply_costs(read_trace(real(*B200)))
    assert cov.uncosted_why["vllm::moe_forward"].startswith("no expert weights recorded")
    assert cov.uncosted_why["vllm::unified_attention_with_output"].startswith("KV lengths not recorded")
    # moe_forward records hidden states and router logits only: no formula could fit
    assert cost_of("vllm::moe_forward", [[888, 3072], [888, 128], []], [BF, BF, ""]) is None
    assert uncosted_reason("vllm::moe_forward.default") == uncosted_reason("vllm::moe_forward")


def test_b200_coverage_rises_by_the_multimem_share():
    raw = load_json(real(*B200))["traceEvents"]
    ext_names = {e["args"]["External id"]: e["name"] for e in raw if e.get("cat") == "cpu_op"}
    dev = [e for e in raw if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    by_op = collections.Counter()
    for e in dev:
        by_op[ext_names.get(e["args"].get("External id"))] += float(e["dur"])
    share = by_op["symm_mem::multimem_all_reduce_"] / sum(by_op.values())
    ops, cov = apply_costs(read_trace(real(*B200)))
    # every multimem kernel is costed (a sized collective) and none of its time is uncosted
    mm = ops.filter(pl.col("op") == "symm_mem::multimem_all_reduce_")
    assert mm.height == 73 and mm["comm_bytes"].null_count() == 0 and mm["group_size"].null_count() == 0
    assert "symm_mem::multimem_all_reduce_" not in cov.uncosted_ns
    # what stays uncosted is the time of the ops the trace gives no cost for, from the raw JSON
    assert share == pytest.approx(0.1817, abs=5e-4)
    left = sum(by_op[k] for k in ("vllm::moe_forward", "vllm::unified_attention_with_output")) / sum(by_op.values())
    assert 1 - cov.costed_share == pytest.approx(left, abs=2e-3)


# --------------------------------------------------------------------------- FlashAttention-2
def _fa_fwd(q, k, v, causal=False, wl=-1, wr=-1):
    dims = [list(q), list(k), list(v)] + [[]] * 8
    types = [BF] * 3 + ["Scalar", "Scalar", "Scalar", "Scalar", "Scalar", "Scalar", "", "Scalar"]
    conc = ["", "", "", "0.", "0.125", str(causal), str(wl), str(wr), "0.", "", "False"]
    return cost_of("flash_attn::_flash_attn_forward", dims, types, conc)


@pytest.mark.parametrize("b,s_q,s_k,h_q,h_kv,d", [(2, 128, 256, 8, 8, 64), (1, 100, 300, 32, 8, 128)])
def test_flash_attn_forward_and_backward_equal_torch_sdpa_counts(b, s_q, s_k, h_q, h_kv, d):
    # torch counts [b, h, s, d]; flash-attn records [b, s, h, d]
    fwd = flop_counter.sdpa_flop_count((b, h_q, s_q, d), (b, h_q, s_k, d), (b, h_q, s_k, d))
    bwd = flop_counter.sdpa_backward_flop_count((b, h_q, s_q, d), (b, h_q, s_q, d), (b, h_q, s_k, d),
                                                (b, h_q, s_k, d))
    q, k = (b, s_q, h_q, d), (b, s_k, h_kv, d)
    c = _fa_fwd(q, k, k)
    assert c.flops == fwd and c.kind == "attention" and c.dtype == "bf16"
    # reads q, k, v (GQA: the smaller k/v); writes out [b, s_q, h_q, d] bf16 + lse [b, h_q, s_q] fp32
    assert c.bytes_read == 2 * (b * s_q * h_q * d + 2 * b * s_k * h_kv * d)
    assert c.bytes_written == 2 * b * s_q * h_q * d + 4 * b * h_q * s_q
    dims = [list(q), list(q), list(k), list(k), list(q), [b, h_q, s_q], list(q), list(k), list(k)] + [[]] * 9
    types = [BF] * 5 + ["float"] + [BF] * 3 + ["Scalar"] * 9
    conc = [""] * 9 + ["0.", "0.125", "False", "-1", "-1", "0.", "", "False", ""]
    c = cost_of("flash_attn::_flash_attn_backward", dims, types, conc)
    assert c.flops == bwd


def test_flash_attn_forward_counted_under_flop_counter_mode():
    """The FLOPs torch counts while running SDPA itself (CPU, math path) for the same shapes."""
    q, k = torch.randn(2, 4, 64, 32), torch.randn(2, 4, 96, 32)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    # the math backend: torch's own decomposition into bmm (CPU's fused kernel is not counted)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as fc:
        torch.nn.functional.scaled_dot_product_attention(q, k, k)
    c = _fa_fwd((2, 64, 4, 32), (2, 96, 4, 32), (2, 96, 4, 32))
    assert c.flops == fc.get_total_flops() == 4 * 2 * 4 * 64 * 96 * 32


def test_flash_attn_causal_is_bottom_right_and_windows_narrow_it():
    # s_q = s_k = 64, causal: 64·65/2 = 2080 pairs per head; 4·b·h·d per pair
    assert _fa_fwd((1, 64, 2, 16), (1, 64, 2, 16), (1, 64, 2, 16), causal=True).flops == 4 * 2 * 16 * 2080
    # decode: one query over 4096 keys sees them all (bottom-right)
    assert _fa_fwd((1, 1, 2, 16), (1, 4096, 2, 16), (1, 4096, 2, 16), causal=True).flops == 4 * 2 * 16 * 4096
    # sliding window left=7 with causal: row i sees min(i, 7) + 1 keys: Σ = 36 + 56·8 = 484
    assert _fa_fwd((1, 64, 1, 16), (1, 64, 1, 16), (1, 64, 1, 16), causal=True, wl=7).flops == 4 * 16 * 484


def _varlen(t_q, t_k, b, max_q, max_k, causal=False, paged=False):
    dims = [[t_q, 8, 64], [t_k, 2, 64], [t_k, 2, 64], [b + 1], [b + 1]] + [[]] * 10 + (
        [[b, 16]] if paged else [[]]) + [[], []]
    types = [BF] * 3 + ["int", "int"] + ["Scalar"] * 10 + (["int"] if paged else [""]) + ["", ""]
    conc = ["", "", "", "", "", str(max_q), str(max_k), "0.", "0.125", str(causal), "-1", "-1", "0.", "",
            "False", "", "", ""]
    return cost_of("flash_attn::_flash_attn_varlen_forward", dims, types, conc)


def test_flash_attn_varlen_equal_lengths_match_torch_formula_with_real_offsets():
    b, s_q, s_k = 3, 100, 200
    q, k = torch.empty(b * s_q, 8, 64), torch.empty(b * s_k, 2, 64)
    cq, ck = torch.arange(0, b * s_q + 1, s_q), torch.arange(0, b * s_k + 1, s_k)
    fwd = flop_counter._flash_attention_forward_flop(q, k, k, cq, ck, s_q, s_k)
    assert _varlen(b * s_q, b * s_k, b, s_q, s_k).flops == fwd == b * 4 * 8 * s_q * s_k * 64


def test_flash_attn_varlen_unequal_lengths_are_unknown_flops_exact_bytes():
    # lengths 50 and 150 (max 150): torch, given the real offsets, counts 4·8·64·(50² + 150²)
    q = torch.empty(200, 8, 64)
    kv = torch.empty(200, 2, 64)
    off = torch.tensor([0, 50, 200])
    real_flops = flop_counter._flash_attention_forward_flop(q, kv, kv, off, off, 150, 150)
    assert real_flops == 4 * 8 * 64 * (50**2 + 150**2)
    c = _varlen(200, 200, 2, 150, 150)
    assert c.flops is None and "FLOPs unknown" in c.note  # the offsets' values are not recorded
    # bytes are exact: q 200·8·64 + k, v 2·200·2·64 (bf16); out 200·8·64 bf16 + lse 8·200 fp32
    assert c.bytes_read == 2 * (200 * 8 * 64 + 2 * 200 * 2 * 64)
    assert c.bytes_written == 2 * 200 * 8 * 64 + 4 * 8 * 200


def test_flash_attn_varlen_with_a_block_table_is_unknown_with_its_reason():
    assert _varlen(32, 32, 32, 1, 1, paged=True) is None
    assert "KV lengths" in uncosted_reason("flash_attn::_flash_attn_varlen_forward")


def test_aten_varlen_flash_attention_no_longer_guesses_unequal_lengths():
    # 3 sequences, 250 tokens, recorded max 100: the lengths are not decided by the record
    dims = [[250, 8, 64], [250, 8, 64], [250, 8, 64], [4], [4]] + [[]] * 4
    types = [BF] * 3 + ["int", "int", "Scalar", "Scalar", "Scalar", "Scalar"]
    c = cost_of("aten::_flash_attention_forward", dims, types, ["", "", "", "", "", "100", "100", "0.", "False"])
    assert c.flops is None and c.bytes_read == 3 * 250 * 8 * 64 * 2


@pytest.mark.parametrize("op", ["_flash_attention_forward", "_flash_attention_backward",
                                "_efficient_attention_forward", "_efficient_attention_backward",
                                "_cudnn_attention_forward", "_scaled_dot_product_cudnn_attention_backward"])
def test_aten_varlen_max_lengths_follow_cum_seq_k_in_torch_schemas(op):
    from traceroof.costs import formula_for

    names = [a.name for a in getattr(torch.ops.aten, op).default._schema.arguments]
    lay = formula_for(f"aten::{op}").layout
    assert names[lay.cum_k + 1] in ("max_q", "max_seqlen_q") and names[lay.cum_k + 2] in ("max_k", "max_seqlen_k")


# --------------------------------------------------------------------------- fused MoE
def _reference_moe(x, w1, w2, ids):
    """A gated MoE forward written with torch ops: per (token, expert) the two GEMMs."""
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for e in ids[t].tolist():
            h = x[t:t + 1] @ w1[e].T  # [1, 2·d_ff]
            g, u = h.chunk(2, dim=-1)
            out[t:t + 1] += (torch.nn.functional.silu(g) * u) @ w2[e].T
    return out


def test_fused_experts_flops_equal_flop_counter_on_the_reference_moe():
    T, d, d_ff, E, topk = 5, 32, 48, 8, 2
    x, w1, w2 = torch.randn(T, d), torch.randn(E, 2 * d_ff, d), torch.randn(E, d, d_ff)
    ids = torch.stack([torch.randperm(E)[:topk] for _ in range(T)])
    with FlopCounterMode(display=False) as fc:
        _reference_moe(x, w1, w2, ids)
    dims = [[T, d], [E, 2 * d_ff, d], [E, d, d_ff], [T, topk], [T, topk]] + [[]] * 3
    types = [BF, BF, BF, "float", "int", "", "Scalar", "Scalar"]
    c = cost_of("vllm::outplace_fused_experts", dims, types)
    assert c.flops == fc.get_total_flops() == 6 * T * topk * d * d_ff
    # min(E, T·topk) = 8 experts' w1 and w2 read; hidden, topk weights (fp32) and ids (int32)
    assert c.bytes_read == 2 * T * d + 4 * T * topk * 2 + 8 * (2 * d_ff * d + d * d_ff) * 2
    assert c.bytes_written == 2 * T * d
    assert c.kind == "matmul" and c.dtype == "bf16"


def test_fused_experts_decode_reads_only_the_chosen_experts_and_fp8_weights_use_fp8():
    # T = 1, topk = 4 of 128 experts: 4 experts' weights (fp8, 1 byte) read, not 128
    dims = [[1, 2880], [128, 5760, 2880], [128, 2880, 2880], [1, 4], [1, 4]]
    c = cost_of("vllm::inplace_fused_experts", dims, [BF, F8, F8, "float", "int"])
    assert c.flops == 2 * 1 * 4 * (2880 * 5760 + 2880 * 2880)
    assert c.bytes_read == 2 * 2880 + 16 + 16 + 4 * (5760 * 2880 + 2880 * 2880)
    assert c.dtype == "fp8"


def test_fused_moe_kernel_launch_record():
    # first GEMM: A [M=16, K=256], B [E=8, N=512, K], C [16, topk=2, 512]: 2·16·2·512·256 FLOPs
    c = cost_of("fused_moe_kernel", [[16, 256], [8, 512, 256], [16, 2, 512]] + [[]] * 4, [BF] * 3 + ["Scalar"] * 4)
    with FlopCounterMode(display=False) as fc:  # the same products as 32 [1, 256] @ [256, 512]
        torch.randn(32, 256) @ torch.randn(256, 512)
    assert c.flops == fc.get_total_flops() == 2 * 16 * 2 * 512 * 256
    assert c.bytes_read == 2 * (16 * 256 + 8 * 512 * 256) and c.bytes_written == 2 * 16 * 2 * 512
    # second GEMM: A [M·topk, 512], B [8, 256, 512], C [16, 2, 256]
    c2 = cost_of("fused_moe_kernel", [[32, 512], [8, 256, 512], [16, 2, 256]], [BF] * 3)
    assert c2.flops == 2 * 32 * 256 * 512
    assert cost_of("fused_moe_kernel", [[32, 500], [8, 256, 512], [16, 2, 256]], [BF] * 3) is None
    assert kind_of_kernel("fused_moe_kernel") == "matmul"


def test_moe_sum_and_topk_softmax_hand_counts():
    c = cost_of("_moe_C::moe_sum", [[16, 4, 2880], [16, 2880]], [BF, BF])
    assert (c.flops, c.bytes_read, c.bytes_written) == (3 * 16 * 2880, 2 * 16 * 4 * 2880, 2 * 16 * 2880)
    c = cost_of("_moe_C::topk_softmax", [[16, 4], [16, 4], [16, 4], [16, 128]], ["float", "int", "int", BF])
    # softmax 5 per logit over [16, 128]; reads the bf16 logits, writes 3 x [16, 4] 4-byte results
    assert (c.flops, c.bytes_read, c.bytes_written) == (5 * 16 * 128, 2 * 16 * 128, 3 * 4 * 16 * 4)


def _paged_v1(b: int, max_seq_len: int):
    dims = [[b, 32, 128], [b, 32, 128], [1000, 8, 16, 16, 8], [1000, 8, 128, 16], [], [], [b, 64], [b], [], [],
            [], [], [], []]
    types = [BF, BF, "unsigned char", "unsigned char", "Scalar", "Scalar", "int", "int", "Scalar", "Scalar", "",
             "", "float", "float"]
    conc = ["", "", "", "", "8", "0.088", "", "", "16", str(max_seq_len), "", "fp8", "", ""]
    return cost_of("_C::paged_attention_v1", dims, types, conc)


def test_paged_attention_of_one_sequence_reads_its_max_seq_len():
    c = _paged_v1(1, 1000)
    with FlopCounterMode(display=False) as fc:  # one query over 1000 keys, 32 heads, d = 128
        q, k = torch.randn(1, 32, 1, 128), torch.randn(1, 32, 1000, 128)
        (q @ k.transpose(-1, -2)) @ k
    assert c.flops == fc.get_total_flops() == 4 * 32 * 1000 * 128
    # q 32·128 bf16 + K and V of 1000 tokens x 8 kv heads x 128 (fp8 cache, 1 byte) + the
    # block-table row [1, 64] and seq_lens [1] (int32)
    assert c.bytes_read == 2 * 32 * 128 + 2 * 1000 * 8 * 128 + 4 * 64 + 4
    assert c.bytes_written == 2 * 32 * 128
    assert _paged_v1(2, 1000) is None  # two sequences: their lengths are seq_lens' values
    assert "KV lengths" in uncosted_reason("_C::paged_attention_v1")


# --------------------------------------------------------------------------- serving ops
def test_cutlass_scaled_mm_equals_torch_mm_count_at_fp8():
    with FlopCounterMode(display=False) as fc:
        torch.randn(64, 128) @ torch.randn(128, 96)
    c = cost_of("_C::cutlass_scaled_mm", [[64, 96], [64, 128], [128, 96], [64, 1], [1, 96], []],
                [BF, F8, F8, "float", "float", ""])
    assert c.flops == fc.get_total_flops() == 2 * 64 * 96 * 128
    assert c.bytes_read == 64 * 128 + 128 * 96 + 4 * (64 + 96) and c.bytes_written == 2 * 64 * 96
    assert c.dtype == "fp8"


def test_fp4_gemms_count_the_unpacked_k():
    # a [m=32, k/2=64] packed (k = 128), b [n=256, 64]: 2·32·256·128
    c = cost_of("_C::cutlass_scaled_fp4_mm", [[32, 256], [32, 64], [256, 64], [32, 8], [256, 8], []],
                [BF, "unsigned char", "unsigned char", F8, F8, "float"])
    assert c.flops == 2 * 32 * 256 * 128 and c.dtype == "fp4"
    fp4 = "c10::Float4_e2m1fn_x2"
    c = cost_of("aten::_scaled_mm", [[32, 64], [64, 256], [32, 8], [256, 8], [], [], [], []],
                [fp4, fp4, F8, F8, "", "", "Scalar", "Scalar"], ["", "", "", "", "", "", "15", "False"])
    assert c.flops == 2 * 32 * 256 * 128 and c.dtype == "fp4"
    assert c.bytes_written == 2 * 32 * 256  # out_dtype 15 = bf16


def test_grouped_mm_3d_equals_torch_bmm_count_and_2d_is_unknown():
    with FlopCounterMode(display=False) as fc:
        torch.bmm(torch.randn(4, 16, 32), torch.randn(4, 32, 24))
    c = cost_of("aten::_grouped_mm", [[4, 16, 32], [4, 32, 24], [], [], []], [BF, BF, "", "", ""])
    assert c.flops == fc.get_total_flops() == 2 * 4 * 16 * 24 * 32
    assert (c.bytes_read, c.bytes_written) == (2 * (4 * 16 * 32 + 4 * 32 * 24), 2 * 4 * 16 * 24)
    c = cost_of("aten::_scaled_grouped_mm", [[4, 16, 32], [4, 32, 24], [4, 16], [4, 24], [], [], [], [], []],
                [F8, F8, "float", "float", "", "", "", "Scalar", "Scalar"], [""] * 7 + ["15", "False"])
    assert c.dtype == "fp8" and c.bytes_written == 2 * 4 * 16 * 24
    # tokens [M, k] split over 4 experts by offs: the split is in offs' values (not recorded)
    assert cost_of("aten::_grouped_mm", [[64, 32], [4, 32, 24], [4], [], []], [BF, BF, "int", "", ""]) is None
    assert "offs" in uncosted_reason("aten::_grouped_mm")


def _gemm_row(dtype: str, flops: float) -> pl.DataFrame:
    row = {"rank": 0, "device": 0, "stream": 7, "name": "nvjet_tst_128x128", "op": "aten::_scaled_mm",
           "kind": "matmul", "start_ns": 0, "dur_ns": 1_000_000, "dtype": dtype, "flops": flops,
           "bytes": 1e6, "cost_source": "shapes"}
    return conform(pl.DataFrame([row]), OP_SCHEMA)


@pytest.mark.parametrize("dtype,peak", [("fp8", 4.5e15), ("fp4", 9.0e15), ("bf16", 2.25e15)])
def test_scaled_gemms_are_judged_at_their_own_dtype_peak(dtype: str, peak: float):
    r = add_roofline(_gemm_row(dtype, 4.5e12), get_chip("b200")).row(0, named=True)
    # 4.5e12 FLOP in 1 ms = 4.5 PFLOP/s: 100 % at the fp8 peak, 50 % at fp4, 200 % at bf16
    assert r["peak_dtype"] == dtype and r["peak_flops_per_s"] == peak
    assert r["compute_ns"] == pytest.approx(4.5e12 / peak * 1e9)


def test_gated_activation_and_norm_quant_hand_counts():
    c = cost_of("_C::silu_and_mul", [[888, 1536], [888, 3072]], [BF, BF])
    assert c.flops == 5 * 888 * 1536  # silu 4 + mul 1 per output element
    assert (c.bytes_read, c.bytes_written) == (2 * 888 * 3072, 2 * 888 * 1536)
    assert cost_of("_C::silu_and_mul", [[888, 1536], [888, 3000]], [BF, BF]) is None
    assert cost_of("_C::gelu_tanh_and_mul", [[4, 8], [4, 16]], [BF, BF]).flops == 10 * 32
    c = cost_of("_C::fused_add_rms_norm_static_fp8_quant", [[16, 2880], [16, 2880], [16, 2880], [2880], [1], []],
                [F8, BF, BF, BF, "float", "Scalar"])
    assert c.flops == 16 * 2880 * 8  # add 1 + RMS norm 4 + quant 3
    # reads input, residual (bf16), weight, scale; writes fp8 result + bf16 residual
    assert c.bytes_read == 2 * 16 * 2880 * 2 + 2 * 2880 + 4
    assert c.bytes_written == 16 * 2880 + 2 * 16 * 2880
    c = cost_of("_C::dynamic_per_token_scaled_fp8_quant", [[16, 512], [16, 512], [16, 1], []], [F8, BF, "float", ""])
    assert (c.flops, c.bytes_read, c.bytes_written) == (3 * 16 * 512, 2 * 2 * 16 * 512, 16 * 512 + 4 * 16)


# --------------------------------------------------------------------------- recorded by Kineto
# The serving ops registered as torch custom ops with their real schemas (flash-attn 2.6
# ``flash_attn_interface.py``, vLLM ``fused_moe.py``), run on CPU under the profiler: what
# Kineto records for them is what the formulas read. The oracle is FlopCounterMode over the
# same computation written with torch ops.
def _sdpa_bshd(q, k, v, causal=False):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        o = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal, enable_gqa=True)
    return o.transpose(1, 2).contiguous()


FA_SCHEMA = ("(Tensor q, Tensor k, Tensor v, float dropout_p, float softmax_scale, bool causal, "
             "int window_size_left, int window_size_right, float softcap, Tensor? alibi_slopes, "
             "bool return_softmax) -> (Tensor, Tensor)")
MOE_SCHEMA = ("(Tensor hidden_states, Tensor w1, Tensor w2, Tensor topk_weights, Tensor topk_ids, "
              "str activation, bool apply_router_weight_on_input, bool use_fp8_w8a8) -> Tensor")


def _define_ops():
    if hasattr(torch.ops, "flash_attn") and hasattr(torch.ops.flash_attn, "_flash_attn_forward"):
        return

    def fa(q, k, v, dropout_p, softmax_scale, causal, window_size_left, window_size_right, softcap,
           alibi_slopes, return_softmax):
        return _sdpa_bshd(q, k, v, causal), torch.zeros(q.shape[0], q.shape[2], q.shape[1])

    def moe(hidden_states, w1, w2, topk_weights, topk_ids, activation, apply_router_weight_on_input,
            use_fp8_w8a8):
        return _reference_moe(hidden_states, w1, w2, topk_ids)

    torch.library.custom_op("flash_attn::_flash_attn_forward", fa, mutates_args=(), device_types="cpu",
                            schema=FA_SCHEMA)
    torch.library.custom_op("vllm::outplace_fused_experts", moe, mutates_args=(), device_types="cpu",
                            schema=MOE_SCHEMA)


def _recorded(fn, tmp_path: Path, name: str) -> dict:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        fn()
    prof.export_chrome_trace(str(tmp_path / "t.json"))
    (event,) = [e for e in load_json(tmp_path / "t.json")["traceEvents"] if e.get("name") == name]
    return event["args"]


def _cost_recorded(args: dict, name: str):
    return cost_of(name, args["Input Dims"], args["Input type"], args.get("Concrete Inputs"))


def test_recorded_flash_attn_forward_equals_flop_counter(tmp_path: Path):
    _define_ops()
    q, k = torch.randn(2, 48, 8, 16), torch.randn(2, 80, 2, 16)  # GQA 8 over 2
    args = _recorded(lambda: torch.ops.flash_attn._flash_attn_forward(q, k, k, 0.0, 0.25, False, -1, -1, 0.0,
                                                                       None, False), tmp_path,
                     "flash_attn::_flash_attn_forward")
    with FlopCounterMode(display=False) as fc:
        _sdpa_bshd(q, k, k)
    c = _cost_recorded(args, "flash_attn::_flash_attn_forward")
    assert c.flops == fc.get_total_flops() == 4 * 2 * 8 * 48 * 80 * 16
    # causal, bottom-right: row i of 48 sees i + 32 + 1 keys, Σ = 48·33 + 47·48/2 = 2712 pairs
    args = _recorded(lambda: torch.ops.flash_attn._flash_attn_forward(q, k, k, 0.0, 0.25, True, -1, -1, 0.0,
                                                                       None, False), tmp_path,
                     "flash_attn::_flash_attn_forward")
    assert _cost_recorded(args, "flash_attn::_flash_attn_forward").flops == 4 * 2 * 8 * 16 * 2712


def test_recorded_fused_experts_equals_flop_counter(tmp_path: Path):
    _define_ops()
    T, d, d_ff, E, topk = 6, 16, 24, 4, 2
    x, w1, w2 = torch.randn(T, d), torch.randn(E, 2 * d_ff, d), torch.randn(E, d, d_ff)
    ids = torch.stack([torch.randperm(E)[:topk] for _ in range(T)]).to(torch.int32)
    tw = torch.rand(T, topk)
    args = _recorded(lambda: torch.ops.vllm.outplace_fused_experts(x, w1, w2, tw, ids, "silu", False, False),
                     tmp_path, "vllm::outplace_fused_experts")
    with FlopCounterMode(display=False) as fc:
        _reference_moe(x, w1, w2, ids)
    c = _cost_recorded(args, "vllm::outplace_fused_experts")
    assert c.flops == fc.get_total_flops() == 6 * T * topk * d * d_ff
    # fp32: x, topk weights, int32 ids, min(4, 12) = 4 experts' w1 and w2; writes [T, d]
    assert c.bytes_read == 4 * (T * d + T * topk + T * topk + E * (2 * d_ff * d + d * d_ff))
    assert c.bytes_written == 4 * T * d
