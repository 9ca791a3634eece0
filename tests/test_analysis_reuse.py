"""The session-9 speed-ups of the analysis after the read (issue 19), each against the
straightforward formulation it replaced, kept here as the oracle (verbatim in substance):

* ``unlaunched.attribute`` matches each distinct (rank, run of kernel names) once and lends
  the match to every repeat; ``graph_replay.Lending.lend`` writes a match's plan by slices
  instead of a loop per kernel;
* ``costing._tensorlist_bytes`` reads and writes only the rows that need it (a join of the
  whole op table on the kernel name before);
* ``costing.apply_costs_to`` costs a trace's tables plus the lent ops' host rows without
  making a second ``Trace``, the lent rows' shapes looked up apart (``_split_shapes``);
* ``costing_shapes.rank_id_key``: one packed integer join key for ``(rank, external_id)``.
"""

from __future__ import annotations

import json
import random

import polars as pl
import pytest
from conftest import real
from polars.testing import assert_frame_equal
from tracegen import Kernel, TraceBuilder

import traceroof.costing as costing
from traceroof import analysis, analyze, costs, read_trace, unlaunched
from traceroof.costing import apply_costs, apply_costs_to, element_dtype_of_kernel
from traceroof.costing_shapes import (
    _split_shapes,
    join_columns,
    rank_id_key,
    shapes_by_external_id,
)
from traceroof.graph_match import Match, Sequence, starts_of
from traceroof.graph_replay import Lending
from traceroof.graph_sources import _strings_and_codes
from traceroof.trace import Trace

QWEN = real("TraceLens", "tests", "traces", "h100", "Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz")
BF = ["c10::BFloat16", "c10::BFloat16"]
#: FLOPs of one iteration, by hand: mm 2·64·128·256 = 4,194,304; add 64·256 = 16,384;
#: mm 2·64·256·128 = 4,194,304; relu 64·128 = 8,192
ITERATION_FLOPS = 4_194_304 + 16_384 + 4_194_304 + 8_192


def _iteration(b: TraceBuilder) -> None:
    b.op("aten::mm", [[64, 128], [128, 256]], BF, [Kernel("sm90_gemm_a", 20_000)])
    b.op("aten::add", [[64, 256], [64, 256]], BF, [Kernel("vectorized_add", 3_000)])
    b.op("aten::mm", [[64, 256], [256, 128]], BF, [Kernel("sm90_gemm_b", 18_000)])
    b.op("aten::relu", [[64, 128]], ["c10::BFloat16"], [Kernel("vectorized_relu", 2_000)])


def _two_unlaunched_runs(tmp_path):
    """Four iterations; the host side of iterations 0 and 2 cut out (their kernels keep no
    External id): two runs of the same four kernel names on rank 0, each followed by a
    linked iteration."""
    b = TraceBuilder()
    for i in range(4):
        b.begin_step(i + 1)
        _iteration(b)
        b.end_step()
    doc = b.to_json()
    cut = {k["ext"] for k in b.kernels[0:4]} | {k["ext"] for k in b.kernels[8:12]}
    evs = []
    for e in doc["traceEvents"]:
        a = e.get("args") or {}
        if e.get("cat") in ("cpu_op", "cuda_runtime") and a.get("External id") in cut:
            continue
        if e.get("cat") == "kernel" and a.get("External id") in cut:
            a.pop("External id")
        evs.append(e)
    doc["traceEvents"] = evs
    p = tmp_path / "two_runs.json"
    p.write_text(json.dumps(doc))
    return p


def test_repeated_runs_are_matched_once_and_each_gets_ops_of_its_own(tmp_path, monkeypatch):
    tr = read_trace(_two_unlaunched_runs(tmp_path))
    calls = []
    real_eager = unlaunched.eager_runs
    monkeypatch.setattr(unlaunched, "eager_runs", lambda *a: calls.append(a[0]) or real_eager(*a))
    r = analyze(tr, "h100")
    # the runs, from the op table: kernels without launch, op or id, cut by launched ones
    ops = tr.ops.sort("start_ns")
    miss = (ops["launch_start_ns"].is_null() & ops["op"].is_null() & ops["external_id"].is_null()).to_list()
    runs, cur = [], []
    for name, m in zip(ops["name"].to_list(), miss, strict=True):
        if m:
            cur.append(name)
        elif cur:
            runs.append(tuple(cur))
            cur = []
    assert len(runs) == 2 and len(set(runs)) == 1
    assert len(calls) == len(set(runs)) == 1  # matched once, for both runs
    u = r.coverage.unlaunched
    assert (u.kernels, u.kernels_matched) == (8, 8)
    lent = r.ops.filter(pl.col("external_id") < 0)
    # one new id per op instance of each run: 2 runs x 4 ops, none shared between runs
    assert lent["external_id"].n_unique() == 8
    for s in (1, 3):  # the cut iterations cost what a linked one costs (the hand count)
        assert r.ops.filter(pl.col("step") == s)["flops"].sum() == ITERATION_FLOPS
    assert r.ops["flops"].sum() == 4 * ITERATION_FLOPS


def _old_lend(self: Lending, src, match: Match, rows: list[int], rank: int) -> list[int]:
    """Lending.lend as it was (commit f8deefc): a loop over every position."""
    si = next((i for i, x in enumerate(self.sources) if x is src), None)
    if si is None:
        si = len(self.sources)
        self.sources.append(src)
    used = sorted({g for g in match.groups if g is not None})
    ids = {g: self.next_id - i for i, g in enumerate(used)}
    self.next_id -= len(used)
    lender_of = {g: match.lenders[p] for p, g in enumerate(match.groups) if g is not None}
    lent = []
    for p, r in enumerate(rows):
        g = match.groups[p]
        if g is None:
            continue
        self.rows.append(r)
        self.lent_source.append(si)
        self.lent_lender.append(match.lenders[p])
        self.ext.append(ids[g])
        lent.append(r)
    self.part_source.extend(si for _ in used)
    self.part_lender.extend(lender_of[g] for g in used)
    self.part_id.extend(ids[g] for g in used)
    self.part_rank.extend(rank for _ in used)
    return lent


def _random_match(rng: random.Random, n: int) -> Match:
    """Groups of consecutive positions (a group: one lender), some positions unmatched, the
    group ids not in position order (eager_runs numbers them by run, then lender)."""
    lenders: list[int | None] = []
    groups: list[int | None] = []
    gid = rng.sample(range(3 * n), n)
    g = 0
    while len(lenders) < n:
        size = rng.randint(1, 4)
        if rng.random() < 0.25:
            lenders += [None] * size
            groups += [None] * size
        else:
            lender = rng.randrange(50)
            lenders += [lender] * size
            groups += [gid[g]] * size
            g += 1
    return Match(lenders[:n], groups[:n], g)


def test_lend_equals_the_old_loop_on_random_matches():
    rng = random.Random(19)
    fields = ("rows", "ext", "lent_source", "lent_lender", "part_source", "part_lender", "part_id", "part_rank")
    for _ in range(200):
        new, old = Lending(next_id=-7), Lending(next_id=-7)
        srcs = [object(), object()]
        matches = [_random_match(rng, rng.randint(1, 30)) for _ in range(3)]
        for k in range(8):  # the same match lent again (the repeats of a run) and others between
            m = matches[rng.randrange(3)]
            rows = rng.sample(range(10_000), len(m.groups))
            src, rank = srcs[rng.randrange(2)], rng.randrange(3)
            assert new.lend(src, m, rows, rank) == _old_lend(old, src, m, rows, rank)
        assert new.next_id == old.next_id
        for f in fields:
            assert getattr(new, f) == getattr(old, f), f
        assert [id(s) for s in new.sources] == [id(s) for s in old.sources]


def _old_tensorlist_bytes(ops: pl.DataFrame, keys: pl.DataFrame) -> pl.DataFrame:
    """costing._tensorlist_bytes as it was (commit f8deefc): the op table joined on names."""
    miss = pl.col("_f").is_not_null() & pl.col("_b").is_null()
    need = ops.filter(miss, pl.col("_tl"))
    if need.height == 0:
        return ops
    names = need["name"].unique().to_list()
    ldt_of = pl.DataFrame({"name": names, "_ldt": [element_dtype_of_kernel(n or "") for n in names]},
                          schema={"name": pl.String, "_ldt": pl.String})
    need = need.join(ldt_of, on="name", how="left", nulls_equal=True).filter(pl.col("_ldt").is_not_null())
    rows = []
    todo = need.select("op", "_skey", "_ldt").unique().join(keys, on="_skey", how="left")
    for op, skey, ldt, dims, types, conc in todo.select(
            "op", "_skey", "_ldt", "input_dims", "input_types", "concrete_inputs").iter_rows():
        c = costs.cost_of(op, costing._parse(dims), costing._parse(types), costing._parse(conc), tensorlist_dtype=ldt)
        if c is not None and c.bytes is not None:
            rows.append((op, skey, ldt, float(c.bytes)))
    if not rows:
        return ops
    fix = pl.DataFrame(rows, schema={"op": pl.String, "_skey": pl.UInt32, "_ldt": pl.String, "_b2": pl.Float64},
                       orient="row")
    ops = join_columns(ops, ldt_of.rename({"_ldt": "_ldt_n"}), ["name"], nulls_equal=True)
    ops = ops.with_columns(pl.when(miss & pl.col("_tl")).then(pl.col("_ldt_n")).alias("_ldt")).drop("_ldt_n")
    ops = join_columns(ops, fix, ["op", "_skey", "_ldt"], nulls_equal=True)
    return ops.with_columns(pl.coalesce("_b", "_b2").alias("_b")).drop("_ldt", "_b2")


@pytest.mark.parametrize("path", [
    QWEN,
    real("TraceLens", "tests", "traces", "h100", "Falconsai_nsfw_image_detection__1016002.json.gz"),
    real("TraceLens", "tests", "traces", "inference", "sglang_decode", "sglang_Qwen3-8B_decode.json.gz"),
], ids=["qwen", "falconsai", "sglang"])
def test_tensorlist_bytes_equal_the_old_join(path, monkeypatch):
    seen = []
    new = costing._tensorlist_bytes

    def both(ops, keys):
        want, got = _old_tensorlist_bytes(ops, keys), new(ops, keys)
        miss = pl.col("_f").is_not_null() & pl.col("_b").is_null() & pl.col("_tl")
        seen.append((ops.filter(miss).height, ops.filter(miss).height - got.filter(miss).height))
        assert_frame_equal(got, want, check_exact=True)
        return got

    monkeypatch.setattr(costing, "_tensorlist_bytes", both)
    apply_costs(read_trace(path))
    # rows that need it were there, and some of them got bytes (the pass did something)
    assert seen and seen[0][0] > 0 and seen[0][1] > 0


def test_apply_costs_to_equals_costing_a_trace_of_the_concatenation():
    tr = read_trace(QWEN)
    replays = analysis.attribute_replays(tr, None)
    assert replays.changed and replays.shape_rows.height > 0  # unlaunched kernels were lent ops
    want, want_cov = apply_costs(Trace(ops=replays.ops, host=pl.concat([tr.host, replays.shape_rows]), meta=tr.meta))
    got, got_cov = apply_costs_to(replays.ops, tr.host, tr.meta, None, replays.shape_rows)
    assert_frame_equal(got, want, check_exact=True)
    assert got_cov == want_cov


def _host_part(ids: list[int | None], rank: int, start: int) -> pl.DataFrame:
    n = len(ids)
    return pl.DataFrame({
        "rank": pl.Series([rank] * n, dtype=pl.Int32), "external_id": pl.Series(ids, dtype=pl.Int64),
        "cat": pl.Series(["cpu_op"] * n, dtype=pl.Categorical), "start_ns": [start + 10 * i for i in range(n)],
        "input_dims": pl.Series([f"[[{i}]]" for i in range(n)], dtype=pl.Categorical),
        "input_types": pl.Series(["[\"float\"]"] * n, dtype=pl.Categorical),
        "concrete_inputs": pl.Series([None] * n, dtype=pl.Categorical),
    })


@pytest.mark.parametrize("tail_ids", [[-1, -2, -2, None], [3, -1, 7]], ids=["disjoint", "overlapping"])
def test_split_shape_lookup_equals_the_lookup_of_the_whole(tail_ids):
    head = _host_part([1, 2, 2, 3, None, 5, 7], 0, 0)
    tail = _host_part(tail_ids, 0, 1_000)
    host = pl.concat([head, tail])
    of = pl.DataFrame({"rank": pl.Series([0] * 6, dtype=pl.Int32),
                       "external_id": pl.Series([2, 3, 7, -1, -2, None], dtype=pl.Int64)})
    want = shapes_by_external_id(host, of)
    got = _split_shapes(host, of, head.height)
    assert_frame_equal(got, want, check_exact=True)
    # the innermost (last-started) row of id 2 is the head's second, [[2]]; of 7 the tail's
    # when the tail repeats it (it starts later), else the head's
    dims = dict(zip(got["external_id"].to_list(), got["input_dims"].cast(pl.String).to_list(), strict=True))
    assert dims[2] == "[[2]]"
    assert dims[7] == ("[[2]]" if 7 in tail_ids else "[[6]]")


def test_rank_id_key_joins_as_the_two_columns_do():
    rng = random.Random(7)
    for _ in range(100):
        n, m = rng.randint(1, 60), rng.randint(1, 60)
        lo = rng.choice([-(2 ** 40), -5, 0, 2 ** 30])

        def frame(k, extra):
            return pl.DataFrame({
                "rank": pl.Series([rng.choice([0, 1, 3, None]) for _ in range(k)], dtype=pl.Int32),
                "external_id": pl.Series([rng.choice([None, lo + rng.randrange(20)]) for _ in range(k)],
                                         dtype=pl.Int64),
                extra: list(range(k))})
        left, right = frame(n, "a"), frame(m, "b").unique(["rank", "external_id"], keep="first")
        want = left.join(right, on=["rank", "external_id"], how="left", maintain_order="left")
        key = rank_id_key([left, right])
        assert key is not None
        got = left.with_columns(key).join(right.select(key, "b"), on="_k", how="left", maintain_order="left")
        assert got["b"].to_list() == want["b"].to_list()
        assert_frame_equal(join_columns(left, right, ["rank", "external_id"]), want, check_exact=True)
    # out of range: ids spanning 2^62, or a negative rank, are not packed (joined on the columns)
    wide = pl.DataFrame({"rank": pl.Series([0, 1], dtype=pl.Int32),
                         "external_id": pl.Series([-(2 ** 61), 2 ** 61], dtype=pl.Int64)})
    assert rank_id_key([wide]) is None
    neg = pl.DataFrame({"rank": pl.Series([-1], dtype=pl.Int32), "external_id": pl.Series([1], dtype=pl.Int64)})
    assert rank_id_key([neg]) is None


def test_starts_of_from_the_builders_codes_equals_its_own_coding():
    """graph_sources._strings_and_codes gives starts_of the names' codes (nulls a code of
    their own); the index must equal the one starts_of makes from the names alone."""
    rng = random.Random(5)
    for _ in range(50):
        pool = [f"k{i}" for i in range(rng.randint(1, 9))] + [None]
        col = pl.Series("name", [rng.choice(pool) for _ in range(rng.randint(0, 400))], dtype=pl.String)
        names, codes = _strings_and_codes(col)
        assert names == col.to_list()
        # equal names, equal codes, and distinct names, distinct codes
        assert len(set(zip(names, codes.to_list(), strict=True))) == len(set(names)) == codes.n_unique()
        plain = Sequence(list(names), [0] * len(names))
        coded = Sequence(list(names), [0] * len(names))
        object.__setattr__(coded, "_codes", codes)
        assert starts_of(coded) == starts_of(plain)
