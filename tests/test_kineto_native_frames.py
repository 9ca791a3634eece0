"""``kineto_native_frames.NativeRows``: a piece's events sorted on their codes give the
counters and rows of ``kineto._Builder._sort``.

The oracle is twofold: the counts computed in the test from the raw event list (what each
branch of ``_sort`` means), and the msgspec path (``TRACEROOF_DECODER=python``) on every
table, column and meta key, in order. The trace mixes every branch and is streamed in small
pieces, so categories and phases are first met in different pieces.
"""

from __future__ import annotations

import dataclasses
import io
import random

from conftest import kineto, require_native
from test_kineto_native import count_paths

from traceroof.parsers import kineto as K
from traceroof.parsers import kineto_native as N

require_native(module_level=True)


def _events() -> list[dict]:
    rng = random.Random(19)
    evs: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "host"}},  # no ts: kept
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "main"}},
        {"cat": "kernel", "name": "no phase", "ts": 1, "dur": 1},  # no ph: empty
        # a category first met without ts (not counted), counted later: stats keep first-counted order
        {"ph": "X", "cat": "gpu_memset", "name": "early", "pid": 0, "tid": 7, "dur": 1},
    ]
    for i in range(400):
        ts = 10 * i
        kind = rng.randrange(12)
        if kind == 0:
            e = {"ph": "X", "cat": "kernel", "name": f"k{i % 5}", "pid": 0, "tid": 7, "ts": ts, "dur": 2,
                 "args": {"correlation": i, "stream": 7, "device": 0}}
        elif kind == 1:
            e = {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": ts,
                 "dur": 1, "args": {"correlation": i, "External id": 100 + i}}
        elif kind == 2:
            e = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": ts, "dur": 3,
                 "args": {"External id": 100 + i}}
        elif kind == 3:
            e = {"ph": "X", "cat": "python_function", "name": "f.py(1): g", "pid": 1, "tid": 1, "ts": ts, "dur": 1}
        elif kind == 4:
            e = {"ph": "X", "cat": "cuda_profiler_range", "name": "range", "pid": 0, "tid": 7, "ts": ts, "dur": 1}
        elif kind == 5:
            e = {"ph": rng.choice("sft"), "cat": "ac2g", "name": "flow", "id": i, "pid": 1, "tid": 1, "ts": ts}
        elif kind == 6:
            e = {"ph": "C", "cat": "counter", "name": "mem", "pid": 1, "ts": ts, "args": {"v": 1}}
        elif kind == 7:
            e = {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": ts, "s": "t"}
        elif kind == 8:
            e = {"ph": "i", "cat": "user_annotation", "name": "Iteration Start: PyTorch Profiler", "pid": 1,
                 "tid": 1, "ts": ts, "s": "t"}
        elif kind == 9:
            e = {"ph": rng.choice("bn"), "cat": "async", "name": "a", "id": i, "pid": 1, "tid": 1, "ts": ts}
        elif kind == 10:
            e = {"ph": "X", "cat": rng.choice(["gpu_memcpy", "gpu_memset"]), "name": "Memcpy HtoD", "pid": 0,
                 "tid": 7, "ts": ts, "dur": 1, "args": {"correlation": i, "stream": 7, "device": 0}}
        else:
            e = {"ph": "X", "cat": "kernel", "name": "k no ts", "pid": 0, "tid": 7, "dur": 1}  # empty
        evs.append(e)
    return evs


def _oracle(evs: list[dict]) -> dict:
    """What ``_sort`` counts, from the raw events."""
    kept = [e for e in evs if "ph" in e and (e["ph"] == "M" or "ts" in e)]
    x = [e for e in kept if e["ph"] == "X"]
    cats: dict = {}
    for e in kept:
        cats[e.get("cat")] = cats.get(e.get("cat"), 0) + 1
    unknown: dict = {}
    for e in kept:
        if e["ph"] not in "XMsftiIC":
            unknown[e["ph"]] = unknown.get(e["ph"], 0) + 1
    return {
        "skipped_empty": len(evs) - len(kept),
        "python_function_events": sum(e["cat"] == "python_function" for e in x),
        "ranges": sum(e["cat"] == "cuda_profiler_range" for e in x),
        "flow_events": sum(e["ph"] in "sft" for e in kept),
        "counter_samples": sum(e["ph"] == "C" for e in kept),
        "memory_samples": sum(e["ph"] == "i" and e["name"] == "[memory]" for e in kept),
        "device_rows": sum(e["cat"] in ("kernel", "gpu_memcpy", "gpu_memset") for e in x),
        "cats": {f"events[{k}]": v for k, v in cats.items() if k is not None},
        "unknown": unknown,
    }


def test_every_branch_counts_as_the_raw_events_say_and_as_msgspec(monkeypatch):
    evs = _events()
    want = _oracle(evs)
    assert want["unknown"] and want["ranges"] and want["memory_samples"]  # the mix has every branch
    doc = kineto(evs)
    scans, wrapped = count_paths(monkeypatch)
    got = {}
    for mode in ("python", "native"):
        monkeypatch.setenv(N.ENV_DECODER, mode)
        got[mode] = K.read_fileobj(io.BytesIO(doc), path="t.json", block_bytes=2 << 10)
    assert scans.count(True) > 10  # many native pieces
    t = got["native"]
    st = t.meta.stats
    for key in ("skipped_empty", "python_function_events", "flow_events", "counter_samples", "memory_samples"):
        assert st[key] == want[key], key
    assert {k: v for k, v in st.items() if k.startswith("events[")} == want["cats"]
    # categories in the order of their first counted (kept) event, gpu_memset's early empty one aside
    first = list(dict.fromkeys(f"events[{e['cat']}]" for e in evs
                               if "ph" in e and (e["ph"] == "M" or "ts" in e) and "cat" in e))
    assert [k for k in st if k.startswith("events[")] == first
    assert t.ops.height == want["device_rows"]
    unknown = ", ".join(f"{k}×{v}" for k, v in sorted(want["unknown"].items()))
    assert f"ignored events with unsupported phases: {unknown}" in t.meta.warnings
    assert any(f"{want['ranges']} kernel ranges" in w for w in t.meta.warnings)
    m = got["python"]
    for tbl in ("ops", "host"):
        assert getattr(t, tbl).equals(getattr(m, tbl)), tbl
    assert dataclasses.asdict(t.meta) == dataclasses.asdict(m.meta)
    assert list(t.meta.stats) == list(m.meta.stats)
