"""The waterfall from the measured step to its speed of light (traceroof.waterfall): findings
take their time from the pools they claim, nothing twice, and the int terms add up exactly to
measured − speed of light; rule 9 fails on a report tampered to break it; on every real and
generated trace the terms add up exactly and the speed of light is under the measured step."""

from __future__ import annotations

import dataclasses

import pytest
from test_accounting import NOT_TRACES, _inputs, _name
from test_speed_of_light import BASIC, _dev, _ops, _steps

from traceroof.accounting import check_light
from traceroof.analysis import load_report
from traceroof.errors import UnknownChipError
from traceroof.findings import Finding
from traceroof.speed_of_light import device_steps
from traceroof.waterfall import build, waterfall_sum_ns


def _f(kind, ns, rank=0, ops=()):
    return Finding(kind=kind, title=kind, severity="low", recoverable_ns=float(ns), explanation="", rank=rank,
                   ops=list(ops))


@pytest.fixture()
def basic():
    return device_steps(_ops(BASIC), _dev([(0, 1, 0, 1000, 900)]), _steps([(0, 1, 1000, False)]))


def test_pools_without_findings(basic):
    w = build(basic, [], _steps([(0, 1, 1000, False)]), {})
    got = {t.term: t.total_ns for t in w.waterfall}
    # test_speed_of_light.BASIC: 1000 − 600 = 400 = gaps (100 + 100 + 150) + idle 100 − 200 + 150
    assert got == {"collective ops below their roof": 150, "matmul ops below their roof": 100,
                   "elementwise ops below their roof": 100, "device idle, not claimed by a finding": 100,
                   "concurrent ops (time overlapped across streams or past the step's end, counted once)": -200,
                   "collectives hidden behind compute at the speed of light": 150}
    assert waterfall_sum_ns(w) == w.measured_total_ns - w.speed_of_light_total_ns == 400


def test_findings_draw_from_their_pools_never_twice(basic):
    found = [_f("exposed_collectives", 300), _f("fp32_matmul", 500), _f("device_idle", 80),
             _f("unfused_elementwise", 60, ops=["aten::add"])]
    w = build(basic, found, _steps([(0, 1, 1000, False)]), {"aten::add": "elementwise"})
    by = {t.finding: t for t in w.waterfall if t.source == "finding"}
    # the collectives' gap pool holds 150 of the 300 claimed; the matmuls' 100 of 500; idle 80 of 100
    assert (by["exposed_collectives"].total_ns, by["fp32_matmul"].total_ns, by["device_idle"].total_ns) == (150, 100, 80)
    assert by["unfused_elementwise"].total_ns == 60  # from the elementwise gap (100)
    # what-if: the step with that fix alone, the whole claim: 1000 − 300
    assert by["exposed_collectives"].what_if_ns == 700 and by["exposed_collectives"].claimed_ns == 300
    rest = {t.term: t.total_ns for t in w.waterfall if t.source != "finding"}
    assert rest["elementwise ops below their roof"] == 40 and rest["device idle, not claimed by a finding"] == 20
    assert "matmul ops below their roof" not in rest  # used up by the fp32 finding
    assert waterfall_sum_ns(w) == 400


def test_findings_never_exceed_the_distance_to_light():
    # two elementwise ops [0, 100) on two streams, roof 0 ns each: light 0, distance 100, but
    # their gap pool holds 200 (concurrency −100): a finding claiming 200 takes only the 100 there is
    rows = [(0, 1, 0, "step", "elementwise", 0, 100, 0.0), (0, 1, 0, "step", "elementwise", 0, 100, 0.0)]
    ds = device_steps(_ops(rows), _dev([(0, 1, 0, 100, 100)]), _steps([(0, 1, 100, False)]))
    w = build(ds, [_f("unfused_elementwise", 200, ops=["x"])], _steps([(0, 1, 100, False)]), {"x": "elementwise"})
    assert [t.total_ns for t in w.waterfall] == [100, 100, -100]  # finding, gap left, concurrency
    assert waterfall_sum_ns(w) == 100


def test_a_finding_partly_in_partial_steps_counts_its_complete_share():
    rows = [(0, 1, 0, "step", "matmul", 0, 400, 100.0)]
    ds = device_steps(_ops(rows), _dev([(0, 1, 0, 1000, 400)]), _steps([(0, 1, 1000, False), (0, 2, 1000, True)]))
    w = build(ds, [_f("device_idle", 1000)], _steps([(0, 1, 1000, False), (0, 2, 1000, True)]), {})
    # half the rank's step wall is in complete steps: 500 of the 1000 claimed
    assert w.waterfall[0].claimed_ns == 500 and w.waterfall[0].total_ns == 500


def test_rule9_fails_on_a_tampered_waterfall(basic):
    w = build(basic, [], _steps([(0, 1, 1000, False)]), {})

    class R:  # check_light reads only the section
        speed_of_light = w
    assert check_light(R) == []
    R.speed_of_light = dataclasses.replace(w, waterfall=w.waterfall[1:])
    assert [v.rule for v in check_light(R)] == [9]
    R.speed_of_light = dataclasses.replace(w, speed_of_light_ns=2000.0)
    assert any("speed of light" in v.text and "> measured" in v.text for v in check_light(R))
    R.speed_of_light = dataclasses.replace(w, model_floor_ns=700.0)
    assert len(check_light(R)) == 1
    R.speed_of_light = dataclasses.replace(w, model_floor_ns=700.0, model_floor_note="model FLOPs the trace did not run")
    assert check_light(R) == []


@pytest.mark.parametrize("path", [p for p in _inputs() if not any(k in str(p) for k in NOT_TRACES)], ids=_name)
def test_every_trace_adds_up(path):
    try:
        report = load_report(path, jobs=1)
    except UnknownChipError:
        report = load_report(path, "h100", jobs=1)
    s = report.speed_of_light
    if s is None:  # no complete step with a device window: then the steps table says so
        assert report.steps.height == 0 or report.steps["partial"].all() or report.summary.step is None
        return
    assert waterfall_sum_ns(s) == s.measured_total_ns - s.speed_of_light_total_ns
    assert s.speed_of_light_total_ns <= s.measured_total_ns
    assert all(p.speed_of_light_ns <= p.measured_ns for p in s.per_step)
    # measured, independently: the complete steps' per-device walls, from the steps table
    # (wall_ns is the device mean, rounded: × devices, within half a ns per device)
    st = report.steps.filter(~report.steps["partial"])
    expect = sum(w * d for w, d in zip(st["wall_ns"].to_list(), st["devices"].to_list()))
    assert abs(s.measured_total_ns - expect) <= st["devices"].sum()
