"""Intel XPU Kineto traces (Kineto's XPUPTI plugin): kernels are linked to their
``xpu_runtime`` launch by correlation and to the framework op by ``External id``, costed
from the op's shapes; the Level Zero ``xpu_driver`` calls inside each launch are counted,
not taken for second launches; the device family is recognised, the chip never guessed.

The input follows the layout the plugin writes (pytorch/kineto
``libkineto/src/plugin/xpupti/XpuptiActivityHandlers.cpp``): runtime calls on the host
thread with ``correlation`` and ``External id``; kernels on ``pid`` = device index,
``tid`` = SYCL queue, args ``correlation``, ``External id``, ``device``, ``sycl queue``,
``l0 queue``, no ``stream``."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from conftest import kineto, write

from traceroof import read_trace
from traceroof.analysis import analyze
from traceroof.errors import UnknownChipError
from traceroof.parsers.kineto_vocab import device_family

M, K, N = 256, 512, 1024
PID = 4242


def _xpu_events(steps: int = 2, per_step: int = 3, devices: int = 2) -> list[dict]:
    ev: list[dict] = [{"ph": "M", "pid": PID, "name": "process_name", "args": {"name": "python3"}}]
    for d in range(devices):
        ev += [{"ph": "M", "pid": d, "name": "process_name", "args": {"name": f"XPU {d}"}},
               {"ph": "M", "pid": d, "tid": 7 + d, "name": "thread_name", "args": {"name": f"Stream {7 + d}"}}]
    t, corr, ext = 1000.0, 100, 10
    for step in range(steps):
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": PID, "tid": PID,
                   "ts": t, "dur": 90.0 * per_step + 100, "args": {"External id": ext}})
        for j in range(per_step):
            ext += 1
            corr += 1
            d = (step * per_step + j) % devices
            t0 = t + 10 + 90 * j
            ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": PID, "tid": PID, "ts": t0, "dur": 50.0,
                       "args": {"External id": ext, "Input Dims": [[M, K], [K, N]],
                                "Input type": ["c10::BFloat16", "c10::BFloat16"], "Input Strides": [[K, 1], [N, 1]]}})
            ev.append({"ph": "X", "cat": "xpu_runtime", "name": "urEnqueueKernelLaunch", "pid": PID, "tid": PID,
                       "ts": t0 + 10, "dur": 10.0, "args": {"correlation": corr, "External id": ext}})
            ev.append({"ph": "X", "cat": "xpu_driver", "name": "zeCommandListAppendLaunchKernel", "pid": PID,
                       "tid": PID, "ts": t0 + 12, "dur": 5.0, "args": {"correlation": corr, "External id": ext}})
            ev.append({"ph": "X", "cat": "kernel", "name": "gemm_kernel", "pid": d, "tid": 7 + d, "ts": t0 + 40,
                       "dur": 30.0, "args": {"correlation": corr, "External id": ext, "device": d,
                                             "context": "0x0000000000000001", "sycl queue": 7 + d,
                                             "l0 queue": "0x00000000deadbeef", "kernel_id": corr}})
            ev.append({"ph": "s", "id": corr, "pid": PID, "tid": PID, "ts": t0 + 10, "cat": "ac2g", "name": "ac2g"})
            ev.append({"ph": "f", "id": corr, "pid": d, "tid": 7 + d, "ts": t0 + 40, "cat": "ac2g", "name": "ac2g",
                       "bp": "e"})
        t += 90.0 * per_step + 200
    return ev


@pytest.fixture()
def xpu(tmp_path) -> tuple[Path, list[dict]]:
    ev = _xpu_events()
    return write(tmp_path, "xpu.json", kineto(ev, deviceProperties=[])), ev


def test_every_xpu_kernel_is_linked_to_its_launch_and_op(xpu):
    path, ev = xpu
    kernels = [e for e in ev if e.get("cat") == "kernel"]
    runtime = {e["args"]["correlation"]: e for e in ev if e.get("cat") == "xpu_runtime"}
    ops = read_trace(path).ops.sort("start_ns")
    assert ops.height == len(kernels) == 6
    # N of N linked: a launch (start from the xpu_runtime call with the kernel's correlation)
    # and a framework op (the cpu_op with the launch's External id)
    assert ops["op"].to_list() == ["aten::mm"] * len(kernels)
    assert ops["correlation"].to_list() == [k["args"]["correlation"] for k in kernels]
    launch_ns = [round(runtime[k["args"]["correlation"]]["ts"] * 1000) for k in kernels]
    kernel_ns = [round(k["ts"] * 1000) for k in kernels]
    # queue lag launch -> kernel start, from the raw events: 30 µs each
    assert [s - lo for s, lo in zip(ops["start_ns"], ops["launch_start_ns"])] == [
        k - lo for k, lo in zip(kernel_ns, launch_ns)] == [30_000] * 6
    assert ops["device"].to_list() == [k["pid"] for k in kernels]
    assert ops["stream"].to_list() == [k["args"]["sycl queue"] for k in kernels]  # the queue id in tid


def test_driver_calls_are_counted_not_taken_for_launches(xpu):
    path, ev = xpu
    t = read_trace(path)
    n_driver = sum(1 for e in ev if e.get("cat") == "xpu_driver")
    n_runtime = sum(1 for e in ev if e.get("cat") == "xpu_runtime")
    assert t.meta.stats["events[xpu_driver]"] == n_driver == 6
    runtime_rows = t.host.filter(pl.col("cat") == "runtime")
    assert runtime_rows.height == n_runtime and set(runtime_rows["name"]) == {"urEnqueueKernelLaunch"}
    assert t.meta.stats.get("links_dropped_rule8", 0) == 0


def test_linked_xpu_kernels_are_costed_from_shapes(xpu):
    path, _ = xpu
    rep = analyze(read_trace(path), "h100")
    ops = rep.ops
    assert set(ops["cost_source"]) == {"shapes"}
    # aten::mm [M,K]x[K,N]: 2·M·K·N FLOPs = 2·256·512·1024 = 268,435,456
    assert ops["flops"].to_list() == [2.0 * M * K * N] * 6
    assert rep.coverage.shapes_share == pytest.approx(1.0)


def test_an_xpu_trace_names_its_family_and_never_gets_a_guessed_chip(xpu, tmp_path):
    path, ev = xpu
    t = read_trace(path)
    assert device_family(t.meta.stats) == "Intel XPU"
    with pytest.raises(UnknownChipError, match=r"an Intel XPU trace .*pass --chip"):
        analyze(t, None)
    # a device the trace names but the chip table does not know: an error, not a default
    named = write(tmp_path, "named.json", kineto(ev, deviceProperties=[
        {"id": 0, "name": "Intel(R) Data Center GPU Max 1550", "totalGlobalMem": 68702699520}]))
    with pytest.raises(UnknownChipError):
        analyze(read_trace(named), None)


def test_a_cuda_trace_names_no_family():
    assert device_family({"events[cuda_runtime]": 5, "events[kernel]": 5}) is None

