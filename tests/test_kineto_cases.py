"""Kineto parsing cases from ../shared/cases/CASES.md, each on a small input built here."""

from __future__ import annotations

import gzip
import json

import polars as pl
import pytest
from conftest import kineto, write

from traceroof.errors import TraceFormatError
from traceroof.parsers import kineto as K


def kernel(name="k", ts=0, dur=5, stream=7, corr=None, **args):
    a = {"device": 0, "stream": stream, **args}
    if corr is not None:
        a["correlation"] = corr
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur, "args": a}


# --------------------------------------------------------------------------- BC-01
def test_bc01_unescaped_quote_and_backslash_in_names_are_repaired():
    good = json.dumps(kernel("gemm", ts=10, dur=5))
    bad_quote = '{"ph": "X", "cat": "python_function", "name": "{"device": "cpu", "dtype": "float32"}(12): run", "pid": 1, "tid": 1, "ts": 1, "dur": 2}'
    bad_bslash = '{"ph": "X", "cat": "python_function", "name": "C:\\Users\\u\\a.py(3): f", "pid": 1, "tid": 1, "ts": 3, "dur": 2}'
    doc = '{"schemaVersion": 1, "traceEvents": [' + ",".join([good, bad_quote, bad_bslash]) + "]}"
    with pytest.raises(json.JSONDecodeError):
        json.loads(doc)  # the input really is invalid JSON
    t = K.read_bytes(doc.encode(), path="bc01.json")
    assert t.ops.height == 1 and t.ops["name"][0] == "gemm"
    assert t.meta.stats["malformed_events"] == 2
    assert t.meta.stats["repaired_events"] == 2
    assert t.meta.stats["python_function_events"] == 2  # both kept after repair
    assert any("not valid JSON" in w for w in t.meta.warnings)


# --------------------------------------------------------------------------- BC-02
def test_bc02_control_char_and_invalid_utf8_are_replaced_and_counted():
    k = json.dumps(kernel("gemm", ts=10, dur=5)).encode()
    op = b'{"ph": "X", "cat": "cpu_op", "name": "aten::a\x01b", "pid": 1, "tid": 1, "ts": 1, "dur": 2, "args": {"External id": 3}}'
    py = b'{"ph": "X", "cat": "python_function", "name": "cfg\xffx.py(0): <module>", "pid": 1, "tid": 1, "ts": 2, "dur": 1}'
    doc = b'{"traceEvents": [' + b",".join([k, op, py]) + b"]}"
    t = K.read_bytes(doc, path="bc02.json")
    assert t.ops.height == 1
    assert t.meta.stats["encoding_repairs"] == 2
    assert t.meta.stats["events"] == 3
    names = t.host["name"].to_list()
    assert names == ["aten::a\x01b"]  # the control character is kept, escaped on read
    assert t.meta.stats["python_function_events"] == 1


def test_bc02_host_only_noise_is_noted():
    evs = [{"ph": "X", "cat": "python_function", "name": f"f{i}.py(1): g", "pid": 1, "tid": 1, "ts": i, "dur": 1} for i in range(2000)]
    evs.append(kernel("gemm", ts=5000, dur=5))
    t = K.read_bytes(kineto(evs), path="noise.json")
    assert t.ops.height == 1
    assert any("host-only noise" in w for w in t.meta.warnings)


# --------------------------------------------------------------------------- BC-04
def test_bc04_empty_last_event_and_unknown_top_level_keys():
    doc = b'{"traceEvents":[{"ph":"X","name":"k","pid":1,"tid":1,"ts":0,"dur":5,"cat":"kernel"},{}],"metadata":{"x":1}}'
    t = K.read_bytes(doc, path="bc04.json")
    assert t.ops.height == 1
    assert t.meta.stats["skipped_empty"] == 1
    assert t.ops["dur_ns"][0] == 5000


# --------------------------------------------------------------------------- BC-05
def test_bc05_no_distributed_info_is_one_rank():
    evs = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 10, "args": {"External id": 9}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 1, "dur": 3,
         "args": {"External id": 9, "correlation": 77}},
        kernel("gemm", ts=5, dur=4, corr=77),
    ]
    t = K.read_bytes(kineto(evs), path="single.json")
    assert t.meta.ranks == [0]
    assert t.ops.height == 1
    row = t.ops.row(0, named=True)
    assert row["op"] == "aten::mm"
    assert row["launch_start_ns"] == 1000 and row["launch_dur_ns"] == 3000
    assert row["start_ns"] == 5000 and row["rank"] == 0


def test_bc05_metadata_only_file():
    evs = [{"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "python"}},
           {"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": "main"}}]
    t = K.read_bytes(kineto(evs), path="meta_only.json")
    assert t.ops.height == 0 and t.host.height == 0
    assert any("no timed events" in w for w in t.meta.warnings)


# --------------------------------------------------------------------------- BC-06
def test_bc06_phases_other_than_x_do_not_become_ops():
    evs = [
        kernel("gemm", ts=0, dur=10),
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 10, "args": {"External id": 1}},
        {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": 2, "args": {"Bytes": 1048576}},
        {"ph": "C", "name": "GPU Utilization", "pid": 0, "tid": 0, "ts": 3, "args": {"GPU Utilization": 0.5}},
        {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 7, "pid": 1, "tid": 1, "ts": 1},
        {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": 7, "pid": 0, "tid": 7, "ts": 4, "bp": "e"},
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}},
    ]
    t = K.read_bytes(kineto(evs), path="bc06.json")
    assert t.ops.height == 1 and t.host.height == 1  # 2 op rows in all: kernel + cpu_op
    assert t.meta.stats["memory_samples"] == 1
    assert t.meta.stats["counter_samples"] == 1
    assert t.meta.stats["flow_events"] == 2
    assert int(t.ops["dur_ns"].sum()) == 10_000


def test_bc06_two_rank_files_with_the_same_correlation_ids_do_not_cross_link(tmp_path):
    from traceroof.io import read_trace

    for r, (op, launch_ts) in enumerate((("aten::mm", 1), ("aten::add", 2))):
        evs = [
            {"ph": "X", "cat": "cpu_op", "name": op, "pid": 1, "tid": 1, "ts": 0, "dur": 10, "args": {"External id": 5}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": launch_ts, "dur": 1,
             "args": {"External id": 5, "correlation": 7}},
            kernel(f"k{r}", ts=5, dur=2, corr=7),
        ]
        write(tmp_path, f"rank{r}.json", kineto(evs, distributedInfo={"rank": r, "world_size": 2}))
    t = read_trace(tmp_path, jobs=1)
    got = dict(zip(t.ops["name"].to_list(), t.ops["op"].to_list()))
    assert got == {"k0": "aten::mm", "k1": "aten::add"}
    assert sorted(t.ops["rank"].to_list()) == [0, 1]


# --------------------------------------------------------------------------- BC-07
def test_bc07_sub_microsecond_and_negative_durations():
    evs = [kernel("a", ts=100.7, dur=0.2), kernel("b", ts=200.0, dur=0), kernel("c", ts=300.0, dur=-1)]
    t = K.read_bytes(kineto(evs), path="bc07.json")
    assert t.ops["dur_ns"].to_list() == [200, 0]  # exact, never negative
    assert t.ops["dur_ns"].mean() == 100
    assert t.meta.stats["negative_duration_device_events"] == 1
    assert any("negative duration" in w for w in t.meta.warnings)


# --------------------------------------------------------------------------- BC-10
@pytest.mark.parametrize("quote", [False, True])
def test_bc10_absolute_timestamps_keep_nanoseconds(quote):
    ts1, ts2 = "1708722576381804.130", "1708722576381804.560"
    q = '"' if quote else ""
    doc = (
        '{"traceEvents": ['
        f'{{"ph":"X","cat":"kernel","name":"K1","pid":0,"tid":7,"ts":{q}{ts1}{q},"dur":0.400,"args":{{"stream":7}}}},'
        f'{{"ph":"X","cat":"kernel","name":"K2","pid":0,"tid":7,"ts":{q}{ts2}{q},"dur":0.100,"args":{{"stream":7}}}}'
        "]}"
    )
    t = K.read_bytes(doc.encode(), path="bc10.json")
    k1, k2 = t.ops.sort("start_ns").iter_rows(named=True)
    assert (k1["name"], k2["name"]) == ("K1", "K2")
    gap = k2["start_ns"] - (k1["start_ns"] + k1["dur_ns"])
    assert gap == 30  # 804.560 − (804.130 + 0.400) µs = 0.030 µs, exactly
    assert t.meta.origin_ns == 1708722576381804130
    # a float64 parse would have seen an overlap
    assert float(ts1) + 0.4 > float(ts2)


# --------------------------------------------------------------------------- BC-12
NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


@pytest.mark.parametrize("name", [NCCL, NCCL.lower()])
def test_bc12_nccl_dev_kernels_are_collectives(name):
    evs = [kernel("gemm", ts=0, dur=10, stream=7), kernel(name, ts=5, dur=10, stream=20)]
    t = K.read_bytes(kineto(evs), path="bc12.json")
    kinds = dict(zip(t.ops["name"].to_list(), t.ops["kind"].cast(pl.String).to_list()))
    assert kinds[name] == "collective"
    assert kinds["gemm"] != "collective"


def test_bc12_collective_message_size_from_kernel_args():
    evs = [kernel("ncclDevKernel_AllGather_RING_LL(x)", ts=0, dur=20, stream=20,
                  **{"Collective name": "_allgather_base", "In msg nelems": 25136, "Out msg nelems": 201088,
                     "Group size": 8, "dtype": "BFloat16"})]
    t = K.read_bytes(kineto(evs), path="coll.json")
    row = t.ops.row(0, named=True)
    assert row["comm_bytes"] == 201088 * 2  # the full gathered buffer, bf16
    assert row["group_size"] == 8
    assert row["op"] == "nccl:_allgather_base"


# --------------------------------------------------------------------------- BC-14
def _step_trace(with_steps: bool, lost_launch: bool = False) -> bytes:
    evs = []
    corr = 100
    for n in range(3, 7):
        base = n * 1000
        if with_steps:
            evs.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": 1, "tid": 1,
                        "ts": base, "dur": 900, "args": {}})
        for i in range(3):
            corr += 1
            evs.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                        "ts": base + 10 + i * 10, "dur": 5, "args": {"correlation": corr}})
            if not (lost_launch and n == 6 and i == 2):
                evs.append(kernel("k", ts=base + 50 + i * 100, dur=50, corr=corr))
    return kineto(evs)


def test_bc14_no_step_markers_is_one_unsegmented_step():
    from traceroof import analyze
    from traceroof.chips import get_chip

    t = K.read_bytes(_step_trace(False), path="nosteps.json")
    assert t.ops["step"].null_count() == t.ops.height == 12
    r = analyze(t, get_chip("h100"))
    assert r.steps.height == 1 and r.steps["step"][0] is None
    assert any("unsegmented" in w for w in r.warnings)


def test_bc14_cut_last_step_is_partial_and_excluded():
    from traceroof import analyze
    from traceroof.chips import get_chip

    t = K.read_bytes(_step_trace(True, lost_launch=True), path="steps.json")
    assert sorted(t.ops["step"].unique().to_list()) == [3, 4, 5, 6]
    r = analyze(t, get_chip("h100"))
    partial = r.steps.filter("partial")["step"].to_list()
    assert partial == [6]
    assert r.summary.step.complete_steps == 3
    assert any("step 6 is partial" in w for w in r.warnings)


# --------------------------------------------------------------------------- BC-35
def _thousand() -> bytes:
    evs = [kernel(f"k{i}", ts=i * 10, dur=5) for i in range(1000)]
    return kineto(evs, deviceProperties=[{"name": "NVIDIA H100 80GB HBM3", "numSms": 132}])


def test_bc35_cut_mid_name_keeps_complete_events():
    data = _thousand()
    i998 = data.index(b'"name": "k997"')  # event 998 (1-based)
    cut = data[: i998 + len(b'"name": "k9')]
    t = K.read_bytes(cut, path="cut.json")
    assert t.ops.height == 997
    assert t.ops["name"].to_list()[-1] == "k996"
    w = [x for x in t.meta.warnings if "truncated at byte" in x]
    assert w and str(len(cut)) in w[0]


def test_bc35_cut_after_comma():
    data = _thousand()
    i = data.index(b'{"ph": "X", "cat": "kernel", "name": "k998"')
    cut = data[:i]  # ends with ', '
    t = K.read_bytes(cut, path="cut2.json")
    assert t.ops.height in (997, 998)
    assert t.ops.height == 998  # events up to k997 are complete
    # nothing was dropped, but the user is told the file ends early
    assert [w for w in t.meta.warnings if "truncated" in w] == [
        f"cut2.json: trace is truncated at byte {len(cut)} (cut between two events); 998 complete events "
        "recovered; the last step is probably incomplete and header keys written after the events may be missing"
    ]


def test_bc35_cut_gzip_stream():
    data = gzip.compress(_thousand())
    t = K.read_bytes(data[: len(data) * 3 // 4], path="cut.json.gz")
    assert 0 < t.ops.height < 1000
    assert any("truncated" in w for w in t.meta.warnings)


# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "data, where",
    [(b"", "empty file"), (b"hello world", "JSON object"), (b"[1, 2, 3]", "JSON object"),
     (b'{"foo": 1}', "traceEvents"), (b"\x1f\x8b\x08\x00garbage", "gzip")],
)
def test_not_a_trace_is_one_clear_error(data, where):
    with pytest.raises(TraceFormatError) as ei:
        K.read_bytes(data, path="bad.json")
    msg = str(ei.value)
    assert msg.startswith("bad.json: ") and where in msg


def test_bc02_invalid_utf8_in_a_large_chunked_file_recovers_every_event():
    # > 1.5 chunks, so the array is decoded in pieces; one lone 0xFF byte in one name is the
    # only damage (the whole-file pass skips the event array without checking its UTF-8)
    evs = [kernel(f"k{i}", ts=i * 10, dur=5) for i in range(150_000)]
    doc = kineto(evs).replace(b'"k75000"', b'"k\xff75000"')
    assert len(doc) > 12 << 20
    t = K.read_bytes(doc, path="big.json")
    assert t.ops.height == 150_000
    assert t.meta.stats["encoding_repairs"] == 1
    assert "k\ufffd75000" in set(t.ops["name"].to_list())
