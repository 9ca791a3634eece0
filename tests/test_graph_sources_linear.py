"""graph_sources.build_source and unlaunched._runs (vectorised: lenders gathered lazily, op
keys and eager names formed in polars only when capture windows exist, a window's launches
found by sorted search, runs cut by a cumulative count) against the old, straightforward
formulations kept here as oracles (a Python loop or a filter per window), on the generated
capture trace, the real vLLM and SGLang traces (capture windows and graph replays) and the
real Qwen trace (kernels queued before the recording: unlaunched runs)."""

from __future__ import annotations

import polars as pl
import pytest
from conftest import FIXTURES, real
from make_graph_replay import three_ops
from tracegen import TraceBuilder

from traceroof import graph_capture
from traceroof.graph_sources import build_source, key
from traceroof.host import innermost_cpu_ops
from traceroof.io import read_trace
from traceroof.schema import HOST_SCHEMA
from traceroof.unlaunched import _runs

TRACES = [
    FIXTURES / "graph_replay" / "capture_and_replay.json.gz",
    real("TraceLens", "tests", "traces", "inference", "vllm_decode_full", "graph_execution.json.gz"),
    real("TraceLens", "tests", "traces", "inference", "sglang_decode", "sglang_Qwen3-8B_decode.json.gz"),
    real("TraceLens", "tests", "traces", "h100", "Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"),
]


def _old_source(ops: pl.DataFrame, host: pl.DataFrame):
    """build_source as it was (commit fa36e88): every lender row gathered, keys for every
    lender by iter_rows, eager names by a Python loop, one host filter per window."""
    at = innermost_cpu_ops(host, ["rank", "external_id"])
    rows = host[at]
    lender = rows.select("rank", "external_id").with_row_index("_l")
    eager = (ops.filter(~pl.col("graph").fill_null(False), pl.col("external_id").is_not_null(),
                        ~pl.col("kind").cast(pl.String).is_in(["memcpy", "memset"]))
             .sort("rank", "start_ns", "stream")
             .join(lender, on=["rank", "external_id"], how="left", maintain_order="left"))
    seqs = {int(r): (g["name"].to_list(), g["_l"].to_list()) for (r,), g in eager.group_by("rank", maintain_order=True)}
    counts = eager.filter(pl.col("_l").is_not_null()).group_by("_l").len()
    op_kernels = {int(a): int(b) for a, b in counts.iter_rows()}
    keys = key(rows)
    names: dict[tuple, list[str]] = {}
    seen: dict[tuple, int] = {}
    for name, lend in eager.filter(pl.col("_l").is_not_null()).select("name", "_l").iter_rows():
        if seen.setdefault(keys[lend], lend) == lend:
            names.setdefault(keys[lend], []).append(name)
    captures: dict[int, list] = {}
    win = graph_capture.windows(host)
    calls = host.filter(pl.col("cat") == "runtime", pl.col("name").str.contains(r"(?i)launch"),
                        ~pl.col("name").str.contains(r"(?i)graphlaunch|launchhostfunc")).sort("start_ns")
    calls = calls.join(lender, on=["rank", "external_id"], how="left", maintain_order="left")
    for rank, thread, s, e in win.select("rank", "thread", "start_ns", "end_ns").iter_rows():
        lenders = calls.filter(pl.col("rank") == rank, pl.col("thread") == thread,
                               pl.col("start_ns") >= s, pl.col("start_ns") < e)["_l"].to_list()
        nth: dict[int, int] = {}
        known = []
        for lend in lenders:
            if lend is None:
                known.append(None)
                continue
            j = nth.get(lend, 0)
            nth[lend] = j + 1
            ks = names.get(keys[lend], [])
            known.append(ks[j] if j < len(ks) else None)
        captures.setdefault(int(rank), []).append((known, lenders))
    # lenders as host rows: the new Source numbers only the ops it can lend, differently
    to_host = at.to_list()
    seqs = {r: (names, [None if x is None else to_host[x] for x in ls]) for r, (names, ls) in seqs.items()}
    op_kernels = {to_host[x]: n for x, n in op_kernels.items()}
    captures = {r: [(names, [None if x is None else to_host[x] for x in ls]) for names, ls in qs]
                for r, qs in captures.items()}
    return rows, seqs, op_kernels, captures, win.height


def _as_host(src):
    """The new Source's eager sequences, kernel counts and captures with lenders as host rows."""
    to_host = src.at.to_list()
    h = lambda ls: [None if x is None else to_host[x] for x in ls]  # noqa: E731
    return ({r: (q.names, h(q.lenders)) for r, q in src.eager.items()},
            {to_host[x]: n for x, n in src.op_kernels.items()},
            {r: [(q.names, h(q.lenders)) for q in qs] for r, qs in src.captures.items()})


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_build_source_equals_the_old_formulation(path):
    t = read_trace(path)
    rows, seqs, op_kernels, captures, n_windows = _old_source(t.ops, t.host)
    src = build_source(t.ops, t.host, "x", same_trace=True)
    assert _as_host(src) == (seqs, op_kernels, captures)
    # a lender's host row, gathered lazily, is a row the old table held (the old one held
    # every cpu_op; the new one those an eager kernel or a capture's launch names)
    assert 0 < src.at.len() <= rows.height
    old_of_host = {h: i for i, h in enumerate(innermost_cpu_ops(t.host, ["rank", "external_id"]).to_list())}
    assert src.rows_at(list(range(src.at.len()))).equals(rows[[old_of_host[h] for h in src.at.to_list()]])
    if "capture" in path.name:
        # the trace with a capture does exercise the window path: launches with known names
        assert n_windows == 1 and any(x is not None for qs in captures.values() for names, _ in qs for x in names)


def test_build_source_many_windows_equals_the_old_formulation(tmp_path):
    """Three capture windows on one thread (ops captured twice over: a lender launching two
    kernels, keys whose first eager instance decides the names; one capture at batch 32 that
    never ran eagerly: unknown names), then, edited into the host table: the first window's
    End call lasting past the next Begin (overlapping windows: the launches in the overlap
    belong to both), one launch inside a window on no thread, and the three captures copied
    to a second thread of rank 1."""
    b = TraceBuilder()
    b.begin_step(1)
    three_ops(b)
    three_ops(b)
    b.end_step()
    for batch in (64, 64, 32):
        b.begin_capture()
        three_ops(b, batch=batch)
        if batch == 64:
            three_ops(b, batch=batch)
        b.end_capture()
    t = read_trace(b.write(tmp_path / "t.json.gz"))
    h = t.host.with_row_index("_i")
    begins = h.filter(pl.col("name").str.contains("BeginCapture")).sort("start_ns")["start_ns"].to_list()
    end1 = h.filter(pl.col("name").str.contains("EndCapture")).sort("start_ns")["_i"][0]
    launch2 = h.filter(pl.col("name").str.contains("LaunchKernel"), pl.col("start_ns") > begins[1]).sort("start_ns")
    late = int(launch2["start_ns"][2]) + 1  # the first window now ends after the 3rd launch of the second
    h = h.with_columns(pl.when(pl.col("_i") == end1).then(late - pl.col("start_ns")).otherwise(pl.col("dur_ns"))
                       .alias("dur_ns"),
                       pl.when(pl.col("_i") == launch2["_i"][4]).then(None).otherwise(pl.col("thread")).alias("thread"))
    other = h.filter(pl.col("start_ns") >= begins[0]).with_columns(pl.lit(1, pl.Int32).alias("rank"),
                                                                  pl.lit("t2", HOST_SCHEMA["thread"]).alias("thread"))
    host = pl.concat([h, other]).drop("_i")
    ops = pl.concat([t.ops, t.ops.with_columns(pl.lit(1, pl.Int32).alias("rank"))])
    rows, seqs, op_kernels, captures, n_windows = _old_source(ops, host)
    src = build_source(ops, host, "x", same_trace=True)
    assert n_windows == 6
    assert _as_host(src) == (seqs, op_kernels, captures)
    # the overlap: the first window of rank 0 also holds the second's first 3 launches
    # (4 + 4 of its own, 3 more); the launch on no thread is in no window (4 + 4 - 1 = 7)
    assert [len(lenders) for _, lenders in captures[0]] == [11, 7, 4]
    # names known for the batch-64 captures, unknown for the batch-32 one
    assert all(x is not None for x in captures[0][0][0]) and all(x is None for x in captures[0][2][0])


def _old_runs(kern: pl.DataFrame):
    """unlaunched._runs as it was: a Python loop over every kernel in device order."""
    out = []
    for (rank,), g in kern.sort("rank", "start_ns", "stream").group_by("rank", maintain_order=True):
        rows, names, cur_rows, cur_names = g["_r"].to_list(), g["name"].to_list(), [], []
        for r, name, miss in zip(rows, names, g["_miss"].to_list(), strict=True):
            if miss:
                cur_rows.append(r)
                cur_names.append(name or "")
            elif cur_rows:
                out.append((int(rank), cur_rows, cur_names))
                cur_rows, cur_names = [], []
        if cur_rows:
            out.append((int(rank), cur_rows, cur_names))
    return out


def test_unlaunched_runs_equal_the_old_loop():
    """On the Qwen trace (its first kernels were queued before the recording) and on a
    two-rank table built here whose missing flags alternate in runs of 1–5."""
    t = read_trace(TRACES[-1])
    miss = pl.col("launch_start_ns").is_null() & pl.col("op").is_null() & pl.col("external_id").is_null()
    kern = t.ops.with_row_index("_r").with_columns(miss.alias("_miss"))
    want = _old_runs(kern)
    assert len(want) >= 1 and _runs(kern) == want
    n = 200
    flags = [(i // (1 + i % 5)) % 2 == 0 for i in range(n)]
    made = pl.DataFrame({"_r": pl.Series(range(n), dtype=pl.UInt32), "rank": [i % 2 for i in range(n)],
                         "start_ns": [(n - i) * 10 for i in range(n)], "stream": [7] * n,
                         "name": [None if i % 17 == 0 else f"k{i % 6}" for i in range(n)], "_miss": flags})
    want = _old_runs(made)
    assert len(want) > 20 and _runs(made) == want
