"""Straggler: one rank arrives last at the collectives and every other rank waits for it.

From the cross-rank view (:func:`traceroof.ranks.analyze_ranks`): on the aligned clock, at each
matched collective instance with arrivals (kernel starts) ``s_r``, rank r waits
``wait_r = max_q s_q − s_r``; the instance's straggler is the rank that arrived last, and the
wait it causes is ``Σ_r wait_r``. Per straggler rank S over the trace:

    wait_caused_ns(S) = Σ over the instances S arrived last at of Σ_r wait_r
    recoverable_ns    = wait_caused_ns(S) / (n_ranks − 1)     # the mean per-rank wait S causes

(what each of the other ranks would get back on average had S arrived with them). The evidence
also carries ``critical_path_ns`` = Σ (s_S − the second-last arrival): how much earlier those
collectives could have started had S arrived with the next-latest rank, a lower bound.

No finding on a single rank, on balanced ranks, when fewer than :data:`MIN_INSTANCES` instances
could be compared, or when the mean wait per rank and step is below :data:`MIN_SHARE` of the
median step time (and :data:`MIN_NS`). See ``docs/findings/straggler.md``.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from . import Finding, FindingContext, RankView, register
from ._common import claim, fmt_ns, short, wall_ns

#: Compared collective instances needed before a straggler is reported.
MIN_INSTANCES = 3
#: Report when the mean wait per waiting rank and step is at least this share of the median
#: step time ...
MIN_SHARE = 0.01
#: ... and at least this long (ns per step).
MIN_NS = 10_000


def rank_view(ctx: FindingContext) -> RankView:
    """The ranks' collectives compared and the report's ``ranks`` section, once per run: what
    the caller passed (``ctx.rank_comparison``, ``ctx.ranks``: ``analyze`` has both), else
    computed from the op table (:func:`traceroof.ranks.compare_collectives`,
    :func:`traceroof.ranks.analyze_ranks`; both None with fewer than 2 ranks)."""
    def compute() -> RankView:
        from ..ranks import analyze_ranks, compare_collectives

        cmp = ctx.rank_comparison
        if cmp is None:
            cmp = compare_collectives(ctx.ops, ctx.meta.stats)
        sec = ctx.ranks
        if sec is None and cmp is not None:
            sec = analyze_ranks(ctx.ops, ctx.steps, ctx.meta.stats, cmp)
        return RankView(cmp, sec)

    return ctx.shared.once("rank_view", compute)


@register("straggler")
def detect(ctx: FindingContext) -> list[Finding]:
    """One finding per straggler rank whose waits pass the thresholds (usually at most one)."""
    sec = rank_view(ctx).section
    return [_finding(ctx, sec, row, mean_wait, n_steps, median_step)
            for row, mean_wait, n_steps, median_step in _reported(ctx)]


def _reported(ctx: FindingContext) -> list[tuple[dict[str, Any], float, int, float | None]]:
    """The straggler ranks worth a finding: ``(per_rank row, mean wait per other rank (ns),
    steps, median step time (ns))`` each."""
    return ctx.shared.once("stragglers", lambda: _find_stragglers(ctx))


def _find_stragglers(ctx: FindingContext) -> list[tuple[dict[str, Any], float, int, float | None]]:
    """:func:`_reported`, computed."""
    sec = rank_view(ctx).section
    out: list[tuple[dict[str, Any], float, int, float | None]] = []
    if sec and (sec["collectives"].get("compared") or 0) >= MIN_INSTANCES:
        n_ranks = len(sec["ranks"])
        n_steps = max(int(sec["straggler"]["steps"]) if sec.get("straggler") else 1, 1)
        times = [r["step_time_ns"] for r in sec["per_rank"] if r.get("step_time_ns") is not None]
        median_step = float(pl.Series(times).median()) if times else None
        for row in sec["per_rank"]:
            caused = row.get("wait_caused_ns")
            if not caused:
                continue
            mean_wait = caused / (n_ranks - 1)
            per_step = mean_wait / n_steps
            if per_step < MIN_NS or (median_step and per_step < MIN_SHARE * median_step):
                continue
            out.append((row, mean_wait, n_steps, median_step))
    return out


def claimed_waits(ctx: FindingContext) -> pl.DataFrame:
    """The waits this detector claims: on every other rank, ``[kernel start, start + wait)`` at
    the collectives a reported straggler arrived last at (columns ``rank``, ``device``,
    ``start_ns``, ``end_ns``, ``last_rank``; rank-relative ns). ``exposed_collectives`` leaves
    these to the straggler finding, so no nanosecond is claimed twice (BC-33)."""
    from ..ranks import wait_intervals

    def compute() -> pl.DataFrame:
        runs = ctx.chosen is None or "straggler" in ctx.chosen
        reported = [int(row["rank"]) for row, *_ in _reported(ctx)] if runs else []
        w = wait_intervals(rank_view(ctx).comparison if reported else None)
        return w.filter(pl.col("last_rank").is_in(reported))

    return ctx.shared.once("straggler_waits", compute)


def _finding(ctx: FindingContext, sec: dict[str, Any], row: dict[str, Any], mean_wait: float, n_steps: int,
             median_step: float | None) -> Finding:
    r = int(row["rank"])
    n_ranks = len(sec["ranks"])
    caused = float(row["wait_caused_ns"])
    k = int(row["last_arrivals"])
    compared = int(sec["collectives"]["compared"])
    top = [c for c in sec["collectives"]["top"] if c.get("last_rank") == r]
    st = sec.get("straggler") or {}
    al = sec["alignment"]
    title = (
        f"rank {r} arrives last at {k} of {compared} collectives; other ranks wait {fmt_ns(caused)} in total "
        f"({fmt_ns(caused / n_steps)} per step)"
    )
    clock = (
        f"clocks aligned on the collectives' ends (uncertainty ±{fmt_ns(al.get('uncertainty_ns'))})"
        if al.get("applied") else f"on the {al.get('clock')} clock ({al.get('reason')})"
    )
    expl = (
        f"At {k} matched collective instances rank {r} started its collective kernel last, {clock}; the "
        f"{n_ranks - 1} other rank(s) sat in their collective kernels until it arrived, {fmt_ns(caused)} in total, "
        f"{fmt_ns(mean_wait)} per waiting rank. That time shows as slow or exposed communication on the other "
        "ranks, but its cause is on rank "
        f"{r}: more work per step (an uneven data or pipeline split, longer sequences), a slower device "
        "(thermal throttling, a degraded link, a noisy neighbour), or host delays (data loading, Python, "
        f"garbage collection, logging) before the collective. Fix: compare rank {r}'s step breakdown with the "
        "others (`--rank`), balance the work per rank (sequence packing, even pipeline stages), move host work "
        "off the critical path (more dataloader workers, pinned memory), or replace the slow node."
    )
    evidence = {
        "straggler_rank": r,
        "last_arrivals": k,
        "compared_instances": compared,
        "ranks": n_ranks,
        "wait_caused_ns": caused,
        "mean_wait_per_rank_ns": mean_wait,
        "steps": n_steps,
        "wait_caused_per_step_ns": caused / n_steps,
        "critical_path_ns": st.get("critical_path_ns") if st.get("rank") == r else None,
        "median_step_time_ns": median_step,
        "alignment_method": al.get("clock"),
        "alignment_applied": al.get("applied"),
        "alignment_uncertainty_ns": al.get("uncertainty_ns"),
        "top_instances": [
            {"step": c.get("step"), "collective": short(c.get("name"), 60), "arrival_spread_ns": c.get("arrival_spread_ns"),
             "total_wait_ns": c.get("total_wait_ns")}
            for c in top[:5]
        ],
    }
    return claim(
        "straggler", title, float(mean_wait), wall_ns(ctx, r), expl,
        evidence, rank=r,
        ops=sorted({short(c.get("name"), 60) for c in top}),
        occurrences=k,
    )
