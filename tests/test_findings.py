"""Findings (DESIGN §8) on generated traces with faults of known size, and on small inputs
built here for the cases BC-12, BC-13, BC-26 and BC-33 of ../shared/cases/CASES.md.

The injected values come from ``fixtures/make_faults.py``, which computes them from its own
device schedule without importing traceroof (``fixtures/faults/oracle_<chip>.json``).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import make_faults  # fixtures/ is on sys.path (conftest)
import pytest
from conftest import FIXTURES, kineto, write

from traceroof import analyze, read_trace
from traceroof.findings import Finding, FindingContext, _cap_to_window
from traceroof.findings import _common as C
from traceroof.findings.exposed_collectives import exposed_shares

FAULTS = FIXTURES / "faults"
THREE = ("unfused_elementwise", "launch_bound", "exposed_collectives")


def oracle(chip: str = "h100") -> dict:
    p = FAULTS / f"oracle_{chip}.json"
    if not p.exists():
        raise FileNotFoundError(f"{p} missing: run python fixtures/make_faults.py")
    return json.loads(p.read_text())


def report(name: str, chip: str = "h100", folder: Path = FAULTS, **kw):
    p = folder / f"{name}_{chip}.json.gz"
    if not p.exists():
        raise FileNotFoundError(f"{p} missing: run python fixtures/make_faults.py")
    return analyze(read_trace(p), **kw)


def of(rep, kind: str) -> list[dict]:
    return [f for f in rep.findings if f.kind == kind]


def close(got: float, want: float, rel: float = 0.10) -> bool:
    return abs(got - want) <= rel * abs(want)


def window_ok(rep) -> None:
    """Claims of every rank sum to at most that rank's window (BC-33)."""
    ops = rep.ops
    for r in set(ops["rank"].to_list()):
        o = ops.filter(ops["rank"] == r)
        win = int((o["start_ns"] + o["dur_ns"]).max() - o["start_ns"].min())
        claimed = sum(f.recoverable_ns for f in rep.findings if f.rank == r)
        assert claimed <= win + 1e-6, (r, claimed, win)


# --------------------------------------------------------------------------- generator


def test_committed_fault_traces_match_the_generator(tmp_path):
    """The files in fixtures/faults are what make_faults.py writes today (byte for byte)."""
    o = make_faults.generate("h100", tmp_path)
    assert o == oracle("h100")
    for t in o["traces"].values():
        assert (tmp_path / t["file"]).read_bytes() == (FAULTS / t["file"]).read_bytes(), (
            f"{t['file']} is stale: run python fixtures/make_faults.py")


# --------------------------------------------------------------------------- injected faults


def test_unfused_rmsnorm_chains_found_with_their_recoverable_time():
    inj = oracle()["traces"]["train_unfused"]["unfused_elementwise"]
    rep = report("train_unfused")
    found = of(rep, "unfused_elementwise")
    assert len(found) == 1
    f = found[0]
    assert f.evidence["chain"] == inj["chain"]
    assert f.occurrences == inj["chains"] == 27
    assert f.evidence["per_step"] == inj["chains_per_step"] == 9
    assert close(f.recoverable_ns, inj["recoverable_ns"])
    assert close(f.evidence["fused_bytes_per_chain"], inj["fused_bytes_per_chain"])
    assert f.evidence["measured_ns"] == inj["measured_ns"]
    # the arithmetic on the page: measured − fused roofline
    assert f.recoverable_ns == pytest.approx(f.evidence["measured_ns"] - f.evidence["fused_roofline_ns"])


def test_launch_bound_decode_found_with_the_idle_gaps():
    inj = oracle()["traces"]["decode_launch"]
    rep = report("decode_launch")
    found = of(rep, "launch_bound")
    assert len(found) == 1
    f = found[0]
    assert close(f.recoverable_ns, inj["launch_bound"]["recoverable_ns"])
    ev = f.evidence
    assert ev["median_launch_spacing_ns"] == inj["launch_bound"]["host_launch_interval_ns"]
    assert ev["median_launch_call_ns"] == inj["launch_bound"]["launch_call_ns"]
    assert ev["median_kernel_ns"] < ev["median_launch_spacing_ns"]
    assert len(ev["steps"]) == inj["steps"] == 16
    assert ev["kernels_per_step"] == inj["device_ops_per_step"]
    assert ev["busy_fraction"] < 0.5


def test_exposed_allreduce_found_with_its_roofline():
    o = oracle()["traces"]["train_allreduce"]
    ar = o["allreduce"]
    rep = report("train_allreduce")
    found = of(rep, "exposed_collectives")
    assert len(found) == 1
    f = found[0]
    ev = f.evidence
    assert close(f.recoverable_ns, o["exposed_collectives"]["recoverable_ns"])
    assert ev["message_bytes"] == ar["message_bytes"] and ev["group_size"] == ar["group_size"] == 8
    assert ev["count"] == ar["count"]
    assert ev["roofline_per_op_ns"] == pytest.approx(ar["roofline_ns"], rel=1e-6)
    assert ev["slowdown_vs_roofline"] == pytest.approx(ar["duration_ns"] / ar["roofline_ns"], rel=1e-3)
    assert ev["verdict"].startswith("exposed")  # 1.25× its roofline: exposed, not slow
    assert ev["rank_comm_union_ns"] == ar["comm_union_ns"]
    assert ev["measured_ns"] - ev["exposed_ns"] == pytest.approx(ev["hidden_ns"])


@pytest.mark.parametrize("twin", ["train_clean", "decode_graph", "train_allreduce_overlapped"])
def test_clean_twins_produce_none_of_the_three(twin):
    rep = report(twin)
    assert [f.title for f in rep.findings if f.kind in THREE] == []


def test_faults_found_on_another_chip(tmp_path):
    o = make_faults.generate("a100", tmp_path)["traces"]
    for name, kind in (("train_unfused", "unfused_elementwise"), ("decode_launch", "launch_bound"),
                       ("train_allreduce", "exposed_collectives")):
        rep = report(name, "a100", tmp_path)
        assert rep.chip.key == "a100_sxm_80gb"
        got = sum(f.recoverable_ns for f in of(rep, kind))
        assert close(got, o[name][kind]["recoverable_ns"]), (name, got)
    for twin in ("train_clean", "decode_graph", "train_allreduce_overlapped"):
        assert not [f for f in report(twin, "a100", tmp_path).findings if f.kind in THREE]


@pytest.mark.parametrize("name", sorted(make_faults.TRACES))
def test_generated_claims_fit_the_window(name):
    window_ok(report(name))


def test_only_the_selected_detectors_run():
    rep = report("decode_launch", findings=["launch_bound"])
    assert {f.kind for f in rep.findings} == {"launch_bound"}
    from traceroof.errors import UsageError

    with pytest.raises(UsageError, match="unknown"):
        report("decode_launch", findings=["nope"])


# --------------------------------------------------------------------------- BC-12


def kernel(name, ts, dur, stream=7, corr=None, **args):
    a = {"device": 0, "stream": stream, **args}
    if corr is not None:
        a["correlation"] = corr
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur, "args": a}


def rt(name, ts, dur, corr, tid=1):
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur,
            "args": {"correlation": corr}}


def run(tmp_path, events, chip="h100", name="t.json", **kw):
    return analyze(read_trace(write(tmp_path, name, kineto(events))), chip, **kw)


NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_execute_kernel__5x_cublas"


@pytest.mark.parametrize("name", [NCCL, NCCL.lower()])
def test_bc12_nccl_dev_kernel_exposed_5us(tmp_path, name):
    rep = run(tmp_path, [kernel(GEMM, 0, 10), kernel(name, 5, 10, stream=20)])
    found = of(rep, "exposed_collectives")
    assert len(found) == 1
    f = found[0]
    assert f.recoverable_ns == 5_000
    assert f.evidence["rank_comm_union_ns"] == 10_000
    assert f.evidence["rank_comm_exposed_ns"] == 5_000
    assert f.evidence["measured_ns"] == 10_000 and f.evidence["hidden_ns"] == 5_000


def test_bc12_no_collectives_no_finding_no_nan(tmp_path):
    rep = run(tmp_path, [kernel(GEMM, 0, 10), kernel(GEMM, 12, 10, stream=8)])
    assert of(rep, "exposed_collectives") == []
    json.dumps(rep.to_dict(), allow_nan=False)  # raises on NaN/inf anywhere


# --------------------------------------------------------------------------- BC-13


def graph_events(record=None, n=500):
    ev = [rt("cudaGraphLaunch", 0, 20, 42)]
    for i in range(n):
        if record is None or i in record:
            ev.append(kernel(f"graph_kernel_{i % 7}", 25 + 11 * i, 10, corr=42))
    return ev


def test_bc13_graph_replay_is_not_launch_bound(tmp_path):
    rep = run(tmp_path, graph_events())
    assert int(rep.ops["graph"].sum()) == 500
    assert of(rep, "launch_bound") == [] and of(rep, "device_idle") == []
    st = rep.steps.row(0, named=True)
    assert st["busy_ns"] / st["wall_ns"] == pytest.approx(10 / 11, abs=0.005)


def test_bc13_incomplete_capture_instead_of_idle(tmp_path):
    rep = run(tmp_path, graph_events(record={0, 124, 249, 374, 499}))
    lb = of(rep, "launch_bound")
    assert len(lb) == 1
    f = lb[0]
    assert f.evidence["incomplete_capture"] is True
    assert f.evidence["recorded_kernels"] == 5
    assert f.evidence["recorded_busy_fraction"] < 0.02
    assert f.recoverable_ns == 0 and "incomplete device capture" in f.title
    assert of(rep, "device_idle") == []  # the 99 % "idle" is not claimed


def test_bc13_control_the_same_kernels_launched_one_by_one_are_launch_bound(tmp_path):
    ev = []
    for i in range(500):  # host: one launch every 30 µs (5 µs call); kernel 10 µs, 2 µs after the call
        ev.append(rt("cudaLaunchKernel", 30 * i, 5, 1000 + i))
        ev.append(kernel(f"k{i % 7}", 30 * i + 7, 10, corr=1000 + i))
    rep = run(tmp_path, ev)
    lb = of(rep, "launch_bound")
    assert len(lb) == 1
    assert lb[0].recoverable_ns == 499 * 20_000
    assert lb[0].evidence["median_launch_spacing_ns"] == 30_000


# --------------------------------------------------------------------------- BC-33


def test_bc33_concurrent_collectives_counted_once_and_claims_fit(tmp_path):
    ev = [
        kernel(NCCL, 0, 10_000, stream=20),
        kernel("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 0, 10_000, stream=21),
        kernel(GEMM, 0, 5_000, stream=7),
        {"ph": "X", "cat": "cuda_sync", "name": "Stream Sync", "pid": 0, "tid": 7, "ts": 10_000, "dur": 2_000,
         "args": {"device": 0, "stream": 7}},
    ]
    rep = run(tmp_path, ev)
    ex = of(rep, "exposed_collectives")
    assert {f.evidence["collective"] for f in ex} == {"all_reduce", "all_gather"}
    assert sum(f.recoverable_ns for f in ex) == 5_000_000  # exposed once, shared by the two
    for f in ex:
        assert f.evidence["rank_comm_union_ns"] == 10_000_000  # not 20 ms
        assert f.evidence["rank_comm_exposed_ns"] == 5_000_000
        assert f.evidence["rank_compute_union_ns"] == 5_000_000  # the sync is not compute
    st = rep.steps.row(0, named=True)
    assert st["comm_ns"] == 10_000_000 and st["comm_exposed_ns"] == 5_000_000
    assert sum(f.recoverable_ns for f in rep.findings) <= 12_000_000


def test_exposed_shares_sum_to_the_exposed_union():
    rng = random.Random(7)
    for _ in range(200):
        comm = [(s, s + rng.randint(1, 40)) for s in (rng.randint(0, 100) for _ in range(rng.randint(1, 6)))]
        comp = C.union((s, s + rng.randint(1, 30)) for s in (rng.randint(0, 100) for _ in range(rng.randint(0, 5))))
        shares = exposed_shares(comm, comp)
        # brute force on a 1-ns grid
        covered = {t for s, e in comm for t in range(s, e)}
        busy = {t for s, e in comp for t in range(s, e)}
        assert sum(shares) == pytest.approx(len(covered - busy))
        assert C.total(C.subtract(C.union(comm), comp)) == len(covered - busy)
        assert C.total(C.intersect(C.union(comm), comp)) == len(covered & busy)
        for (s, e), x in zip(comm, shares):
            assert 0 <= x <= e - s


def test_cap_keeps_claims_within_the_window():
    import polars as pl

    from traceroof import get_chip
    from traceroof.trace import TraceMeta

    ops = pl.DataFrame({"rank": [0, 0], "start_ns": [0, 50], "dur_ns": [60, 50]})
    ctx = FindingContext(ops=ops, host=pl.DataFrame(), steps=pl.DataFrame(), chip=get_chip("h100"), meta=TraceMeta())
    fs = [Finding("a", "a", "low", 80.0, ""), Finding("b", "b", "low", 50.0, "")]
    for f in fs:
        f.rank = 0
    _cap_to_window(ctx, fs)
    assert [f.recoverable_ns for f in fs] == [80.0, 20.0]
    assert fs[1].evidence["recoverable_before_cap_ns"] == 50.0


# --------------------------------------------------------------------------- unfused: what is and is not a chain


def _ew_trace(names: list[str], op_prefix: str = "aten::") -> list[dict]:
    """Three pointwise ops on [4096, 4096] bf16, back to back, each with its cpu_op and shapes."""
    ev = []
    t = 0
    for i, (op, kname) in enumerate(names):
        corr, ext = 100 + i, 500 + i
        ev.append({"ph": "X", "cat": "cpu_op", "name": op, "pid": 1, "tid": 1, "ts": t, "dur": 8,
                   "args": {"External id": ext, "Input Dims": [[4096, 4096], [4096, 4096]],
                            "Input type": ["c10::BFloat16", "c10::BFloat16"], "Concrete Inputs": ["", ""]}})
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t + 1,
                   "dur": 3, "args": {"correlation": corr, "External id": ext}})
        ev.append(kernel(kname, 10 + 60 * i, 50, corr=corr))
        t += 8
    return ev


def test_bc26_triton_kernels_are_not_unfused(tmp_path):
    eager = _ew_trace([("aten::add", "void at::native::vectorized_elementwise_kernel<4, add>"),
                       ("aten::mul", "void at::native::vectorized_elementwise_kernel<4, mul>"),
                       ("aten::add", "void at::native::vectorized_elementwise_kernel<4, add>")])
    found = of(run(tmp_path, eager, name="eager.json"), "unfused_elementwise")
    assert len(found) == 1 and found[0].evidence["kernels_per_chain"] == 3
    # fused kernel: reads a, b (first op) once, every later input is an intermediate or seen; writes once
    assert found[0].evidence["fused_bytes_per_chain"] == 3 * 4096 * 4096 * 2
    trit = _ew_trace([(f"triton_poi_fused_add_mul_{i}", f"triton_poi_fused_add_mul_{i}") for i in range(3)])
    assert of(run(tmp_path, trit, name="triton.json"), "unfused_elementwise") == []


# --------------------------------------------------------------------------- idle, syncs, copies, fp32


def test_sync_stall_and_exposed_copy_are_claimed_once(tmp_path):
    ev = [
        rt("cudaLaunchKernel", 0, 5, 1), kernel(GEMM, 10, 100, corr=1),
        rt("cudaDeviceSynchronize", 20, 92, 2),  # returns at 112 µs, after the device drained at 110
        rt("cudaLaunchKernel", 150, 5, 3), kernel(GEMM, 160, 40, corr=3),  # device idle 110 -> 160
        rt("cudaMemcpyAsync", 160, 5, 4),
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0, "tid": 7,
         "ts": 200, "dur": 100, "args": {"device": 0, "stream": 7, "correlation": 4, "bytes": 1 << 24}},
    ]
    rep = run(tmp_path, ev)
    hd = {f.evidence["what"]: f for f in of(rep, "host_device_copies")}
    assert hd["syncs"].recoverable_ns == 50_000
    assert hd["syncs"].evidence["by_call"] == {"cudaDeviceSynchronize": 1}
    assert hd["copies"].recoverable_ns == 100_000
    assert hd["copies"].evidence["pageable_count"] == 1 and hd["copies"].evidence["direction"] == "HtoD"
    assert of(rep, "device_idle") == []  # the stall is not claimed twice
    window_ok(rep)


def test_device_idle_names_what_the_host_was_doing(tmp_path):
    ev = []
    corr = 1
    for i in range(3):
        base = i * 5_200
        for j in range(4):  # device-bound burst: queued kernels, no gaps
            ev.append(rt("cudaLaunchKernel", base + j, 1, corr))
            ev.append(kernel(GEMM, base + 10 + 50 * j, 50, corr=corr))
            corr += 1
        ev.append({"ph": "X", "cat": "cpu_op", "name": "DataLoader.__next__", "pid": 1, "tid": 1,
                   "ts": base + 10, "dur": 5_000, "args": {}})
    rep = run(tmp_path, ev)
    idle = of(rep, "device_idle")
    assert len(idle) == 1
    f = idle[0]
    assert f.recoverable_ns == 2 * (5_200 - 200) * 1_000  # two gaps of 5 ms between the bursts
    assert f.evidence["by_cause_ns"] == {"host": f.recoverable_ns}
    assert f.evidence["largest_gaps"][0]["host"][0][0] == "DataLoader.__next__"
    assert of(rep, "launch_bound") == []


def test_queued_work_waiting_is_not_host_bound(tmp_path):
    ev = [rt("cudaLaunchKernel", 0, 5, 1), kernel(GEMM, 10, 10, corr=1),
          rt("cudaStreamWaitEvent", 6, 2, 2),
          rt("cudaLaunchKernel", 12, 5, 3), kernel(GEMM, 5_000, 10, corr=3)]  # launched at 17 µs, ran at 5 ms
    rep = run(tmp_path, ev)
    assert sum(f.recoverable_ns for f in of(rep, "device_idle")) == 0
    wait = of(rep, "device_idle")
    assert len(wait) == 1 and wait[0].evidence["queued_wait_ns"] == 4_980_000


def test_fp32_matmul_on_cuda_cores(tmp_path):
    m = n = k = 4096
    flops = 2 * m * n * k
    dur_us = 2_500  # 55 TFLOP/s: under the H100 fp32 peak (66.9), so not TF32
    ev = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 10,
         "args": {"External id": 7, "Input Dims": [[m, k], [k, n]], "Input type": ["float", "float"]}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 1, "dur": 5,
         "args": {"correlation": 1, "External id": 7}},
        kernel("ampere_sgemm_128x128_nn", 10, dur_us, corr=1),
    ]
    rep = run(tmp_path, ev)
    found = of(rep, "fp32_matmul")
    assert len(found) == 1
    f = found[0]
    assert f.evidence["flops"] == flops and f.evidence["target_dtype"] == "tf32"
    want = dur_us * 1_000 * (1 - 66.9e12 / 494.7e12)
    assert f.recoverable_ns == pytest.approx(want, rel=1e-6)
    # the same kernel named as a TF32 tensor-core kernel is not flagged
    ev[2] = kernel("sm80_xmma_gemm_tf32f32_tf32f32_f32_nn_n_tilesize128x128x32", 10, dur_us, corr=1)
    assert of(run(tmp_path, ev, name="tf32.json"), "fp32_matmul") == []
