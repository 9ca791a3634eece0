"""Session 8 (issue 19 item 2, the 1 GB memory bar): the host table's text columns but
``name`` are dictionary-coded (``schema.CAT``, polars Categorical), on both Kineto decoder
paths and through the cache; an all-null declared column is a broadcast null; the findings
stage takes a slice, not a copy, of the op table when it leaves out one run of rows."""

from __future__ import annotations

import gzip
import json
from collections import Counter

import numpy as np
import polars as pl
import pytest
from conftest import real
from polars.testing import assert_frame_equal

from traceroof import read_trace
from traceroof.analysis import _kept_rows
from traceroof.cache import read_cache
from traceroof.ingest import write_cache
from traceroof.parsers.kineto_native_frames import _coded
from traceroof.schema import CAT, HOST_SCHEMA, OP_SCHEMA, conform

QWEN = ("TraceLens", "tests", "traces", "h100", "Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz")
CODED = ["pid", "thread", "cat", "input_dims", "input_types", "concrete_inputs", "coll_name", "coll_dtype"]


def _raw_cpu_op_dims(path) -> Counter:
    """The oracle: each ``cpu_op`` X event's ``Input Dims`` from the raw JSON (json module),
    re-serialised canonically."""
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    return Counter(json.dumps(e["args"]["Input Dims"]) for e in doc["traceEvents"]
                   if e.get("ph") == "X" and e.get("cat") == "cpu_op" and "Input Dims" in e.get("args", {}))


@pytest.mark.parametrize("decoder", ["native", "python"])
def test_host_text_columns_are_categorical_and_hold_the_traces_text(decoder, monkeypatch):
    monkeypatch.setenv("TRACEROOF_DECODER", decoder)
    path = real(*QWEN)
    host = read_trace(path).host
    assert [c for c, d in host.schema.items() if d == CAT] == CODED
    assert host.schema["name"] == pl.String and host.schema == HOST_SCHEMA
    # the text is the trace's: every cpu_op's Input Dims, as many times as the raw JSON has it
    dims = host.filter(pl.col("cat") == "cpu_op")["input_dims"].drop_nulls().to_list()
    got = Counter(json.dumps(json.loads(t)) for t in dims)
    want = _raw_cpu_op_dims(path)
    assert sum(want.values()) > 100 and got == want


def test_the_cache_keeps_the_coded_columns(tmp_path):
    tr = read_trace(real(*QWEN))
    back = read_cache(write_cache(tr, tmp_path / "c"))
    assert back.host.schema == HOST_SCHEMA
    assert_frame_equal(back.host, tr.host, check_exact=True)


def test_a_cache_written_with_text_columns_reads_back_coded(tmp_path):
    # a cache of the previous layout (the eight columns stored as String: cache_version 1
    # unchanged) reads back with the coded schema and the same text
    tr = read_trace(real(*QWEN))
    old = read_trace(real(*QWEN))
    object.__setattr__(old, "host", tr.host.with_columns(pl.col(c).cast(pl.String) for c in CODED))
    d = write_cache(old, tmp_path / "c")
    stored = {f: pl.read_parquet_schema(f) for f in d.rglob("*.parquet")}
    host_files = [s for s in stored.values() if "input_dims" in s]
    assert host_files and all(s["input_dims"] == pl.String for s in host_files)  # really the old layout
    back = read_cache(d)
    assert back.host.schema == HOST_SCHEMA
    assert_frame_equal(back.host, tr.host, check_exact=True)


def test_coded_is_the_plain_gather_with_nulls_and_repeats():
    # the dictionary with a null at 0 (an absent value), codes repeated and out of order
    strings = pl.Series(["", None, "[[2, 3]]", "[]", "unused", "[[4]]"], dtype=pl.String)
    codes = np.array([2, 2, 1, 5, 0, 3, 5, 2], dtype=np.int32)
    got = _coded(strings, codes)
    assert got.dtype == CAT
    assert got.to_list() == ["[[2, 3]]", "[[2, 3]]", None, "[[4]]", "", "[]", "[[4]]", "[[2, 3]]"]


def test_conform_broadcast_null_behaves_as_a_materialised_null():
    # (the memory it saves is measured by benchmarks/mem_stages.py, not here: polars'
    # estimated_size counts a broadcast column at 8 B a row too)
    df = pl.DataFrame({"rank": [0, 1, 1], "coll_name": pl.Series([None, None, None], dtype=pl.String),
                       "coll_in_nelems": pl.Series([None, None, None], dtype=pl.Int64),
                       "name": ["a", None, "b"]})
    out = conform(df, HOST_SCHEMA)
    assert out.schema == HOST_SCHEMA and out.height == 3
    assert out["coll_name"].null_count() == 3 and out["coll_in_nelems"].null_count() == 3
    # a partly-null column keeps its values
    assert out["name"].to_list() == ["a", None, "b"]
    # the broadcast null behaves as the materialised one: a filter and a gather of it
    assert out.filter(pl.col("rank") == 1)["coll_in_nelems"].to_list() == [None, None]
    assert out[[2, 0]]["coll_name"].to_list() == [None, None]


def test_conform_keeps_the_height_when_every_column_is_null():
    # every declared column present is null in every row and there is no extra column:
    # a select of literals alone would give one row, not three
    df = pl.DataFrame({"name": pl.Series([None] * 3, dtype=pl.String),
                       "start_ns": pl.Series([None] * 3, dtype=pl.Int64)})
    out = conform(df, HOST_SCHEMA)
    assert out.height == 3 and out.schema == HOST_SCHEMA
    assert conform(df.head(0), HOST_SCHEMA).height == 0


@pytest.mark.parametrize("mask", [
    [False, True, True, True, False],   # one run inside: a slice
    [True, True, False, False, False],  # one run at the start
    [True, True, True, True, True],     # every row
    [False, False, False, False, False],
    [True, False, True, False, True],   # gaps: a filter
    [False, False, False, False, True],
])
def test_kept_rows_equal_the_filter(mask):
    ops = conform(pl.DataFrame({"start_ns": [5, 1, 3, 2, 4], "name": ["a", "b", "c", "d", "e"]}), OP_SCHEMA)
    keep = pl.Series(mask)
    got = _kept_rows(ops, keep)
    assert_frame_equal(got, ops.filter(keep))
    assert got.height == sum(mask)


def test_kept_rows_copies_nothing_for_one_run(monkeypatch):
    # the slice path is taken for one run of kept rows (a filter would copy every column):
    # DataFrame.filter made to fail, the one-run masks still answer, the gapped one does not
    ops = conform(pl.DataFrame({"start_ns": [5, 1, 3, 2, 4], "name": ["a", "b", "c", "d", "e"]}), OP_SCHEMA)

    def no_filter(*a, **k):
        raise AssertionError("filtered")
    monkeypatch.setattr(pl.DataFrame, "filter", no_filter)
    assert _kept_rows(ops, pl.Series([False, True, True, True, False]))["name"].to_list() == ["b", "c", "d"]
    assert _kept_rows(ops, pl.Series([True] * 5)) is ops
    with pytest.raises(AssertionError, match="filtered"):
        _kept_rows(ops, pl.Series([True, False, True, False, True]))
