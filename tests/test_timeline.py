"""The time base (accounting rules 1, 2, 3, 5): each device's timeline partitioned into buckets.

Inputs are built with ``fixtures/tracegen.py``, which records every kernel it writes (device
start, duration, stream, device, launch start) without importing traceroof; the oracles
below recompute windows and unions from that record, or from the raw JSON, by plain
interval arithmetic.
"""

from __future__ import annotations

import gzip
import json
import statistics
from pathlib import Path

from conftest import REAL, union_ns
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tracegen import Kernel, TraceBuilder

import traceroof
from traceroof.accounting import check
from traceroof.render.sections import summary as summary_rows

BF16 = ["c10::BFloat16", "c10::BFloat16"]
MM = ("aten::mm", [[64, 128], [128, 256]], BF16)



def _analyze(tmp: Path, b: TraceBuilder, name: str = "t.json.gz"):
    return traceroof.analyze(traceroof.read_trace(b.write(tmp / name)), chip="h100")


def _buckets(r) -> dict[str, dict]:
    """Bucket name → {ops, wall_ns, busy_ns} summed over devices."""
    out: dict[str, dict] = {}
    for b in r.summary.timeline.buckets:
        t = out.setdefault(b["bucket"], {"ops": 0, "wall_ns": 0, "busy_ns": 0})
        t["ops"] += b["ops"]
        t["busy_ns"] += b["busy_ns"]
        t["wall_ns"] = None if b["wall_ns"] is None else t["wall_ns"] + b["wall_ns"]
    return out


def _time_rules(r) -> list:
    return [v.line() for v in check(r) if v.rule in (1, 2, 3, 5)]


# --------------------------------------------------------------------------- lagging device


def _lagging(n_steps: int = 3) -> TraceBuilder:
    """A host far ahead of the device: no sync at step ends, 40 µs kernels launched every
    ~7 µs, so step n's kernels run long after step n's host window closed."""
    b = TraceBuilder(device_markers=False, host_op_ns=4_000)
    for n in range(n_steps):
        b.begin_step(n)
        for _ in range(4):
            b.op(*MM, [Kernel("sm90_gemm_bf16", 40_000, stream=7)])
        b.end_step(sync=False)
    return b


def test_lagging_device_steps_partition_the_device_timeline(tmp_path):
    b = _lagging()
    r = _analyze(tmp_path, b)
    assert _time_rules(r) == []
    ks = b.kernels  # 4 per step, in step order (one stream: they run back to back)
    starts = [ks[4 * n]["start_ns"] for n in range(3)]
    ends = starts[1:] + [ks[-1]["start_ns"] + ks[-1]["dur_ns"]]
    got = r.steps.sort("step")
    # each step runs from its first kernel to the next step's first kernel: 4 × 40 µs
    assert [e - s for s, e in zip(starts, ends)] == [160_000] * 3
    assert got["wall_ns"].to_list() == [160_000] * 3
    # busy summed over the steps = the plain union of every kernel
    assert int(got["busy_ns"].sum()) == union_ns([(k["start_ns"], k["start_ns"] + k["dur_ns"]) for k in ks])
    # queue lag: median over the step's kernels of device start − launch start
    want = [int(statistics.median(k["start_ns"] - k["launch_ns"] for k in ks[4 * n: 4 * n + 4])) for n in range(3)]
    assert got["queue_lag_ns"].to_list() == want
    assert want[2] > want[0] > 0  # the lag grows as the host runs ahead
    # device lag: device step start − host ProfilerStep start, from the raw JSON
    raw = json.loads(gzip.decompress((tmp_path / "t.json.gz").read_bytes()))
    host = sorted(float(e["ts"]) for e in raw["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#"))
    assert [round((s - (h * 1000 - b.base_ts_ns))) for s, h in zip(starts, host)] == got["device_lag_ns"].to_list()
    # the text summary has the line, the JSON the numbers
    rows = dict(summary_rows(r))
    assert "launch → device start" in rows["queue lag"]
    d = r.to_dict()["summary"]
    assert d["queue_lag_ns"] == statistics.mean(want)


# --------------------------------------------------------------------------- recording window


def _clean_steps(b: TraceBuilder, steps: int = 2) -> None:
    for n in range(steps):
        b.begin_step(n)
        b.op(*MM, [Kernel("sm90_gemm_bf16", 20_000, stream=7)])
        b.op(*MM, [Kernel("sm90_gemm_bf16", 10_000, stream=8)])
        b.end_step()


def test_warm_up_before_the_recording_window_is_outside(tmp_path):
    ref = TraceBuilder()
    _clean_steps(ref)
    b = TraceBuilder()
    b.host_t = 0
    _clean_steps(b)
    end = b.host_t + 1_000
    b.recording_window(0, end)
    # two ROCm-style warm-up kernels 3 s before the window, one after it closed
    b.stray_kernel("warmup_kernel", -3_000_000_000, 5_000)
    b.stray_kernel("warmup_kernel", -2_999_000_000, 5_000)
    b.stray_kernel("late_kernel", end + 50_000, 5_000)
    r = _analyze(tmp_path, b)
    r_ref = _analyze(tmp_path, ref, "ref.json.gz")
    assert _time_rules(r) == []
    bk = _buckets(r)
    assert bk["outside_recording"]["ops"] == 3 and bk["outside_recording"]["wall_ns"] is None
    assert bk["outside_recording"]["busy_ns"] == 15_000  # 3 × 5 µs, disjoint
    assert r.summary.timeline.outside_recording == {"after_recording": 1, "before_recording": 2}
    # the steps are those of the same trace without the strays
    cols = ["step", "wall_ns", "busy_ns", "idle_ns", "ops"]
    assert r.steps.select(cols).to_dicts() == r_ref.steps.select(cols).to_dicts()
    assert r.ops.filter(r.ops["bucket"] == "outside_recording")["step"].null_count() == 3
    assert sum("outside the recorded timeline" in w for w in r.warnings) == 1


def test_work_launched_inside_the_window_stays_in_its_step(tmp_path):
    # a device 3 ms behind the host, no sync: the last step's kernels run after Record Window
    # End (the host stopped the profiler), but were launched inside it: CUPTI records them
    # and they belong to their step, not outside the recording
    b = TraceBuilder(queue_ns=3_000_000)
    b.host_t = 0
    for n in range(3):
        b.begin_step(n)
        for _ in range(3):
            b.op(*MM, [Kernel("sm90_gemm_bf16", 50_000, stream=7)])
        b.end_step(sync=False)
    end = b.host_t + 1_000
    assert max(k["start_ns"] for k in b.kernels) > end  # the oracle: they do run after it
    b.recording_window(0, end)
    r = _analyze(tmp_path, b)
    assert _time_rules(r) == []
    assert r.summary.timeline.outside_recording == {}
    assert int(r.steps["ops"].sum()) == len(b.kernels) == 9
    assert not any("clock offset" in w for w in r.warnings)  # 3 ms is queued work
    # 3 s behind is a clock: said once
    b2 = TraceBuilder(queue_ns=3_000_000_000)
    _clean_steps(b2, 2)
    r2 = _analyze(tmp_path, b2, "offset.json.gz")
    assert sum("clock offset" in w for w in r2.warnings) == 1


def test_a_capture_never_ended_is_not_a_window(tmp_path):
    # a cudaStreamBeginCapture with no EndCapture a third of the way in: the kernels after it
    # ran (they are in the trace), so it must not swallow them nor drop steps
    ref = TraceBuilder()
    _clean_steps(ref, 3)
    b = TraceBuilder()
    _clean_steps(b, 1)
    b._runtime("cudaStreamBeginCapture", 2_000)
    for n in (1, 2):
        b.begin_step(n)
        b.op(*MM, [Kernel("sm90_gemm_bf16", 20_000, stream=7)])
        b.op(*MM, [Kernel("sm90_gemm_bf16", 10_000, stream=8)])
        b.end_step()
    r, r_ref = _analyze(tmp_path, b), _analyze(tmp_path, ref, "ref.json.gz")
    assert _time_rules(r) == []
    assert r.summary.step.complete_steps == r_ref.summary.step.complete_steps == 3
    assert "graph_capture" not in _buckets(r) and r.summary.timeline.capture_windows == 0
    assert r.steps.select("step", "ops", "busy_ns").to_dicts() == r_ref.steps.select("step", "ops", "busy_ns").to_dicts()
    assert sum("never ended" in w for w in r.warnings) == 1


def test_junk_timestamps_define_no_step(tmp_path):
    b = TraceBuilder()
    _clean_steps(b)
    launch = b.kernels[-1]["launch_ns"]
    b.restamp_last_kernel(launch - 10**14)  # 10^14 ns (27.8 h) before its own launch
    b.stray_kernel("zero_ts_kernel", 0, 3_000, raw_ts="0.000")  # CUPTI clock fallback
    r = _analyze(tmp_path, b)
    assert _time_rules(r) == []
    assert r.summary.timeline.outside_recording == {"before_launch": 1, "ts_zero": 1}
    # no 27-hour step: the walls are those of the kept kernels (device markers' windows)
    kept = [k for k in b.kernels if k.get("tag") not in ("restamped", "stray")]
    last_end = max(k["start_ns"] + k["dur_ns"] for k in kept)
    assert int(r.steps["wall_ns"].sum()) == last_end - kept[0]["start_ns"]
    assert r.summary.step.step_time_ns < 1e6  # under 1 ms, not 1e14 ns
    assert sum("outside the recorded timeline" in w for w in r.warnings) == 1


# --------------------------------------------------------------------------- graph capture


def test_graph_capture_is_its_own_bucket_not_idle_nor_partial(tmp_path):
    b = TraceBuilder()
    _clean_steps(b, 1)
    b.begin_step(1)
    b.op(*MM, [Kernel("sm90_gemm_bf16", 20_000, stream=7)])
    b.begin_capture()
    for _ in range(5):
        b.op(*MM, [Kernel("sm90_gemm_bf16", 20_000, stream=7)])
    b.end_capture()
    b.op(*MM, [Kernel("sm90_gemm_bf16", 20_000, stream=7)])
    b.end_step()
    r = _analyze(tmp_path, b)
    assert b.captured_launches == 5
    assert _time_rules(r) == []
    # the last step is complete: its captured launches have no device op by design
    assert not r.steps["partial"].any() and r.summary.step.complete_steps == 2
    raw = json.loads(gzip.decompress((tmp_path / "t.json.gz").read_bytes()))
    ev = {e["name"]: e for e in raw["traceEvents"] if "Capture" in str(e.get("name", ""))}
    cap_s = round(float(ev["cudaStreamBeginCapture"]["ts"]) * 1000) - b.base_ts_ns
    cap_e = round((float(ev["cudaStreamEndCapture"]["ts"]) + float(ev["cudaStreamEndCapture"]["dur"])) * 1000) - b.base_ts_ns
    bk = _buckets(r)
    # the device time under the capture window is the bucket, from when the device finished
    # the work launched before the capture (that is the step's work, not capture)
    dev_s = max([cap_s] + [k["start_ns"] + k["dur_ns"] for k in b.kernels if k["launch_ns"] < cap_s])
    inside = [k for k in b.kernels if dev_s <= k["start_ns"] < cap_e]
    assert bk["graph_capture"]["wall_ns"] == cap_e - dev_s and bk["graph_capture"]["ops"] == len(inside)
    assert bk["graph_capture"]["busy_ns"] == union_ns([(k["start_ns"], min(k["start_ns"] + k["dur_ns"], cap_e))
                                                         for k in inside])
    # step 1's wall leaves the capture time out: its window less the capture window
    s1 = r.steps.filter(r.steps["step"] == 1).row(0, named=True)
    mark = next(e for e in raw["traceEvents"] if e.get("cat") == "gpu_user_annotation" and e["name"] == "ProfilerStep#1")
    d0 = round(float(mark["ts"]) * 1000) - b.base_ts_ns  # the device starts step 1 here
    end = b.kernels[-1]["start_ns"] + b.kernels[-1]["dur_ns"]
    assert s1["wall_ns"] == (end - d0) - (min(cap_e, end) - max(dev_s, d0))
    assert s1["busy_ns"] + s1["idle_ns"] == s1["wall_ns"]
    assert r.summary.timeline.capture_windows == 1
    assert "under graph capture" in dict(summary_rows(r))["not in steps"]


# --------------------------------------------------------------------------- several devices


def test_two_devices_are_partitioned_each_on_its_own(tmp_path):
    b = TraceBuilder(device_markers=False)
    for n in range(2):
        b.begin_step(n)
        b.op(*MM, [Kernel("sm90_gemm_bf16", 30_000, stream=7, device=0)])
        b.op(*MM, [Kernel("sm90_gemm_bf16", 10_000, stream=7, device=1)])
        b.end_step()
    r = _analyze(tmp_path, b)
    assert _time_rules(r) == []
    ws = [w for w in r.summary.timeline.windows if w["bucket"] == "step"]
    assert sorted({w["device"] for w in ws}) == [0, 1]
    for dev in (0, 1):
        ks = [k for k in b.kernels if k["device"] == dev]
        mine = sorted((w for w in ws if w["device"] == dev), key=lambda w: w["step"])
        assert [w["start_ns"] for w in mine] == [k["start_ns"] for k in ks]  # one kernel per step
        assert mine[-1]["end_ns"] == ks[-1]["start_ns"] + ks[-1]["dur_ns"]
    # the step table is the per-device mean: step 1's walls are 30 µs and 10 µs
    last = r.steps.sort("step").row(-1, named=True)
    assert last["devices"] == 2 and last["wall_ns"] == 20_000 and last["busy_ns"] == 20_000


# --------------------------------------------------------------------------- the real trace


def test_trace_diff_test_steps_have_the_profiler_step_period():
    path = REAL / "HolisticTraceAnalysis/tests/data/trace_diff/test/test.json.gz"
    raw = json.loads(gzip.decompress(path.read_bytes()))
    ev = raw["traceEvents"]
    marks = sorted((float(e["ts"]), float(e["dur"])) for e in ev
                   if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("ProfilerStep#"))
    # the host steps run back to back (each starts within 100 µs of the previous end), so
    # the mean ProfilerStep duration is their period: 744 401 µs / 6 = 124.07 ms
    assert all(0 <= b[0] - (a[0] + a[1]) < 100 for a, b in zip(marks, marks[1:]))
    period_us = statistics.mean(d for _, d in marks)
    r = traceroof.analyze(traceroof.read_trace(path), chip="a100")
    assert _time_rules(r) == []
    st = r.summary.step
    assert st.complete_steps == 6
    assert abs(st.step_time_ns / 1000 - period_us) / period_us < 0.01
    # busy share = the union of every device op over the span they cover
    dev = [(round(float(e["ts"]) * 1000), round((float(e["ts"]) + float(e.get("dur", 0))) * 1000)) for e in ev
           if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    span = max(e for _, e in dev) - min(s for s, _ in dev)
    assert abs(st.busy_fraction - union_ns(dev) / span) < 1e-6


# --------------------------------------------------------------------------- random traces


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(st.tuples(st.integers(1_000, 60_000), st.sampled_from([7, 8, 9]), st.sampled_from([0, 1]),
                                   st.integers(0, 20_000)), min_size=1, max_size=5), min_size=2, max_size=4),
       st.booleans(), st.booleans(), st.booleans(), st.integers(0, 30_000))
def test_random_traces_keep_the_time_rules(tmp_path, plan, sync, capture, junk, queue_ns):
    b = TraceBuilder(device_markers=False, queue_ns=queue_ns)
    for n, step in enumerate(plan):
        b.begin_step(n)
        for i, (dur, stream, dev, idle) in enumerate(step):
            if idle:
                b.idle_host(idle)
            if capture and n == len(plan) - 1 and i == 0:
                b.begin_capture()
                b.op(*MM, [Kernel("sm90_gemm_bf16", dur, stream=stream, device=dev)])
                b.end_capture()
            b.op(*MM, [Kernel("sm90_gemm_bf16", dur, stream=stream, device=dev)])
        b.end_step(sync=sync)
    if junk:
        b.restamp_last_kernel(b.kernels[-1]["launch_ns"] - 10**12)
    r = _analyze(tmp_path, b)
    assert _time_rules(r) == []
    placed = [k for k in b.kernels if k.get("tag") != "restamped"]
    # per device, busy over the buckets = the plain union of its kernels
    for dev in {k["device"] for k in placed}:
        busy = sum(x["busy_ns"] for x in r.summary.timeline.buckets
                   if x["device"] == dev and x["bucket"] != "outside_recording")
        assert busy == union_ns([(k["start_ns"], k["start_ns"] + k["dur_ns"]) for k in placed if k["device"] == dev])
    assert _buckets(r).get("outside_recording", {"ops": 0})["ops"] == int(junk)
    assert r.ops.height == len(b.kernels)


def test_capture_gap_is_not_claimed_as_idle(tmp_path):
    # a device kept up with (3 µs kernels, one launched every 4.5 µs: gaps of 1.5 µs, under
    # the 10 µs idle threshold), then 60 launches captured into a graph: the device runs dry
    # under the capture window, by design
    b = TraceBuilder()
    b.begin_step(0)
    for _ in range(20):
        b.op(*MM, [Kernel("sm90_gemm_bf16", 3_000, stream=7)])
    b.begin_capture()
    for _ in range(60):
        b.op(*MM, [Kernel("sm90_gemm_bf16", 3_000, stream=7)])
    b.end_capture()
    for _ in range(20):
        b.op(*MM, [Kernel("sm90_gemm_bf16", 3_000, stream=7)])
    b.end_step()
    ks = b.kernels
    gap = ks[20]["start_ns"] - (ks[19]["start_ns"] + ks[19]["dur_ns"])
    assert gap > 100_000  # the premise: > 100 µs of device time with nothing to run
    r = _analyze(tmp_path, b)
    assert [v.line() for v in check(r)] == []
    claimed = [f for f in r.findings if f.kind in ("device_idle", "launch_bound")]
    assert claimed == [], [(f.kind, f.recoverable_ns) for f in claimed]
    # and the step's idle leaves the capture time out: wall − busy, with the window less it
    s0 = r.steps.row(0, named=True)
    assert s0["idle_ns"] == s0["wall_ns"] - s0["busy_ns"] and s0["idle_ns"] < gap


def test_mtia_ops_recorded_before_the_window_are_outside():
    # a real trace with device ops recorded up to 99 ms before Kineto's active window opened,
    # none with a launch: counted in outside_recording, not in the (unsegmented) step
    path = REAL / "HolisticTraceAnalysis/tests/data/mtia_inference_trace/mtia_inference_rank_0.json.gz"
    ev = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    ws = next(float(e["ts"]) for e in ev if str(e.get("name", "")).startswith("Iteration Start"))
    early = [e for e in ev if e.get("ph") == "X" and e.get("cat") == "mtia_ccp_events" and float(e["ts"]) < ws]
    r = traceroof.analyze(traceroof.read_trace(path), chip="h100")
    assert _time_rules(r) == []
    assert r.summary.timeline.outside_recording == {"before_recording": len(early)} and len(early) == 295
    out = r.ops.filter(r.ops["bucket"] == "outside_recording")
    assert out.height == 295 and out["launch_start_ns"].null_count() == 295
    # the step starts at the first op inside the window (1 µs rounding of the raw µs)
    first_in = min(float(e["ts"]) for e in ev if e.get("ph") == "X" and e.get("cat") == "mtia_ccp_events"
                   and float(e["ts"]) >= ws)
    origin = min(float(e["ts"]) for e in ev if e.get("ph") == "X" and e.get("cat") not in ("Trace",))
    assert abs(int(r.steps["start_ns"][0]) - (first_in - origin) * 1000) < 2


def test_a_device_idle_through_a_step_has_that_step_as_idle(tmp_path):
    # 2 GPUs, 4 steps, no device-side markers; GPU 1 runs nothing in step 1. Its step-0
    # window must end where the rank's step 1 starts (not run on through step 1), and step 1
    # on GPU 1 is a window of pure idle
    b = TraceBuilder(device_markers=False)
    for n in range(4):
        b.begin_step(n)
        for _ in range(3):
            b.op(*MM, [Kernel("gemm_a", 40_000, stream=7, device=0)], tag=str(n))
            if n != 1:
                b.op(*MM, [Kernel("gemm_b", 40_000, stream=7, device=1)], tag=str(n))
        b.end_step(sync=True)
    r = _analyze(tmp_path, b)
    assert _time_rules(r) == []
    win = {(w["device"], w["step"]): w for w in r.summary.timeline.windows if w["bucket"] == "step"}
    first = {n: min(k["start_ns"] for k in b.kernels if k["tag"] == str(n)) for n in range(4)}
    assert win[(1, 0)]["end_ns"] == win[(1, 1)]["start_ns"] == first[1]  # step 1's first kernel (on GPU 0)
    gpu1 = [k for k in b.kernels if k["device"] == 1]
    busy1 = union_ns([(k["start_ns"], k["start_ns"] + k["dur_ns"]) for k in gpu1])
    dev1 = next(d for d in r.summary.devices if d.device == 1)
    assert dev1.steps == 4 and dev1.busy_ns * 4 == busy1  # 9 kernels × 40 µs over 4 steps
    assert r.steps.filter(r.steps["step"] == 1)["devices"][0] == 2


def test_work_launched_before_a_capture_is_not_capture_time(tmp_path):
    # a device behind the host (no sync in step 1): the 3 kernels launched before
    # BeginCapture run while the host captures; that device time is step 1's work, not
    # graph capture (the window on the device starts when that work ends)
    b = TraceBuilder()
    for n in range(3):
        b.begin_step(n)
        for _ in range(3):
            b.op(*MM, [Kernel("gemm", 40_000, stream=7)], tag=str(n))
        if n == 1:
            b.begin_capture()
            for _ in range(5):
                b.op(*MM, [Kernel("gemm", 40_000, stream=7)])
            b.end_capture()
        b.end_step(sync=(n != 1))
    r = _analyze(tmp_path, b)
    assert _time_rules(r) == []
    s1 = r.steps.filter(r.steps["step"] == 1).row(0, named=True)
    assert (s1["ops"], s1["busy_ns"]) == (3, 3 * 40_000)  # the oracle: the 3 kernels of step 1
    bk = _buckets(r)
    assert bk.get("graph_capture", {"busy_ns": 0})["busy_ns"] == 0


def test_one_step_reports_that_steps_buckets_only(tmp_path):
    # --step N: the timeline section is step N's (its ops, its windows), and the rules hold
    b = TraceBuilder()
    _clean_steps(b, 3)
    path = b.write(tmp_path / "t.json.gz")
    r = traceroof.analyze(traceroof.read_trace(path), chip="h100", step=1)
    assert [v.line() for v in check(r)] == []
    assert {x["bucket"] for x in r.summary.timeline.buckets} == {"step"}
    assert sum(x["ops"] for x in r.summary.timeline.buckets) == r.ops.height == 2
    assert {w["step"] for w in r.summary.timeline.windows if w["bucket"] == "step"} == {1}


def test_time_of_ops_without_a_cost_model_is_its_own_part_of_the_breakdown(tmp_path):
    # one costed matmul (20 µs) and one op of no formula (30 µs, bound unknown), one after the
    # other on one stream: the 30 µs are "no cost model", not memory/latency-bound
    b = TraceBuilder()
    b.begin_step(0)
    b.op(*MM, [Kernel("sm90_gemm_bf16", 20_000, stream=7)])
    b.op("myext::mystery", [[64]], ["float"], [Kernel("mystery_kernel", 30_000, stream=7)])
    b.end_step()
    r = _analyze(tmp_path, b)
    s = r.steps.row(0, named=True)
    assert s["unknown_bound_ns"] == 30_000
    assert s["compute_bound_ns"] + s["memory_bound_ns"] + s["unknown_bound_ns"] == s["busy_ns"] == 50_000
    assert "no cost model 30 µs" in dict(summary_rows(r))["breakdown"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cuts=st.lists(st.integers(0, 60), min_size=1, max_size=8),
       ops=st.lists(st.tuples(st.integers(0, 1), st.integers(0, 70), st.integers(0, 30)), min_size=1, max_size=12))
def test_cut_pieces_equal_a_brute_force_intersection(cuts, ops):
    """``timeline._cut`` (one polars query) against intersecting every op with every segment
    in Python: an op ``[a, a + d)`` gets one piece per segment it overlaps, starting from the
    last segment starting at or before ``a`` (its head, kept even when empty), on its device.
    Segments: per device, consecutive ``[c_i, c_{i+1})`` over sorted cut points (equal points:
    zero-length segments), the last closed at 100; an op starting before the first segment has
    no piece (the real segments cover every placed op)."""
    import polars as pl

    from traceroof import timeline

    pts = sorted(cuts) + [100]
    seg_rows = [(0, dev, "step", i, pts[i], pts[i + 1]) for dev in (0, 1) for i in range(len(pts) - 1)]
    seg = pl.DataFrame(seg_rows, schema=timeline.SEGMENT_SCHEMA, orient="row")
    placed = pl.DataFrame(
        [(i, 0, dev, a, d, None, "gemm", "compute", 1.0) for i, (dev, a, d) in enumerate(ops)], orient="row",
        schema={"_i": pl.Int64, "rank": pl.Int32, "device": pl.Int32, "start_ns": pl.Int64, "dur_ns": pl.Int64,
                "launch_start_ns": pl.Int64, "kind": pl.String, "bound": pl.String, "flops": pl.Float64})
    want = []
    for i, (dev, a, d) in enumerate(ops):
        segs = sorted((s, e, k) for (_, sd, _, k, s, e) in seg_rows if sd == dev)
        k0 = max((j for j, (s, _, _) in enumerate(segs) if s <= a), default=None)
        if k0 is None:
            continue
        k1 = max(k0, max(j for j, (s, _, _) in enumerate(segs) if s <= max(a + d - 1, a)))
        for j in range(k0, k1 + 1):
            s, e, step = segs[j]
            ps, pe = max(a, s), min(a + d, e)
            if j == k0 or pe > ps:
                want.append((dev, ps, max(pe, ps), step, j == k0))
    pieces, head = timeline._cut(placed, seg)
    got = sorted(pieces.select("device", "start_ns", "end_ns", "step", "head").rows())
    assert got == sorted(want)
    assert head.height == sum(1 for w in want if w[4])
