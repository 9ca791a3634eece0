"""Copies and fills recorded without a byte count (ROCm's ``gpu_memcpy`` events carry none)
take it from the tensor their framework op moves (``costing._copy_sizes_from_op``)."""

from __future__ import annotations

import gzip
import json

import polars as pl
from conftest import kineto, real

from traceroof import read_trace
from traceroof.costing import apply_costs
from traceroof.parsers import kineto as K

PID = 100


def op(name, ts, dur, dims, types):
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": PID, "tid": PID, "ts": ts, "dur": dur,
            "args": {"External id": ts, "Input Dims": dims, "Input type": types}}


def call(name, corr, ts, ext=None):
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": PID, "tid": PID, "ts": ts + 1, "dur": 2,
            "args": {"correlation": corr, "External id": ts if ext is None else ext}}


def copy(name, corr, ts, cat="gpu_memcpy", nbytes=None):
    a = {"device": 0, "stream": 7, "correlation": corr}
    if nbytes is not None:
        a["bytes"] = nbytes
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": 5, "args": a}


def test_copies_without_a_byte_count_take_their_ops_tensor_size():
    evs = [
        # copy_(self, src): the source [5, 128] float32 crosses the link: 5·128·4 = 2,560 bytes
        op("aten::copy_", 0, 10, [[5, 128], [5, 128], []], ["float", "float", "Scalar"]),
        call("hipMemcpyWithStream", 1, 0), copy("Memcpy HtoD (Host -> Device)", 1, 1000),
        # clone of [4, 4] bf16 on the device: read and written, 2 · 4·4·2 = 64 bytes of HBM
        op("aten::clone", 20, 10, [[4, 4], []], ["c10::BFloat16", ""]),
        call("hipMemcpyAsync", 2, 20), copy("Memcpy DtoD (Device -> Device)", 2, 1010),
        # zero_ of [1000] int64: a fill writing 8,000 bytes
        op("aten::zero_", 40, 10, [[1000]], ["long int"]),
        call("hipMemsetAsync", 3, 40), copy("Memset (Device)", 3, 1020, cat="gpu_memset"),
        # an op whose copy is not one of its tensors (index_put_): stays unknown, never guessed
        op("aten::index_put_", 60, 10, [[8, 8], [], [8]], ["float", "TensorList", "float"]),
        call("hipMemcpyAsync", 4, 60), copy("Memcpy HtoD (Host -> Device)", 4, 1030),
        # a copy whose byte count the trace carries keeps it (not the op's 2,560 bytes)
        op("aten::copy_", 80, 10, [[5, 128], [5, 128], []], ["float", "float", "Scalar"]),
        call("hipMemcpyAsync", 5, 80), copy("Memcpy HtoD (Host -> Device)", 5, 1040, nbytes=1234),
    ]
    ops, cov = apply_costs(K.read_bytes(kineto(evs), path="copies.json"))
    got = {r["start_ns"] // 1000: (r["bytes"], r["flops"], r["cost_source"]) for r in ops.iter_rows(named=True)}
    assert got[1000] == (2560.0, 0.0, "shapes")
    assert got[1010] == (64.0, 0.0, "shapes")
    assert got[1020] == (8000.0, 0.0, "shapes")
    assert got[1030][0] is None and got[1030][2] != "shapes"
    assert got[1040] == (1234.0, 0.0, "trace")
    assert cov.uncosted_why == {"aten::index_put_": "no byte count in the trace"}


def test_an_op_with_two_copies_moves_its_tensor_once():
    # one copy_ of [5, 128] float (2,560 bytes) issued as two chunks of 30 and 10 µs: the
    # tensor crosses the link once, 1,920 + 640 bytes by duration
    evs = [op("aten::copy_", 0, 10, [[5, 128], [5, 128], []], ["float", "float", "Scalar"]),
           call("hipMemcpyAsync", 1, 0), call("hipMemcpyAsync", 2, 4, ext=0)]
    a, b = copy("Memcpy HtoD (Host -> Device)", 1, 1000), copy("Memcpy HtoD (Host -> Device)", 2, 1100)
    a["dur"], b["dur"] = 30, 10
    ops, _ = apply_costs(K.read_bytes(kineto(evs + [a, b]), path="chunks.json"))
    assert ops.sort("start_ns")["bytes"].to_list() == [1920.0, 640.0]


def test_rocm_minitoy_copies_are_costed_from_their_ops():
    path = real("HolisticTraceAnalysis/tests/data/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz")
    doc = json.load(gzip.open(path))
    # the oracle from the raw JSON: each gpu_memcpy's copy_ op (same External id) and its
    # source tensor's recorded shape, float32 (4 bytes per element)
    ops_by_ext = {e["args"]["External id"]: e for e in doc["traceEvents"] if e.get("cat") == "cpu_op"}
    want = []
    for e in doc["traceEvents"]:
        if e.get("cat") == "gpu_memcpy":
            o = ops_by_ext[e["args"]["External id"]]
            assert o["name"] == "aten::copy_" and o["args"]["Input type"][1] == "float"
            n = 1
            for d in o["args"]["Input Dims"][1]:
                n *= d
            want.append(4.0 * n)
    assert want == [2560.0, 2560.0]
    ops, cov = apply_costs(read_trace(path))
    got = ops.filter(pl.col("kind") == "memcpy").sort("start_ns")["bytes"].to_list()
    assert got == want
    assert cov.costed_share == 1.0  # before: 74.4 %, the two copies were 25.6 % of device time
