"""Several devices per process: every busy / idle / exposed figure is accounted per device.

Inputs built here (a Kineto trace of one process driving 3 GPUs with different busy shares,
built from raw events: ``TraceBuilder`` drives device 0 only) and the real 4-chip TPU trace
(``xprof/.../tpu_inference_2.xplane.pb``). Oracles: interval unions computed in the test
(:func:`_union_ns`, a plain sort-and-merge, independent of ``traceroof.intervals``), hand
arithmetic in comments.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import polars as pl
from conftest import real, union_ns
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tracegen import H100_SXM_PROPS

from traceroof import analyze, read_trace
from traceroof.accounting import check, check_findings
from traceroof.findings import Finding
from traceroof.render import markdown
from traceroof.web import figures

TPU = ("xprof", "xprof", "convert", "test_xplanes", "tpu_inference_2.xplane.pb")



def _per_device_busy(ops: pl.DataFrame) -> dict[int, int]:
    """Per device of ``ops``: the union (ns) of its ops' intervals over all its streams."""
    out = {}
    for (dev,), g in ops.partition_by("device", as_dict=True).items():
        out[int(dev)] = union_ns(list(zip(g["start_ns"].to_list(), (g["start_ns"] + g["dur_ns"]).to_list())))
    return out


# --------------------------------------------------------------------------- a built trace

#: per device: kernels ``(start µs, duration µs, stream)``; one process (no rank), 3 GPUs.
#: The window is [0, 1000) µs on every device (each has an op at 0 and one ending at 1000).
#: device 0: busy 100+300+400 = 800 µs (streams 7 and 8 overlap on [50, 100): union 0–100)
#: device 1: busy 100+100 = 200 µs, a 800 µs gap in the middle
#: device 2: busy 100+200+100 = 400 µs, gaps of 200 and 400 µs
KERNELS = {
    0: [(0, 100, 7), (50, 50, 8), (150, 300, 7), (600, 400, 7)],
    1: [(0, 100, 7), (900, 100, 7)],
    2: [(0, 100, 7), (300, 200, 7), (900, 100, 7)],
}
BUSY_US = {0: 800, 1: 200, 2: 400}
WALL_US = 1000


def _write(tmp_path: Path, kernels: dict[int, list[tuple[int, int, int]]] = KERNELS) -> Path:
    ev: list[dict] = [{"name": "process_name", "ph": "M", "ts": 0, "pid": 1, "tid": 0, "args": {"name": "python3"}}]
    for dev, ks in kernels.items():
        for i, (ts, dur, stream) in enumerate(ks):
            ev.append({"ph": "X", "cat": "kernel", "name": f"k{dev}_{i}", "pid": dev, "tid": stream, "ts": ts + 1000,
                       "dur": dur, "args": {"device": dev, "stream": stream, "correlation": 100 * dev + i + 1}})
    doc = {"schemaVersion": 1, "deviceProperties": [dict(H100_SXM_PROPS, id=d) for d in kernels],
           "traceEvents": ev, "displayTimeUnit": "ms"}
    p = tmp_path / "three_gpus.json"
    p.write_text(json.dumps(doc))
    return p


def test_built_trace_is_accounted_per_device(tmp_path):
    r = analyze(read_trace(_write(tmp_path)), "h100")
    assert sorted(r.ops["device"].unique().to_list()) == [0, 1, 2]
    rows = {d.device: d for d in r.summary.devices}
    assert sorted(rows) == [0, 1, 2]
    busy = _per_device_busy(r.ops)
    assert busy == {d: us * 1000 for d, us in BUSY_US.items()}  # the hand arithmetic above
    for dev, row in rows.items():
        assert row.wall_ns == WALL_US * 1000
        assert row.busy_ns == busy[dev]
        assert row.idle_ns == WALL_US * 1000 - busy[dev]
        assert 0.0 <= row.busy_fraction <= 1.0
        assert row.busy_fraction == busy[dev] / (WALL_US * 1000)
    # the header's busy share is the mean of the devices': (0.8 + 0.2 + 0.4) / 3 (the step
    # table rounds the per-device mean busy to whole ns: 466,667 ns, within 1 ns / 1 ms)
    assert abs(r.summary.step.busy_fraction - (0.8 + 0.2 + 0.4) / 3) <= 1 / (WALL_US * 1000)
    md = markdown.render(r)
    assert "46.7 % (busy time over device-time of 3 devices, 20.0 %–80.0 % per device" in md
    assert "## Devices" in md and "| 0 | 1 | 200 µs | 20.0 % | 800 µs |" in md


def test_built_trace_idle_findings_name_their_device_and_stay_within_its_idle(tmp_path):
    r = analyze(read_trace(_write(tmp_path)), "h100")
    idle = [f for f in r.findings if f.kind == "device_idle" and f.recoverable_ns > 0]
    # device 0's gaps: 50 µs (100→150) and 150 µs (450→600); device 1: 800 µs; device 2: 200 + 400 µs
    claimed = {f.device: f.recoverable_ns for f in idle}
    assert claimed == {0: 200_000.0, 1: 800_000.0, 2: 600_000.0}
    for f in idle:
        dev_idle = WALL_US * 1000 - BUSY_US[f.device] * 1000
        assert f.recoverable_ns <= dev_idle
        assert f.title.startswith(f"device {f.device} idle {f.recoverable_ns / (WALL_US * 1000):.0%}")
        assert f.evidence["device_idle_ns"] == dev_idle
        assert f.to_dict()["device"] == f.device
    assert not [w for w in r.warnings if "rule 6" in w]


def test_one_device_findings_carry_no_device_key(tmp_path):
    r = analyze(read_trace(_write(tmp_path, {1: KERNELS[1]})), "h100")
    (f,) = [f for f in r.findings if f.kind == "device_idle" and f.recoverable_ns > 0]
    assert f.device is None and "device" not in f.to_dict()
    assert f.recoverable_ns == 800_000.0 and f.title.startswith("device idle 80%")
    assert r.summary.devices is None


def test_rule6_per_device_bound_catches_what_the_rank_bound_misses(tmp_path):
    r = analyze(read_trace(_write(tmp_path)), "h100")
    # device 0's idle is 200 µs; the rank's summed idle is 200 + 800 + 600 = 1600 µs: a claim
    # of 500 µs on device 0 is within the rank's but not within the device's
    bad = Finding("device_idle", "x", "low", 500_000.0, "", rank=0, device=0)
    v = check_findings(dataclasses.replace(r, findings=[bad]))
    assert [x.device for x in v] == [0] and "device 0" in v[0].text and "its idle" in v[0].text
    ok = dataclasses.replace(bad, device=1)
    assert check_findings(dataclasses.replace(r, findings=[ok])) == []


def test_built_trace_timeline_has_a_row_per_device_and_stream(tmp_path):
    r = analyze(read_trace(_write(tmp_path)), "h100")
    fig = figures.timeline_figure(r.ops, findings=r.findings)
    want = sorted(f"device {d} · stream {s}" for d, ks in KERNELS.items() for s in {k[2] for k in ks})
    assert sorted(fig.layout.meta["rows"]) == want  # 4 rows: device 0 has two streams
    f1 = next(f for f in r.findings if f.kind == "device_idle" and f.device == 1)
    order = list(reversed(fig.layout.meta["rows"]))
    shape = fig.layout.shapes[[f for _, f in enumerate(r.findings) if f.start_ns is not None].index(f1)]
    i = order.index("device 1 · stream 7")
    assert (shape.y0, shape.y1) == (i - 0.5, i + 0.5)


def test_saved_report_keeps_the_devices(tmp_path):
    from traceroof.report import Report
    from traceroof.report_schema import validate_report

    r = analyze(read_trace(_write(tmp_path)), "h100")
    d = json.loads(r.to_json())
    validate_report(d)
    assert [x["busy_ns"] for x in d["summary"]["devices"]] == [800_000, 200_000, 400_000]
    back = Report.from_dict(d)
    assert back.summary.devices == r.summary.devices
    assert [f.device for f in back.findings] == [f.device for f in r.findings]


# --------------------------------------------------------------------------- the real 4-chip TPU trace


def _tpu():
    return analyze(read_trace(real(*TPU)))


def _step_unions(r, dev: int, steps: list[int]) -> list[int]:
    """The union (ns) of ``dev``'s ops in each step of ``steps`` (the oracle of its busy time)."""
    out = []
    for s in steps:
        g = r.ops.filter((pl.col("device") == dev) & (pl.col("step") == s))
        out.append(union_ns(list(zip(g["start_ns"].to_list(), (g["start_ns"] + g["dur_ns"]).to_list()))))
    return out


def test_tpu_busy_per_device_is_the_union_of_its_ops():
    r = _tpu()
    rows = {d.device: d for d in r.summary.devices}
    assert sorted(rows) == [0, 1, 2, 3]
    # no step annotation: steps inferred from the program's 100 executions (99 complete steps)
    complete = r.steps.filter(~pl.col("partial"))["step"].to_list()
    assert len(complete) == 99 and any("inferred" in w for w in r.warnings)
    peak = r.summary.hfu.peak_flops_per_s
    for dev, row in rows.items():
        busy = _step_unions(r, dev, complete)
        assert row.steps == 99 and abs(row.busy_ns - sum(busy) / len(busy)) <= 1e-6 * row.busy_ns
        assert 0.0 <= row.busy_fraction <= 1.0 and row.busy_ns <= row.wall_ns
        # HFU per device: its FLOPs per step / (its mean wall × peak)
        fl = float(r.ops.filter((pl.col("device") == dev) & pl.col("step").is_in(complete))["flops"].sum()) / 99
        assert abs(row.hfu - fl / (row.wall_ns * 1e-9) / peak) <= 1e-12
    mean = sum(row.busy_ns for row in rows.values()) / sum(row.wall_ns for row in rows.values())
    assert abs(r.summary.step.busy_fraction - mean) < 1e-6


def test_tpu_idle_findings_are_per_device_and_within_its_idle():
    r = _tpu()
    rows = {d.device: d for d in r.summary.devices}
    idle = [f for f in r.findings if f.kind == "device_idle"]
    # each chip is busy but for ~1.5 µs of each 784 ms step: nothing worth a finding
    for f in idle:
        assert f.device in rows and 0 < f.recoverable_ns <= 99 * (rows[f.device].wall_ns - rows[f.device].busy_ns)
    assert all(row.wall_ns - row.busy_ns < 10_000 for row in rows.values()) and not idle
    assert not [w for w in r.warnings if "accounting" in w.lower() or "rule" in w]
    md = markdown.render(r)
    assert "(busy time over device-time of 4 devices," in md and "× 4 devices × peak" in md


def test_tpu_timeline_draws_each_chip_on_its_own_row():
    r = _tpu()
    fig = figures.timeline_figure(r.ops, launches=False)
    pairs = r.ops.select("device", "stream").unique()
    want = sorted(f"device {d} · stream {s}" for d, s in pairs.iter_rows())
    assert sorted(fig.layout.meta["rows"]) == want and len(want) >= 4
    sub = figures.steps_figure(r.steps).layout.title.subtitle.text
    assert "means of each rank's 4 devices" in sub


def test_tpu_mfu_counts_the_chips():
    r = analyze(read_trace(real(*TPU)), model_flops_per_step=1e12)
    assert r.summary.mfu.devices == 4
    # 1e12 FLOPs / 92.5 s / (4 × 918 TFLOP/s): far below 1
    st = r.summary.step.step_time_ns
    assert abs(r.summary.mfu.value - 1e12 / (st * 1e-9) / (4 * r.summary.hfu.peak_flops_per_s)) < 1e-15


def test_built_trace_exposed_communication_is_per_device(tmp_path):
    # device 0: an all-reduce on [0, 100) µs beside a kernel on [0, 50) → 50 µs exposed;
    # device 1: the same all-reduce alone → 100 µs exposed; both end with a kernel at 1000 µs
    nccl = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
    ev: list[dict] = []
    for dev, ks in {0: [("k", 0, 50, 7), (nccl, 0, 100, 9), ("k", 900, 100, 7)],
                    1: [(nccl, 0, 100, 9), ("k", 900, 100, 7)]}.items():
        for i, (name, ts, dur, stream) in enumerate(ks):
            ev.append({"ph": "X", "cat": "kernel", "name": name, "pid": dev, "tid": stream, "ts": ts + 1000, "dur": dur,
                       "args": {"device": dev, "stream": stream, "correlation": 100 * dev + i + 1}})
    p = tmp_path / "two_gpus_comm.json"
    p.write_text(json.dumps({"schemaVersion": 1, "deviceProperties": [dict(H100_SXM_PROPS, id=d) for d in (0, 1)],
                             "traceEvents": ev}))
    r = analyze(read_trace(p), "h100")
    rows = {d.device: d for d in r.summary.devices}
    assert (rows[0].comm_ns, rows[0].comm_exposed_ns) == (100_000, 50_000)
    assert (rows[1].comm_ns, rows[1].comm_exposed_ns) == (100_000, 100_000)
    exp = {f.device: f.recoverable_ns for f in r.findings if f.kind == "exposed_collectives"}
    assert exp == {0: 50_000.0, 1: 100_000.0}
    for f in r.findings:
        if f.kind == "exposed_collectives":
            assert f.title.startswith(f"device {f.device}: ") and f.evidence["window_ns"] == 1_000_000
    assert not [w for w in r.warnings if "rule 6" in w]


# --------------------------------------------------------------------------- generated: 2–4 devices

_NAMES = ("sm90_gemm_bf16", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "Memcpy HtoD (Pinned -> Device)")


@st.composite
def _devices(draw):
    """Per device (2–4 of them): 1–8 ops ``(name, start µs, duration µs, stream)`` at random
    times on 1–2 streams (overlapping), kernels, collectives and copies mixed."""
    out = {}
    for dev in range(draw(st.integers(2, 4))):
        out[dev] = [(draw(st.sampled_from(_NAMES)), draw(st.integers(0, 5_000)), draw(st.integers(1, 800)),
                     draw(st.sampled_from([7, 9]))) for _ in range(draw(st.integers(1, 8)))]
    return out


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(devs=_devices())
def test_generated_devices_every_claim_within_its_device(devs, tmp_path_factory):
    ev = []
    for dev, ks in devs.items():
        for i, (name, ts, dur, stream) in enumerate(ks):
            cat = "gpu_memcpy" if name.startswith("Memcpy") else "kernel"
            ev.append({"ph": "X", "cat": cat, "name": name, "pid": dev, "tid": stream, "ts": ts + 1000, "dur": dur,
                       "args": {"device": dev, "stream": stream, "correlation": 1000 * dev + i + 1}})
    p = tmp_path_factory.mktemp("devs") / "t.json"
    p.write_text(json.dumps({"schemaVersion": 1, "traceEvents": ev,
                             "deviceProperties": [dict(H100_SXM_PROPS, id=d) for d in devs]}))
    r = analyze(read_trace(p), "h100")
    vs = check(r)
    assert vs == [], [v.line() for v in vs]
    lo = min(ts for ks in devs.values() for _, ts, _, _ in ks) * 1000
    hi = max(ts + d for ks in devs.values() for _, ts, d, _ in ks) * 1000
    # the oracle: each device's union from the raw events (µs → ns), not from the op table
    busy = {dev: union_ns([(ts * 1000, (ts + d) * 1000) for _, ts, d, _ in ks]) for dev, ks in devs.items()}
    rows = {d.device: d for d in r.summary.devices}
    assert sorted(rows) == sorted(devs)
    for dev, row in rows.items():
        assert row.busy_ns == busy[dev] and row.wall_ns == hi - lo
        assert 0.0 <= row.busy_fraction <= 1.0
    claimed: dict[int, float] = {}
    for f in r.findings:
        if f.kind in ("device_idle", "launch_bound", "host_device_copies", "exposed_collectives"):
            assert f.device in devs  # every time claim names its device
        if f.device is not None:
            claimed[f.device] = claimed.get(f.device, 0.0) + f.recoverable_ns
            if f.kind == "device_idle":
                assert f.recoverable_ns <= (hi - lo) - busy[f.device]
    for dev, c in claimed.items():
        assert c <= hi - lo


def test_device_without_ops_in_the_steps_keeps_its_row_and_is_named(tmp_path):
    # step 0 covers [0, 1000) µs (the rank's one device-side marker, on device 0); device 0
    # busy 600 µs and device 1 200 µs in it (device 1, without a marker of its own, takes the
    # rank's: its kernel starts inside it); device 2's only kernel runs at 3000 µs, after the
    # step: device 2 took no part in it, and the step's mean is over devices 0 and 1
    ev = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1, "tid": 1, "ts": 1000, "dur": 1000,
           "args": {}},
          {"ph": "X", "cat": "gpu_user_annotation", "name": "ProfilerStep#0", "pid": 0, "tid": 7, "ts": 1000,
           "dur": 1000, "args": {"device": 0}}]
    for dev, (ts, dur) in {0: (0, 600), 1: (100, 200), 2: (3000, 100)}.items():
        ev.append({"ph": "X", "cat": "kernel", "name": f"k{dev}", "pid": dev, "tid": 7, "ts": ts + 1000, "dur": dur,
                   "args": {"device": dev, "stream": 7, "correlation": dev + 1}})
    p = tmp_path / "absent.json"
    p.write_text(json.dumps({"schemaVersion": 1, "traceEvents": ev,
                             "deviceProperties": [dict(H100_SXM_PROPS, id=d) for d in range(3)]}))
    r = analyze(read_trace(p), "h100")
    rows = {d.device: d for d in r.summary.devices}
    assert (rows[0].steps, rows[0].busy_ns, rows[0].idle_ns) == (1, 600_000, 400_000)
    assert (rows[1].steps, rows[1].busy_ns, rows[1].idle_ns) == (1, 200_000, 800_000)
    assert (rows[2].steps, rows[2].busy_ns, rows[2].busy_fraction) == (0, None, None)
    # (0.6 + 0.2) / 2 = 40 %: the step table's mean over the devices present
    assert r.summary.step.busy_fraction == 0.4
    md = markdown.render(r)
    assert "40.0 % (busy time over device-time of 2 devices with ops in the complete steps (device 2 has none), 20.0 %–60.0 % per device" in md
    assert "| 0 | 2 | — | — | — |" in md
    # device 2's kernel is outside the steps, in no step and not idle
    assert [(b["device"], b["bucket"], b["ops"]) for b in r.summary.timeline.buckets if b["device"] == 2] == [
        (2, "before_first_step", 1)]


def _kineto(tmp_path: Path, ev: list[dict], n_devices: int, name: str) -> Path:
    p = tmp_path / name
    p.write_text(json.dumps({"schemaVersion": 1, "traceEvents": ev,
                             "deviceProperties": [dict(H100_SXM_PROPS, id=d) for d in range(n_devices)]}))
    return p


def test_built_launch_bound_is_per_device(tmp_path):
    # per device, 20 kernels, each launched (5 µs call) by its own host thread every 20 µs and
    # starting 6 µs after the call: device 0's kernels last 2 µs, device 1's 4 µs.
    # window: first start 6 µs, last end 20·19 + 6 + 4 = 390 µs → 384 µs.
    # launch gaps: device 0 19 × (20 − 2) = 342 µs, device 1 19 × (20 − 4) = 304 µs;
    # idle: device 0 384 − 20·2 = 344 µs, device 1 384 − 20·4 = 304 µs
    ev = []
    for dev, kdur in {0: 2, 1: 4}.items():
        for i in range(20):
            corr, t = 1000 * (dev + 1) + i, 1000 + 20 * i
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": dev + 1,
                       "ts": t, "dur": 5, "args": {"correlation": corr}})
            ev.append({"ph": "X", "cat": "kernel", "name": f"small{dev}", "pid": dev, "tid": 7, "ts": t + 6, "dur": kdur,
                       "args": {"device": dev, "stream": 7, "correlation": corr}})
    r = analyze(read_trace(_kineto(tmp_path, ev, 2, "launch.json")), "h100")
    lb = {f.device: f for f in r.findings if f.kind == "launch_bound"}
    assert {d: f.recoverable_ns for d, f in lb.items()} == {0: 342_000.0, 1: 304_000.0}
    assert {d: f.evidence["device_idle_ns"] for d, f in lb.items()} == {0: 344_000, 1: 304_000}
    assert lb[1].title.startswith("launch-bound: device 1 busy 21%")  # 80 / 384
    assert all(f.evidence["window_ns"] == 384_000 for f in lb.values())
    assert check(r) == []


def test_built_copies_are_per_device(tmp_path):
    # device 0: an HtoD copy on [0, 100) µs alone; device 1: the same copy beside a kernel on
    # [0, 60) µs → 40 µs exposed; both end with a kernel on [900, 1000) µs
    copy = "Memcpy HtoD (Pinned -> Device)"
    ev = []
    for dev, ks in {0: [(copy, 0, 100, 9), ("k", 900, 100, 7)],
                    1: [(copy, 0, 100, 9), ("k", 0, 60, 7), ("k", 900, 100, 7)]}.items():
        for i, (name, ts, dur, stream) in enumerate(ks):
            ev.append({"ph": "X", "cat": "gpu_memcpy" if name == copy else "kernel", "name": name, "pid": dev,
                       "tid": stream, "ts": ts + 1000, "dur": dur,
                       "args": {"device": dev, "stream": stream, "correlation": 100 * dev + i + 1, "bytes": 1 << 20}})
    r = analyze(read_trace(_kineto(tmp_path, ev, 2, "copies.json")), "h100")
    cp = {f.device: f for f in r.findings if f.kind == "host_device_copies"}
    assert {d: f.recoverable_ns for d, f in cp.items()} == {0: 100_000.0, 1: 40_000.0}
    assert cp[1].title.startswith("device 1: HtoD copies ×1")
    assert check(r) == []
