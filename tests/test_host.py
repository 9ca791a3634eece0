"""traceroof.host.innermost_cpu_ops: which cpu_op names a kernel's framework op."""

from __future__ import annotations

import polars as pl

from traceroof.host import innermost_cpu_ops


def host(rows: list[tuple]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema={"rank": pl.Int32, "cat": pl.String, "start_ns": pl.Int64,
                                      "external_id": pl.Int64, "name": pl.String}, orient="row")


def test_the_innermost_op_is_the_one_that_started_last():
    h = host([
        (0, "cpu_op", 100, 7, "aten::linear"),
        (0, "cpu_op", 120, 7, "aten::addmm"),  # nested in linear: started later
        (0, "cuda_runtime", 130, 7, "cudaLaunchKernel"),  # not a cpu_op
        (0, "cpu_op", 200, 8, "aten::relu"),
        (0, "cpu_op", 90, None, "aten::empty"),  # no External id: never picked
    ])
    rows = innermost_cpu_ops(h, ["external_id"])
    assert rows.to_list() == [1, 3]
    assert h["name"].gather(rows).to_list() == ["aten::addmm", "aten::relu"]


def test_a_tie_in_start_goes_to_the_later_row_whatever_the_order():
    rows = [
        (0, "cpu_op", 100, 7, "aten::linear"),
        (0, "cpu_op", 100, 7, "aten::addmm"),  # same start: the later in table order wins
        (1, "cpu_op", 100, 7, "aten::mm"),  # another rank, same External id
    ]
    for _ in range(20):  # the sort must not leave the tie to chance
        picked = innermost_cpu_ops(host(rows), ["rank", "external_id"])
        assert picked.to_list() == [1, 2]
    assert innermost_cpu_ops(host(rows), ["external_id"]).to_list() == [2]


def test_many_rows_against_a_loop_over_the_rows():
    """200 k rows with few distinct starts (many ties), several keys per rank: the rows the
    polars query picks are the ones a plain loop keeps (a later start, or an equal start
    further down the table, replaces the one kept)."""
    import numpy as np

    rng = np.random.default_rng(19)
    n = 200_000
    cat = np.where(rng.random(n) < 0.7, "cpu_op", "cuda_runtime")
    ext = rng.integers(0, 5_000, n).astype(float)
    ext[rng.random(n) < 0.01] = np.nan  # no External id: never picked
    h = pl.DataFrame({"rank": rng.integers(0, 3, n).astype(np.int32), "cat": cat,
                      "start_ns": rng.integers(0, 50, n), "external_id": pl.Series(ext).fill_nan(None).cast(pl.Int64),
                      "name": ["x"] * n})
    kept: dict[tuple, tuple[int, int]] = {}
    for i, (r, c, s, e) in enumerate(zip(h["rank"].to_list(), h["cat"].to_list(), h["start_ns"].to_list(),
                                        h["external_id"].to_list())):
        if c == "cpu_op" and e is not None and ((r, e) not in kept or s >= kept[(r, e)][0]):
            kept[(r, e)] = (s, i)
    assert innermost_cpu_ops(h, ["rank", "external_id"]).to_list() == sorted(i for _, i in kept.values())


def test_a_table_flagged_in_start_order_picks_the_rows_of_the_sort():
    """A host table flagged sorted by ``start_ns`` (as the Kineto reader's is) takes the
    path without a sort; it picks the rows the sorting path picks on the same rows (ties in
    start, nested ops, several ranks, keys without an External id), and a table that is not
    flagged, or has a null start, takes the sorting path."""
    import numpy as np

    from traceroof import host as host_mod

    rng = np.random.default_rng(7)
    n = 50_000
    ext = rng.integers(0, 2_000, n).astype(float)
    ext[rng.random(n) < 0.02] = np.nan
    h = pl.DataFrame({"rank": rng.integers(0, 2, n).astype(np.int32),
                      "cat": np.where(rng.random(n) < 0.6, "cpu_op", "cuda_runtime"),
                      "start_ns": np.sort(rng.integers(0, 3_000, n)),  # many ties
                      "external_id": pl.Series(ext).fill_nan(None).cast(pl.Int64), "name": ["x"] * n})
    flagged = h.with_columns(pl.col("start_ns").set_sorted())
    assert not host_mod.in_start_order(h) and host_mod.in_start_order(flagged)
    assert not host_mod.in_start_order(flagged.with_columns(pl.col("start_ns").set_sorted().shift(1)))
    for by in (["external_id"], ["rank", "external_id"]):
        fast = innermost_cpu_ops(flagged, by)
        assert fast.dtype == pl.UInt32
        assert fast.to_list() == innermost_cpu_ops(h, by).to_list()
        assert len(fast) > 1_000


def test_the_linking_of_ops_by_id_is_the_same_in_start_order_and_not():
    """kineto_link._op_rows_by_id: on a host table flagged in start order only the ops' ids
    are grouped (largest row per id); the rows equal those of the sorting path on the same
    table unflagged, for ops whose id is missing, null, or names several nested cpu_ops."""
    import numpy as np

    from traceroof.parsers.kineto_link import _op_rows_by_id

    rng = np.random.default_rng(11)
    n = 30_000
    h = pl.DataFrame({"cat": np.where(rng.random(n) < 0.7, "cpu_op", "cuda_runtime"),
                      "start_ns": np.sort(rng.integers(0, 2_000, n)),
                      "external_id": rng.integers(0, 4_000, n)})
    ext = rng.integers(0, 6_000, 5_000).astype(float)  # ids past 4,000: no cpu_op
    ext[rng.random(5_000) < 0.1] = np.nan
    ops = pl.DataFrame({"external_id": pl.Series(ext).fill_nan(None).cast(pl.Int64)})
    slow = _op_rows_by_id(h, ops)
    fast = _op_rows_by_id(h.with_columns(pl.col("start_ns").set_sorted()), ops)
    assert fast.dtype == slow.dtype == pl.UInt32
    assert fast.to_list() == slow.to_list()
    assert 0 < fast.null_count() < ops.height
    # every row found is a cpu_op with the op's id, the last such row of the table
    found = pl.DataFrame({"ext": ops["external_id"], "row": fast}).drop_nulls()
    last = h.with_row_index("row").filter(pl.col("cat") == "cpu_op").group_by("external_id").agg(pl.col("row").max())
    want = dict(zip(last["external_id"].to_list(), last["row"].to_list()))
    assert all(want[e] == r for e, r in found.iter_rows())
