"""The accounting rules on random Kineto traces written here from raw events.

The generator below writes the JSON itself (not through ``fixtures/tracegen.py``), so it is a
second, independent description of what torch.profiler writes. Each trace draws: 1–3 devices
driven by one process, 1–2 streams per device, 1–4 ProfilerStep#N steps with a random number of
``aten::mm`` ops, a random queue lag that can grow (a device lagging the host, so kernels
launched in step N run during step N+1), and optionally a graph-capture window (launches that
produce no kernel), warm-up kernels before the recording window, and kernels with impossible
timestamps (ts 0, or 10^14 ns before their own launch).

Every analysis must hold every rule: ``accounting.check`` finds no violation, and the numbers it
cannot see hold too: no device op is lost from the op table, each step's busy is at most its
wall, and the device busy share lies in [0, 1].
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from traceroof.accounting import check
from traceroof.analysis import load_report

BASE_NS = 1_700_000_000_000_000  # an absolute-looking origin, ns (µs floats keep ns exactly)
PID, TID = 321, 321


@dataclass
class _Gen:
    """A raw Kineto event list under construction (times: ns from ``BASE_NS``)."""

    devices: int
    events: list[dict[str, Any]] = field(default_factory=list)
    t: int = 1_000_000  # host clock, ns
    corr: int = 10
    ext: int = 10
    free: dict[tuple[int, int], int] = field(default_factory=dict)  # (device, stream) -> free at
    kernels: int = 0  # device ops written

    def x(self, cat: str, name: str, pid: Any, tid: Any, ts_ns: int, dur_ns: int, **args: Any) -> None:
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid,
                            "ts": (BASE_NS + ts_ns) / 1000.0,
                            "dur": dur_ns / 1000.0, "args": args})

    def kernel(self, device: int, stream: int, ts_ns: int, dur_ns: int, corr: int, ext: int) -> None:
        self.x("kernel", "sm90_xmma_gemm_bf16bf16_bf16f32", device, stream, ts_ns, dur_ns,
               device=device, stream=stream, correlation=corr, **{"External id": ext})
        self.kernels += 1

    def op(self, device: int, stream: int, dur_ns: int, lag_ns: int, *, captured: bool = False) -> None:
        """One aten::mm launching one kernel (none while captured)."""
        self.ext += 1
        self.corr += 1
        start = self.t
        launch = start + 2_000
        self.x("cuda_runtime", "cudaLaunchKernel", PID, TID, launch, 3_000,
               correlation=self.corr, **{"External id": self.ext})
        if not captured:
            dev = max(launch + 3_000 + lag_ns, self.free.get((device, stream), 0))
            self.kernel(device, stream, dev, dur_ns, self.corr, self.ext)
            self.free[(device, stream)] = dev + dur_ns
        self.t = start + 8_000
        self.x("cpu_op", "aten::mm", PID, TID, start, self.t - start,
               **{"External id": self.ext, "Input Dims": [[512, 512], [512, 512]],
                  "Input type": ["c10::BFloat16", "c10::BFloat16"]})

    def runtime(self, name: str, dur_ns: int = 2_000) -> None:
        self.corr += 1
        self.x("cuda_runtime", name, PID, TID, self.t, dur_ns, correlation=self.corr)
        self.t += dur_ns + 1_000

    def document(self, window: tuple[int, int] | None) -> dict[str, Any]:
        meta = [{"name": "process_name", "ph": "M", "ts": 0, "pid": PID, "tid": 0, "args": {"name": "python3"}}]
        meta += [{"name": "process_name", "ph": "M", "ts": 0, "pid": d, "tid": 0, "args": {"name": f"GPU {d}"}}
                 for d in range(self.devices)]
        events = list(self.events)
        if window is not None:
            events.append({"name": "Iteration Start: PyTorch Profiler", "ph": "i", "s": "g",
                           "pid": "Traces", "tid": "Trace PyTorch Profiler", "ts": (BASE_NS + window[0]) / 1000.0})
            events.append({"name": "Record Window End", "ph": "i", "s": "g", "pid": "", "tid": "",
                           "ts": (BASE_NS + window[1]) / 1000.0})
        props = [{"id": d, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85018279936,
                  "computeMajor": 9, "computeMinor": 0, "numSms": 132} for d in range(self.devices)]
        return {"schemaVersion": 1, "deviceProperties": props, "record_shapes": 1,
                "traceroof": {"synthetic": True, "generator": "tests/test_accounting_random.py"},
                "traceEvents": meta + events, "baseTimeNanoseconds": 0}


@st.composite
def _traces(draw) -> _Gen:
    g = _Gen(devices=draw(st.integers(1, 3)))
    lag_growth = draw(st.integers(0, 200_000))  # ns the lag grows by per op
    capture_step = draw(st.one_of(st.none(), st.integers(0, 3)))
    warmup = draw(st.booleans())
    junk = draw(st.sampled_from([None, "zero", "before_launch"]))
    window_start = None
    if warmup:  # a kernel 3 s before the recording window starts (ROCm warm-up), no launch
        g.corr += 1
        g.ext += 1
        g.kernel(0, 7, 1_000, 10_000, g.corr, g.ext)
        g.t = 3_000_000_000
        window_start = g.t - 1_000_000
    lag = draw(st.integers(0, 2_000_000))
    n_steps = draw(st.integers(1, 4))
    for n in range(n_steps):
        h0 = g.t
        g.t += 1_000
        if capture_step == n:
            g.runtime("cudaStreamBeginCapture")
            for _ in range(draw(st.integers(1, 4))):
                g.op(0, 7, 10_000, lag, captured=True)
            g.runtime("cudaStreamEndCapture")
            g.runtime("cudaGraphInstantiate", 50_000)
        for _ in range(draw(st.integers(1, 6))):
            device = draw(st.integers(0, g.devices - 1))
            stream = draw(st.sampled_from([7, 13]))
            g.op(device, stream, draw(st.integers(2_000, 400_000)), lag)
            lag += lag_growth
            g.t += draw(st.integers(0, 300_000))
        g.ext += 1
        g.x("user_annotation", f"ProfilerStep#{n}", PID, TID, h0, g.t - h0, **{"External id": g.ext})
    if junk is not None:
        g.op(0, 7, 20_000, lag)
        k = g.events[-2]  # the kernel just written (the cpu_op comes after it)
        assert k["cat"] == "kernel"
        k["ts"] = 0 if junk == "zero" else k["ts"] - 1e14 / 1000.0
    end = max([g.t, *g.free.values()]) + 1_000_000
    g.window = (window_start, end) if window_start is not None else None  # type: ignore[attr-defined]
    return g


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(g=_traces())
def test_random_traces_hold_every_rule(g, tmp_path_factory):
    path = tmp_path_factory.mktemp("rand") / "t.json.gz"
    path.write_bytes(gzip.compress(json.dumps(g.document(getattr(g, "window", None))).encode(), mtime=0))
    report = load_report(path, "h100", jobs=1)
    vs = check(report)
    assert vs == [], [v.line() for v in vs]
    # nothing silently dropped: every kernel written is a device op of the report
    assert report.ops.height == g.kernels
    steps = report.steps
    assert (steps["busy_ns"] <= steps["wall_ns"]).all()
    assert (steps["busy_ns"] >= 0).all()
    st_ = report.summary.step
    assert st_ is None or st_.busy_fraction is None or 0.0 <= st_.busy_fraction <= 1.0
