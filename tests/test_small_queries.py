"""Session 10 (issue 19, small traces): the analysis of a small trace runs polars' in-memory
engine and chains of frame operations as one lazy plan (:mod:`traceroof.frames`), and skips
the queries of stages whose input is empty. Every test compares against an independent
oracle: the default engine and the eager steps (forced by a bound of 0 rows), plain Python
interval arithmetic, or a count of the queries polars ran."""

from __future__ import annotations

import json
import os
import random

import polars as pl
import pytest
from conftest import real
from polars.testing import assert_frame_equal

from traceroof import (
    accounting,
    analysis,
    frames,
    intervals,
    read_trace,
    speed_of_light,
)

BERT = ("TraceLens", "tests", "traces", "h100", "gaunernst_bert-small-uncased__1016001.json.gz")
TPU = ("xprof", "xprof", "convert", "test_xplanes", "tpu_inference_2.xplane.pb")
NCCL = ("HolisticTraceAnalysis", "tests", "data", "nccl_parser_config", "nccl_data.json.gz")
DLRM = ("param", "et_replay", "tests", "inputs", "dlrm_kineto.tar.gz")


def _engine_seen(monkeypatch) -> list[str | None]:
    """The ``POLARS_ENGINE_AFFINITY`` in force while ``analyze`` ranks the ops, per call."""
    seen: list[str | None] = []
    rank_groups = analysis.rank_groups

    def spy(*a, **k):
        seen.append(os.environ.get("POLARS_ENGINE_AFFINITY"))
        return rank_groups(*a, **k)

    monkeypatch.setattr(analysis, "rank_groups", spy)
    return seen


def test_a_small_trace_runs_in_memory_and_the_setting_is_restored(monkeypatch):
    monkeypatch.delenv("POLARS_ENGINE_AFFINITY", raising=False)
    trace = read_trace(real(*BERT))
    assert trace.ops.height + trace.host.height <= frames.IN_MEMORY_MAX_ROWS  # 61 ops, 615 host rows
    seen = _engine_seen(monkeypatch)
    analysis.analyze(trace, "h100")
    assert seen == ["in-memory"] and "POLARS_ENGINE_AFFINITY" not in os.environ
    # above the bound: polars' default, nothing set
    monkeypatch.setattr(frames, "IN_MEMORY_MAX_ROWS", trace.ops.height + trace.host.height - 1)
    analysis.analyze(trace, "h100")
    assert seen == ["in-memory", None]
    # an engine the process chose itself is kept
    monkeypatch.setattr(frames, "IN_MEMORY_MAX_ROWS", 10**9)
    monkeypatch.setenv("POLARS_ENGINE_AFFINITY", "streaming")
    analysis.analyze(trace, "h100")
    assert seen == ["in-memory", None, "streaming"] and os.environ["POLARS_ENGINE_AFFINITY"] == "streaming"


def test_the_engine_setting_touches_nothing_else_and_is_restored_on_error(monkeypatch):
    monkeypatch.delenv("POLARS_ENGINE_AFFINITY", raising=False)
    monkeypatch.delenv("POLARS_FMT_MAX_ROWS", raising=False)
    # another setting changed inside the block (another thread's, say) survives the block's end
    with frames.engine_for(10):
        assert os.environ["POLARS_ENGINE_AFFINITY"] == "in-memory"
        pl.Config.set_tbl_rows(50)
    assert os.environ.get("POLARS_FMT_MAX_ROWS") == "50" and "POLARS_ENGINE_AFFINITY" not in os.environ
    pl.Config.set_tbl_rows(None)
    # an exception inside puts the affinity back as it was
    with pytest.raises(ZeroDivisionError), frames.engine_for(10):
        1 / 0
    assert "POLARS_ENGINE_AFFINITY" not in os.environ
    # an engine object the process chose (no environment variable) is kept, and done() uses it
    from polars.lazyframe.engine_config import get_engine_affinity_override
    pl.Config.set_engine_affinity(pl.GPUEngine(raise_on_fail=False))
    try:
        with frames.engine_for(10):
            assert "POLARS_ENGINE_AFFINITY" not in os.environ
            assert isinstance(get_engine_affinity_override(), pl.GPUEngine)
        assert frames._engine_chosen()
    finally:
        pl.Config.set_engine_affinity(None)
    assert not frames._engine_chosen()


def _report_json(rep) -> str:
    d = rep.to_dict()
    d.pop("created_at", None)
    return json.dumps(d, sort_keys=True, default=str)


@pytest.mark.parametrize("parts, kinds", [
    (BERT, {"device_idle", "host_device_copies", "launch_bound", "unfused_elementwise"}),
    (NCCL, {"device_idle", "exposed_collectives", "launch_bound"}),
    (DLRM, {"device_idle", "exposed_collectives", "fp32_matmul", "host_device_copies", "launch_bound", "straggler",
            "unfused_elementwise"}),
    (TPU, set()),
], ids=["bert", "nccl", "dlrm_ranks", "tpu_xplane"])
def test_the_small_path_gives_the_report_of_the_default_engine_and_eager_steps(monkeypatch, parts, kinds):
    monkeypatch.delenv("POLARS_ENGINE_AFFINITY", raising=False)
    fast = analysis.analyze(read_trace(real(*parts)))
    assert {f.kind for f in fast.findings} == kinds  # the detectors' chains ran and found
    # the oracle: no table is small (every chain eager, polars' default engine)
    monkeypatch.setattr(frames, "IN_MEMORY_MAX_ROWS", -1)
    monkeypatch.setattr(frames, "SMALL_ROWS", -1)
    slow = analysis.analyze(read_trace(real(*parts)))
    assert _report_json(fast) == _report_json(slow)
    for a, b in ((fast.ops, slow.ops), (fast.ranking, slow.ranking), (fast.steps, slow.steps)):
        assert_frame_equal(a, b, check_exact=True)


def _py_union(iv):
    out = []
    for s, e in sorted(iv):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [tuple(x) for x in out]


@pytest.mark.parametrize("bound", [frames.SMALL_ROWS, -1], ids=["lazy", "eager"])
def test_unions_as_one_plan_or_eager_equal_plain_python(monkeypatch, bound):
    monkeypatch.setattr(frames, "SMALL_ROWS", bound)
    rng = random.Random(7)
    rows = [(rng.randrange(3), rng.randrange(0, 10_000), rng.randrange(0, 400), rng.random() < 0.3) for _ in range(500)]
    df = pl.DataFrame({"g": [r[0] for r in rows], "start_ns": [r[1] for r in rows],
                       "end_ns": [r[1] + r[2] for r in rows], "odd": [r[3] for r in rows]})
    u = intervals.union(df, by=["g"])
    for g in range(3):
        want = _py_union([(s, s + d) for gg, s, d, _ in rows if gg == g])
        got = u.filter(pl.col("g") == g).select("start_ns", "end_ns").rows()
        assert got == want
    lengths = intervals.union_lengths(df, {"all": pl.lit(True), "odd": pl.col("odd")}, ["g"])
    for g, n_all, n_odd in lengths.iter_rows():
        assert n_all == sum(e - s for s, e in _py_union([(s, s + d) for gg, s, d, _ in rows if gg == g]))
        assert n_odd == sum(e - s for s, e in _py_union([(s, s + d) for gg, s, d, o in rows if gg == g and o]))


def _count_queries(monkeypatch) -> list[int]:
    """A counter of the queries polars runs (lazy collects and eager frame operations)."""
    n = [0]
    for name in ("collect", "_collect_eager"):
        orig = getattr(pl.LazyFrame, name)

        def counted(self, *a, _orig=orig, **k):
            n[0] += 1
            return _orig(self, *a, **k)
        monkeypatch.setattr(pl.LazyFrame, name, counted)
    return n


def test_empty_inputs_cost_no_query(monkeypatch):
    dev = pl.DataFrame(schema={"rank": pl.Int32, "step": pl.Int32, "device": pl.Int32, "wall_ns": pl.Int64,
                               "busy_ns": pl.Int64})
    n = _count_queries(monkeypatch)
    table = speed_of_light.empty_table(dev)
    assert n[0] == 0 and table.height == 0 and table.columns[-1] == "sol_ns"

    class NoFindings:  # a report with nothing to bound: rule 6 reads no table
        findings: list = []
        ops = pl.DataFrame({"rank": [0], "device": [0], "start_ns": [0], "dur_ns": [10]})

    assert accounting.check_findings(NoFindings()) == [] and n[0] == 0
