"""The waterfall from the measured step down to its speed of light (docs/speed-of-light.md).

The time between them, ``measured − speed of light`` summed over the complete device-steps
(int ns), is first split into **pools** by the exact identity of
:mod:`traceroof.speed_of_light`: device idle, the per-op gaps of each op kind (Σ dur −
expected), concurrency (busy − Σ dur: op time overlapped across streams, or run past the
step's end, ≤ 0), collectives hidden behind compute at the speed of light (min(O, C)) and the
cap (speed of light held at the measured step). Then each finding, largest recoverable time
first, takes its time out of the pools it claims from (:data:`DRAWS_FROM`), never more than
they hold and never more than what is left of the whole, so no time is counted twice; what a
finding claims beyond that lies below the speed of light (a fix that changes the roof itself:
a dtype, an overlap the program did not do) and shows in its what-if. The pools' remainders are
the rest of the terms: the terms' totals add up exactly to ``measured − speed of light``.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from .findings import Finding
from .sections import SpeedOfLightInfo, StepLight, WaterfallTerm
from .speed_of_light import CONVENTION, DeviceSteps

#: the pools a finding of each detector takes its time from, in order (docs/findings/README.md
#: says what each claims): idle gaps → ``idle``; communication-only time → the collectives'
#: gaps; copy-only time → the copies'; kernel time → the gaps of that kind (``ops``: of the
#: kinds of the ops the finding names). A detector not listed takes from ``ops``, then ``idle``.
DRAWS_FROM: dict[str, tuple[str, ...]] = {
    "unfused_elementwise": ("ops",),
    "device_idle": ("idle",),
    "launch_bound": ("idle",),
    "host_device_copies": ("gap:memcpy", "idle"),
    "exposed_collectives": ("gap:collective",),
    "straggler": ("gap:collective", "idle"),
    "fp32_matmul": ("gap:matmul",),
}

_WORDS = {
    "idle": "device idle, not claimed by a finding",
    "concurrency": "concurrent ops (time overlapped across streams or past the step's end, counted once)",
    "hidden_comm": "collectives hidden behind compute at the speed of light",
    "cap": "speed of light held at the measured step (op roofs add up past it)",
}


def _pools(ds: DeviceSteps) -> dict[str, int]:
    t = ds.table
    s = {c: int(t[c].sum()) for c in t.columns if c not in ("rank", "step", "device")}
    pools = {f"gap:{k}": s[f"gap_{k}_ns"] for k in ds.kinds}
    pools["idle"] = s["idle_ns"]
    pools["concurrency"] = s["busy_ns"] - s["ops_dur_ns"]
    pools["hidden_comm"] = int(t.select(pl.min_horizontal("comm_overlapped_ns", "compute_ns").sum()).item())
    pools["cap"] = int(t.select((pl.col("sol_raw_ns") - pl.col("wall_ns")).clip(lower_bound=0).sum()).item())
    return pools


def _complete_share(steps: pl.DataFrame) -> dict[int, float]:
    """Per rank, the complete steps' share of its step wall (findings also claim in partial ones)."""
    if not steps.height:
        return {}
    g = steps.group_by("rank").agg(
        pl.col("wall_ns").filter(~pl.col("partial").fill_null(False)).sum().alias("c"), pl.col("wall_ns").sum().alias("a"))
    return {r: (c / a if a else 0.0) for r, c, a in g.iter_rows()}


def _draws_from(f: Finding, kind_of: dict[str, str]) -> list[str]:
    out: list[str] = []
    for p in DRAWS_FROM.get(f.kind, ("ops", "idle")):
        out += [f"gap:{kind_of[o]}" for o in f.ops if o in kind_of] if p == "ops" else [p]
    return list(dict.fromkeys(out))


def _take(f: Finding, claim: int, pools: dict[str, int], left: int, kind_of: dict[str, str]) -> int:
    """Take up to ``claim`` ns (and ``left``) out of ``f``'s pools, in order; the ns taken."""
    taken = 0
    for p in _draws_from(f, kind_of):
        have = max(pools.get(p, 0), 0)
        n = min(have, claim - taken, left - taken)
        if n > 0:
            pools[p] -= n
            taken += n
    return taken


def _term_name(pool: str, ns: int) -> tuple[str, str]:
    if pool.startswith("gap:"):
        kind = pool[4:]
        return "gap", (f"{kind} ops below their roof" if ns >= 0 else f"{kind} ops measured faster than their roof")
    return pool, _WORDS[pool]


def build(ds: DeviceSteps, findings: Sequence[Finding], steps: pl.DataFrame, kind_of: dict[str, str],
          model_floor_ns: float | None = None, model_floor_why: str | None = None) -> SpeedOfLightInfo | None:
    """The speed-of-light section: the mean measured step and speed of light, per (rank, step),
    and the waterfall between them.

    Args:
        ds: :func:`traceroof.speed_of_light.device_steps`.
        findings: the report's findings (largest recoverable time first).
        steps: the per-step table (``rank``, ``wall_ns``, ``partial``), to count only the part
            of a finding's claim that falls in complete steps (its rank's complete share).
        kind_of: op label → op kind, for findings of detectors not in :data:`DRAWS_FROM`.
        model_floor_ns: the model floor per step (ns), when a model is given.
        model_floor_why: why the floor is above the speed of light, if it may be.

    Returns:
        None when no complete step has a device window.
    """
    t = ds.table
    n = t.height
    if n == 0:
        return None
    wall_ns, sol_ns = int(t["wall_ns"].sum()), int(t["sol_ns"].sum())
    pools = _pools(ds)  # they add up to wall − sol (the identity of traceroof.speed_of_light)
    left = wall_ns - sol_ns
    share = _complete_share(steps)
    terms: list[WaterfallTerm] = []
    for f in findings:
        full = float(f.recoverable_ns or 0.0) * (share.get(f.rank, 1.0) if f.rank is not None else 1.0)
        if full <= 0:
            continue
        took = _take(f, int(round(full)), pools, left, kind_of)
        left -= took
        terms.append(WaterfallTerm(term=f.title, source="finding", ns=took / n, total_ns=took, finding=f.kind,
                                   claimed_ns=full / n, what_if_ns=(wall_ns - full) / n))
    terms.sort(key=lambda x: -x.total_ns)
    rest = []
    for pool, ns in pools.items():
        if ns:
            source, words = _term_name(pool, ns)
            rest.append(WaterfallTerm(term=words, source=source, ns=ns / n, total_ns=ns))
    order = {"gap": 0, "idle": 1, "concurrency": 2, "hidden_comm": 3, "cap": 4}
    rest.sort(key=lambda x: (order[x.source], -x.total_ns))
    per_step = (t.group_by("rank", "step").agg(pl.col("wall_ns").mean(), pl.col("sol_ns").mean())
                .sort("rank", "step", nulls_last=True))
    measured, light = wall_ns / n, sol_ns / n
    note = None
    if model_floor_ns is not None and model_floor_ns > light:
        note = model_floor_why or ("the model floor is above the op-level speed of light: the model's FLOPs are "
                                   "more than the trace ran at its roofs (a model config larger than the run, or "
                                   "ops the trace did not record)")
    return SpeedOfLightInfo(
        device_steps=n, measured_ns=measured, speed_of_light_ns=light, fraction=light / measured if measured else None,
        measured_total_ns=wall_ns, speed_of_light_total_ns=sol_ns, uncosted_ns=int(t["uncosted_ns"].sum()) / n,
        model_floor_ns=model_floor_ns, model_floor_note=note, convention=CONVENTION, waterfall=terms + rest,
        per_step=[StepLight(rank=r, step=s, measured_ns=w, speed_of_light_ns=x) for r, s, w, x in per_step.iter_rows()],
    )


def waterfall_sum_ns(info: SpeedOfLightInfo) -> int:
    """Σ of the waterfall terms' ``total_ns`` (int ns): equals ``measured_total_ns −
    speed_of_light_total_ns`` exactly (accounting rule 9)."""
    return sum(int(x.total_ns) for x in info.waterfall)


__all__ = ["DRAWS_FROM", "build", "waterfall_sum_ns"]
