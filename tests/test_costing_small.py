"""Session 11 (issue 19 item 5): the costing stage on small and medium traces.

* the per-op sums the kernels' shares divide by are one ``group_by`` joined back on a small op
  table (four windows in one query were slow on polars' in-memory engine): compared with the
  windows (``frames.SMALL_ROWS`` = -1, the code as it was) on real traces, floats exactly;
* the kernel-name rules skip the slow case-insensitive patterns on an ASCII name that holds
  none of their words: compared with the patterns run on every name (the code as it was) on
  every kernel name of several real traces and on names made to trip a naive filter;
* the collective annotations' sizes look up the innermost op of the wanted ids only: compared
  with the lookup over every id (the code as it was).
"""

from __future__ import annotations

import polars as pl
import pytest
from conftest import FIXTURES, real
from polars.testing import assert_frame_equal

from traceroof import costing, frames, read_trace
from traceroof.costs import kinds
from traceroof.host import innermost_cpu_ops

TRACES = [
    real("TraceLens", "tests", "traces", "h100", "gaunernst_bert-small-uncased__1016001.json.gz"),
    real("HolisticTraceAnalysis", "tests", "data", "trace_diff", "test", "test.json.gz"),
    real("HolisticTraceAnalysis", "tests", "data", "nccl_parser_config", "nccl_data.json.gz"),
    real("TraceLens", "tests", "traces", "mi300", "ddp_resnet18_no_pool", "train_resnet18.json.gz"),
    FIXTURES / "faults" / "train_allreduce_h100.json.gz",
]


def _costed(path, monkeypatch, small_rows):
    monkeypatch.setattr(frames, "SMALL_ROWS", small_rows)
    t = read_trace(path)
    with frames.engine_for(t.ops.height + t.host.height):
        return costing.compute_costs(t)


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.name)
def test_group_sums_equal_the_windows(path, monkeypatch):
    ops_w, cov_w = _costed(path, monkeypatch, -1)  # every table "large": the windows, as before
    ops_g, cov_g = _costed(path, monkeypatch, frames.IN_MEMORY_MAX_ROWS)
    assert ops_g.columns == ops_w.columns
    assert_frame_equal(ops_g, ops_w, check_exact=True)
    assert cov_g.to_json() == cov_w.to_json()
    # shares to compare: ops costed from shapes (nccl_data's costs are all the trace's own)
    assert ops_g["cost_source"].to_list().count("shapes") > 0 or path.name == "nccl_data.json.gz"


def _fill_input() -> pl.DataFrame:
    """A hand-made table for :func:`costing._fill_from_formulas`: op 1 with two arithmetic
    kernels (16 + 48 ns) and a layout mover (64 ns); op 2 with two 0 ns kernels; a kernel with
    no External id."""
    n = 6
    return pl.DataFrame({
        "rank": [0, 0, 0, 0, 0, 0], "external_id": [1, 1, 1, 2, 2, None],
        "name": ["gemm_a", "gemm_b", "nchwToNhwcKernel", "k0", "k0", "lost"],
        "op": ["aten::conv2d"] * 3 + ["aten::add"] * 2 + [None],
        "kind": pl.Series(["other"] * 6, dtype=costing.KIND), "dur_ns": [16, 48, 64, 0, 0, 5],
        "flops": [None] * n, "bytes": [None] * n, "dtype": [None] * n, "cost_source": ["unknown"] * n,
        "_pre": [False] * n, "_f": [1024.0, 1024.0, 1024.0, 8.0, 8.0, None],
        "_b": [512.0, 512.0, 512.0, 4.0, 4.0, None], "_kind": ["conv"] * 3 + ["elementwise"] * 2 + [None],
        "_dtype": ["bf16"] * 5 + [None],
    }, schema_overrides={"flops": pl.Float64, "bytes": pl.Float64, "dtype": pl.String})


def test_fill_shares_by_hand(monkeypatch):
    d = _fill_input().with_columns(pl.lit(False).alias("_tl"))
    got = costing._fill_from_formulas(d)
    # op 1: bytes 512 by duration over 128 ns (16/128, 48/128, 64/128: 64, 192, 256); FLOPs
    # 1024 over the two gemm kernels only (16/64, 48/64: 256, 768), the layout mover none
    assert got["bytes"].to_list()[:3] == [64.0, 192.0, 256.0]
    assert got["flops"].to_list()[:3] == [256.0, 768.0, 0.0]
    # op 2: both kernels 0 ns: an equal split (4/2 bytes, 8/2 FLOPs); no External id: no cost
    assert got["bytes"].to_list()[3:] == [2.0, 2.0, None]
    assert got["flops"].to_list()[3:] == [4.0, 4.0, None]
    assert got["_nk"].to_list() == [3, 3, 3, 2, 2, None]
    monkeypatch.setattr(frames, "SMALL_ROWS", -1)
    assert_frame_equal(costing._fill_from_formulas(d), got, check_exact=True)


def test_small_fill_runs_no_window(monkeypatch):
    """On a small table the shares divide by joined group sums: no ``over`` is built (the
    windows were the slow part of the query on the in-memory engine)."""
    calls = []
    over = pl.Expr.over

    def spy(self, *a, **k):
        calls.append(a)
        return over(self, *a, **k)

    monkeypatch.setattr(pl.Expr, "over", spy)
    d = _fill_input().with_columns(pl.lit(False).alias("_tl"))
    costing._fill_from_formulas(d)
    assert calls == []
    monkeypatch.setattr(frames, "SMALL_ROWS", -1)
    costing._fill_from_formulas(d)
    assert len(calls) >= 4  # the large path: the four sums (and the kernel count) as windows


# --------------------------------------------------------------------------- kernel names

def _old_kernel_key(kernel_name: str) -> str:
    """:func:`kinds.kernel_key` as it was (the whole name scanned)."""
    s = kernel_name.replace("(anonymous namespace)", "anon")
    depth = 0
    base: list[str] = []
    first: list[str] = []
    state = 0
    parens = 0
    for ch in s:
        if depth and ch in "()":
            parens = max(0, parens + (1 if ch == "(" else -1))
        elif parens and ch in "<>":
            pass
        elif ch == "<":
            depth += 1
            if depth == 1 and state == 0:
                state = 1
            continue
        elif ch == ">":
            depth = max(0, depth - 1)
            if depth == 0 and state == 1:
                state = 2
            continue
        if depth == 0:
            base.append(ch)
        elif depth == 1 and state == 1:
            if ch == ",":
                state = 2
            else:
                first.append(ch)
    head = "".join(base).split("(", 1)[0].split()
    name = head[-1] if head else kernel_name
    return f"{name} {''.join(first).strip()}".strip()


def _old_kind_of_kernel(name: str) -> str:
    for pattern, kind in kinds._FULL_NAME_RULES:
        if pattern.search(name):
            return kind
    key = _old_kernel_key(name)
    for pattern, kind in kinds._KERNEL_RULES:
        if pattern.search(key):
            return kind
    return "other"


ODD_NAMES = [
    "\u017fendrecv_kernel",  # long s: matches "sendrecv" case-insensitively, lower() keeps it
    "\u212across_all_reduce",  # Kelvin sign (K) before a word that decides anyway
    "ALL_REDUCE_kernel", "NCCLDevKernel_AllGather", "Deep_EP::intranode::dispatch<8>(int)",
    "void foo(at::Tensor<all_reduce>)",  # a template only in the signature (state 0 at "(")
    "void bar<float>(cutlass::Kernel<nccl>)", "void baz<a, b<c>>(x<(1)>)", "castle", "CastKernel",
    "transpose\u0130", "\u0130copy", "void (anonymous namespace)::f<int>(float)", "", "(", "<>",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, NormTwoOps>>(x)",
]


def _names() -> list[str]:
    out = set(ODD_NAMES)
    for p in TRACES:
        out |= set(read_trace(p).ops["name"].drop_nulls().to_list())
    return sorted(out)


def test_kernel_rules_equal_the_plain_patterns():
    names = _names()
    assert len(names) > 100
    for n in names:
        assert kinds.kernel_key(n) == _old_kernel_key(n), n
        assert kinds.kind_of_kernel(n) == _old_kind_of_kernel(n), n
        assert kinds.is_data_movement_kernel(n) == bool(kinds._DATA_MOVEMENT.search(n)), n
    # the long s is a collective, as the pattern says (a filter on lower() alone would miss it)
    assert kinds.kind_of_kernel("\u017fendrecv_kernel") == "collective"


class _Spy:
    def __init__(self, pattern):
        self.pattern, self.calls = pattern, 0

    def search(self, s):
        self.calls += 1
        return self.pattern.search(s)


def test_collective_pattern_skipped_where_it_cannot_match(monkeypatch):
    spy = _Spy(kinds._FULL_NAME_RULES[0][0])
    monkeypatch.setattr(kinds, "_FULL_NAME_RULES", ((spy, "collective"), *kinds._FULL_NAME_RULES[1:]))
    long_name = "void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float>>(" + "x, " * 100 + ")"
    assert kinds.kind_of_kernel(long_name) == "elementwise"
    assert spy.calls == 0  # ASCII, no collective word: not searched
    assert kinds.kind_of_kernel("\u017fendrecv") == "collective" and spy.calls == 1  # not ASCII: searched
    assert kinds.kind_of_kernel("ncclDevKernel_AllReduce_Sum_f32") == "collective" and spy.calls == 2


# --------------------------------------------------------------------------- collectives

def _old_comm_annotation_bytes(host: pl.DataFrame, keys: pl.DataFrame) -> pl.DataFrame:
    """:func:`costing.comm_annotation_bytes` as it was: the innermost op of every id."""
    from traceroof import costs

    ann = host.filter(pl.col("input_dims").is_not_null()).filter(pl.col("name").str.contains(costs.COMM_ANNOTATION_RE))
    uniq = ann.select("input_dims", "input_types").unique()
    uniq = uniq.with_columns(pl.Series("_ab", [costs.message_bytes(d, t) for d, t in uniq.iter_rows()],
                                       dtype=pl.Float64))
    ann = ann.join(uniq, on=["input_dims", "input_types"], how="left", nulls_equal=True).select(
        "rank", "pid", "thread", pl.col("start_ns").alias("_as"),
        (pl.col("start_ns") + pl.col("dur_ns")).alias("_ae"), "_ab")
    ops = host.select("rank", "pid", "thread", "external_id", "start_ns", "dur_ns")[
        innermost_cpu_ops(host, ["rank", "external_id"])]
    ops = ops.join(keys.unique(), on=["rank", "external_id"], how="semi").select(
        "rank", "pid", "thread", "external_id", "start_ns", (pl.col("start_ns") + pl.col("dur_ns")).alias("_oe"))
    nested = ops.join(ann, on=["rank", "pid", "thread"]).filter(
        pl.col("_as") >= pl.col("start_ns"), pl.col("_ae") <= pl.col("_oe"))
    return nested.group_by("rank", "external_id").agg(
        pl.when(pl.col("_ab").n_unique() == 1).then(pl.col("_ab").first()).alias("_cb"))


@pytest.mark.parametrize("path", [
    TRACES[1], real("HolisticTraceAnalysis", "tests", "data", "trace_filter", "sampled_rank-0.json.gz"),
    real("TraceLens", "tests", "traces", "b200", "eager_trace.json.gz"),
], ids=lambda p: p.name)
def test_comm_annotation_bytes_equal_the_lookup_over_every_id(path):
    t = read_trace(path)
    keys = t.ops.filter(pl.col("kind") == "collective", pl.col("external_id").is_not_null()).select(
        "rank", "external_id")
    assert keys.height > 0
    got = costing.comm_annotation_bytes(t.host, keys).sort("rank", "external_id")
    want = _old_comm_annotation_bytes(t.host, keys).sort("rank", "external_id")
    assert_frame_equal(got, want, check_exact=True)
    assert got["_cb"].null_count() < got.height  # some sizes found, to compare


def test_comm_annotation_bytes_without_keys_reads_no_host(monkeypatch):
    t = read_trace(TRACES[2])
    none = pl.DataFrame(schema={"rank": pl.Int32, "external_id": pl.Int64})
    calls = []
    monkeypatch.setattr(pl.DataFrame, "filter", lambda self, *a, **k: calls.append(a))
    got = costing.comm_annotation_bytes(t.host, none)
    assert calls == [] and got.height == 0 and got.columns == ["rank", "external_id", "_cb"]
