"""``traceroof diff A B``: the step-time change from A to B, explained (docs/diff.md).

Both reports' complete device-steps are put side by side (per step: means over each report's
complete (rank, step, device) windows, the base of its speed of light, docs/speed-of-light.md).
Two waterfalls explain ``Δ = measured(B) − measured(A)``, each adding up to it exactly (int
sums per report; the per-step means to float rounding):

* **by op**: per op label, the change of its measured time per step, plus the change of the
  device idle (wall − busy) and of the concurrency (busy − Σ op time: time overlapped across
  streams). ``measured = Σ_label dur + concurrency + idle`` in each report.
* **by cause**: per op label the change of its roofline time (the work itself, at its roof),
  each finding's change (appeared, grew, shrank, went away), the change of the per-kind gaps
  no finding claimed, of the unclaimed idle and of the concurrency. ``measured = Σ_label
  roof + Σ speed-of-light waterfall terms except the hidden collectives and the cap``, which
  cancel against the speed of light (``sol = Σ roof − hidden − cap``).

Ops are matched by their ranking label (``--group-by`` of each report); labels on one side
only are listed as appeared / went away, never dropped. Findings are matched by detector and
the ops they name (their title without its numbers, when they name none).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

import polars as pl

from .errors import UsageError
from .report import Report
from .roofline import group_label_expr
from .schema import ROOFLINE_SCHEMA
from .sections import SpeedOfLightInfo
from .waterfall import waterfall_sum_ns


@dataclass(frozen=True)
class Side:
    """One report's per-step figures (ns per complete device-step, over ``device_steps``).
    Without a complete step (a cut-off single step) ``complete`` is False and the step figures
    are None; its ops are then compared per device-step of its partial steps."""

    name: str
    device_steps: int
    measured_ns: float | None
    speed_of_light_ns: float | None
    idle_ns: float | None
    concurrency_ns: float | None
    chip: str | None
    format: str
    devices: list[str]
    group_by: str
    complete: bool = True


@dataclass(frozen=True)
class OpChange:
    """One op label in A and/or B: ``status`` ``changed`` / ``appeared`` / ``went away``;
    per step (ns): count, measured, roofline (expected, uncosted ops at measured), gap; FLOPs
    per step (None when no op of the label is costed); ``delta_ns`` = measured B − A;
    ``uncosted_*_ns``: the part of measured with no cost model (counted at measured in expected)."""

    label: str
    kind: str | None
    status: str
    count_a: float
    count_b: float
    measured_a_ns: float
    measured_b_ns: float
    expected_a_ns: float
    expected_b_ns: float
    gap_a_ns: float
    gap_b_ns: float
    flops_a: float | None
    flops_b: float | None
    delta_ns: float
    uncosted_a_ns: float = 0.0
    uncosted_b_ns: float = 0.0


@dataclass(frozen=True)
class FindingChange:
    """A finding matched across A and B: recoverable time per step (ns, its claim in complete
    steps), what it took from the speed-of-light waterfall (``drawn``), ``status``, and how many
    findings of each report it sums (``count_a``, ``count_b``)."""

    kind: str
    title: str
    status: str
    recoverable_a_ns: float
    recoverable_b_ns: float
    drawn_a_ns: float
    drawn_b_ns: float
    delta_ns: float
    count_a: int = 0
    count_b: int = 0


@dataclass(frozen=True)
class Term:
    """A waterfall term: ``term`` (words), ``source`` (``op``, ``roof``, ``finding``, ``gap``,
    ``idle``, ``concurrency``) and its change per step (ns, B − A)."""

    term: str
    source: str
    delta_ns: float


@dataclass
class Diff:
    """The comparison of A and B (see the module docstring); ``delta_ns`` = measured B − A per
    step (None, and no waterfalls, when a side has no complete step); ``changed`` lists what
    differs in chip, format and devices."""

    a: Side
    b: Side
    delta_ns: float | None
    changed: list[str]
    ops: list[OpChange]
    findings: list[FindingChange]
    by_op: list[Term]
    by_cause: list[Term]
    notes: list[str] = field(default_factory=list)
    #: the ops matched by what they compute (:func:`traceroof.op_match.match`), for a diff
    #: across frameworks or chips, where names differ
    matching: Any = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (docs/diff.md)."""
        return asdict(self)


def complete_ops(r: Report) -> pl.DataFrame:
    """The ops of ``r``'s complete steps in the step bucket (those its speed of light stands on).

    Raises:
        UsageError: ``r`` was saved without its op table.
    """
    if r.ops is None:
        raise UsageError(f"{r.trace.sources[0] if r.trace.sources else 'report'}: saved without its op table; "
                         "diff needs it (save with `analyze -o report.json`)")
    keys = r.steps.filter(~pl.col("partial").fill_null(False)).select("rank", "step")
    ops = r.ops.filter(pl.col("bucket") == "step") if "bucket" in r.ops.columns else r.ops.clear()
    return ops.join(keys, on=["rank", "step"], how="semi", nulls_equal=True)


def _light(r: Report) -> SpeedOfLightInfo | None:
    """``r``'s speed of light when it counts a device-step (a section of 0 steps, which only
    a report built by hand can hold, is no speed of light: its means would divide by 0)."""
    s = r.speed_of_light
    return s if s is not None and s.device_steps > 0 else None


def compared_ops(r: Report) -> tuple[pl.DataFrame, int, bool]:
    """The ops a diff compares, the device-steps they are per, and whether they are those of
    partial steps: the complete steps' ops (:func:`complete_ops`, over the speed of light's
    device-steps), else, with no complete step, every op in a step bucket (over its distinct
    (rank, step, device)).

    Raises:
        UsageError: ``r`` was saved without its op table.
    """
    ops = complete_ops(r)
    s = _light(r)
    n = s.device_steps if s else 0
    if ops.height and n:
        return _roofline_columns(ops), n, False
    assert r.ops is not None  # complete_ops raised otherwise
    ops = r.ops.filter(pl.col("bucket") == "step") if "bucket" in r.ops.columns else r.ops
    return _roofline_columns(ops), max(ops.select("rank", "step", "device").unique().height, 1), True


def _roofline_columns(ops: pl.DataFrame) -> pl.DataFrame:
    """``ops`` with every ``ROOFLINE_SCHEMA`` column: an op table the roofline stage never saw
    (the analysis of a trace with no device op) has none, and its ops are uncosted (null)."""
    return ops.with_columns(pl.lit(None, dtype=t).alias(c) for c, t in ROOFLINE_SCHEMA.items() if c not in ops.columns)


def _per_label(r: Report) -> dict[str, dict[str, Any]]:
    by = (r.filters.group_by if r.filters and r.filters.group_by else "op")
    ops = compared_ops(r)[0].with_columns(group_label_expr(by).alias("label"), pl.col("kind").cast(pl.String))
    exp = pl.when(pl.col("expected_ns").is_null()).then(pl.col("dur_ns")).otherwise(
        pl.col("expected_ns").round(0).cast(pl.Int64))
    g = ops.group_by("label").agg(pl.len().alias("count"), pl.col("kind").first(), pl.col("dur_ns").sum().alias("dur_ns"),
                                 exp.sum().alias("exp_ns"), pl.col("flops").sum().alias("flops"),
                                 pl.col("flops").is_not_null().any().alias("has_flops"),
                                 pl.col("dur_ns").filter(pl.col("expected_ns").is_null()).sum().alias("uncosted_ns"))
    return {row["label"]: {**row, "flops": row["flops"] if row["has_flops"] else None} for row in g.iter_rows(named=True)}


def _side(name: str, r: Report, dur_total: int) -> Side:
    s = _light(r)
    by = r.filters.group_by if r.filters and r.filters.group_by else "op"
    if s is None:
        return Side(name=name, device_steps=compared_ops(r)[1], measured_ns=None, speed_of_light_ns=None,
                    idle_ns=None, concurrency_ns=None, chip=r.chip.name if r.chip else None, format=r.trace.format,
                    devices=list(r.trace.devices), group_by=by, complete=False)
    n = s.device_steps
    conc = sum(t.total_ns for t in s.waterfall if t.source == "concurrency")
    idle = s.measured_total_ns - dur_total - conc  # wall = busy + idle, busy = Σ dur + concurrency
    return Side(name=name, device_steps=n, measured_ns=s.measured_ns, speed_of_light_ns=s.speed_of_light_ns,
                idle_ns=idle / n, concurrency_ns=conc / n, chip=r.chip.name if r.chip else None,
                format=r.trace.format, devices=list(r.trace.devices), group_by=by)


def _ops(la: dict[str, dict[str, Any]], lb: dict[str, dict[str, Any]], na: int, nb: int) -> list[OpChange]:
    out = []
    for label in sorted(la.keys() | lb.keys()):
        a, b = la.get(label), lb.get(label)
        status = "changed" if a and b else ("appeared" if b else "went away")
        z = {"count": 0, "dur_ns": 0, "exp_ns": 0, "flops": None, "kind": None, "uncosted_ns": 0}
        a, b = a or z, b or z
        out.append(OpChange(
            label=label, kind=b["kind"] or a["kind"], status=status, count_a=a["count"] / na, count_b=b["count"] / nb,
            measured_a_ns=a["dur_ns"] / na, measured_b_ns=b["dur_ns"] / nb, expected_a_ns=a["exp_ns"] / na,
            expected_b_ns=b["exp_ns"] / nb, gap_a_ns=(a["dur_ns"] - a["exp_ns"]) / na, gap_b_ns=(b["dur_ns"] - b["exp_ns"]) / nb,
            flops_a=a["flops"] / na if a["flops"] is not None else None,
            flops_b=b["flops"] / nb if b["flops"] is not None else None,
            delta_ns=b["dur_ns"] / nb - a["dur_ns"] / na, uncosted_a_ns=a["uncosted_ns"] / na, uncosted_b_ns=b["uncosted_ns"] / nb))
    return sorted(out, key=lambda o: (-abs(o.delta_ns), -(o.measured_a_ns + o.measured_b_ns), o.label))


def _finding_key(kind: str, title: str) -> tuple[str, str]:
    """A finding's identity across two runs: its detector and its title without the numbers
    (``HtoD copies ×150 (404 MiB): 16 ms …`` is ``HtoD copies ×151 (404 MiB): 13.6 ms …``).
    Findings of one report with the same identity are summed, and counted (``count_a``/``_b``)."""
    return kind, re.sub(r"\d[\d.,]*", "#", title)


def _findings(ra: Report, rb: Report) -> list[FindingChange]:
    def table(r: Report) -> dict[tuple[str, str], tuple[str, float, float, int]]:
        s = _light(r)
        n = s.device_steps if s else 1
        out: dict[tuple[str, str], tuple[str, float, float, int]] = {}
        for t in (s.waterfall if s else []):
            if t.source != "finding":
                continue
            k = _finding_key(t.finding or "", t.term)
            title, rec, drawn, c = out.get(k, (t.term, 0.0, 0.0, 0))
            out[k] = (title, rec + (t.claimed_ns or 0.0), drawn + t.total_ns / n, c + 1)
        return out

    ta, tb = table(ra), table(rb)
    out = []
    for k in ta.keys() | tb.keys():
        a, b = ta.get(k), tb.get(k)
        status = "appeared" if a is None else "went away" if b is None else (
            "grew" if b[1] > a[1] else "shrank" if b[1] < a[1] else "same")
        ra_ns, rb_ns = (a[1] if a else 0.0), (b[1] if b else 0.0)
        da, db = (a[2] if a else 0.0), (b[2] if b else 0.0)
        out.append(FindingChange(kind=k[0], title=(b or a)[0], status=status, recoverable_a_ns=ra_ns,
                                 recoverable_b_ns=rb_ns, drawn_a_ns=da, drawn_b_ns=db, delta_ns=db - da,
                                 count_a=a[3] if a else 0, count_b=b[3] if b else 0))
    return sorted(out, key=lambda f: (-abs(f.delta_ns), -abs(f.recoverable_b_ns - f.recoverable_a_ns), f.title))


def _by_cause(ra: Report, rb: Report, ops: list[OpChange], findings: list[FindingChange]) -> list[Term]:
    def roof_words(o: OpChange) -> str:
        unc = o.uncosted_a_ns + o.uncosted_b_ns
        if not unc:
            return f"{o.label}: roofline time"
        whole = unc >= o.measured_a_ns + o.measured_b_ns
        return f"{o.label}: roofline time ({'no' if whole else 'partly no'} cost model: counted at measured time)"

    out = [Term(roof_words(o), "roof", o.expected_b_ns - o.expected_a_ns) for o in ops]
    out += [Term(f"{f.kind}: {f.title}", "finding", f.delta_ns) for f in findings]

    def rest(r: Report) -> dict[tuple[str, str], float]:
        s = _light(r)
        d: dict[tuple[str, str], float] = {}
        for t in s.waterfall if s else []:
            if t.source in ("gap", "idle", "concurrency"):
                d[(t.source, t.term)] = d.get((t.source, t.term), 0.0) + t.total_ns / s.device_steps
        return d

    a, b = rest(ra), rest(rb)
    for k in sorted(a.keys() | b.keys()):
        out.append(Term(k[1].replace("below their roof", "below their roof, unclaimed"), k[0],
                        b.get(k, 0.0) - a.get(k, 0.0)))
    return sorted([t for t in out if t.delta_ns], key=lambda t: -abs(t.delta_ns))


def compare(a: Report, b: Report, *, name_a: str = "A", name_b: str = "B") -> Diff:
    """The diff of reports ``a`` → ``b`` (see the module docstring).

    Raises:
        UsageError: a report saved without its op table.
    """
    for nm, r in ((name_a, a), (name_b, b)):
        s = r.speed_of_light
        if s is not None and waterfall_sum_ns(s) != s.measured_total_ns - s.speed_of_light_total_ns:
            raise UsageError(f"{nm}: its speed-of-light waterfall does not add up (accounting rule 9)")
    la, lb = _per_label(a), _per_label(b)
    sa = _side(name_a, a, sum(v["dur_ns"] for v in la.values()))
    sb = _side(name_b, b, sum(v["dur_ns"] for v in lb.values()))
    ops = _ops(la, lb, sa.device_steps, sb.device_steps)
    found = _findings(a, b)
    whole = sa.complete and sb.complete
    by_op = [Term(o.label, "op", o.delta_ns) for o in ops if o.delta_ns] if whole else []
    if whole:
        assert sa.idle_ns is not None and sb.idle_ns is not None and sa.concurrency_ns is not None
        assert sb.concurrency_ns is not None
        by_op += [Term("device idle (wall − busy)", "idle", sb.idle_ns - sa.idle_ns),
                  Term("concurrency (busy − Σ op time)", "concurrency", sb.concurrency_ns - sa.concurrency_ns)]
    changed = [f"{what}: {x} → {y}" for what, x, y in (("chip", sa.chip, sb.chip), ("format", sa.format, sb.format),
                                                       ("devices", ", ".join(sa.devices), ", ".join(sb.devices)),
                                                       ("ops grouped by", sa.group_by, sb.group_by)) if x != y]
    notes = [f"{x.name}: no complete step (a cut-off step): no step time and no waterfall; the ops of its partial "
             "steps are compared per device-step" for x in (sa, sb) if not x.complete]
    if sa.group_by != sb.group_by or sa.format != sb.format:
        notes.append("the two sides label ops differently (format or --group-by): labels match only where the "
                     "names agree; the unmatched are listed as appeared / went away")
    from .op_match import match

    delta = sb.measured_ns - sa.measured_ns if sa.measured_ns is not None and sb.measured_ns is not None else None
    return Diff(a=sa, b=sb, delta_ns=delta, changed=changed, ops=ops, findings=found,
                by_op=[t for t in by_op if t.delta_ns], by_cause=_by_cause(a, b, ops, found) if whole else [],
                notes=notes, matching=match(a, b))


def terms_sum_ns(terms: list[Term]) -> float:
    """Σ of the terms' changes (ns per step): the step-time change, to float rounding."""
    return float(sum(t.delta_ns for t in terms))


__all__ = ["Diff", "FindingChange", "OpChange", "Side", "Term", "compare", "compared_ops", "complete_ops",
           "terms_sum_ns"]
