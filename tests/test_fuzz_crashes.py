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
import zlib

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


def test_a_time_past_decimals_exponent_range_is_skipped_and_counted():
    # "16728767E9197675" × 1000 is past Decimal's largest exponent (999,999 by default):
    # decimal.Overflow, an ArithmeticError that is no OverflowError (fuzz: kineto_times.py:106)
    data = kineto(_five()).replace(b'"ts": 1020', b'"ts": 16728767E9197675')
    for t in _both(data):
        assert t.ops["name"].to_list() == ["k0", "k1", "k3", "k4"]
        assert any("1 device events without a readable 'ts'" in w for w in t.meta.warnings)


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


def test_a_damaged_parquet_part_is_a_format_error_not_an_abort(cache):
    # bytes flipped inside a part's data pages made polars abort the process (a Rust
    # allocation of 2^61 bytes: the fuzz worker died with SIGABRT); the manifest now lists each
    # part's CRC-32 and the reader checks it first
    doc = json.loads((cache / "meta.json").read_text())
    part = cache / doc["tables"]["ops"]["files"][0]
    data = bytearray(part.read_bytes())
    assert doc["tables"]["ops"]["crc32"] == [zlib.crc32(data)]  # the CRC of the bytes as written
    data[len(data) // 2] ^= 0xFF
    part.write_bytes(bytes(data))
    with pytest.raises(TraceFormatError) as ex:
        read_trace(cache, jobs=1)
    assert ex.value.where == "crc32" and str(part) in str(ex.value) and "\n" not in str(ex.value)
    doc["tables"]["ops"]["crc32"] = ["0x1"]  # a damaged list of CRCs is named too
    (cache / "meta.json").write_text(json.dumps(doc))
    with pytest.raises(TraceFormatError) as ex:
        read_trace(cache, jobs=1)
    assert ex.value.where == "tables.ops.crc32"


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


# --- saved reports: the chip, the speed of light and the op table's read columns ----------
# (fuzz signatures TypeError / AttributeError / ValueError @web/figures.py:56, ValueError
# @figures.py:119 and :154, ZeroDivisionError @diff.py:187, ColumnNotFoundError @views.py:186)


@pytest.mark.parametrize("path, value, says", [
    # the chip section's "{} when no chip" alternative let any object through: a chip of the
    # wrong shape reached the dashboard's roofs
    ("chip.peak_flops_per_s", 18446744073709551616, "report.chip.peak_flops_per_s: expected object"),
    ("chip.peak_flops_per_s", "1e3", "report.chip.peak_flops_per_s: expected object"),
    ("chip.peak_flops_per_s.bf16", [None], "report.chip.peak_flops_per_s.bf16: expected number"),
    ("chip.peak_flops_per_s.fp8", "abc", "report.chip.peak_flops_per_s.fp8: expected number"),
    # of the right type but no peak: log10 of a negative roof
    ("chip.peak_flops_per_s.fp8", -(2 ** 63) - 1, "chip.peak_flops_per_s.fp8: expected a positive number"),
    ("chip.peak_flops_per_s.tf32", -1, "chip.peak_flops_per_s.tf32: expected a positive number"),
    ("chip.hbm_bytes_per_s", 0, "chip.hbm_bytes_per_s: expected a positive number"),
    ("filters", {"group_by": 5}, "report.filters.group_by: expected string"),  # the same hole in the filters
    # a speed of light of no device-step: its means divided by 0 in diff / gate --baseline
    ("speed_of_light.device_steps", KeyError, "speed_of_light.device_steps: expected an integer"),
    ("speed_of_light.device_steps", 0, "speed_of_light.device_steps: expected an integer"),
    # a column the dashboard reads, renamed ("peak_dtype "): polars' ColumnNotFoundError
    ("ops.peak_dtype", KeyError, "ops.peak_dtype: expected the op table's column"),
    ("ops.bucket", ["step", 2, "step", 4, "step"], "ops.bucket[1]: expected string or null, found 2"),
])
def test_a_saved_chip_light_or_read_column_of_the_wrong_shape_is_refused(tmp_path, saved, path, value, says):
    from traceroof.analysis import load_report

    f = write(tmp_path, "r.json", json.dumps(_set(saved, path, value)))
    with pytest.raises(ReportVersionError) as ex:
        load_report(str(f))
    assert says in str(ex.value) and str(f) in str(ex.value) and "\n" not in str(ex.value)


def _report(saved):
    from traceroof.report import Report

    return Report.from_dict(json.loads(json.dumps(saved)))


def test_the_roofline_draws_only_positive_peaks_and_clamps_its_axes_into_the_floats(saved):
    # a chip built by hand (library use; no door) with peaks at and past the float range's
    # edges: 5e-324 (the smallest float) ÷ 4 is 0 and 1e308 × 2.5 is inf, whose log10 raised
    import dataclasses
    import math
    import sys

    from traceroof.web import figures

    r = _report(saved)
    chip = dataclasses.replace(r.chip, peak_flops_per_s={"bf16": 5e-324, "fp32": 1e308, "fp8": -1.0,
                                                         "int8": "abc", "fp16": 0.0})
    assert figures.roofs(chip) == [(["fp32"], 1e308), (["bf16"], 5e-324)]  # fp8, int8, fp16: no roof
    fig = figures.roofline_figure(r.ops, chip)
    for axis in (fig.layout.xaxis, fig.layout.yaxis):
        lo, hi = axis.range
        assert math.isfinite(lo) and math.isfinite(hi) and lo < hi
        # ends clamped to the positive floats: log10(2.2e-308) = -307.65, log10(1.8e308) = 308.25
        assert math.log10(sys.float_info.min) <= lo and hi <= math.log10(sys.float_info.max)
        assert all(0 < v <= sys.float_info.max for v in axis.tickvals)
    assert [t.meta["peak_flops_per_s"] for t in fig.data if t.meta["role"] == "roof"] == [1e308, 5e-324]
    bad_hbm = dataclasses.replace(r.chip, hbm_bytes_per_s=-3.0)  # no bandwidth: no roofline, a note
    assert not [t for t in figures.roofline_figure(r.ops, bad_hbm).data if t.meta["role"] == "roof"]


def test_op_groups_of_a_table_without_peak_dtype_have_it_null(saved):
    import polars as pl

    from traceroof.web import views

    ops = _report(saved).ops.with_columns(pl.lit(1e6).alias("flops"))  # FLOPs, so a peak is taken
    assert ops["peak_dtype"].to_list() == ["fp32"] * 5 and ops["peak_flops_per_s"].null_count() == 0
    with_col = views.op_groups(ops)
    without = views.op_groups(ops.drop("peak_dtype"))
    # the five kernels k0..k4 (no framework op: grouped by kernel name) are five groups either way
    assert without.height == with_col.height == 5
    assert with_col["peak_dtype"].to_list() == ["fp32"] * 5
    assert without["peak_dtype"].null_count() == 5  # no column: no peak named, not a guess
    assert without.drop("peak_dtype").equals(with_col.drop("peak_dtype"))


def test_diff_of_a_speed_of_light_with_no_device_step_counts_the_steps_itself(saved):
    import dataclasses

    from traceroof import diff, gate

    r = _report(saved)
    hand = dataclasses.replace(r, speed_of_light=dataclasses.replace(r.speed_of_light, device_steps=0))
    d = diff.compare(hand, hand)
    # no speed of light to stand on: per (rank, step, device) of the step bucket's ops, as for
    # a report without one; the five kernels are all in step 0 of rank 0, device 0: 1 device-step
    assert d.a.device_steps == 1 and d.a.measured_ns is None and not d.a.complete
    lines = gate.explain(hand, hand)
    assert lines and lines[0].startswith("no step-time diff")


def test_a_saved_column_of_nulls_only_keeps_its_type(tmp_path, saved):
    # no op costed: expected_ns is all null in the JSON, which polars reads as its Null type;
    # diff's round() of it raised InvalidOperationError. Columns now take their declared types.
    import polars as pl

    from traceroof import diff
    from traceroof.analysis import load_report

    d = json.loads(json.dumps(saved))
    for col in ("expected_ns", "gap_ns", "efficiency", "peak_dtype"):
        d["ops"][col] = [None] * 5
    d["steps"][0]["flops"] = None
    r = load_report(str(write(tmp_path, "nulls.json", json.dumps(d))))
    assert r.ops.schema["expected_ns"] == pl.Float64 and r.ops.schema["peak_dtype"] == pl.String
    assert r.ops.schema["rank"] == pl.Int32 and r.steps.schema["flops"] == pl.Float64
    got = diff.compare(r, r)
    # uncosted ops count at their measured time: 5 kernels of 5 µs in one device-step, no change
    assert got.a.device_steps == 1 and [o.label for o in got.ops] == [f"k{i}" for i in range(5)]
    assert all(o.uncosted_a_ns == o.measured_a_ns == o.expected_a_ns == 5000.0 and o.delta_ns == 0.0 for o in got.ops)


def test_analyze_with_no_device_time_makes_a_report():
    # kernels without a duration: device time 0, and the "% of device time has no cost model"
    # warning divided by it (ZeroDivisionError @analysis.py:366)
    from traceroof.analysis import analyze

    evs = [_kernel(0, name="ncclKernel_AllReduce"), _kernel(1, name="ncclKernel_AllReduce")]
    for e in evs:
        del e["dur"]
    r = analyze(K.read_bytes(kineto(evs), path="t.json"), "h100")
    assert r.ops.height == 2 and int(r.ops["dur_ns"].sum()) == 0
    assert r.coverage.device_time_ns == 0
    assert not [w for w in r.warnings if "no cost model" in w]  # a share of no time is not said


# --- XPlane: HLO protos with fields of the wrong wire type (TypeError @hlo_modules.py:123) --


def _varint(n: int) -> bytes:
    out = b""
    while True:
        b, n = n & 0x7F, n >> 7
        out += bytes([b | (0x80 if n else 0)])
        if not n:
            return out


def _f(num: int, v) -> bytes:
    """One protobuf field: an int as a varint (wire type 0), bytes or str length-delimited
    (2), ``("i32", n)`` as fixed32 (5). https://protobuf.dev/programming-guides/encoding/"""
    if isinstance(v, tuple):
        return _varint(num << 3 | 5) + v[1].to_bytes(4, "little")
    if isinstance(v, int):
        return _varint(num << 3) + _varint(v)
    v = v.encode() if isinstance(v, str) else v
    return _varint(num << 3 | 2) + _varint(len(v)) + v


def _hlo_proto(*, shape=None, comp_id=None, entry_name="main", metadata=None) -> bytes:
    """An ``xla.HloProto``: one computation ``main`` of a parameter and ``add(p0, p0)``, both
    f32[4,4] (field numbers: the comment above ``PRIMITIVE_TYPES`` in hlo_modules.py)."""
    f32x4x4 = _f(2, 11) + _f(3, _varint(4) + _varint(4)) + _f(5, _f(1, _varint(1) + _varint(0)))
    shape = f32x4x4 if shape is None else shape
    p0 = _f(1, "p0") + _f(2, "parameter") + _f(3, f32x4x4) + _f(9, 0) + _f(35, 1)
    add = _f(1, "add") + _f(2, "add") + _f(3, shape) + _f(35, 2) + _f(36, _varint(1) + _varint(1))
    if metadata is not None:
        add += _f(7, metadata)
    comp = _f(1, "main") + _f(2, p0) + _f(2, add) + _f(5, 1 if comp_id is None else comp_id) + _f(6, 2)
    module = _f(1, "m") + _f(2, entry_name) + _f(3, comp) + _f(6, 1)
    return _f(1, module)


def test_a_good_hand_made_hlo_proto_reads_as_text():
    from traceroof.parsers import hlo_modules, xplane_source

    name, text = hlo_modules.module_text(hlo_modules.hlo_module_bytes(_hlo_proto()))
    assert name == "m"
    assert "ENTRY %main {" in text
    assert "  ROOT %add = f32[4,4]{1,0} add(%p0, %p0)" in text.splitlines()
    md = _f(2, "jit(f)/add") + _f(3, "f.py") + _f(4, 7)
    assert xplane_source.instruction_sources(_hlo_proto(metadata=md)) == {"add": ("jit(f)/add", "f.py:7")}


def _deep_tuple(depth: int) -> bytes:
    shape = _f(2, 11)
    for _ in range(depth):
        shape = _f(2, 13) + _f(4, shape)  # a tuple (element type 13) of the shape so far
    return shape


@pytest.mark.parametrize("kw, says", [
    ({"entry_name": 7}, "field 2 has wire type 0, expected length-delimited"),  # the fuzz case
    ({"comp_id": "one"}, "field 5 has wire type 2, expected varint"),
    ({"shape": 5}, "field 3 has wire type 0, expected length-delimited"),
    ({"shape": _f(2, 11) + _f(3, ("i32", 4))}, "an int field with wire type 5"),  # dims as fixed32
    ({"shape": _deep_tuple(1000)}, "tuple shapes nested deeper than 64"),  # RecursionError before
])
def test_an_hlo_proto_field_of_the_wrong_wire_type_is_a_wire_error(kw, says):
    from traceroof.parsers import hlo_modules
    from traceroof.parsers.xplane_proto_wire import WireError

    with pytest.raises(WireError) as ex:
        hlo_modules.module_info(_hlo_proto(**kw), "m")
    assert says in str(ex.value)


def test_op_metadata_of_the_wrong_wire_type_is_a_wire_error():
    from traceroof.parsers import xplane_source
    from traceroof.parsers.xplane_proto_wire import WireError

    for md in (3, _f(2, 9), _f(2, "op") + _f(4, "seven")):  # metadata, op_name, source_line
        with pytest.raises(WireError):
            xplane_source.instruction_sources(_hlo_proto(metadata=md))


def test_a_damaged_hlo_proto_in_a_trace_leaves_its_ops_uncosted_with_a_warning():
    # the project's jax CPU profile with one more field in jit_train_step(40)'s module: its
    # entry_computation_name again, as a varint (the last value of a field wins)
    from conftest import FIXTURES

    path = FIXTURES / "jax_cpu" / "train_step.xplane.pb"
    space = xp.XSpace()
    space.ParseFromString(path.read_bytes())
    meta = next(p for p in space.planes if p.name == "/host:metadata")
    names = {k: v.name for k, v in meta.stat_metadata.items()}
    stat = next(s for m in meta.event_metadata.values() if m.name == "jit_train_step(40)"
                for s in m.stats if names[s.metadata_id] == "Hlo Proto")
    from traceroof.parsers import hlo_modules

    module = hlo_modules.hlo_module_bytes(stat.bytes_value)
    stat.bytes_value = _f(1, module + _f(2, 7))
    good = xplane.read(path)
    t = xplane.read_bytes(space.SerializeToString(), "t.xplane.pb")
    n40 = good.ops.filter(good.ops["program_id"] == 40).height
    assert n40 > 0 and t.ops.height == good.ops.height
    # every op of program 40 lost its costs; the others kept theirs
    assert t.ops.filter(t.ops["program_id"] == 40)["cost_source"].unique().to_list() == ["unknown"]
    assert t.ops.filter(t.ops["program_id"] != 40)["flops"].equals(good.ops.filter(good.ops["program_id"] != 40)["flops"])
    assert any("HLO module not costed: jit_train_step(40)" in w and "wire type 0" in w for w in t.meta.warnings)


def test_diff_of_reports_with_no_steps_or_no_device_ops(tmp_path, saved):
    # a saved report of no step ("steps": []) came back as a table of no columns (diff:
    # ColumnNotFoundError "partial"); the analysis of a trace with no device op has an op
    # table without roofline columns (diff, op_match: ColumnNotFoundError "expected_ns")
    from traceroof import diff
    from traceroof.analysis import analyze, load_report

    d = json.loads(json.dumps(saved))
    d["steps"] = []
    del d["speed_of_light"]  # no step: no speed of light (the key is left out)
    r = load_report(str(write(tmp_path, "nosteps.json", json.dumps(d))))
    assert r.steps.height == 0 and {"rank", "step", "partial", "wall_ns"} <= set(r.steps.columns)
    got = diff.compare(r, r)
    # no complete step: the five step-bucket kernels of rank 0, device 0, step 0: 1 device-step
    assert got.a.device_steps == 1 and not got.a.complete and len(got.ops) == 5
    empty = analyze(K.read_bytes(kineto([]), path="t.json"), "h100")
    assert empty.ops.height == 0
    got = diff.compare(empty, empty)
    assert got.ops == [] and got.a.measured_ns is None
