"""The report core on its own: the walk of ``analyze`` through its stages, the typed
sections' JSON round trip, the report's JSON Schema, and every renderer, over every fixture
(every real trace under ../shared/fixtures/real and every generated fixture)."""

from __future__ import annotations

import copy
import csv
import io
import json
from pathlib import Path

import pytest
from conftest import FIXTURES, REAL, real

from traceroof import analysis
from traceroof import units as rfmt
from traceroof.errors import TraceroofError, UnknownChipError
from traceroof.io import read_trace
from traceroof.render import RENDERERS, render
from traceroof.report import Report
from traceroof.report_schema import report_schema, validate_report

jsonschema = pytest.importorskip("jsonschema")  # the test extra; CI installs it

EXAMPLE = FIXTURES / "example_h100_decoder.json.gz"


def _inputs() -> list[Path]:
    """Every real trace file (and the directories that are one input), every generated fixture."""
    files = sorted(p for p in REAL.rglob("*") if p.is_file() and p.name != "MANIFEST.md")
    dirs = [REAL / "profiler" / "demo", REAL / "kineto" / "tb_plugin" / "samples" / "resnet50_num_workers_0"]
    gen = sorted(p for p in FIXTURES.rglob("*") if p.is_file()
                 and p.name.endswith((".json.gz", ".xplane.pb")) and "models" not in p.parts)
    return files + [d for d in dirs if d.exists()] + gen


INPUTS = _inputs()


def _id(p: Path) -> str:
    try:
        return "real/" + str(p.relative_to(REAL))
    except ValueError:
        return "fixtures/" + str(p.relative_to(FIXTURES))


def _report(path: Path) -> Report | None:
    """The report of ``path`` (``h100`` when no chip is detected); None when the input is not
    a readable trace (the damaged-input cases: they exit 4 on the command line)."""
    try:
        trace = read_trace(path, jobs=1)
    except TraceroofError:
        return None
    try:
        return analysis.analyze(trace)
    except UnknownChipError:
        return analysis.analyze(trace, chip="h100")


# ----------------------------------------------------------------------------- the walk

def test_analyze_walks_every_stage_once_in_the_declared_order(monkeypatch):
    """Each stage of analysis.STAGES is wrapped to record its call; analyzing one fixture
    must call every stage exactly once, in the declared order (trace → chip → costs →
    roofline → steps → ... → findings → report sections)."""
    calls: list[str] = []
    for name in analysis.STAGES:
        fn = getattr(analysis, name)

        def wrapped(*a, __fn=fn, __name=name, **kw):
            calls.append(__name)
            return __fn(*a, **kw)

        monkeypatch.setattr(analysis, name, wrapped)
    report = analysis.analyze(read_trace(EXAMPLE), "h100")
    assert calls == list(analysis.STAGES)
    assert report.ranking.height and report.summary.hfu is not None
    # the declared walk itself: chip, then costs, roofline, steps, ..., findings, then the report
    order = list(analysis.STAGES)
    assert order.index("resolve_chip") < order.index("cost_ops") < order.index("apply_roofline") \
        < order.index("segment_steps") < order.index("detect_findings") < order.index("describe_trace")


def test_the_walk_test_fails_when_a_stage_is_skipped(monkeypatch):
    """The recorder above can fail: a stage analyze does not call is missing from the record."""
    calls: list[str] = []
    stages = list(analysis.STAGES) + ["_no_device_ops"]  # a function analyze skips for this trace
    for name in stages:
        fn = getattr(analysis, name)
        monkeypatch.setattr(analysis, name, lambda *a, __fn=fn, __n=name, **kw: (calls.append(__n), __fn(*a, **kw))[1])
    analysis.analyze(read_trace(EXAMPLE), "h100")
    assert calls != stages and calls == list(analysis.STAGES)


def test_hfu_and_mfu_come_from_the_mfu_module(monkeypatch):
    from traceroof import mfu as mfu_mod
    from traceroof import utilization

    seen: list[str] = []
    monkeypatch.setattr(utilization, "hfu", lambda *a, **k: (seen.append("hfu"), mfu_mod.hfu(*a, **k))[1])
    monkeypatch.setattr(utilization, "mfu", lambda *a, **k: (seen.append("mfu"), mfu_mod.mfu(*a, **k))[1])
    r = analysis.analyze(read_trace(EXAMPLE), "h100", model_flops_per_step=1e12)
    assert seen == ["hfu", "mfu"]
    s = r.summary
    assert s.hfu.value == pytest.approx(s.hfu.achieved_flops_per_s / s.hfu.peak_flops_per_s, rel=1e-12)
    # per step, by the same formula
    step = r.steps.row(0, named=True)
    assert step["hfu"] == pytest.approx(step["flops"] / step["devices"] / (step["wall_ns"] * 1e-9)
                                        / s.hfu.peak_flops_per_s, rel=1e-12)


# ----------------------------------------------------------------------------- load_report

def test_load_report_is_one_door_for_traces_reports_and_trace_objects(tmp_path):
    trace = read_trace(EXAMPLE)
    a = analysis.load_report(trace, "h100")
    saved = tmp_path / "r.json"
    a.save(saved)
    b = analysis.load_report(str(saved))
    c = analysis.load_report(str(EXAMPLE), "h100")
    assert b.to_dict() == a.to_dict()
    for r in (b, c):
        assert r.ranking["label"].to_list() == a.ranking["label"].to_list()
    assert analysis.load_report(a) is a
    refused: list[Report] = []
    analysis.load_report(str(saved), on_saved=refused.append)
    assert len(refused) == 1
    with pytest.raises(TraceroofError, match="give it alone"):
        analysis.load_report([str(saved), str(EXAMPLE)])


# ----------------------------------------------------------------------------- schema

def _example_dict() -> dict:
    return json.loads(analysis.analyze(read_trace(EXAMPLE), "h100", model_flops_per_step=1e12).to_json())


def test_schema_is_strict_wrong_type_missing_key_unknown_key_fail():
    d = _example_dict()
    validate_report(d)
    bad = []
    wrong = copy.deepcopy(d)
    wrong["summary"]["hfu"] = "54 %"  # a string where a number belongs
    bad.append(wrong)
    missing = copy.deepcopy(d)
    del missing["chip"]["reason"]  # a required key of a section
    bad.append(missing)
    gone = copy.deepcopy(d)
    del gone["coverage"]
    bad.append(gone)
    unknown = copy.deepcopy(d)
    unknown["trace"]["formatt"] = "kineto"  # a misspelt key
    bad.append(unknown)
    half = copy.deepcopy(d)
    del half["summary"]["mfu_devices"]  # a group present with one of its keys missing
    bad.append(half)
    step = copy.deepcopy(d)
    step["steps"][0]["wall_ns"] = 1.5  # an int64 column holding a float
    bad.append(step)
    for b in bad:
        with pytest.raises(jsonschema.ValidationError):
            validate_report(b)


def test_schema_is_a_valid_json_schema():
    jsonschema.Draft202012Validator.check_schema(report_schema())


# ----------------------------------------------------------------------------- every fixture

def test_fixtures_are_there():
    real("TraceLens")  # fails (never skips) when ../shared is missing
    assert len(INPUTS) >= 40


@pytest.mark.slow
@pytest.mark.parametrize("path", INPUTS, ids=_id)
def test_report_core_on_every_fixture(path: Path, tmp_path: Path):
    report = _report(path)
    if report is None:
        return  # not a readable trace: no report to check (tests/test_kineto_cases.py covers it)
    # the saved report validates against the schema
    saved = tmp_path / "report.json"
    report.save(saved)
    doc = json.loads(saved.read_text())
    validate_report(doc)
    validate_report(json.loads(report.to_json()))
    # round trips: to_dict → from_dict → to_dict; save → load
    d = report.to_dict(include_ops=True)
    assert Report.from_dict(json.loads(json.dumps(d))).to_dict(include_ops=True) == d
    loaded = Report.load(saved)
    assert loaded.to_dict(include_ops=True) == doc
    assert json.dumps(loaded.to_dict(include_ops=True), separators=(", ", ": ")) == saved.read_text()
    # every renderer, on the fresh and on the loaded report; the top op's name in each
    for rep in (report, loaded):
        outs = {name: render(rep, name, top=20) for name in RENDERERS}
        if not rep.ranking.height:
            continue
        label = rep.ranking["label"][0]
        assert json.loads(outs["json"])["ranking"][0]["label"] == label
        assert next(csv.DictReader(io.StringIO(outs["csv"])))["label"] == label
        assert rfmt.short(label, 60).replace("|", "\\|") in outs["markdown"]
        # the table shortens names to its op column at template arguments and word boundaries
        assert any(rfmt.short_name(label, k) in outs["table"] for k in range(16, 61)), label


# ----------------------------------------------------------------------------- sometimes-present keys

def test_keys_present_only_sometimes_stay_absent_and_hfu_above_100_is_an_inconsistency():
    import dataclasses

    from traceroof.chips import get_chip

    trace = read_trace(EXAMPLE)
    plain = analysis.analyze(trace, "h100").to_dict()["summary"]
    assert "mfu" not in plain and "mfu_note" not in plain and "achieved_flops_per_s" in plain
    h = get_chip("h100")
    tiny = dataclasses.replace(h, peak_flops_per_s={k: v / 1000 if v else v for k, v in h.peak_flops_per_s.items()})
    r = analysis.analyze(trace, tiny, model_flops_per_step=1e15)
    d = r.to_dict()
    assert d["summary"]["hfu"] is None and "achieved_flops_per_s" in d["summary"]
    assert d["summary"]["mfu"] is None and "mfu_note" not in d["summary"] and d["summary"]["mfu_devices"] == 1
    hfu_inc, mfu_inc = d["inconsistencies"][:2]
    assert list(hfu_inc) == ["what", "value", "suspects"] and hfu_inc["what"] == "HFU above 100 %"
    assert list(mfu_inc) == ["what", "value", "suspects"] and mfu_inc["what"] == "MFU" and mfu_inc["value"] > 1
    validate_report(json.loads(r.to_json()))
    assert "HFU came out above 100 %, an inconsistency" in render(r, "markdown")
    empty = analysis.analyze(read_trace(real("HolisticTraceAnalysis/tests/data/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"))).to_dict()
    assert empty["summary"] == {"steps": 0} and empty["chip"] == {} and empty["filters"] == {}
    assert list(empty["coverage"]) == ["device_time_ns", "costed_share", "shapes_share", "trace_share"]
    validate_report(empty)


def test_a_key_without_a_field_is_refused_where_it_would_be_dropped():
    from traceroof.sections import RanksInfo, Summary, section_from_dict

    with pytest.raises(ValueError, match="new_key"):
        section_from_dict(RanksInfo, {"ranks": [0, 1], "new_key": 1}, strict=True)
    # a summary's flattened groups are known keys
    d = _example_dict()["summary"]
    assert section_from_dict(Summary, d, strict=True).to_dict() == d


# ----------------------------------------------------------------------------- version 1

def _as_version_1(d: dict) -> dict:
    """A report dict written as version 1 wrote it: a ranking row's ``measured_ns`` was
    every op's time (version 2's ``total_ns``), with no ``total_ns`` or ``costed``."""
    old = copy.deepcopy(d)
    old["schema_version"] = 1
    for r in old["ranking"]:
        r["measured_ns"] = r.pop("total_ns")
        r.pop("costed")
    return old


def test_version_1_reports_are_upgraded_as_read(tmp_path):
    # tw003 has a partly costed row (__amd_rocclr_copyBuffer.kd: 12 of 24 ops costed), whose
    # version-2 measured time (the costed ops') version 1 did not store: it is expected /
    # efficiency (version 1's efficiency was expected / costed ops' time)
    r = analysis.load_report(real("TraceLens", "tests", "traces", "mi300", "jax08_gemm", "tw003.xplane.pb"), jobs=1)
    d = r.to_dict()
    partly = [x for x in d["ranking"] if x["costed_count"] and x["costed_count"] < x["count"]]
    assert partly, "the fixture must hold a partly costed row"
    back = Report.from_dict(_as_version_1(d), source="v1.json")
    assert back.schema_version == 2
    for want, got in zip(d["ranking"], back.ranking.to_dicts()):
        for k in ("total_ns", "measured_ns", "costed"):
            assert got[k] == pytest.approx(want[k], rel=1e-9), (want["label"], k)
    # a gate baseline saved by version 1 still gates
    base = tmp_path / "v1.json"
    base.write_text(json.dumps(_as_version_1(d)))
    cur = tmp_path / "cur.json"
    cur.write_text(json.dumps(d))
    from click.testing import CliRunner

    from traceroof.cli import cli

    res = CliRunner().invoke(cli, ["gate", str(cur), "--baseline", str(base), "--max-step-time-increase", "0.01"])
    assert res.exit_code == 0, res.output
    # a version this traceroof does not know is still refused, naming what it reads
    d3 = dict(d, schema_version=3)
    with pytest.raises(TraceroofError, match="reads versions 1, 2"):
        Report.from_dict(d3, source="v3.json")
