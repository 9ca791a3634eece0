"""The CI gate: fail when MFU, HFU, roofline efficiency or step time regresses (DESIGN §9).

``check(report, ...)`` compares one report against absolute thresholds and/or a baseline
report and returns a :class:`GateResult` (pure; no I/O). The CLI prints its markdown
summary, appends it to ``$GITHUB_STEP_SUMMARY`` when set, and exits 1 on failure.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from . import units
from .errors import UsageError
from .report import Report
from .sections import Summary


@dataclass
class Check:
    """One comparison: ``metric`` measured ``value`` against ``limit`` (``op`` is >= or <=)."""

    metric: str
    value: float | None
    limit: float
    op: str
    passed: bool
    detail: str = ""


@dataclass
class GateResult:
    """All checks; ``passed`` when every check passed."""

    checks: list[Check] = field(default_factory=list)
    candidate: str = ""
    baseline: str | None = None
    #: when a baseline check failed: the top lines of ``traceroof diff BASELINE CANDIDATE``
    #: (:func:`explain`), else empty
    explain: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        d = {
            "passed": self.passed,
            "candidate": self.candidate,
            "baseline": self.baseline,
            "checks": [asdict(c) for c in self.checks],
        }
        if self.explain:
            d["diff"] = self.explain
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_markdown(self) -> str:
        head = "### traceroof gate: " + ("✅ passed" if self.passed else "❌ FAILED")
        lines = [head, "", f"candidate: `{self.candidate}`" + (f", baseline: `{self.baseline}`" if self.baseline else ""), ""]
        lines += ["| check | value | limit | result |", "|---|---|---|---|"]
        for c in self.checks:
            v = "unknown" if c.value is None else _fmt(c.metric, c.value)
            lines.append(f"| {c.metric} | {v} | {c.op} {_fmt(c.metric, c.limit)} | {'pass' if c.passed else '**FAIL**'}{(' — ' + c.detail) if c.detail else ''} |")
        if self.explain:
            lines += ["", "What changed against the baseline (`traceroof diff BASELINE CANDIDATE`, docs/diff.md):", ""]
            lines += [f"- {x}" for x in self.explain]
        return "\n".join(lines) + "\n"


def _fmt(metric: str, v: float) -> str:
    if metric.endswith("_ns") or "step time" in metric:
        return units.ms(v)
    return units.pct(v, 2)


#: the gated metrics: name → its value in a report's summary (None when unknown).
METRICS: dict[str, Callable[[Summary], float | None]] = {
    "mfu": lambda s: s.mfu.value if s.mfu else None,
    "hfu": lambda s: s.hfu.value if s.hfu else None,
    "roofline_efficiency": lambda s: s.roofline.efficiency if s.roofline else None,
    "step_time_ns": lambda s: s.step_time_ns,
}


def _metric(report: Report, key: str) -> float | None:
    v = METRICS[key](report.summary)
    return None if v is None else float(v)


def check(
    report: Report,
    *,
    min_mfu: float | None = None,
    min_hfu: float | None = None,
    min_efficiency: float | None = None,
    baseline: Report | None = None,
    max_drop: float | None = None,
    max_step_time_increase: float | None = None,
    candidate_name: str = "",
    baseline_name: str | None = None,
) -> GateResult:
    """Gate ``report`` on thresholds and/or a baseline.

    Args:
        min_mfu, min_hfu, min_efficiency: absolute floors, fractions (0.40 = 40 %).
            ``min_efficiency`` is the roofline efficiency (Σ expected / Σ measured over
            costed ops).
        baseline: a report to compare against.
        max_drop: largest allowed absolute drop of MFU, HFU and roofline efficiency versus
            the baseline (0.02 = two percentage points); each metric present in both.
        max_step_time_increase: largest allowed relative step-time increase (0.05 = 5 %).

    A metric that is unknown in the candidate fails its check (an unknown MFU is not a
    pass). Raises :class:`UsageError` when no check is requested, or baseline options are
    given without a baseline.
    """
    if (max_drop is not None or max_step_time_increase is not None) and baseline is None:
        raise UsageError("--max-drop/--max-step-time-increase need --baseline REPORT.json")
    res = GateResult(candidate=candidate_name, baseline=baseline_name)
    for key, floor, label in ((("mfu", min_mfu, "MFU")), ("hfu", min_hfu, "HFU"), ("roofline_efficiency", min_efficiency, "roofline efficiency")):
        if floor is None:
            continue
        v = _metric(report, key)
        detail = "" if v is not None else why_unknown(report, key)
        res.checks.append(Check(label, v, floor, ">=", v is not None and v >= floor, detail))
    if baseline is not None:
        if max_drop is not None:
            for key, label in (("mfu", "MFU"), ("hfu", "HFU"), ("roofline_efficiency", "roofline efficiency")):
                b, c = _metric(baseline, key), _metric(report, key)
                if b is None:
                    continue
                limit = b - max_drop
                res.checks.append(Check(f"{label} vs baseline", c, limit, ">=", c is not None and c >= limit,
                                        f"baseline {100 * b:.2f} %, max drop {100 * max_drop:.2f} pp"
                                        + ("" if c is not None else f"; {why_unknown(report, key)}")))
        if max_step_time_increase is not None:
            b, c = _metric(baseline, "step_time_ns"), _metric(report, "step_time_ns")
            if b is not None:
                limit = b * (1 + max_step_time_increase)
                res.checks.append(Check("step time vs baseline", c, limit, "<=", c is not None and c <= limit,
                                        f"baseline {b / 1e6:.4g} ms, max +{100 * max_step_time_increase:.1f} %"
                                        + ("" if c is not None else f"; {why_unknown(report, 'step_time_ns')}")))
    if baseline is not None and not res.passed:
        res.explain = explain(baseline, report)
    if not res.checks:
        raise UsageError(
            "gate: nothing to check: give --min-mfu/--min-hfu/--min-efficiency, or --baseline with "
            "--max-drop/--max-step-time-increase (a baseline without a comparable metric checks nothing)"
        )
    return res


def explain(baseline: Report, report: Report, top: int = 5) -> list[str]:
    """The top lines of the diff baseline → candidate (:func:`traceroof.diff.compare`): the
    step-time change and the ``top`` largest terms of the by-op waterfall, and the idle; or
    one line saying why there is no diff (a report saved without its op table, no step)."""
    from .diff import compare

    try:
        d = compare(baseline, report, name_a="baseline", name_b="candidate")
    except UsageError as exc:
        return [f"no diff: {exc}"]

    def signed(v: float) -> str:
        return ("+" if v > 0 else "−" if v < 0 else "") + units.ns(abs(v))

    if d.delta_ns is None:
        return [f"no step-time diff: {'; '.join(d.notes)}"]
    out = [f"step {units.ns(d.a.measured_ns)} → {units.ns(d.b.measured_ns)} ({signed(d.delta_ns)} per step); "
           f"speed of light {units.ns(d.a.speed_of_light_ns)} → {units.ns(d.b.speed_of_light_ns)}"]
    out += [f"changed: {c}" for c in d.changed]
    named = [t for t in d.by_op if t.source == "op"][:top]
    out += [f"{t.term}: {signed(t.delta_ns)}" for t in named]
    out += [f"{t.term}: {signed(t.delta_ns)}" for t in d.by_op if t.source != "op"]
    out += [f"finding {f.status}: {f.title} ({signed(f.recoverable_b_ns - f.recoverable_a_ns)} recoverable)"
            for f in d.findings if f.status in ("appeared", "grew")][:3]
    return out


def why_unknown(report: Report, key: str) -> str:
    """Why metric ``key`` is unknown in ``report``: no complete step (accounting rule 5), a
    value above 100 % (an inconsistency), no model FLOPs for MFU, else no cost."""
    st = report.summary.step
    if report.summary.steps and st is not None and st.complete_steps == 0:
        return "unknown: no complete step, every step is partial (accounting rule 5)"
    word = {"hfu": "HFU", "mfu": "MFU", "roofline_efficiency": "roofline efficiency"}.get(key)
    if word and any(i.what.startswith(word) for i in report.inconsistencies):
        return f"unknown: {word} came out above 100 %, an inconsistency (see the report's inconsistencies)"
    if key == "mfu":
        return "unknown in this report (pass --model/--model-flops-per-step)"
    return "unknown in this report (no costed FLOPs)" if key != "step_time_ns" else "unknown in this report"


def write_step_summary(markdown: str) -> str | None:
    """Append to ``$GITHUB_STEP_SUMMARY`` when set; returns the path written, else None."""
    path = os.environ.get("GITHUB_STEP_SUMMARY")
    if not path:
        return None
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(markdown + "\n")
    return path
