"""The accounting check (traceroof.accounting, docs/accounting.md): zero violations where the
rules hold, each rule's check fails on a report tampered to break it, and on every real and
generated trace the violations found today are listed explicitly (no xfail)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import polars as pl
import pytest
from conftest import FIXTURES, REAL
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tracegen import Kernel, TraceBuilder

from traceroof import read_trace
from traceroof.accounting import Violation, check, warnings_for
from traceroof.analysis import STAGES, analyze, load_report
from traceroof.errors import TraceFormatError, UnknownChipError

BF16 = ["c10::BFloat16", "c10::BFloat16"]


def _analyze(path: Path, chip: str | None = "h100"):
    return analyze(read_trace(path), chip)


# --------------------------------------------------------------------------- generated traces


@st.composite
def _traces(draw):
    """A TraceBuilder trace: random queue lag, 1–3 streams (overlapping), host gaps, steps."""
    tb = TraceBuilder(queue_ns=draw(st.integers(0, 2_000_000)), host_op_ns=draw(st.integers(1_000, 50_000)))
    for n in range(draw(st.integers(1, 4))):
        tb.begin_step(n)
        for _ in range(draw(st.integers(1, 6))):
            stream = draw(st.sampled_from([7, 13, 21]))
            dur = draw(st.integers(1_000, 300_000))
            tb.op("aten::mm", [[256, 256], [256, 256]], BF16, [Kernel("sm90_gemm_bf16", dur, stream)])
            tb.idle_host(draw(st.integers(0, 400_000)))
        # the host waits for the device at each step end, so the device windows are disjoint
        # by construction (without it see test_device_lag_without_sync_overlaps)
        tb.end_step(sync=True)
    return tb


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tb=_traces())
def test_generated_traces_hold_every_rule(tb, tmp_path_factory):
    path = tb.write(tmp_path_factory.mktemp("acct") / "t.json.gz")
    report = _analyze(path)
    vs = check(report)
    assert vs == [], [v.line() for v in vs]
    assert not any(w.startswith("accounting rule") for w in report.warnings)


def test_device_lag_without_sync_is_partitioned(tmp_path):
    """The device lagging the host (no sync at the step end): step 1's first kernel starts
    at 11 500 ns on stream 13 while step 0's kernel on stream 7 runs to 5 500 + 6 001 =
    11 501 ns. Step 0's window ends where step 1's starts: [5 500, 11 500) and [11 500,
    12 500); no overlap, and the busy times (6 000 + 1 000, the 1 ns overhang counted once
    under step 1's own kernel) sum to the plain union 7 000."""
    tb = TraceBuilder(queue_ns=0, host_op_ns=1_000)
    tb.begin_step(0)
    tb.op("aten::mm", [[256, 256], [256, 256]], BF16, [Kernel("sm90_gemm_bf16", 6_001, 7)])
    tb.end_step(sync=False)
    tb.begin_step(1)
    tb.op("aten::mm", [[256, 256], [256, 256]], BF16, [Kernel("sm90_gemm_bf16", 1_000, 13)])
    tb.end_step(sync=False)
    r = _analyze(tb.write(tmp_path / "lag.json.gz"))
    assert [v for v in check(r) if v.rule in (1, 2)] == []
    ks = [(k["start_ns"], k["start_ns"] + k["dur_ns"]) for k in tb.kernels]
    assert ks == [(5_500, 11_501), (11_500, 12_500)]  # the premise, from the generator's record
    got = r.steps.sort("step").select("wall_ns", "busy_ns").rows()
    assert got == [(6_000, 6_000), (1_000, 1_000)]
    assert sum(b for _, b in got) == 12_500 - 5_500  # = the union of ks


# --------------------------------------------------------------------------- each rule can fail


@pytest.fixture(scope="module")
def clean():
    """A report that holds every rule: 3 steps, communication, findings."""
    r = _analyze(FIXTURES / "faults" / "train_allreduce_h100.json.gz")
    assert check(r) == [] and r.steps.height >= 2 and r.findings
    return r


def _copy(r, **kw):
    return dataclasses.replace(r, **kw)


def _rules(r) -> set[int]:
    return {v.rule for v in check(r)}


def _with_windows(r, windows=None, buckets=None):
    tl = r.summary.timeline
    tl = dataclasses.replace(tl, windows=tl.windows if windows is None else windows,
                             buckets=tl.buckets if buckets is None else buckets)
    return _copy(r, summary=dataclasses.replace(r.summary, timeline=tl))


def test_rule1_overlapping_windows(clean):
    ws = [dict(w) for w in clean.summary.timeline.windows]
    st = sorted((w for w in ws if w["bucket"] == "step"), key=lambda w: w["start_ns"])
    # step 1 starts 1 µs before step 0 ends on its device: an overlap of exactly 1000 ns
    st[1]["start_ns"] = st[0]["end_ns"] - 1_000
    vs = [v for v in check(_with_windows(clean, ws)) if v.rule == 1]
    assert vs and vs[0].numbers["overlap_ns"] == 1_000 and vs[0].device == st[1]["device"]


def test_rule1_old_report_checked_per_rank(clean):
    # a report without the timeline section: rule 1 on the steps table, per rank
    s = clean.steps.sort("start_ns")
    first_end = int(s["end_ns"][0])
    s = s.with_columns(pl.when(pl.int_range(pl.len()) == 1).then(first_end - 1_000)
                       .otherwise(pl.col("start_ns")).alias("start_ns"))
    old = _copy(clean, steps=s, summary=dataclasses.replace(clean.summary, timeline=None))
    vs = [v for v in check(old) if v.rule == 1]
    assert vs and vs[0].numbers["overlap_ns"] == 1_000


def test_rule2_bucket_walls_and_counts(clean):
    # the buckets of the clean report cover each device's span exactly: 1 ns more is caught
    bs = [dict(b) for b in clean.summary.timeline.buckets]
    span = {(w["rank"], w["device"]): w["wall_ns"] for w in clean.summary.timeline.windows if w["bucket"] == "span"}
    assert {k: sum(b["wall_ns"] for b in bs if (b["rank"], b["device"]) == k) for k in span} == span
    assert sum(b["ops"] for b in bs) == clean.ops.height
    bs[0]["wall_ns"] += 1_000
    bs[0]["ops"] += 1
    vs = [v for v in check(_with_windows(clean, buckets=bs)) if v.rule == 2]
    assert any("recorded span" in v.text and v.numbers["walls_ns"] - v.numbers["span_ns"] == 1_000 for v in vs)
    assert any("holds" in v.text and v.numbers["bucket_ops"] - v.numbers["table_ops"] == 1 for v in vs)


def test_rule2_bucket_busy_against_the_union_of_the_ops(clean):
    # the buckets' busy time per device equals the union of its ops' intervals (computed here
    # by a sort and a sweep): 2 µs of busy moved into a bucket from nowhere is caught
    ops = clean.ops.filter(pl.col("bucket") != "outside_recording")
    union = 0
    cur = None
    for s, e in sorted(zip(ops["start_ns"].to_list(), (ops["start_ns"] + ops["dur_ns"]).to_list())):
        if cur is None or s > cur[1]:
            union += 0 if cur is None else cur[1] - cur[0]
            cur = [s, e]
        else:
            cur[1] = max(cur[1], e)
    union += cur[1] - cur[0]
    bs = [dict(b) for b in clean.summary.timeline.buckets]
    assert sum(b["busy_ns"] for b in bs if b["bucket"] != "outside_recording") == union
    bs[0]["busy_ns"] += 2_000
    vs = [v for v in check(_with_windows(clean, buckets=bs)) if v.rule == 2 and "union" in v.text]
    assert vs and vs[0].numbers["buckets_busy_ns"] - vs[0].numbers["union_ns"] == 2_000


def test_rule2_op_in_no_bucket(clean):
    ops = clean.ops.with_columns(pl.when(pl.int_range(pl.len()) == 0).then(None).otherwise(pl.col("bucket")).alias("bucket"))
    vs = [v for v in check(_copy(clean, ops=ops)) if v.rule == 2]
    assert any("in no bucket" in v.text and v.numbers["ops"] == 1 for v in vs)


def test_rule3_busy_over_wall(clean):
    s = clean.steps.with_columns((pl.col("wall_ns") + 1_000).alias("busy_ns"), pl.lit(-1_000, pl.Int64).alias("idle_ns"))
    vs = [v for v in check(_copy(clean, steps=s)) if v.rule == 3]
    assert vs and all("busy" in v.text for v in vs)
    assert len(vs) == s.height  # one per step: busy+idle=wall still holds, busy ≤ wall does not


def test_rule3_exposed_over_comm(clean):
    s = clean.steps.with_columns((pl.col("comm_ns") + 1_000).alias("comm_exposed_ns"))
    assert _rules(_copy(clean, steps=s)) == {3}


def test_rule4_hfu_and_efficiency(clean):
    summ = dataclasses.replace(clean.summary, hfu=dataclasses.replace(clean.summary.hfu, value=1.3))
    assert _rules(_copy(clean, summary=summ)) == {4}
    top = clean.ranking["label"][0]
    rk = clean.ranking.with_columns(pl.when(pl.col("label") == top).then(1.2).otherwise(pl.col("efficiency")).alias("efficiency"))
    vs = [v for v in check(_copy(clean, ranking=rk)) if v.rule == 4]
    assert len(vs) == 1 and vs[0].numbers["efficiency"] == 1.2
    # the same row reported as an inconsistency (above its roof) is no violation
    from traceroof.sections import InconsistencyInfo

    flagged = _copy(clean, ranking=rk, inconsistencies=[InconsistencyInfo(what="op above its roof", op=top)])
    assert 4 not in {v.rule for v in check(flagged)}


def test_rule5_step_time_from_no_complete_step(clean):
    s = clean.steps.with_columns(pl.lit(True).alias("partial"))
    step = dataclasses.replace(clean.summary.step, complete_steps=0)
    r = _copy(clean, steps=s, summary=dataclasses.replace(clean.summary, step=step))
    assert _rules(r) == {5}


def test_rule6_finding_over_window(clean):
    f = clean.findings[0]
    big = dataclasses.replace(f, recoverable_ns=1e15)
    vs = [v for v in check(_copy(clean, findings=[big, *clean.findings[1:]])) if v.rule == 6]
    assert any("window" in v.text for v in vs)


def test_rule6_idle_claim_over_idle(clean):
    # idle of a rank: window − busy union, computed here from the op table (one device)
    ops = clean.ops
    s, e = int(ops["start_ns"].min()), int((ops["start_ns"] + ops["dur_ns"]).max())
    starts = sorted(zip(ops["start_ns"].to_list(), (ops["start_ns"] + ops["dur_ns"]).to_list()))
    busy, cur_s, cur_e = 0, None, None
    for a, b in starts:
        if cur_e is None or a > cur_e:
            busy += (cur_e - cur_s) if cur_e is not None else 0
            cur_s, cur_e = a, b
        else:
            cur_e = max(cur_e, b)
    busy += cur_e - cur_s
    idle = (e - s) - busy
    claim = dataclasses.replace(clean.findings[0], kind="device_idle", rank=0, recoverable_ns=float(idle + 10_000),
                                evidence={})
    vs = [v for v in check(_copy(clean, findings=[claim])) if v.rule == 6]
    assert len(vs) == 1 and vs[0].numbers["limit_ns"] == idle


def test_rule7_gap_not_measured_minus_expected(clean):
    rk = clean.ranking.with_columns((pl.col("gap_ns") + 1_000_000).alias("gap_ns"))
    vs = [v for v in check(_copy(clean, ranking=rk)) if v.rule == 7]
    assert len(vs) == rk.filter(pl.col("expected_ns").is_not_null()).height


def test_warnings_are_capped_per_rule():
    vs = [Violation(3, f"step {i} rank 0: x") for i in range(7)] + [Violation(1, "rank 0: y")]
    w = warnings_for(vs)
    assert w[0] == "accounting rule 1: rank 0: y"
    assert w[1:4] == [f"accounting rule 3: step {i} rank 0: x" for i in range(3)]
    assert w[4].startswith("accounting rule 3: 4 more") and len(w) == 5


def test_stage_declared():
    assert STAGES[-1] == "check_accounting"


# --------------------------------------------------------------------------- every trace today

#: the traces that break a rule today, and how often (rule → violations). Every other input
#: gives zero; the table is empty, and a violation that comes back fails here by name.
KNOWN: dict[str, dict[int, int]] = {}


#: real files that are not traces (xprof's tool outputs, a deliberately mangled XSpace): they
#: must be refused with one clear error, not analysed
NOT_TRACES = ("/golden/", "utf8-mangled")


def _inputs() -> list[Path]:
    real = sorted(p for p in REAL.rglob("*") if p.is_file() and p.name != "MANIFEST.md")
    gen = sorted(p for p in FIXTURES.rglob("*") if p.is_file() and p.name.endswith((".json.gz", ".xplane.pb"))
                 and "models" not in p.parts)
    return real + gen


def _name(p: Path) -> str:
    return str(p.relative_to(REAL)) if p.is_relative_to(REAL) else str(p.relative_to(FIXTURES.parent))


@pytest.mark.parametrize("path", _inputs(), ids=_name)
def test_every_trace(path: Path):
    if any(k in str(path) for k in NOT_TRACES):
        with pytest.raises(TraceFormatError):
            load_report(path, "h100", jobs=1)
        return
    try:
        report = load_report(path, jobs=1)
    except UnknownChipError:
        report = load_report(path, "h100", jobs=1)
    got = dict(sorted(Counter(v.rule for v in check(report)).items()))
    assert got == KNOWN.get(_name(path), {}), [v.line() for v in check(report)]
    # and each one is a warning of the report
    if got:
        assert any(w.startswith("accounting rule") for w in report.warnings)
