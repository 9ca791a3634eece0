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
    assert not host_mod._in_start_order(h) and host_mod._in_start_order(flagged)
    assert not host_mod._in_start_order(flagged.with_columns(pl.col("start_ns").set_sorted().shift(1)))
    for by in (["external_id"], ["rank", "external_id"]):
        fast = innermost_cpu_ops(flagged, by)
        assert fast.dtype == pl.UInt32
        assert fast.to_list() == innermost_cpu_ops(h, by).to_list()
        assert len(fast) > 1_000
