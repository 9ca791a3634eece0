"""Steps on their own: the per-step breakdown against an independent oracle.

The traces are written by ``fixtures/tracegen.py``, which records every kernel it emits
(start, duration, stream) without importing traceroof; the oracle below recomputes each
step's window, busy time (a union over streams) and idle time from that record by plain
interval arithmetic. traceroof's step table must agree exactly (integer ns).
"""

from __future__ import annotations

from pathlib import Path

from conftest import union_ns
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tracegen import Kernel, TraceBuilder

import traceroof

BF16 = ["c10::BFloat16", "c10::BFloat16"]



def _build(plan: list[list[tuple[int, int, int]]], host_gap_ns: int = 0) -> TraceBuilder:
    """One step per entry of ``plan``; each step a list of (duration ns, stream, idle host ns
    before the op) kernels, one framework op each."""
    b = TraceBuilder()
    for n, step in enumerate(plan):
        b.begin_step(n)
        for dur, stream, idle in step:
            if idle:
                b.idle_host(idle)
            b.op("aten::mm", [[64, 128], [128, 256]], BF16, [Kernel("sm90_xmma_gemm_bf16", dur, stream=stream)])
        if host_gap_ns:
            b.idle_host(host_gap_ns)
        b.end_step()
    return b


def _oracle(b: TraceBuilder, plan: list[list]) -> list[dict[str, int]]:
    """Per step: window (the step's first kernel start, as the device-side ProfilerStep
    annotation tracegen writes, → the next step's first kernel start; the last step → its
    last kernel end), busy (union over streams of every kernel, clipped to the window),
    idle, op count (kernels starting in the window)."""
    per: list[list[dict]] = []
    # tracegen emits the kernels of step n after begin_step(n): split by emission order
    i = 0
    for step in plan:
        per.append(b.kernels[i: i + len(step)])
        i += len(step)
    starts = [min(k["start_ns"] for k in ks) for ks in per]
    ends = starts[1:] + [max(k["start_ns"] + k["dur_ns"] for k in per[-1])]
    every = [(k["start_ns"], k["start_ns"] + k["dur_ns"]) for k in b.kernels]
    out = []
    for s, e in zip(starts, ends):
        busy = union_ns([(max(a, s), min(z, e)) for a, z in every if a < e and z > s])
        n = sum(1 for a, _ in every if s <= a < e)
        out.append({"wall_ns": e - s, "busy_ns": busy, "idle_ns": e - s - busy, "ops": n})
    return out


def _analyze(tmp: Path, b: TraceBuilder):
    p = b.write(tmp / "t.json.gz")
    return traceroof.analyze(traceroof.read_trace(p), chip="h100")


def test_two_streams_overlap_is_counted_once(tmp_path):
    # step 0: 10 µs on stream 7, then 4 µs on stream 8 launched right after: the second
    # kernel starts while the first still runs (launch 3 µs + queue 1 µs after the op's
    # host start), so busy < the sum of durations (14 µs).
    # step 1: one 5 µs kernel after 50 µs of host idle: step 0's window runs to its start
    # (the device idles for step 0 meanwhile); the last window is the kernel itself.
    plan = [[(10_000, 7, 0), (4_000, 8, 0)], [(5_000, 7, 50_000)]]
    b = _build(plan)
    steps = _analyze(tmp_path, b).steps.sort("step")
    want = _oracle(b, plan)
    got = steps.select("wall_ns", "busy_ns", "idle_ns", "ops").to_dicts()
    assert got == want
    assert got[0]["busy_ns"] < 14_000  # the overlap is not double-counted
    assert got[1] == {"wall_ns": 5_000, "busy_ns": 5_000, "idle_ns": 0, "ops": 1}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(st.tuples(st.integers(1_000, 40_000), st.sampled_from([7, 8, 9]),
                                   st.integers(0, 30_000)), min_size=1, max_size=6),
                min_size=1, max_size=4))
def test_busy_plus_idle_is_wall_and_matches_the_oracle(tmp_path, plan):
    b = _build(plan)
    report = _analyze(tmp_path, b)
    steps = report.steps.sort("step")
    want = _oracle(b, plan)
    got = steps.select("wall_ns", "busy_ns", "idle_ns", "ops").to_dicts()
    assert got == want
    for row in steps.iter_rows(named=True):
        assert 0 <= row["busy_ns"] <= row["wall_ns"]
        assert row["busy_ns"] + row["idle_ns"] == row["wall_ns"]
    # every device op is in exactly one step
    assert report.ops["step"].null_count() == 0
    # the op table and the step table count the same ops (by device start)
    assert report.ops.group_by("step").len().sort("step")["len"].to_list() == [w["ops"] for w in want]
