"""The detectors' hand-overs (traceroof/findings/__init__.py): typed inputs on FindingContext,
the run's chosen detectors, and the results they share (Shared), each computed once.

The contexts are the ones ``analyze`` builds, caught on their way into ``run_detectors``, on a
4-rank set whose rank 3 arrives 2 ms late at every all-reduce (tests/test_ranks.py's fixture).
"""

from __future__ import annotations

import dataclasses

import pytest
from test_ranks import LATE_NS, _build, _read
from tracegen import write_ranks

import traceroof.findings as F
from traceroof.analysis import analyze
from traceroof.findings import FindingContext, RankView, Shared, run_detectors
from traceroof.findings._common import device_order, windows
from traceroof.findings._idle import stretches, timeline
from traceroof.findings.straggler import claimed_waits, rank_view


@pytest.fixture(scope="module")
def caught(tmp_path_factory):
    """``(report, the FindingContext analyze handed to run_detectors)``."""
    bs, _ = _build(late={3: LATE_NS})
    d = tmp_path_factory.mktemp("straggler_ctx")
    write_ranks(bs, d)
    seen: list[FindingContext] = []
    real = F.run_detectors

    def spy(ctx, names=None):
        seen.append(ctx)
        return real(ctx, names)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(F, "run_detectors", spy)
        rep = analyze(_read(d), "h100")
    assert len(seen) == 1
    return rep, seen[0]


def _fresh(ctx: FindingContext, **kw) -> FindingContext:
    """A new context on the same tables (nothing shared with ``ctx``)."""
    return FindingContext(ops=ctx.ops, host=ctx.host, steps=ctx.steps, chip=ctx.chip, meta=ctx.meta, **kw)


def test_constructor_takes_typed_inputs_only():
    init = [f.name for f in dataclasses.fields(FindingContext) if f.init]
    assert init == ["ops", "host", "steps", "chip", "meta", "ranks", "rank_comparison", "captures", "chosen"]
    shared = Shared()
    results = [f for f in dataclasses.fields(Shared) if not f.name.startswith("_")]  # _locks: Shared.once's
    assert results and all(getattr(shared, f.name) is None for f in results)


def test_analyze_hands_over_the_cross_rank_view(caught):
    rep, ctx = caught
    assert ctx.ranks is not None and ctx.ranks == rep.ranks.to_dict()
    assert ctx.rank_comparison is not None
    assert ctx.chosen == tuple(F.DETECTORS)
    # the timeline's graph-capture windows, not a second scan of the host table
    from traceroof import graph_capture

    assert ctx.captures is not None and ctx.captures.equals(graph_capture.windows(ctx.host))
    # the straggler used what analyze handed over, not a second computation
    view = rank_view(ctx)
    assert isinstance(view, RankView)
    assert view.section is ctx.ranks and view.comparison is ctx.rank_comparison


def test_without_the_hand_over_the_detectors_compute_the_same(caught):
    rep, ctx = caught
    alone = _fresh(ctx)
    found = [f.to_dict() for f in run_detectors(alone)]
    assert found == [f.to_dict() for f in rep.findings]
    assert alone.shared.rank_view is not None and alone.shared.rank_view.section == rep.ranks.to_dict()


def test_shared_results_are_computed_once(caught):
    _, ctx = caught
    tl = ctx.shared.timeline
    assert tl is not None and ctx.shared.device_order is not None
    assert timeline(ctx) is tl and stretches(ctx) is ctx.shared.stretches
    assert device_order(ctx) is ctx.shared.device_order and windows(ctx) is ctx.shared.windows
    assert claimed_waits(ctx) is ctx.shared.straggler_waits
    # every idle gap has at most one owner, and the claims of the owners add up to the owned gaps
    owned = tl.filter(tl["owner"].is_not_null())
    assert owned["gap_ns"].sum() == sum(
        tl.filter(tl["owner"] == o)["gap_ns"].sum() for o in owned["owner"].unique().to_list()
    )


def test_chosen_tells_exposed_collectives_whether_the_straggler_runs(caught):
    _, ctx = caught

    def waiting(names):
        c = _fresh(ctx, ranks=ctx.ranks, rank_comparison=ctx.rank_comparison)
        fs = run_detectors(c, names)
        assert c.chosen == tuple(names)
        ev = [f.evidence for f in fs if f.kind == "exposed_collectives"]
        return claimed_waits(c).height, sum(e.get("rank_comm_waiting_on_straggler_ns", 0) for e in ev)

    n_with, ns_with = waiting(["exposed_collectives", "straggler"])
    n_alone, ns_alone = waiting(["exposed_collectives"])
    assert n_with > 0 and ns_with > 0
    assert n_alone == 0 and ns_alone == 0
