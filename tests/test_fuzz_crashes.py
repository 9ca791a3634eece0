"""Every kind of crash the fuzz harness (fuzz/, docs/fuzzing.md) found, as a minimal
reproducer built here from bytes, with the behaviour the fix gives: a damaged trace keeps
what can be read and says what was lost; what is not a trace is one line naming the file,
the place and what was expected, with its exit code (never 70, never a traceback).
"""

from __future__ import annotations

import gzip
import io
import json
import tarfile
import time

import pytest
from conftest import kineto, write

from traceroof.cli import main
from traceroof.errors import ReportVersionError, TraceFormatError
from traceroof.io import read_trace
from traceroof.parsers import kineto as K
from traceroof.parsers import xplane
from traceroof.parsers import xplane_proto as xp


def _kernel(i: int, **kw) -> dict:
    e = {"ph": "X", "cat": "kernel", "name": f"k{i}", "pid": 0, "tid": 7, "ts": 1000 + 10 * i, "dur": 5,
         "args": {"correlation": i, "device": 0, "stream": 7}}
    e.update(kw)
    return e


def _five() -> list[dict]:
    return [_kernel(i) for i in range(5)]


def _both(data: bytes):
    """The in-memory and the streaming reader (1 KiB blocks) on the same bytes."""
    return (K.read_bytes(data, path="t.json"),
            K.read_fileobj(io.BytesIO(data), path="t.json", block_bytes=1024))


def _dropped(trace) -> int:
    return int(trace.meta.stats.get("dropped_events", 0))


# --- Kineto: nesting past the recursion limit (msgspec RecursionError) --------------------


@pytest.mark.parametrize("where", ["name", "args"])
def test_nesting_deeper_than_the_recursion_limit_drops_that_event_only(where):
    deep = "[" * 1200 + "]" * 1200  # msgspec counts depth against sys.getrecursionlimit() (1000)
    evs = _five()
    evs[2][where] = "@DEEP@"
    data = kineto(evs).replace(b'"@DEEP@"', deep.encode())
    for t in _both(data):
        assert t.ops["name"].to_list() == ["k0", "k1", "k3", "k4"]  # 5 written, the deep one lost
        assert _dropped(t) == 1
        assert any("1 dropped" in w for w in t.meta.warnings)


def test_nesting_in_the_header_keeps_the_events():
    data = kineto(_five()).replace(b'"schemaVersion": 1', b'"schemaVersion": ' + b"[" * 1500 + b"]" * 1500)
    for t in _both(data):
        assert t.ops.height == 5


def test_an_array_as_event_name_is_a_damaged_event_not_seconds_of_polars():
    # 500 deep is under the recursion limit: before the fix polars took ~4 s and 1.6 GB
    # building (then refusing) a nested-list column for this one name
    evs = _five()
    evs[1]["name"] = "@N@"
    evs[3]["cat"] = ["kernel"]  # a list as category: unhashable, it crashed the event sort
    data = kineto(evs).replace(b'"@N@"', b"[" * 500 + b"1" + b"]" * 500)
    t0 = time.process_time()
    for t in _both(data):
        assert t.ops["name"].to_list() == ["k0", "k2", "k4"]
        assert _dropped(t) == 2
    assert time.process_time() - t0 < 2.0


# --- Kineto: numbers past the column's integer range -----------------------------------


def test_ids_past_int64_are_unknown_and_a_device_past_int32_falls_back_to_pid():
    evs = _five()
    evs[3]["args"]["correlation"] = 2 ** 64  # past int64
    evs[1]["args"]["External id"] = 10 ** 30
    evs[2]["args"]["device"] = 2 ** 40  # past Int32
    evs[2]["pid"] = 3
    for t in _both(kineto(evs)):
        rows = {r["name"]: r for r in t.ops.to_dicts()}
        assert rows["k3"]["correlation"] is None
        assert rows["k4"]["correlation"] == 4
        assert rows["k2"]["device"] == 3  # the pid
        assert t.ops.height == 5


def test_a_time_past_int64_ns_is_skipped_and_counted():
    data = kineto(_five()).replace(b'"ts": 1020', b'"ts": 1e400').replace(b'"ts": 1030', b'"ts": -1e300')
    for t in _both(data):
        assert t.ops["name"].to_list() == ["k0", "k1", "k4"]
        assert any("2 device events without a readable 'ts'" in w for w in t.meta.warnings)


# --- gzip and tar wrappers --------------------------------------------------------------


def _corrupt_deflate() -> tuple[bytes, int]:
    """A gzip of 20,000 kernels whose deflate stream turns corrupt three quarters in."""
    raw = kineto([_kernel(i) for i in range(20_000)])
    gz = bytearray(gzip.compress(raw, compresslevel=1, mtime=0))
    at = len(gz) * 3 // 4
    gz[at:at + 64] = bytes(64)  # zeroed: a bad block, or a bad CRC at the end (zlib.error either way)
    return bytes(gz), 20_000


def test_a_corrupt_deflate_block_keeps_what_inflated_before_it():
    gz, n = _corrupt_deflate()
    mem = K.read_bytes(gz, path="t.json.gz")  # gzip.decompress raised zlib.error: exit 70 before
    streamed = K.read_fileobj(io.BytesIO(gz), path="t.json.gz", block_bytes=1 << 16)
    for t in (mem, streamed):
        assert n // 2 < t.ops.height < n  # the first ~3/4 kept, the rest lost
        assert any("cut" in w or "truncat" in w or "dropped" in w for w in t.meta.warnings), t.meta.warnings


def test_a_corrupt_gzip_head_is_sniffed_as_gzip_not_a_traceback(tmp_path):
    gz = bytearray(gzip.compress(kineto(_five()), mtime=0))
    gz[12:40] = bytes(28)  # the deflate stream broken at its start: the registry's sniff raised zlib.error
    f = write(tmp_path, "t.json.gz", bytes(gz))
    with pytest.raises(TraceFormatError) as ex:
        read_trace(f, jobs=1)
    assert str(f) in str(ex.value) and "\n" not in str(ex.value)


def test_a_damaged_tar_is_one_line_exit_4(tmp_path, capsys):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        data = kineto(_five())
        info = tarfile.TarInfo("rank0.json")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    gz = bytearray(gzip.compress(buf.getvalue(), mtime=0))
    gz[40:48] = bytes(8)
    f = write(tmp_path, "run.tar.gz", bytes(gz))
    with pytest.raises(SystemExit) as ex:
        main(["analyze", str(f), "-q"])
    err = capsys.readouterr().err
    assert ex.value.code == 4
    assert err.count("\n") == 1 and str(f) in err and "a readable tar archive" in err


# --- XPlane: negative durations -----------------------------------------------------------


def test_xplane_negative_duration_events_are_left_out_and_counted():
    space = xp.XSpace(hostnames=["h"])
    plane = space.planes.add(id=1, name="/device:GPU:0")
    plane.event_metadata[1].CopyFrom(xp.XEventMetadata(id=1, name="gemm_kernel"))
    line = plane.lines.add(id=7, name="Stream #7", timestamp_ns=100)
    for i in range(4):
        line.events.add(metadata_id=1, offset_ps=i * 10_000, duration_ps=2_000)
    line.events[2].duration_ps = -5_000_000  # a damaged duration (varint 2^64 - 5e6, read as signed)
    t = xplane.read_bytes(space.SerializeToString(), "t.xplane.pb")
    assert t.ops.height == 3  # 4 written, 1 negative
    assert t.meta.stats["xplane.negative_duration_device_ops"] == 1
    assert any("negative duration" in w for w in t.meta.warnings)


# --- the cache ----------------------------------------------------------------------------


@pytest.fixture()
def cache(tmp_path):
    from traceroof.ingest import write_cache

    return write_cache(K.read_bytes(kineto(_five()), path="t.json"), tmp_path / "c")


@pytest.mark.parametrize("edit, where", [
    (lambda m: "[" * 5000 + "]" * 5000, "meta.json"),  # nested past json's recursion limit
    (lambda m: json.dumps({**m, "tables": {**m["tables"], "ops": {**m["tables"]["ops"], "files": [None]}}}),
     "tables.ops.files"),
    (lambda m: json.dumps({**m, "meta": {**m["meta"], "rank_labels": [1, 2]}}), "meta"),
    (lambda m: json.dumps({**m, "meta": {**m["meta"], "devices": [7]}}), "meta"),
    # fields of the wrong type crashed the merge of a dataset's fragments (unhashable, str < int)
    (lambda m: json.dumps({**m, "meta": {**m["meta"], "devices": [{"name": ["H100"]}]}}), "meta"),
    (lambda m: json.dumps({**m, "meta": {**m["meta"], "ranks": ["zero"]}}), "meta"),
    (lambda m: json.dumps({**m, "costs": {**m["costs"], "model_id": [1]}}), "costs.model_id"),  # unhashable
    (lambda m: json.dumps({**m, "costs": {**m["costs"], "coverage": {**m["costs"]["coverage"],
                                                                     "by_source_ns": {"trace": float("inf")}}}}),
     "costs"),  # json.loads reads Infinity: int(inf) raised OverflowError
])
def test_a_damaged_cache_manifest_is_a_format_error_naming_the_place(cache, edit, where):
    f = cache / "meta.json"
    f.write_text(edit(json.loads(f.read_text())))
    with pytest.raises(TraceFormatError) as ex:
        read_trace(cache, jobs=1)
    assert ex.value.where == where and "\n" not in str(ex.value)


# --- saved reports (gate, serve) ------------------------------------------------------------


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    from traceroof.analysis import analyze

    f = tmp_path_factory.mktemp("r") / "report.json"
    analyze(K.read_bytes(kineto(_five(), deviceProperties=[{"id": 0, "name": "NVIDIA H100 80GB HBM3"}]),
                         path="t.json"), "h100").save(f)
    return json.loads(f.read_text())


def _set(d: dict, path: str, value) -> dict:
    d = json.loads(json.dumps(d))
    *head, last = path.split(".")
    cur = d
    for k in head:
        cur = cur[k]
    if value is KeyError:
        del cur[last]
    else:
        cur[last] = value
    return d


@pytest.mark.parametrize("path, value, says", [
    ("chip", KeyError, "expected the key 'chip'"),
    ("summary.step_time_ns", "fast", "report.summary.step_time_ns: expected"),
    ("filters.group_by", "-inf", "filters.group_by: expected 'op' or 'kernel'"),
    ("ranking", [{"label": "a", "count": 1}, {"label": [[[1]]], "count": 2}], "report.ranking[1].label: expected string"),
    # a column the schema does not type: polars refused the nested list ("failed to determine supertype")
    ("ranking", [{"label": "a", "extra": 1.5}, {"label": "b", "extra": [[[1]]]}], "ranking.extra: expected a scalar"),
    ("steps", [{"step": 1}, {"step": "two"}], "report.steps[1].step: expected integer"),
    ("ops.kind", None, "ops.kind: expected an array"),
    ("ops.start_ns", KeyError, "ops.start_ns: expected the op table's column"),  # the timeline read it
])
def test_a_damaged_saved_report_is_one_line_naming_the_key(tmp_path, saved, path, value, says):
    from traceroof.analysis import load_report

    f = write(tmp_path, "r.json", json.dumps(_set(saved, path, value)))
    with pytest.raises(ReportVersionError) as ex:
        load_report(str(f))
    assert says in str(ex.value) and str(f) in str(ex.value) and "\n" not in str(ex.value)


def test_report_nan_surrogates_deep_nesting_and_missing_finding_keys_are_refused(tmp_path, saved):
    from traceroof.report import Report

    text = json.dumps(saved)
    bad = {
        "nan": text.replace('"trace":', '"nan_probe": NaN, "trace":', 1),  # json.loads reads NaN
        "surrogate": json.dumps({**saved, "warnings": ["\ud800"]}),
        "deep": json.dumps({**saved, "warnings": []}).replace('"warnings": []', '"warnings": ' + "[" * 3000 + "]" * 3000),
        "finding": json.dumps({**saved, "findings": [{"detector": "x"}]}),
    }
    for name, body in bad.items():
        f = write(tmp_path, f"{name}.json", body)
        with pytest.raises(ReportVersionError) as ex:
            Report.load(f)
        assert str(f) in str(ex.value) and "\n" not in str(ex.value), name


def test_a_good_saved_report_still_loads_and_gates(tmp_path, saved, capsys):
    f = write(tmp_path, "good.json", json.dumps(saved))
    with pytest.raises(SystemExit) as ex:
        main(["gate", str(f), "--min-hfu", "0.0"])
    err = capsys.readouterr().err
    # read and gated: this trace has no shapes, so HFU is unknown and its check fails (exit 1,
    # docs/gate.md), where a refused report would exit 4
    assert ex.value.code == 1 and "gate failed" in err, err


def test_every_section_of_a_full_report_passes_the_check(example_trace):
    from traceroof.analysis import analyze
    from traceroof.report_schema import check_report

    d = json.loads(analyze(read_trace(example_trace, jobs=1)).to_json(include_ops=True))
    assert d["findings"] and d["ops"] and d["steps"] and d["ranking"]  # the check sees every table
    check_report(d, "example.json")  # raises on the first key of the wrong type


def test_gate_on_a_damaged_report_exits_4_with_one_line(tmp_path, saved, capsys):
    f = write(tmp_path, "bad.json", json.dumps(_set(saved, "summary.step_time_ns", [1, 2])))
    with pytest.raises(SystemExit) as ex:
        main(["gate", str(f), "--min-hfu", "0.1"])
    err = capsys.readouterr().err
    assert ex.value.code == 4 and err.count("\n") == 1 and "summary.step_time_ns" in err


def test_header_numbers_out_of_range_are_ignored_with_a_warning():
    # distributedInfo.rank past Int32 crashed the rank column's literal (InvalidOperationError)
    data = kineto(_five(), distributedInfo={"rank": -(2 ** 63), "world_size": 10 ** 30},
                  baseTimeNanoseconds=10 ** 40)
    for t in _both(data):
        assert t.ops["rank"].unique().to_list() == [0]
        assert t.meta.world_size is None and t.meta.base_time_ns is None
        assert sum("ignored" in w for w in t.meta.warnings) == 3


def test_one_long_event_streams_in_linear_time():
    # no event boundary for 10 MB: the stream read one more block per try and searched the
    # whole buffer again (O(n^2 / block): over 10 s at 1 KiB blocks); now it reads
    # geometrically more
    evs = _five()
    evs[2]["args"]["Input Dims"] = [[1] * 3_200_000]  # ~10 MB of one event, no "}, {" inside
    data = kineto(evs)
    t0 = time.process_time()
    streamed = K.read_fileobj(io.BytesIO(data), path="t.json", block_bytes=1024)
    assert time.process_time() - t0 < 3.0
    assert streamed.ops["name"].to_list() == [f"k{i}" for i in range(5)]
