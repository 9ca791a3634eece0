"""``analyze --perfetto``: the export checked by the consumers available offline.

Three readers: the Trace Event Format's own rules (checked here event by event), HTA's
trace loader (``hta.common.trace.Trace``, pandas) and traceroof's Kineto reader. Every
expected value comes from the report's op table or findings, read in the test with plain
Python, never from the writer.
"""

from __future__ import annotations

import gzip
import json
import logging
from bisect import bisect_right
from collections import Counter, defaultdict
from itertools import accumulate
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner
from conftest import kineto, real, write

from traceroof import analyze, read_trace
from traceroof.cli import cli
from traceroof.render.perfetto import (
    FINDINGS_PID,
    MAX_FLOWS,
    STEPS_PID_BASE,
    write_perfetto,
)

QWEN = "TraceLens/tests/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"


@pytest.fixture(scope="module")
def example(example_trace):
    return analyze(read_trace(example_trace))


@pytest.fixture(scope="module")
def qwen():
    return analyze(read_trace(real(QWEN)))


def _export(report, tmp_path: Path, name: str = "out.json.gz") -> tuple[Path, dict]:
    p = tmp_path / name
    write_perfetto(report, p)
    return p, json.loads(gzip.decompress(p.read_bytes()) if name.endswith(".gz") else p.read_bytes())


def _ns(us: float) -> int:
    return round(us * 1000)


def _check_format_rules(doc: dict) -> None:
    """The Trace Event Format's rules for the event types the export uses."""
    events = doc["traceEvents"]
    slices: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    flows: dict[int, list[dict]] = defaultdict(list)
    named: set[tuple] = set()
    for e in events:
        assert e["ph"] in {"X", "M", "C", "s", "f"}, e
        assert isinstance(e["pid"], int), e
        if e["ph"] == "M":
            assert e["name"] in {"process_name", "thread_name", "thread_sort_index"}, e
            assert isinstance(e["tid"], int) and e["args"], e
            key = (e["name"], e["pid"], None if e["name"] == "process_name" else e["tid"])
            assert key not in named, f"{key} named twice"
            named.add(key)
            continue
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0, e
        if e["ph"] == "X":
            assert isinstance(e["tid"], int) and isinstance(e["dur"], (int, float)) and e["dur"] >= 0, e
            slices[(e["pid"], e["tid"])].append((_ns(e["ts"]), _ns(e["ts"] + e["dur"])))
        elif e["ph"] == "C":
            assert e["args"] and all(isinstance(v, (int, float)) for v in e["args"].values()), e
        else:
            flows[e["id"]].append(e)
    for track, spans in slices.items():  # slices on one track nest: none ends inside another
        stack: list[int] = []
        for s, end in sorted(spans, key=lambda x: (x[0], -x[1])):
            while stack and stack[-1] <= s:
                stack.pop()
            assert not stack or end <= stack[-1], f"track {track}: [{s}, {end}] crosses the end of an enclosing slice"
            stack.append(end)
    # per track: starts sorted, the running max of ends, the set of starts (to test a flow's binding)
    index = {}
    for track, spans in slices.items():
        spans.sort()
        ends = list(accumulate((e for _, e in spans), max))
        index[track] = ([s for s, _ in spans], ends, {s for s, _ in spans})
    for fid, pair in flows.items():  # one start, one end; each bound to a slice of its track
        assert sorted(e["ph"] for e in pair) == ["f", "s"], (fid, pair)
        for e in pair:
            t = _ns(e["ts"])
            starts, ends, _ = index[(e["pid"], e["tid"])]
            i = bisect_right(starts, t)  # some slice starting at or before t ends at or after it
            assert i and ends[i - 1] >= t, (fid, e)
        f = next(e for e in pair if e["ph"] == "f")
        assert f["bp"] == "e"
        assert _ns(f["ts"]) in index[(f["pid"], f["tid"])][2], f  # at the op's own start


@pytest.mark.parametrize("which", ["example", "qwen"])
def test_export_follows_the_trace_event_format(which, request, tmp_path):
    _, doc = _export(request.getfixturevalue(which), tmp_path)
    _check_format_rules(doc)


@pytest.mark.parametrize("rel", [
    "HolisticTraceAnalysis/tests/data/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",  # no device op
    "HolisticTraceAnalysis/tests/data/trace_diff/test/test.json.gz",  # ops overlapping on a stream
    "xprof/xprof/convert/test_xplanes/tpu_inference_2.xplane.pb",  # XPlane, several TPU devices
    "param/et_replay/tests/inputs/dlrm_kineto.tar.gz",  # a tar of per-rank traces
])
def test_real_traces_of_every_shape_export_by_the_rules(rel, tmp_path):
    report = analyze(read_trace(real(rel), jobs=1))  # the chip each trace names
    _, doc = _export(report, tmp_path)
    _check_format_rules(doc)
    dev = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] in ("kernel", "gpu_memcpy", "gpu_memset")]
    assert len(dev) == report.ops.height == doc["traceroof"]["ops"]
    assert doc["traceroof"]["findings"] == len(report.findings)


@pytest.mark.parametrize("which", ["example", "qwen"])
def test_every_device_op_is_a_slice_with_its_roofline_as_args(which, request, tmp_path):
    report = request.getfixturevalue(which)
    _, doc = _export(report, tmp_path)
    got = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] in ("kernel", "gpu_memcpy", "gpu_memset")]
    ops = report.ops.to_dicts()
    assert len(got) == len(ops)
    key = lambda name, start, dur, exp: (name, start, dur, None if exp is None else round(exp, 3))  # noqa: E731
    want = Counter(key(o["name"], o["start_ns"], o["dur_ns"], o["expected_ns"]) for o in ops)
    have = Counter(key(e["name"], _ns(e["ts"]), _ns(e["dur"]), e["args"]["expected_ns"]) for e in got)
    assert have == want
    by_start = {(o["name"], o["start_ns"]): o for o in ops}
    for e in got:
        o = by_start[(e["name"], _ns(e["ts"]))]
        a = e["args"]
        assert (a["gap_ns"], a["bound"], a["flops"], a["hbm_bytes"], a["kind"]) == \
            (o["gap_ns"], o["bound"], o["flops"], o["bytes"], str(o["kind"]))
    # unknown stays unknown: as many null expected times in the file as in the op table, none turned into 0
    assert sum(e["args"]["expected_ns"] is None for e in got) == sum(o["expected_ns"] is None for o in ops)
    assert sum(e["args"]["flops"] == 0 for e in got) == sum(o["flops"] == 0 for o in ops)


def _named(f, ops: list[dict]) -> list[dict]:
    """The ops a finding names, found here from its fields with plain Python."""
    names = set(f.ops)
    return [o for o in ops if (f.rank is None or o["rank"] == f.rank)
            and (o["name"] in names or o["op"] in names) and o["start_ns"] <= f.end_ns
            and o["start_ns"] + o["dur_ns"] >= f.start_ns]


def test_findings_are_slices_on_their_own_track_with_flows_to_the_ops_they_name(example, tmp_path):
    _, doc = _export(example, tmp_path)
    ev = doc["traceEvents"]
    fs = [e for e in ev if e["ph"] == "X" and e["cat"] == "traceroof_finding"]
    assert len(fs) == len(example.findings) == 5
    assert {e["pid"] for e in fs} == {FINDINGS_PID}
    ops = example.ops.to_dicts()
    flows_s = Counter(e["tid"] for e in ev if e["ph"] == "s" and e["cat"] == "traceroof_flow")
    op_at = {(e["pid"], e["tid"], e["ts"]): e for e in ev if e["ph"] == "X" and e["cat"] == "kernel"}
    total = 0
    for e in fs:
        f = example.findings[e["args"]["finding"] - 1]
        assert e["name"] == f.title and (_ns(e["ts"]), _ns(e["ts"] + e["dur"])) == (f.start_ns, f.end_ns)
        named = _named(f, ops)
        assert e["args"]["ops_matched"] == len(named)
        assert e["args"]["flows_drawn"] == min(len(named), MAX_FLOWS)
        total += e["args"]["flows_drawn"]
        ends = [x for x in ev if x["ph"] == "f" and x["name"] == f"finding #{e['args']['finding']}"]
        assert len(ends) == e["args"]["flows_drawn"]
        for x in ends:  # each flow lands on an op the finding names
            op = op_at[(x["pid"], x["tid"], x["ts"])]
            assert op["name"] in f.ops or op["args"]["op"] in f.ops
    assert sum(flows_s.values()) == total > 0
    # the host-sync finding names cudaDeviceSynchronize, a host call: no device op, no flow
    sync = next(e for e in fs if e["args"]["kind"] == "host_device_copies")
    assert sync["args"]["ops_matched"] == 0


def test_launches_are_host_slices_with_a_flow_to_each_op_they_launched(qwen, tmp_path):
    _, doc = _export(qwen, tmp_path)
    ev = doc["traceEvents"]
    launches = [e for e in ev if e["ph"] == "X" and e["cat"] == "cuda_runtime"]
    linked = [o for o in qwen.ops.to_dicts() if o["launch_start_ns"] is not None]
    # one slice per distinct launch (a graph launch runs many kernels under one correlation)
    assert len(launches) == len({(o["rank"], o["correlation"], o["launch_start_ns"]) for o in linked}) == doc["traceroof"]["launches"]
    assert len(linked) == 1707 - 509  # the trace's warning: 509 device ops have no host launch
    by_id: dict[int, dict] = defaultdict(dict)
    for e in ev:
        if e.get("cat") == "ac2g":
            by_id[e["id"]][e["ph"]] = e
    assert len(by_id) == len(linked)
    launch_at = {(e["pid"], e["tid"], e["ts"]): e for e in launches}
    op_at = {(e["pid"], e["tid"], e["ts"]): e for e in ev if e["ph"] == "X" and e["cat"] in ("kernel", "gpu_memcpy", "gpu_memset")}
    for pair in by_id.values():
        start, end = pair["s"], pair["f"]
        la = launch_at[(start["pid"], start["tid"], start["ts"])]
        op = op_at[(end["pid"], end["tid"], end["ts"])]
        assert la["args"]["correlation"] == op["args"]["correlation"]


def test_step_counter_is_the_sum_of_expected_op_times(example, tmp_path):
    _, doc = _export(example, tmp_path)
    ev = doc["traceEvents"]
    pid = STEPS_PID_BASE + 0
    counters = [e for e in ev if e["ph"] == "C" and e["name"] == "sum of expected op times, costed ops only (µs)"]
    walls = [e for e in ev if e["ph"] == "C" and e["name"] == "step wall time (µs)"]
    steps = example.steps.sort("start_ns").to_dicts()
    assert len(counters) == len(steps) + 1 == 4 and {e["pid"] for e in counters} == {pid}
    for c, w, s in zip(counters, walls, steps):
        want = sum(o["expected_ns"] for o in example.ops.to_dicts() if o["step"] == s["step"] and o["expected_ns"] is not None)
        assert _ns(c["ts"]) == s["start_ns"]
        assert c["args"]["value"] == pytest.approx(want / 1000, abs=1e-3)
        assert w["args"]["value"] == pytest.approx((s["end_ns"] - s["start_ns"]) / 1000, abs=1e-3)
    assert counters[-1]["args"]["value"] == 0 and _ns(counters[-1]["ts"]) == steps[-1]["end_ns"]
    # the example's steps are 2.53 ms, 2.53 ms, 2.47 ms long (make_example.py) and every op is costed
    assert [round(w["args"]["value"]) for w in walls[:3]] == [2526, 2526, 2468]


def test_unsegmented_partly_costed_step_sums_its_costed_ops(tmp_path):
    # the vLLM graph-replay window: no step markers (one step, step null) and 97 % of its
    # device time without a cost; the step's sum is over its costed ops, the rest counted
    r = analyze(read_trace(real("TraceLens/tests/traces/inference/vllm_decode_full/graph_execution.json.gz")),
                "mi300x")
    assert r.steps.height == 1 and r.steps["step"].to_list() == [None]
    _, doc = _export(r, tmp_path)
    (step,) = [e for e in doc["traceEvents"] if e.get("cat") == "traceroof_step"]
    costed = r.ops.filter(pl.col("expected_ns").is_not_null())
    assert step["args"]["ops"] == r.ops.height
    assert step["args"]["ops_without_cost"] == r.ops.height - costed.height > 0
    assert step["args"]["sum_expected_ns"] == pytest.approx(float(costed["expected_ns"].sum()))


def test_hta_reads_the_tracks_slices_and_args(qwen, tmp_path, caplog):
    from hta.common.trace import Trace
    from hta.configs.parser_config import ParserConfig

    caplog.set_level(logging.ERROR)
    d = tmp_path / "hta"
    d.mkdir()
    _export(qwen, d, "rank-0.json.gz")
    t = Trace(trace_dir=str(d), parser_config=ParserConfig(parse_all_args=True))
    t.parse_traces(max_ranks=1, use_multiprocessing=False)
    df = t.get_trace(0)
    sym = t.symbol_table.sym_table
    cats = Counter(sym[i] for i in df["cat"])
    kinds = Counter(str(k) for k in qwen.ops["kind"].to_list())
    assert cats["kernel"] == sum(n for k, n in kinds.items() if k not in ("memcpy", "memset"))
    assert (cats["gpu_memcpy"], cats["gpu_memset"]) == (kinds["memcpy"], kinds["memset"]) == (1, 241)
    assert cats["traceroof_finding"] == len(qwen.findings) and cats["traceroof_step"] == qwen.steps.height
    assert cats["cuda_runtime"] == 1707 - 509  # one launch per linked op (the trace warns of 509 unlinked)
    dev = df[df["cat"].map(lambda i: sym[i] in ("kernel", "gpu_memcpy", "gpu_memset"))]
    tracks = sorted({(int(p), int(s)) for p, s in zip(dev["pid"], dev["stream"])})
    want = sorted({(0 * 1000 + int(d), int(s)) for d, s in qwen.ops.select("device", "stream").iter_rows()})
    assert tracks == want
    assert int(dev["expected_ns"].notna().sum()) == int(qwen.ops["expected_ns"].is_not_null().sum())
    assert set(dev["bound"]) == set(qwen.ops["bound"].to_list())
    # HTA links each launched op to its launch by correlation (index_correlation: the other event's index)
    assert int((dev["index_correlation"] > 0).sum()) == 1707 - 509
    # HTA rounds ns timestamps to whole µs, start up and end down (trace_parser.round_down_time_stamps)
    o = qwen.ops.select("start_ns", (pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns"))
    assert sorted(int(x) for x in dev["ts"]) == sorted(-(-s // 1000) for s in o["start_ns"].to_list())
    assert sorted(int(x) for x in dev["end"]) == sorted(e // 1000 for e in o["end_ns"].to_list())


def test_traceroof_reads_the_export_back(qwen, tmp_path):
    p, _ = _export(qwen, tmp_path)
    back = read_trace(p)
    a = qwen.ops.sort("start_ns", "name")
    b = back.ops.sort("start_ns", "name")
    assert b.height == a.height == 1707
    a0, b0 = int(a["start_ns"].min()), int(b["start_ns"].min())
    assert [s - a0 for s in a["start_ns"].to_list()] == [s - b0 for s in b["start_ns"].to_list()]
    assert a["dur_ns"].to_list() == b["dur_ns"].to_list() and a["name"].to_list() == b["name"].to_list()
    assert a["stream"].to_list() == b["stream"].to_list() and a["device"].to_list() == b["device"].to_list()
    assert Counter(map(str, b["kind"].to_list()))["memset"] == 241
    # the launches link back to their kernels by correlation, at the same times
    rel = lambda df, t0: [None if x is None else x - t0 for x in df["launch_start_ns"].to_list()]  # noqa: E731
    assert rel(a, a0) == rel(b, b0) and b["launch_start_ns"].is_not_null().sum() == 1707 - 509
    assert any(w.startswith("509 device ops (30.1% of device time) have no host launch") for w in back.meta.warnings)


def test_overlapping_ops_of_one_stream_go_to_an_overlap_lane(tmp_path):
    # three kernels on stream 7: [0, 10) µs, [5, 8) µs (inside: would nest, still a lane), [9, 20) µs (crosses the first)
    evs = [{"ph": "X", "cat": "kernel", "name": f"k{i}", "pid": 0, "tid": 7, "ts": ts, "dur": dur,
            "args": {"device": 0, "stream": 7, "correlation": i}} for i, (ts, dur) in enumerate([(0, 10), (5, 3), (9, 11)])]
    report = analyze(read_trace(write(tmp_path, "t.json", kineto(evs))), chip="h100")
    out = write_perfetto(report, tmp_path / "o.json")
    doc = json.loads((tmp_path / "o.json").read_text())
    _check_format_rules(doc)
    lanes = {e["name"]: e["tid"] for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "kernel"}
    assert lanes["k0"] == 7 and lanes["k1"] != 7 and lanes["k2"] != 7  # k1 and k2 each overlap k0
    assert lanes["k1"] == lanes["k2"]  # k1 ends (8 µs) before k2 starts (9 µs): one overlap lane holds both
    assert out.overlap_lanes == 2 and "2 ops overlap" in out.notes[0]
    names = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names[7] == "stream 7" and names[lanes["k1"]] == "stream 7 · overlap lane 1"


def test_cli_writes_it_and_checks_the_path_before_reading(example_trace, tmp_path):
    out = tmp_path / "t.json.gz"
    res = CliRunner().invoke(cli, ["analyze", str(example_trace), "--perfetto", str(out), "-q"])
    assert res.exit_code == 0, res.output
    doc = json.loads(gzip.decompress(out.read_bytes()))
    assert doc["traceroof"]["ops"] == 252 and doc["traceroof"]["findings"] == 5 and doc["distributedInfo"] == {"rank": 0}
    # a saved report with its op table exports the same slices
    saved = tmp_path / "r.json"
    assert CliRunner().invoke(cli, ["analyze", str(example_trace), "-o", str(saved), "-q"]).exit_code == 0
    out2 = tmp_path / "t2.json"
    assert CliRunner().invoke(cli, ["analyze", str(saved), "--perfetto", str(out2), "-q"]).exit_code == 0
    assert len([e for e in json.loads(out2.read_text())["traceEvents"] if e.get("cat") == "kernel"]) == 252
    # an unwritable path is exit 9, named with the option, before the (missing) trace is even looked at
    res = CliRunner().invoke(cli, ["analyze", str(tmp_path / "missing.json"), "--perfetto", str(tmp_path / "no" / "x.json")])
    assert res.exit_code == 9
    assert res.output.strip() == f"traceroof: error: --perfetto {tmp_path / 'no' / 'x.json'}: folder {tmp_path / 'no'} does not exist (create it first)"


def test_several_ranks_get_a_process_per_rank_and_device(tmp_path):
    from make_multirank import sglang_run

    run = sglang_run(tmp_path, per_rank=False)  # one merged file, 4 ranks (TP 2 × PP 2)
    report = analyze(read_trace(run["merged"]), chip="h100")
    _, doc = _export(report, tmp_path)
    _check_format_rules(doc)
    procs = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    pairs = sorted(set(report.ops.select("rank", "device").iter_rows()))
    assert len({r for r, _ in pairs}) == 4
    for r, d in pairs:
        assert procs[r * 1000 + d] == f"rank {r} · device {d}"
    for r in {r for r, _ in pairs}:
        assert procs[STEPS_PID_BASE + r] == f"rank {r} · steps"
    assert "distributedInfo" not in doc  # several ranks in one file: no single rank to name
