"""Interval unions (traceroof.intervals) against a plain-Python sweep, grouped and ungrouped.

The grouped union shifts each group's times by ``group index * span`` so one running
maximum serves every group; when that could overflow int64 it falls back to a per-group
window. Both paths are checked against the same oracle.
"""

from __future__ import annotations

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from traceroof import intervals as iv


def _oracle(rows: list[tuple[int, int, int, int]]) -> list[tuple[int, int, int, int]]:
    """Plain sort-and-sweep union per (a, b) group: the textbook algorithm."""
    out: list[list[int]] = []
    for a, b, s, e in sorted(rows):
        if out and (out[-1][0], out[-1][1]) == (a, b) and s <= out[-1][3]:
            out[-1][3] = max(out[-1][3], e)
        else:
            out.append([a, b, s, e])
    return [tuple(x) for x in out]  # type: ignore[misc]


interval_rows = st.lists(
    st.tuples(
        st.integers(0, 2), st.integers(0, 2), st.integers(-1_000, 1_000), st.integers(0, 300)
    ).map(lambda t: (t[0], t[1], t[2], t[2] + t[3])),
    min_size=1, max_size=60,
)


def _frame(rows: list[tuple[int, int, int, int]]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema={"a": pl.Int32, "b": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64},
                        orient="row")


@settings(max_examples=300, deadline=None)
@given(interval_rows)
def test_grouped_union_equals_the_sweep(rows: list[tuple[int, int, int, int]]) -> None:
    got = iv.union(_frame(rows), by=["a", "b"])
    assert [tuple(r) for r in got.iter_rows()] == _oracle(rows)


@settings(max_examples=100, deadline=None)
@given(interval_rows)
def test_grouped_union_with_huge_spans_takes_the_window_path_and_agrees(rows: list[tuple[int, int, int, int]]) -> None:
    # one interval 2**61 ns away makes span * rows exceed 2**62: the offset trick is off
    far = (9, 9, 2**61, 2**61 + 5)
    got = iv.union(_frame([*rows, far]), by=["a", "b"])
    assert [tuple(r) for r in got.iter_rows()] == _oracle([*rows, far])


@settings(max_examples=200, deadline=None)
@given(interval_rows)
def test_ungrouped_union_equals_the_sweep(rows: list[tuple[int, int, int, int]]) -> None:
    flat = [(0, 0, s, e) for _, _, s, e in rows]
    got = iv.union(_frame(rows).select("start_ns", "end_ns"))
    assert [(s, e) for s, e in got.iter_rows()] == [(s, e) for _, _, s, e in _oracle(flat)]


def test_touching_intervals_merge_and_gaps_do_not() -> None:
    # [0,10) and [10,20) touch: one interval; [25,30) is separate: total 20 + 5 = 25
    df = pl.DataFrame({"start_ns": [0, 10, 25], "end_ns": [10, 20, 30]})
    assert iv.union(df).rows() == [(0, 20), (25, 30)]
    assert iv.union_ns(df) == 25


sorted_lists = st.lists(st.tuples(st.integers(-500, 500), st.integers(0, 60)), max_size=40).map(
    lambda xs: [(s, s + d) for s, d in xs])


def _points(intervals):
    """The integer instants an interval list covers: the oracle for set arithmetic."""
    return {t for s, e in intervals for t in range(s, e)}


@settings(max_examples=300, deadline=None)
@given(sorted_lists, sorted_lists)
def test_subtract_by_bisection_covers_exactly_a_minus_b(a, b):
    from traceroof.findings._common import subtract, subtract_sorted, union

    ua, ub = union(a), union(b)
    got = subtract_sorted(ua, [s for s, _ in ub], [e for _, e in ub])
    assert _points(got) == _points(ua) - _points(ub)
    # disjoint, sorted, non-empty pieces
    assert all(s < e for s, e in got) and all(x[1] <= y[0] for x, y in zip(got, got[1:]))
    assert _points(subtract(ua, ub)) == _points(ua) - _points(ub)


def _oracle_length(rows: list[tuple[int, int, int, int]]) -> dict[tuple[int, int], int]:
    """Union length per (a, b) group from the sweep oracle."""
    out: dict[tuple[int, int], int] = {}
    for a, b, s, e in _oracle(rows):
        out[(a, b)] = out.get((a, b), 0) + (e - s)
    return out


@settings(max_examples=300, deadline=None)
@given(interval_rows, st.booleans())
def test_union_lengths_of_several_subsets_equal_the_sweep_of_each(rows, far) -> None:
    """``union_lengths`` sweeps every subset in one pass; each column must be the length of
    that subset's own union (the sweep oracle), per group, 0 where the group has none of it.
    ``far`` adds an interval 2**61 ns away, which turns the offset trick off (the fallback)."""
    if far:
        rows = [*rows, (9, 9, 2**61, 2**61 + 5)]
    df = _frame(rows)
    sets = {"all": pl.lit(True), "even": pl.col("start_ns") % 2 == 0, "long": (pl.col("end_ns") - pl.col("start_ns")) > 100}
    got = iv.union_lengths(df, sets, by=["a", "b"])
    keys = sorted({(a, b) for a, b, _, _ in rows})
    assert [(a, b) for a, b in got.select("a", "b").iter_rows()] == keys
    for name, keep in (("all", lambda s, e: True), ("even", lambda s, e: s % 2 == 0), ("long", lambda s, e: e - s > 100)):
        want = _oracle_length([r for r in rows if keep(r[2], r[3])])
        assert got[name].to_list() == [want.get(k, 0) for k in keys], name


@settings(max_examples=300, deadline=None)
@given(interval_rows)
def test_device_order_cover_and_busy_time_equal_the_sweep(rows) -> None:
    """The detectors' device order (a running maximum of the ends per rank/device, lifted
    per group instead of a window) and the busy time summed from its growth, against plain
    Python: the cover of each op is the latest end of its rank/device so far, and the busy
    time the sweep union's length."""
    from traceroof.findings import FindingContext
    from traceroof.findings._common import busy_ns, device_order

    df = _frame(rows).rename({"a": "rank", "b": "device"}).with_columns(
        pl.col("rank").cast(pl.Int32), pl.col("device").cast(pl.Int32),
        (pl.col("end_ns") - pl.col("start_ns")).alias("dur_ns"))
    ctx = FindingContext(ops=df, host=pl.DataFrame(), steps=pl.DataFrame(), chip=None, meta=None)
    d = device_order(ctx)
    cover: dict[tuple[int, int], int] = {}
    want = []
    for a, b, _, e in sorted(rows):
        cover[(a, b)] = max(cover.get((a, b), e), e)
        want.append(cover[(a, b)])
    assert d["cover_ns"].to_list() == want
    per_rank: dict[int, int] = {}
    for (r, _), n in _oracle_length(rows).items():
        per_rank[r] = per_rank.get(r, 0) + n
    for r in range(3):
        assert busy_ns(ctx, r) == per_rank.get(r, 0)


@settings(max_examples=200, deadline=None)
@given(interval_rows, st.booleans())
def test_union_of_an_already_sorted_frame_equals_the_sweep(rows, far) -> None:
    """``union_sorted`` skips the sort for a frame kept in (group, start) order; ``far`` (an
    interval 2**61 ns away) takes the per-group window path instead of the offset trick."""
    if far:
        rows = [*rows, (9, 9, 2**61, 2**61 + 5)]
    df = _frame(rows).sort("a", "b", "start_ns")
    got = iv.union_sorted(df, by=["a", "b"])
    assert [tuple(r) for r in got.iter_rows()] == _oracle(rows)
