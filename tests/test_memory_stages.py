"""The memory-saving forms of the analysis stages (issue 19) give exactly what the plain
forms gave: ``costing_shapes.shape_keys`` (packed dense-rank codes instead of a hash of
three text columns), ``graph_sources.shared_strings`` (one Python string per distinct
value), ``unlaunched._runs`` (names by code)."""

from __future__ import annotations

import polars as pl
from conftest import real

from traceroof import read_trace
from traceroof.costing_shapes import join_columns, shape_keys, shapes_by_external_id
from traceroof.graph_match import KernelCounts
from traceroof.graph_sources import shared_strings
from traceroof.unlaunched import _runs

QWEN = ("TraceLens", "tests", "traces", "h100", "Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz")
SK = ["input_dims", "input_types", "concrete_inputs"]


def _text_keys(host: pl.DataFrame, of: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The oracle: the former form, a unique of the three text columns and a join on them."""
    sh = shapes_by_external_id(host, of)
    keys = sh.select(SK).unique(maintain_order=True).with_row_index("_skey")
    ids = sh.join(keys, on=SK, how="left", nulls_equal=True, maintain_order="left").select(
        "rank", "external_id", "_skey")
    return ids, keys


def test_shape_keys_equal_the_text_join_on_a_real_trace():
    tr = read_trace(real(*QWEN))
    of = tr.ops.select("rank", "external_id").filter(pl.col("external_id").is_not_null())
    ids, keys = shape_keys(tr.host, of)
    want_ids, want_keys = _text_keys(tr.host, of)
    assert ids.equals(want_ids) and keys.equals(want_keys)
    # the keys are distinct triples, as many as the text has (counted from the rows themselves)
    sh = shapes_by_external_id(tr.host, of)
    assert keys.height == len(set(sh.select(SK).iter_rows())) > 1


def test_shape_keys_nulls_and_codes_apart():
    # rows 0 and 3 equal (a null equals a null); row 1 differs from 0 only in the third
    # column, row 2 only by a null where 0 has text; ("a", None, None) vs (None, "a", None):
    # the same codes in different columns must stay apart
    host = pl.DataFrame({
        "rank": [0] * 6, "external_id": [1, 2, 3, 4, 5, 6], "cat": ["cpu_op"] * 6,
        "start_ns": [10, 20, 30, 40, 50, 60],
        "input_dims": ["[[1]]", "[[1]]", None, "[[1]]", "a", None],
        "input_types": ["float", "float", "float", "float", None, "a"],
        "concrete_inputs": [None, "['']", None, None, None, None],
    })
    of = host.select("rank", "external_id")
    ids, keys = shape_keys(host, of)
    assert ids["_skey"].to_list() == [0, 1, 2, 0, 3, 4]
    assert keys.select(SK).rows() == [("[[1]]", "float", None), ("[[1]]", "float", "['']"),
                                      (None, "float", None), ("a", None, None), (None, "a", None)]


def test_shape_keys_a_column_null_on_every_row():
    host = pl.DataFrame({
        "rank": [0, 0, 0], "external_id": [1, 2, 3], "cat": ["cpu_op"] * 3, "start_ns": [1, 2, 3],
        "input_dims": ["[[2]]", "[[3]]", "[[2]]"], "input_types": ["float"] * 3,
        "concrete_inputs": pl.Series([None, None, None], dtype=pl.String),
    })
    ids, keys = shape_keys(host, host.select("rank", "external_id"))
    assert ids["_skey"].to_list() == [0, 1, 0]
    assert keys.select(SK).rows() == [("[[2]]", "float", None), ("[[3]]", "float", None)]
    # every text column null on every row: one key, the all-null triple
    none = host.with_columns(pl.lit(None, pl.String).alias(c) for c in SK)
    ids, keys = shape_keys(none, none.select("rank", "external_id"))
    assert ids["_skey"].to_list() == [0, 0, 0] and keys.select(SK).rows() == [(None, None, None)]


def test_shared_strings_equal_to_list_one_object_per_value():
    col = pl.Series(["kernel_" + "x" * 200, None, "k2", "kernel_" + "x" * 200, "k2", None])
    got = shared_strings(col)
    assert got == col.to_list()
    assert got[0] is got[3] and got[2] is got[4]
    distinct = pl.Series(["a", "b"])
    assert shared_strings(distinct) == ["a", "b"]


def test_unlaunched_runs_names_as_in_the_table():
    # rank 0: kernels in device order z, a(miss), b(miss), launched, a(miss); rank 1: b(miss)
    kern = pl.DataFrame({
        "_r": [0, 1, 2, 3, 4, 5], "rank": [0, 0, 0, 0, 0, 1], "start_ns": [1, 2, 3, 4, 5, 1],
        "stream": [7] * 6, "name": ["z", "a", None, "q", "a", "b"],
        "_miss": [False, True, True, False, True, True],
    })
    assert _runs(kern) == [(0, [1, 2], ["a", ""]), (0, [4], ["a"]), (1, [5], ["b"])]


def test_join_columns_is_the_left_join():
    ops = pl.DataFrame({"k": [1, 2, None, 1, 3], "v": ["a", "b", "c", "d", "e"]})
    right = pl.DataFrame({"k": [1, 3, None], "x": [10.0, 30.0, 99.0]})
    for ne in (False, True):
        want = ops.join(right, on=["k"], how="left", nulls_equal=ne, maintain_order="left")
        got = join_columns(ops, right, ["k"], nulls_equal=ne)
        assert got.equals(want)
    # nulls apart: the null key takes no value; nulls equal: it takes 99
    assert join_columns(ops, right, ["k"])["x"].to_list() == [10.0, None, None, 10.0, 30.0]
    assert join_columns(ops, right, ["k"], nulls_equal=True)["x"].to_list() == [10.0, None, 99.0, 10.0, 30.0]
    # a key matching two rows on the right: more rows than ops, as the plain join gives
    dup = pl.DataFrame({"k": [1, 1], "x": [1.0, 2.0]})
    got = join_columns(ops, dup, ["k"])
    assert got.height == 7 and got.equals(ops.join(dup, on=["k"], how="left", maintain_order="left"))


def test_kernel_counts_is_the_dict_it_replaces():
    # lenders 0 and 2 launched 3 and 1 kernels; 1 launched none (not a key); 5 is out of range
    counts = KernelCounts([3, 0, 1])
    assert counts == {0: 3, 2: 1} and len(counts) == 2 and list(counts.items()) == [(0, 3), (2, 1)]
    assert counts.get(1, 7) == 7 and counts.get(5, 9) == 9 and counts.get(-1, 4) == 4 and counts[2] == 1
    assert 1 not in counts and 0 in counts
