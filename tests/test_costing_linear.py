"""The costing's cheaper formulations against the old, straightforward ones (kept here as
oracles): the innermost cpu_op of the External ids wanted (one sort and a shift compare,
``costing_shapes.innermost_of``) against :func:`traceroof.host.innermost_cpu_ops` over the whole
table; the shapes looked up for an op table's ids only against the shapes of every id; the
coverage sums in one select against one filter per sum; the formula fill as one lazy query
against the eager ``with_columns``; and ``compute_costs`` with them all on real traces
against the shapes of every host row."""

from __future__ import annotations

import random

import polars as pl
import pytest
from conftest import FIXTURES, real
from polars.testing import assert_frame_equal

from traceroof import costing, costing_shapes
from traceroof.host import innermost_cpu_ops
from traceroof.io import read_trace
from traceroof.schema import HOST_SCHEMA, empty


def _random_host(rng: random.Random, n: int) -> pl.DataFrame:
    """``n`` host rows: 3 ranks (and a null one), External ids from a small range (so keys
    repeat: nested ops), starts from a small range (so ties at one ns), some rows of other
    categories and some without an External id."""
    base = empty(HOST_SCHEMA)
    return pl.DataFrame({
        "rank": [rng.choice([0, 1, 2, None]) for _ in range(n)],
        "cat": [rng.choice(["cpu_op"] * 4 + ["runtime", "annotation"]) for _ in range(n)],
        "start_ns": [rng.randrange(50) for _ in range(n)],
        "external_id": [None if rng.random() < 0.1 else rng.randrange(200) for _ in range(n)],
        "input_dims": [rng.choice(["[[1,2]]", "[[3]]", None]) for _ in range(n)],
    }, schema={k: base.schema[k] for k in ("rank", "cat", "start_ns", "external_id", "input_dims")})


def test_innermost_of_equals_innermost_cpu_ops():
    rng = random.Random(7)
    for _ in range(60):
        host = _random_host(rng, rng.randint(0, 400))
        every = innermost_cpu_ops(host, ["rank", "external_id"])
        assert costing_shapes.innermost_of(host, None).equals(every)
        want = pl.Series([rng.randrange(200) for _ in range(rng.randint(0, 80))] + [None], dtype=pl.Int64)
        got = costing_shapes.innermost_of(host, want).to_list()
        # the oracle: the rows of the whole-table rule whose External id is wanted
        ids = set(want.drop_nulls().to_list())
        assert got == [r for r in every.to_list() if host["external_id"][r] in ids]
    # the tie rules the sort must keep: the later start wins, then the later row
    host = pl.DataFrame({"rank": [0, 0, 0, 0], "cat": ["cpu_op"] * 4, "start_ns": [5, 9, 9, 1],
                         "external_id": [1, 1, 1, 1]}, schema_overrides={"rank": pl.Int32})
    assert costing_shapes.innermost_of(host, pl.Series([1])).to_list() == [2]


@pytest.mark.parametrize("path", [
    real("TraceLens", "tests", "traces", "h100", "Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"),
    real("HolisticTraceAnalysis", "tests", "data", "trace_filter", "sampled_rank-0.json.gz"),
    FIXTURES / "example_h100_decoder.json.gz",
], ids=lambda p: p.name)
def test_shapes_of_the_linked_ids_equal_those_of_every_id(path):
    t = read_trace(path)
    of = t.ops.select("rank", "external_id").filter(pl.col("external_id").is_not_null())
    every = costing.shapes_by_external_id(t.host)
    some = costing.shapes_by_external_id(t.host, of)
    keys = ["rank", "external_id"]
    wanted = every.join(of.unique(), on=keys, how="semi", maintain_order="left")
    assert wanted.height > 0
    assert_frame_equal(some.join(of.unique(), on=keys, how="semi", maintain_order="left"), wanted, check_exact=True)
    # and the costed table is the one the shapes of every host row give
    old = costing.shape_keys
    try:
        costing.shape_keys = lambda host, of=None: old(host)
        want_ops, want_cov = costing.compute_costs(t)
    finally:
        costing.shape_keys = old
    got_ops, got_cov = costing.compute_costs(t)
    assert_frame_equal(got_ops, want_ops, check_exact=True)
    assert got_cov == want_cov


def _old_coverage_sums(ops: pl.DataFrame) -> dict[str, int]:
    """The sums ``_coverage`` took one filter at a time (commit fa36e88)."""
    kernels = ops.filter(~pl.col("kind").cast(pl.String).is_in(["memcpy", "memset"]))
    linked = kernels.filter(pl.col("op").is_not_null())
    bytes_only = (~pl.col("kind").cast(pl.String).is_in(["collective", "memcpy", "memset"])
                  & pl.col("bytes").is_not_null() & pl.col("flops").is_null())
    return {
        "device_ns": int(ops["dur_ns"].sum() or 0),
        "linked_ns": int(linked["dur_ns"].sum() or 0),
        "linked_costed_ns": int(linked.filter(costing._costed())["dur_ns"].sum() or 0),
        "split_ops": int(ops.filter(pl.col("_nk") > 1).select(pl.struct(["rank", "external_id"]).n_unique()).item()
                         if ops.height else 0),
        "kernel_ns": int(kernels["dur_ns"].sum() or 0),
        "bytes_only_ns": int(ops.filter(bytes_only)["dur_ns"].sum() or 0),
        "group_size_assumed_ns": int(ops.filter(pl.col("_gs_assumed").fill_null(False))["dur_ns"].sum() or 0),
    }


@pytest.mark.parametrize("path", [
    real("TraceLens", "tests", "traces", "h100", "Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"),
    FIXTURES / "faults" / "train_allreduce_h100.json.gz",
    real("TraceLens", "tests", "traces", "mi300", "ddp_resnet18_no_pool", "train_resnet18.json.gz"),
], ids=lambda p: p.name)
def test_coverage_and_fill_equal_their_old_formulations(path):
    t = read_trace(path)
    seen: dict[str, pl.DataFrame] = {}
    fill, cover = costing._fill_from_formulas, costing._coverage

    def grab_fill(ops):
        seen["fill_in"] = ops
        return fill(ops)

    def grab_cover(ops):
        seen["cov_in"] = ops
        return cover(ops)

    costing._fill_from_formulas, costing._coverage = grab_fill, grab_cover
    try:
        costing.compute_costs(t)
    finally:
        costing._fill_from_formulas, costing._coverage = fill, cover
    cov = cover(seen["cov_in"])
    want = _old_coverage_sums(seen["cov_in"])
    assert {k: getattr(cov, k) for k in want} == want
    assert want["device_ns"] > 0 and want["linked_ns"] > 0
    # the lazy fill against the same expressions run eagerly, one with_columns at a time
    eager = _eager_fill(seen["fill_in"])
    assert_frame_equal(fill(seen["fill_in"]), eager, check_exact=True)
    assert eager["cost_source"].to_list().count("shapes") > 0


def _eager_fill(ops: pl.DataFrame) -> pl.DataFrame:
    """``_fill_from_formulas`` run eagerly (as it was): every ``lf = lf.with_columns`` of its
    source applied to the DataFrame at once."""
    import inspect

    src = inspect.getsource(costing._fill_from_formulas)
    src = (src.replace("def _fill_from_formulas(", "def _eager(").replace("ops.lazy().with_columns(", "ops.with_columns(")
           .replace("    ).collect()\n", "    )\n").replace(".collect().rechunk()", ".rechunk()"))
    assert ".lazy()" not in src and ".collect()" not in src
    ns = dict(vars(costing))
    exec(compile(src, "<eager fill>", "exec"), ns)
    return ns["_eager"](ops)
