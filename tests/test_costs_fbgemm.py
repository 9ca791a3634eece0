"""FBGEMM (torchrec/DLRM) cost formulas, the TBE forward/backward pairing, and PyTorch 1.x
collectives sized from their ``nccl:*`` annotation. Oracles: hand arithmetic in comments
(torch's FlopCounterMode counts no embedding-bag op: it registers only matmul, conv and
attention formulas, so it cannot be the oracle here)."""

from __future__ import annotations

import polars as pl
import pytest
from conftest import kineto

from traceroof import costs
from traceroof.costing import apply_costs
from traceroof.costing_tbe import pair_tbe
from traceroof.parsers import kineto as K

SPLIT = "fbgemm::split_embedding_codegen_lookup_rowwise_adagrad_function"
DENSE = "fbgemm::dense_embedding_codegen_lookup_function"
BWD = "torch::autograd::CppNode<SplitLookupFunction_rowwise_adagrad_Op>"


def split_args(L, bt, t, weighted, weights=96000, momentum=1000):
    """A recorded split TBE forward's (dims, types), the positions of the 2022 schema (as in
    HTA's trace_diff/control): indices at 11, offsets at 12, indice_weights at 14."""
    dims = [[0], [weights], [0], [0, 0], [t], [t], [t + 1], [], [], [t + 1], [], [L], [bt + 1], [],
            [L] if weighted else [], [], [0], [], [], [], [momentum], [0], [t], [t], [], [], [], [], []]
    types = ["float", "float", "float", "float", "int", "long", "int", "Scalar", "Scalar", "long", "Scalar",
             "long", "long", "Scalar", "float" if weighted else "", "", "int", "Scalar", "Scalar", "Scalar",
             "float", "float", "int", "long", "Scalar", "Scalar", "Scalar", "Scalar", "Scalar"]
    return dims, types


def with_total_d(n, pos, total_d):
    conc = [""] * n
    conc[pos] = str(total_d)
    return conc


# --------------------------------------------------------------------------- formulas
def test_split_forward_weighted_hand_arithmetic():
    dims, types = split_args(61072, 8192, 1, weighted=True)
    c = costs.cost_of(SPLIT, dims, types, with_total_d(len(dims), 7, 96))
    # L = 61072 rows of D = 96/1: 2 FLOPs (multiply by the weight, add) per element
    assert c.flops == 2 * 61072 * 96 == 11_725_824
    # rows 61072·96·4 + indices 61072·8 + offsets 8193·8 + weights 61072·4
    assert c.bytes_read == 23_451_648 + 488_576 + 65_544 + 244_288
    assert c.bytes_written == 8192 * 96 * 4  # the pooled output [B=8192, total_D=96]
    assert c.dtype == "fp32"


def test_split_forward_without_total_d_is_unknown_not_zero():
    dims, types = split_args(61072, 8192, 1, weighted=True)
    assert costs.cost_of(SPLIT, dims, types) is None


def test_split_forward_uses_uvm_weights_when_dev_weights_empty_and_offsets_must_fit():
    dims, types = split_args(100, 10, 2, weighted=False, weights=0)
    dims[2] = [5000]  # the tables in host memory (UVM)
    c = costs.cost_of(SPLIT, dims, types, with_total_d(len(dims), 7, 32))
    assert c.flops == 100 * 16  # T=2 tables, mean D = 32/2 = 16, unweighted: 1 add per element
    assert c.bytes_read == 100 * 16 * 4 + 100 * 8 + 11 * 8
    dims[12] = [12]  # 11 bags over T=2 tables: not B·T+1
    assert costs.cost_of(SPLIT, dims, types, with_total_d(len(dims), 7, 32)) is None


def test_dense_forward_hand_arithmetic():
    # DLRM worker0's dense lookup: T=2 (D_offsets [3]), B·T=32 (offsets [33]), L=32
    dims = [[112], [2], [3], [], [], [3], [], [32], [33], [], [], [], []]
    types = ["float", "long int", "int", "Scalar", "Scalar", "long int", "Scalar", "long int", "long int",
             "Scalar", "", "", "Scalar"]
    c = costs.cost_of(DENSE, dims, types, with_total_d(len(dims), 3, 32))
    assert c.flops == 32 * 16 == 512  # mean D = 32/2
    assert c.bytes_read == 32 * 16 * 4 + 32 * 8 + 33 * 8 == 2568
    assert c.bytes_written == 16 * 32 * 4 == 2048  # [B=16, total_D=32]


def test_backward_node_paired_hand_arithmetic_and_unpaired_unknown():
    fd, ft = split_args(61072, 8192, 1, weighted=True)
    conc = with_total_d(len(fd), 7, 96)
    c = costs.cost_of(BWD, [[8192, 96], *fd], ["float", *ft], ["", *conc])
    assert c.flops == 2 * 61072 * 96
    # grad_output 8192·96·4 + indices 61072·8 + offsets 8193·8 + weights 61072·4
    assert c.bytes_read == 3_145_728 + 488_576 + 65_544 + 244_288
    assert c.bytes_written == 61072 * 8  # the linearized int64 indices
    assert "lower bound" in c.note
    assert costs.cost_of(BWD, [[8192, 96]], ["float"]) is None  # grad_output alone
    # a grad_output whose rows are not the forward's B does not fit
    assert costs.cost_of(BWD, [[4096, 96], *fd], ["float", *ft], ["", *conc]) is None


def test_small_fbgemm_ops_hand_arithmetic():
    c = costs.cost_of("fbgemm::asynchronous_complete_cumsum", [[8192]], ["int"])
    assert (c.flops, c.bytes_read, c.bytes_written) == (8192, 8192 * 4, 8193 * 4)
    c = costs.cost_of("fbgemm::permute_pooled_embs_auto_grad", [[1024, 70904], [981], [980], [981], [980]],
                      ["float", "long", "long", "long", "long"])
    assert c.flops == 0 and c.bytes_written == 1024 * 70904 * 4
    assert c.bytes_read == 1024 * 70904 * 4 + (981 + 980 + 981 + 980) * 8
    c = costs.cost_of("fbgemm::bounds_check_indices", [[3], [2304], [385], [], [1], []],
                      ["long int", "long int", "long int", "Scalar", "long int", ""])
    assert (c.flops, c.bytes_read, c.bytes_written) == (0, (3 + 2304 + 385 + 1) * 8, 0)
    # a permutation of 24 features x 16 bags: lengths and indices read and written once
    c = costs.cost_of("fbgemm::permute_2D_sparse_data", [[24], [24, 16], [2304], [], []],
                      ["int", "int", "int", "", "Scalar"])
    assert c.bytes_read == (24 + 384 + 2304) * 4 and c.bytes_written == (384 + 2304) * 4
    # 979 of 951 features: a selection/repetition moves a number of indices not recorded; the
    # lower bound reads permute and lengths, writes the [979, 1024] lengths
    c = costs.cost_of("fbgemm::permute_sparse_features", [[979], [951, 1024], [13914359], []],
                      ["int", "int", "int", ""])
    assert (c.bytes_read, c.bytes_written) == ((979 + 951 * 1024) * 4, 979 * 1024 * 4)
    assert "lower bound" in c.note


def test_comm_message_bytes():
    assert costs.message_bytes([[8, 1024, 8816]], ["float"]) == 8 * 1024 * 8816 * 4 == 288_882_688
    assert costs.message_bytes([[24]], ["long int"]) == 24 * 8
    assert costs.message_bytes([[]], ["TensorList"]) is None
    assert costs.message_bytes([[6144]], None) is None
    assert costs.message_bytes([[0]], ["float"]) == 0.0  # an empty buffer is 0 bytes, recorded


# --------------------------------------------------------------------------- pairing
PID = 1


def op(name, ext, ts, dur, tid=PID, dims=None, types=None):
    a = {"External id": ext}
    if dims is not None:
        a.update({"Input Dims": dims, "Input type": types})
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": PID, "tid": tid, "ts": ts, "dur": dur, "args": a}


def launch(corr, ts, tid=PID):
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": PID, "tid": tid, "ts": ts,
            "dur": 2, "args": {"correlation": corr, "External id": corr}}


def kern(name, corr, ts, dur):
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
            "args": {"device": 0, "stream": 7, "correlation": corr, "External id": corr}}


def test_backward_nodes_pair_with_their_forwards_in_reverse_order():
    # two forwards with the same B = 8 (one table; four tables): the later backward node takes the
    # earlier forward; a third backward with B = 3 has no forward and stays unknown
    f1 = split_args(40, 8, 1, weighted=False)
    f2 = split_args(200, 32, 4, weighted=False, weights=4000, momentum=100)
    evs = [
        op(SPLIT, 1, ts=0, dur=20, dims=f1[0], types=f1[1]), launch(900, ts=5), kern("fwd1", 900, 1000, 10),
        op(SPLIT, 2, ts=30, dur=20, dims=f2[0], types=f2[1]), launch(901, ts=35), kern("fwd2", 901, 1020, 10),
        op(BWD, 3, ts=100, dur=20, tid=2, dims=[[8, 64]], types=["float"]), launch(902, ts=105, tid=2),
        kern("bwd_of_2", 902, 1040, 10),
        op(BWD, 4, ts=130, dur=20, tid=2, dims=[[8, 16]], types=["float"]), launch(903, ts=135, tid=2),
        kern("bwd_of_1", 903, 1060, 10),
        op(BWD, 5, ts=160, dur=20, tid=2, dims=[[3, 16]], types=["float"]), launch(904, ts=165, tid=2),
        kern("bwd_alone", 904, 1080, 10),
    ]
    t = K.read_bytes(kineto(evs), path="tbe.json")
    assert pair_tbe(t.host)[1] == 2
    ops, cov = apply_costs(t)
    by = {r["name"]: r for r in ops.iter_rows(named=True)}
    assert by["fwd1"]["flops"] == 40 * 16  # total_D 16 from its backward, T = 1
    assert by["fwd2"]["flops"] == 200 * 16  # total_D 64 over T = 4 tables
    assert by["bwd_of_2"]["flops"] == 200 * 16 and by["bwd_of_2"]["bytes"] == 8 * 64 * 4 + 200 * 8 + 33 * 8 + 200 * 8
    assert by["bwd_of_1"]["flops"] == 40 * 16
    assert by["bwd_alone"]["flops"] is None and by["bwd_alone"]["cost_source"] != "shapes"
    assert cov.uncosted_why[BWD] == "its recorded shapes do not fit its formula"  # unpaired


# --------------------------------------------------------------------------- collectives
def _comm_trace(sizes, world_size=4):
    evs = [op("c10d::allreduce_", 1, ts=0, dur=100, dims=[[], [], [], []], types=["TensorList", "", "Scalar", "Scalar"]),
           op("record_param_comms", 2, ts=10, dur=80)]
    for i, n in enumerate(sizes):
        evs.append({"ph": "X", "cat": "user_annotation", "name": "nccl:all_reduce", "pid": PID, "tid": PID,
                    "ts": 20 + 20 * i, "dur": 15, "args": {"External id": 3 + i, "Input Dims": [[n]],
                                                           "Input type": ["float"]}})
    evs += [launch(900, ts=25), kern("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", 900, 1000, 50)]
    return K.read_bytes(kineto(evs, distributedInfo={"rank": 0, "world_size": world_size}), path="comm.json")


def test_1x_collective_sized_from_its_nccl_annotation():
    ops, cov = apply_costs(_comm_trace([1000]))
    r = ops.row(0, named=True)
    assert r["op"] == "nccl:AllReduce"
    assert r["comm_bytes"] == 1000 * 4  # the annotation's buffer [1000] float
    assert r["group_size"] == 4  # not recorded: the world size
    assert r["cost_source"] == "shapes"
    assert cov.linked_costed_ns == cov.linked_ns == 50_000


@pytest.mark.parametrize("sizes", [[1000, 2000], []])
def test_collective_with_ambiguous_or_no_annotation_stays_unsized(sizes):
    ops, cov = apply_costs(_comm_trace(sizes))
    r = ops.row(0, named=True)
    assert r["comm_bytes"] is None and r["cost_source"] != "shapes"
    assert cov.linked_costed_ns == 0
    assert cov.uncosted_why["nccl:AllReduce"] == "no message size recorded"


def test_collective_without_world_size_has_bytes_but_no_cost():
    ops, cov = apply_costs(_comm_trace([1000], world_size=None))
    r = ops.filter(pl.col("kind") == "collective").row(0, named=True)
    assert r["comm_bytes"] == 4000 and r["group_size"] is None
    assert r["cost_source"] != "shapes" and cov.linked_costed_ns == 0


def test_assumed_group_size_is_said_in_a_warning():
    from traceroof import analyze

    r = analyze(_comm_trace([1000]), "h100")
    # the one kernel is all of the device time (50 us of 50 us)
    assert r.coverage is not None
    w = [x for x in r.warnings if "recorded no group size" in x]
    assert w == ["collectives (100.0% of device time) recorded no group size: their ring factor assumes "
                 "the whole world (world size 4)"]
    # without a world size nothing is assumed (the collective stays uncosted), and nothing said
    assert not any("recorded no group size" in x for x in analyze(_comm_trace([1000], world_size=None), "h100").warnings)


def test_uncosted_reasons_name_what_is_missing():
    evs = [op("aten::cat", 1, ts=0, dur=20, dims=[[], []], types=["TensorList", "Scalar"]), launch(900, ts=5),
           kern("CatArrayBatchedCopy<float, unsigned int, 1, 128, 1>", 900, 1000, 10),
           op("aten::nosuchop", 2, ts=30, dur=20, dims=[[4]], types=["float"]), launch(901, ts=35),
           kern("k_nosuch", 901, 1020, 10),
           op("aten::mm", 3, ts=60, dur=20), launch(902, ts=65), kern("gemm_noshapes", 902, 1040, 10),
           kern("k_unlaunched", 999, 1060, 10),
           launch(903, ts=95), kern("k_opless", 903, 1080, 10)]
    _, cov = apply_costs(K.read_bytes(kineto(evs), path="why.json"))
    assert cov.uncosted_why == {
        "aten::cat": "its Tensor[] sizes are not recorded",
        "aten::nosuchop": "no cost formula for this op",
        "aten::mm": "no shapes recorded",
        # correlation 999 has no runtime call in the trace: nothing says which op launched it
        "k_unlaunched": "no launch in the trace, so no framework op",
        # launched (correlation 903) outside any framework op
        "k_opless": "no framework op linked",
    }
    assert cov.uncosted_ns == {k: 10_000 for k in cov.uncosted_why}  # 10 us each
    assert cov.kernel_ns == 50_000 and cov.linked_ns == 30_000
    # by family: one per (kind, reason); the two unlinked kernels are kind "other" with two
    # different reasons, so five families of 10 us each, adding up to the 50 us uncosted
    fams = cov.families()
    assert sum(f["device_time_ns"] for f in fams) == sum(cov.uncosted_ns.values()) == 50_000
    assert {(f["why"], tuple(f["examples"])) for f in fams} == {(w, (k,)) for k, w in cov.uncosted_why.items()}
    assert {f["kind"] for f in fams if f["examples"] == ["aten::mm"]} == {"matmul"}


def test_tbe_kernels_are_kind_other_so_no_fusion_chain_takes_them():
    # the backward's kernels carry elementwise-looking names (linearize_index_kernel); the op is
    # a sort-and-scatter no elementwise fusion applies to
    f1 = split_args(40, 8, 1, weighted=False)
    evs = [op(SPLIT, 1, ts=0, dur=20, dims=f1[0], types=f1[1]), launch(900, ts=5),
           kern("void split_embedding_codegen_forward_unweighted_kernel<float>", 900, 1000, 10),
           op(BWD, 2, ts=100, dur=20, tid=2, dims=[[8, 16]], types=["float"]), launch(901, ts=105, tid=2),
           kern("void linearize_index_kernel<long>", 901, 1020, 10)]
    ops, _ = apply_costs(K.read_bytes(kineto(evs), path="kind.json"))
    assert ops["kind"].cast(pl.String).to_list() == ["other", "other"]
    assert ops["cost_source"].to_list() == ["shapes", "shapes"]
    assert costs.kind_of_kernel("void linearize_index_kernel<long>") == "elementwise"  # what the name alone says
