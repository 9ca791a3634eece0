"""Launch-bound stretches: the device idles between short kernels because the host cannot
submit them faster (typical of eager decode).

A *stretch* (:func:`traceroof.findings._idle.stretches`) is a run of device ops of one step
separated only by no gap or by *launch gaps*: gaps where the next kernel's launch call ended
after the device had gone idle, and that launch followed the previous one on the same host
thread within ``LAUNCH_SPACING_MAX_NS`` (the host thread was busy launching, back to back).
A stretch is launch-bound when it has ≥ ``STRETCH_MIN_OPS`` ops, keeps the device busy at
most ``STRETCH_MAX_BUSY`` of its span, its median kernel is shorter than its median launch
spacing, and its step replays no CUDA/HIP graph (BC-13: graph kernels share one launch, so
their count says nothing about the host).

Recoverable = the launch gaps inside launch-bound stretches: with the step captured in a
graph the kernels would run back to back. The gap before a stretch's first op (a step
boundary, a sync, a host pause) is not included: graphs do not remove it.

Graph replay whose recorded kernels cover less than ``INCOMPLETE_BUSY`` of their own span is
reported as an *incomplete device capture* (recoverable 0) instead of idle time.
See ``docs/findings/launch_bound.md``.
"""

from __future__ import annotations

import polars as pl

from . import Finding, FindingContext, register
from ._common import (
    by_rank,
    claim,
    fmt_ns,
    scope_evidence,
    scope_wall_ns,
    several_devices,
    short,
    total,
    union,
    wall_ns,
)
from ._idle import (
    LAUNCH_SPACING_MAX_NS,
    STRETCH_MAX_BUSY,
    STRETCH_MIN_OPS,
    stretches,
    timeline,
    with_names,
)

#: Report when the launch gaps are at least this share of the rank's window.
MIN_SHARE = 0.01
#: Graph replay whose recorded kernels keep the device busy less than this share of the
#: graph's own span is an incomplete capture (BC-13).
INCOMPLETE_BUSY = 0.5
#: ... for graph spans at least this long (ns).
INCOMPLETE_MIN_SPAN_NS = 100_000
#: The stretch rules a launch-bound finding's evidence names.
THRESHOLDS = {
    "stretch_min_ops": STRETCH_MIN_OPS,
    "stretch_max_busy": STRETCH_MAX_BUSY,
    "launch_spacing_max_ns": LAUNCH_SPACING_MAX_NS,
}


@register("launch_bound")
def detect(ctx: FindingContext) -> list[Finding]:
    """Launch-bound findings (one per rank; one per (rank, device) for a rank driving several
    devices) and incomplete-capture notes."""
    tl = timeline(ctx)
    st = stretches(ctx)
    out: list[Finding] = []
    # the qualifying stretches and the graph kernels of every rank, split once (one filter per
    # rank over the whole timeline grew with ranks × ops)
    qualifying = dict(by_rank(st.filter(pl.col("qualifies"))))
    graph_rows = dict(by_rank(tl.filter(pl.col("graph"))))
    for rank in sorted(tl["rank"].unique().to_list()):
        q = qualifying.get(int(rank))
        if q is not None and several_devices(ctx, rank):
            parts = sorted(q.partition_by("device", as_dict=True).items(), key=lambda kv: kv[0][0] or 0)
            found = [_launch_finding(ctx, int(rank), g, tl, None if d is None else int(d)) for (d,), g in parts]
            out.extend(f for f in found if f is not None)
        elif q is not None:
            f = _launch_finding(ctx, int(rank), q, tl)
            if f is not None:
                out.append(f)
        gk = graph_rows.get(int(rank))
        f = _incomplete_capture(ctx, int(rank), gk) if gk is not None else None
        if f is not None:
            out.append(f)
    return out


def _launch_finding(ctx: FindingContext, rank: int, q: pl.DataFrame, tl: pl.DataFrame,
                    dev: int | None = None) -> Finding | None:
    """The launch-bound finding of the qualifying stretches ``q`` of rank ``rank`` (all on its
    device ``dev`` when it drives several; None: its only device), a share of that scope's window."""
    wall = scope_wall_ns(ctx, rank, dev)
    rec = float(q["launch_gap_ns"].sum())
    if rec < MIN_SHARE * wall or rec <= 0:
        return None
    rows = tl.filter(pl.col("stretch").is_in(q["stretch"].implode()))  # stretch ids are unique in the timeline
    n_ops = rows.height
    span = float(q["span_ns"].sum())
    busy = float(q["busy_ns"].sum())
    med_dur = float(rows["dur_ns"].median() or 0)
    spacing = rows["spacing_ns"].drop_nulls()
    med_sp = float(spacing.median()) if spacing.len() else None
    calls = rows["launch_dur_ns"].drop_nulls()
    med_call = float(calls.median()) if calls.len() else None
    steps = sorted(s for s in q["step"].unique().to_list() if s is not None)
    n_steps = len(steps) or 1
    launch_rows = rows.filter(pl.col("owner") == "launch_bound")
    gaps = launch_rows["gap_ns"]
    top = _top_kernels(ctx, rows)
    busy_frac = busy / span if span else None
    title = (
        ("launch-bound: device" if dev is None else f"launch-bound: device {dev}") + f" busy {busy_frac:.0%} across {n_ops:,} short device ops"
        + (f" in {len(steps)} step(s)" if steps else "")
        + f" (median op {fmt_ns(med_dur)} vs a launch every {fmt_ns(med_sp)})"
    )
    expl = (
        f"In {q.height:,} stretches of {n_ops:,} device ops the host thread issues one launch every "
        f"{fmt_ns(med_sp)} (the launch call itself takes {fmt_ns(med_call)}), while the median op runs "
        f"{fmt_ns(med_dur)}: each op was submitted only after the device had finished the previous one "
        f"(top: {', '.join(short(a, 40) for a, _ in top.head(3).iter_rows())}), so the device sat idle "
        f"{fmt_ns(rec)} in {gaps.len():,} gaps ({fmt_ns(rec / n_steps)} per step). "
        "Fix: capture the step in a CUDA/HIP graph (torch.cuda.CUDAGraph, torch.compile(mode=\"reduce-overhead\"); "
        "vLLM/SGLang do this for decode), cut per-op host overhead (fewer, fused ops; torch.compile), or raise the "
        "batch so each kernel does more work per launch."
    )
    first = q.sort("start_ns").row(0, named=True)
    evidence = {
        "recoverable_ns": rec,
        "stretches": q.height,
        "steps": steps,
        "recoverable_per_step_ns": rec / n_steps,
        "kernels": n_ops,
        "launch_gaps": int(gaps.len()),
        "launch_gap_median_ns": float(gaps.median()) if gaps.len() else None,
        "stretch_span_ns": span,
        "stretch_busy_ns": busy,
        "busy_fraction": busy_frac,
        "median_kernel_ns": med_dur,
        "median_launch_spacing_ns": med_sp,
        "median_launch_call_ns": med_call,
        "kernels_per_step": n_ops / n_steps,
        "top_kernels": [[short(a, 80), int(b)] for a, b in top.iter_rows()],
        "window_ns": wall,
        "thresholds": dict(THRESHOLDS),
        **scope_evidence(ctx, rank, dev),
    }
    return claim(
        "launch_bound", title, rec, wall, expl,
        evidence, rank=rank, device=dev, steps=steps,
        start_ns=int(first["start_ns"]),
        end_ns=int(q["end_ns"].max()),
        ops=[short(a, 80) for a, _ in top.iter_rows()],
        occurrences=q.height,
    )


def _top_kernels(ctx: FindingContext, rows: pl.DataFrame) -> pl.DataFrame:
    """The 5 most frequent labels (framework op, else kernel name) of timeline ``rows``:
    columns ``l`` and ``len``, most first (ties by label)."""
    return (
        with_names(ctx, rows.select("op_row"))
        .group_by(pl.coalesce("op", "name").alias("l"))
        .agg(pl.len())
        .sort(["len", "l"], descending=[True, False])
        .head(5)
    )


def _incomplete_capture(ctx: FindingContext, rank: int, gk: pl.DataFrame) -> Finding | None:
    """Graph launches whose recorded kernels cover too little of their span (BC-13); ``gk``: the
    timeline rows of rank ``rank``'s graph kernels (in timeline order)."""
    if gk.height == 0:
        return None
    bad = []
    for (dev, corr), part in gk.group_by(["device", "correlation"], maintain_order=True):  # deterministic order
        s, e = int(part["start_ns"].min()), int(part["end_ns"].max())
        span = e - s
        if part.height < 2 or span < INCOMPLETE_MIN_SPAN_NS:
            continue
        busy = total(union(zip(part["start_ns"].to_list(), part["end_ns"].to_list())))
        if busy < INCOMPLETE_BUSY * span:
            bad.append((corr, part.height, span, busy, s, e))
    if not bad:
        return None
    n_k = sum(b[1] for b in bad)
    span = sum(b[2] for b in bad)
    busy = sum(b[3] for b in bad)
    title = (
        f"incomplete device capture: {len(bad)} graph launch(es) recorded only {n_k:,} kernels, "
        f"busy {busy / span:.0%} of their {fmt_ns(span)} span — idle there is not measurable"
    )
    expl = (
        "A CUDA/HIP graph replays all its kernels back to back from one launch, yet the kernels recorded for "
        f"these launches cover only {busy / span:.0%} of the span between the first and the last one: the profiler "
        "missed most of them (a known CUPTI/roctracer limit for graphs captured before profiling started, or for "
        "conditional/while nodes). The idle time inside these spans is an artefact, so no launch-bound or idle "
        "verdict is given for them. Fix: start the profiler before capturing the graph (or re-capture under the "
        "profiler), or profile one eager step to see the kernels."
    )
    return claim(
        "launch_bound", title, 0.0, wall_ns(ctx, rank), expl,
        {
            "incomplete_capture": True,
            "graph_launches": len(bad),
            "recorded_kernels": n_k,
            "graph_span_ns": span,
            "recorded_busy_ns": busy,
            "recorded_busy_fraction": busy / span,
            "correlations": [b[0] for b in bad[:20]],
            "threshold_busy_fraction": INCOMPLETE_BUSY,
        },
        rank=rank,
        start_ns=min(b[4] for b in bad),
        end_ns=max(b[5] for b in bad),
        occurrences=len(bad),
    )
