"""The accounting check: the rules of ``docs/accounting.md``, checked on a finished report.

:func:`check` reads a :class:`~traceroof.report.Report` (its typed sections, the steps and
ranking tables and the op table) and returns one :class:`Violation` per broken rule
instance; :func:`warnings_for` turns them into warnings, a few lines per rule with a count.
:func:`traceroof.analysis.analyze` runs it on every analysis (stage ``check_accounting``).

Rule 8 is not checked here: the report holds no launch links to validate (see
``docs/accounting.md``); rules 1 and 2 read the report's timeline section (the buckets). All times are int64 ns; a relative
slack of :data:`REL_TOL` (plus :data:`ABS_TOL_NS`) absorbs the rounding of per-device means.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import polars as pl

from . import intervals as iv
from . import units
from .roofline import group_label_expr

if TYPE_CHECKING:
    from .report import Report

#: relative slack of every comparison (float sums, rounded per-device means)
REL_TOL = 1e-6
#: absolute slack, ns: per-device means are rounded to whole ns
ABS_TOL_NS = 2
#: warning lines per rule before the rest is counted
LINES_PER_RULE = 3

#: per detector, the evidence key that bounds its recoverable time (rule 6)
EVIDENCE_BOUND = {
    "device_idle": "idle_claimed_ns",
    "exposed_collectives": "exposed_ns",
    "fp32_matmul": "measured_ns",
    "unfused_elementwise": "measured_ns",
    "straggler": "wait_caused_ns",
}


@dataclass(frozen=True)
class Violation:
    """One broken accounting rule.

    Attributes:
        rule: the rule number of ``docs/accounting.md`` (1 to 7, 9).
        text: one line: where and the numbers (``step 7 rank 0: busy 12.1 ms > wall 11.8 ms``).
        rank, device, step: where it applies (None when it does not).
        numbers: the numbers compared, unit-suffixed keys (ns, fractions).
    """

    rule: int
    text: str
    rank: int | None = None
    device: int | None = None
    step: int | None = None
    numbers: dict[str, float] = field(default_factory=dict)

    def line(self) -> str:
        """The warning line: ``accounting rule N: <text>``."""
        return f"accounting rule {self.rule}: {self.text}"


def _over(a: float, b: float) -> bool:
    """``a > b`` beyond the slack."""
    return a > b + ABS_TOL_NS + REL_TOL * abs(b)


def _where(rank: Any, step: Any) -> str:
    return (f"step {step} " if step is not None else "unsegmented step ") + f"rank {rank}"


# --------------------------------------------------------------------------- rule 1


def check_windows(steps: pl.DataFrame, ops: pl.DataFrame | None, timeline: Any = None) -> list[Violation]:
    """Rule 1: per (rank, device), step windows never overlap, and their walls sum to at
    most the recorded span. With the report's timeline section (``timeline.windows``) the
    check is per device on its own windows; a report without it is checked per rank on the
    steps table (its span: the rank's steps and device ops, first start to last end)."""
    if timeline is not None and timeline.windows:
        return _check_device_windows(timeline.windows)
    out: list[Violation] = []
    if steps.height == 0 or "start_ns" not in steps.columns:
        return out
    spans = _op_spans(ops)
    for (rank,), w in steps.filter(pl.col("step").is_not_null()).sort("start_ns").group_by(["rank"], maintain_order=True):
        rows = w.select("step", "start_ns", "end_ns").rows()
        out += _overlaps(rank, None, [(st, a, e, e - a) for st, a, e in rows])
        lo = min([r[1] for r in rows] + ([spans[rank][0]] if rank in spans else []))
        hi = max([r[2] for r in rows] + ([spans[rank][1]] if rank in spans else []))
        out += _walls_within(rank, None, sum(e - s for _, s, e in rows), hi - lo)
    return out


def _check_device_windows(windows: list[dict[str, Any]]) -> list[Violation]:
    """Rule 1 on the timeline's per-(rank, device) step windows and recorded spans."""
    out: list[Violation] = []
    by: dict[tuple[Any, Any], list[dict[str, Any]]] = defaultdict(list)
    for w in windows:
        by[(w["rank"], w["device"])].append(w)
    for (rank, device), ws in sorted(by.items(), key=lambda kv: (kv[0][0], -1 if kv[0][1] is None else kv[0][1])):
        span = [w for w in ws if w["bucket"] == "span"]
        st = sorted((w for w in ws if w["bucket"] == "step"), key=lambda w: (w["start_ns"], w["end_ns"]))
        out += _overlaps(rank, device, [(w["step"], w["start_ns"], w["end_ns"], w["wall_ns"]) for w in st])
        if span:
            out += _walls_within(rank, device, sum(w["wall_ns"] for w in st), span[0]["wall_ns"])
    return out


def _overlaps(rank: Any, device: Any, rows: list[tuple[Any, int, int, int]]) -> list[Violation]:
    """Consecutive windows ``(step, start, end, wall)`` (sorted by start) that overlap."""
    out = []
    dev = f" device {device}" if device is not None else ""
    for (s0, a0, e0, _), (s1, a1, _, _) in zip(rows, rows[1:]):
        if a1 < e0:
            out.append(Violation(1, f"rank {rank}{dev}: step {s0} [{units.ms(a0)}, {units.ms(e0)}] overlaps step {s1} "
                                    f"by {units.ms(e0 - a1)}", rank=rank, device=device, step=s1,
                                 numbers={"overlap_ns": float(e0 - a1)}))
    return out


def _walls_within(rank: Any, device: Any, walls: int, span: int) -> list[Violation]:
    if not _over(walls, span):
        return []
    dev = f" device {device}" if device is not None else ""
    return [Violation(1, f"rank {rank}{dev}: step walls sum to {units.ms(walls)} > recorded span {units.ms(span)}",
                      rank=rank, device=device, numbers={"walls_ns": float(walls), "span_ns": float(span)})]


# --------------------------------------------------------------------------- rule 2


def check_buckets(report: Report, unions: _PlacedUnions | None = None) -> list[Violation]:
    """Rule 2: every device op is in exactly one bucket, and the buckets account for the time.

    Checked on the report's timeline section (none: nothing to check) and op table: every
    op's ``bucket`` is one of the buckets; per (rank, device, bucket) the op counts of the op
    table equal the section's (unless ``--step`` kept a part of the ops); per (rank, device)
    the bucket walls sum to the recorded span; and the steps' walls (× devices) sum to the
    ``step`` bucket walls, so no other bucket's time is inside a step (counted as idle).
    ``unions``: the op unions :func:`check` shares with :func:`check_findings` (None: made here).
    """
    tl = report.summary.timeline
    if tl is None or not tl.buckets:
        return []
    from .timeline import BUCKETS

    out: list[Violation] = []
    ops = report.ops
    filtered = report.filters is not None and report.filters.step is not None
    if ops is not None and ops.height and "bucket" in ops.columns:
        # counted in one lazy query (an eager filter copied every column of the rows)
        bad = int(ops.lazy().filter(pl.col("bucket").is_null() | ~pl.col("bucket").is_in(list(BUCKETS)))
                  .select(pl.len()).collect().item())
        if bad:
            out.append(Violation(2, f"{bad} device ops are in no bucket", numbers={"ops": float(bad)}))
        if not filtered:
            have = {(r, d, b): n for r, d, b, n in ops.group_by("rank", "device", "bucket").len().iter_rows()}
            for b in tl.buckets:
                n = have.get((b["rank"], b["device"], b["bucket"]), 0)
                if n != b["ops"]:
                    out.append(Violation(2, f"rank {b['rank']} device {b['device']}: bucket {b['bucket']} holds "
                                            f"{b['ops']} ops, the op table {n}", rank=b["rank"], device=b["device"],
                                         numbers={"bucket_ops": float(b["ops"]), "table_ops": float(n)}))
    spans = {(w["rank"], w["device"]): w["wall_ns"] for w in tl.windows if w["bucket"] == "span"}
    walls: dict[tuple[Any, Any], int] = defaultdict(int)
    step_walls: dict[Any, int] = defaultdict(int)
    for b in tl.buckets:
        if b["wall_ns"] is not None:
            walls[(b["rank"], b["device"])] += b["wall_ns"]
            if b["bucket"] == "step":
                step_walls[b["rank"]] += b["wall_ns"]
    for key, span in spans.items():
        if abs(walls.get(key, 0) - span) > ABS_TOL_NS:
            out.append(Violation(2, f"rank {key[0]} device {key[1]}: bucket walls sum to {units.ms(walls.get(key, 0))}, "
                                    f"the recorded span is {units.ms(span)}", rank=key[0], device=key[1],
                                 numbers={"walls_ns": float(walls.get(key, 0)), "span_ns": float(span)}))
    st = report.steps
    if not filtered and st.height and {"wall_ns", "devices"} <= set(st.columns):
        # (each step's wall is a per-device mean rounded to whole ns: ± devices/2 ns per step)
        for rank, w, n in st.group_by("rank").agg((pl.col("wall_ns") * pl.col("devices")).sum(),
                                                  pl.col("devices").sum().alias("n")).iter_rows():
            want = step_walls.get(rank, 0)
            if abs(int(w) - want) > ABS_TOL_NS + int(n) + REL_TOL * want:
                out.append(Violation(2, f"rank {rank}: steps' walls {units.ms(w)} != the step buckets' {units.ms(want)} "
                                        "(time of another bucket counted in a step)", rank=rank,
                                     numbers={"steps_wall_ns": float(w), "bucket_wall_ns": float(want)}))
    if not filtered and ops is not None and ops.height and "bucket" in ops.columns:
        out += _check_busy_against_union(unions or _PlacedUnions(ops), tl.buckets)
    return out


class _PlacedUnions:
    """Per (rank, device), the union lengths (ns) of the device ops on the timeline (all but
    ``outside_recording`` when the table has buckets): ``busy`` of all of them and ``comm`` of
    the collectives (:func:`traceroof.intervals.union_lengths`, one pass for both), computed on
    first use and shared by rule 2's check (:func:`_check_busy_against_union`) and rule 6's
    (:func:`_rank_times`). :attr:`table`: the placed ops (``rank``, ``device``, ``start_ns``,
    ``dur_ns``, ``kind``); :meth:`lengths`: ``{(rank, device): (busy_ns, comm_ns)}`` (a null
    device keyed None)."""

    def __init__(self, ops: pl.DataFrame) -> None:
        self._ops = ops
        self._table: pl.DataFrame | None = None
        self._lengths: dict[tuple[Any, Any], tuple[int, int]] | None = None

    @property
    def table(self) -> pl.DataFrame:
        if self._table is None:
            ops = self._ops
            if "bucket" in ops.columns:  # ops off the recorded timeline are in no window (rule 2)
                # the five columns read, in one lazy query (an eager filter copied every column)
                self._table = (ops.lazy().filter(pl.col("bucket") != "outside_recording")
                               .select("rank", "device", "start_ns", "dur_ns", "kind").collect())
            else:
                self._table = ops.select("rank", "device", "start_ns", "dur_ns", "kind")
        return self._table

    def lengths(self) -> dict[tuple[Any, Any], tuple[int, int]]:
        if self._lengths is None:
            t = self.table.select("rank", "device", "start_ns", (pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns"),
                                  "kind")
            u = iv.union_lengths(t, {"busy": pl.lit(True), "comm": pl.col("kind") == "collective"}, ["rank", "device"])
            self._lengths = {(r, d): (int(b), int(c)) for r, d, b, c in u.iter_rows()}
        return self._lengths


def _check_busy_against_union(unions: _PlacedUnions, buckets: list[dict[str, Any]]) -> list[Violation]:
    """Rule 2 against an independent figure: per (rank, device), the busy time of the
    buckets on the timeline (all but ``outside_recording``) sums to the plain union of the
    device intervals of its ops on the timeline, computed here from the op table (not from
    the partition's pieces). Time lost or counted twice between buckets breaks it."""
    if unions.table.height == 0:
        return []
    union = {key: b for key, (b, _) in unions.lengths().items()}
    busy: dict[tuple[Any, Any], int] = defaultdict(int)
    for b in buckets:
        if b["bucket"] != "outside_recording":
            busy[(b["rank"], b["device"])] += int(b["busy_ns"])
    out = []
    for key, u in union.items():
        if abs(busy.get(key, 0) - u) > ABS_TOL_NS:
            out.append(Violation(2, f"rank {key[0]} device {key[1]}: the buckets' busy time {units.ms(busy.get(key, 0))} "
                                    f"!= the union of its ops {units.ms(u)} (time lost or counted twice between "
                                    "buckets)", rank=key[0], device=key[1],
                                 numbers={"buckets_busy_ns": float(busy.get(key, 0)), "union_ns": float(u)}))
    return out


def _op_spans(ops: pl.DataFrame | None) -> dict[Any, tuple[int, int]]:
    """Per rank: (first device-op start, last end) ns."""
    if ops is None or ops.height == 0:
        return {}
    g = ops.group_by("rank").agg(pl.col("start_ns").min().alias("s"),
                                 (pl.col("start_ns") + pl.col("dur_ns")).max().alias("e"))
    return {r: (int(s), int(e)) for r, s, e in g.iter_rows()}


# --------------------------------------------------------------------------- rule 3


def check_steps(steps: pl.DataFrame) -> list[Violation]:
    """Rule 3, per step row (per device of the rank: the breakdown is a per-device mean):
    busy + idle = wall, 0 ≤ busy ≤ wall, 0 ≤ exposed comm ≤ comm."""
    out: list[Violation] = []
    need = {"rank", "step", "wall_ns", "busy_ns", "idle_ns", "comm_ns", "comm_exposed_ns"}
    if steps.height == 0 or not need <= set(steps.columns):
        return out
    for r in steps.select(*sorted(need)).iter_rows(named=True):
        rank, step = r["rank"], r["step"]
        wall, busy, idle = (int(r[k] or 0) for k in ("wall_ns", "busy_ns", "idle_ns"))
        comm, exp = int(r["comm_ns"] or 0), int(r["comm_exposed_ns"] or 0)
        nums = {"wall_ns": float(wall), "busy_ns": float(busy), "idle_ns": float(idle)}
        where = _where(rank, step)
        if abs(busy + idle - wall) > ABS_TOL_NS:
            out.append(Violation(3, f"{where}: busy {units.ms(busy)} + idle {units.ms(idle)} != wall {units.ms(wall)}",
                                 rank=rank, step=step, numbers=nums))
        if busy < 0 or _over(busy, wall):
            out.append(Violation(3, f"{where}: busy {units.ms(busy)} not in [0, wall {units.ms(wall)}]",
                                 rank=rank, step=step, numbers=nums))
        if exp < 0 or _over(exp, comm):
            out.append(Violation(3, f"{where}: exposed communication {units.ms(exp)} not in [0, communication {units.ms(comm)}]",
                                 rank=rank, step=step, numbers={"comm_ns": float(comm), "comm_exposed_ns": float(exp)}))
    return out


# --------------------------------------------------------------------------- rule 4


def _bad_share(v: Any) -> bool:
    return v is not None and not (-REL_TOL <= float(v) <= 1.0 + REL_TOL)


def check_shares(report: Report) -> list[Violation]:
    """Rule 4: busy share, HFU, MFU, roofline efficiency (summary and per step) in [0, 1];
    a ranking row or op with efficiency > 1 is a violation unless the report lists its label
    as an inconsistency (an op above its roof). Ops are labelled as their ranking rows are
    (:func:`~traceroof.roofline.group_label_expr` of the report's ``group_by``)."""
    out: list[Violation] = []
    s = report.summary
    heads = {
        "busy share": s.step.busy_fraction if s.step else None,
        "HFU": s.hfu.value if s.hfu else None,
        "MFU": s.mfu.value if s.mfu else None,
        "roofline efficiency": s.roofline.efficiency if s.roofline else None,
    }
    for name, v in heads.items():
        if _bad_share(v):
            out.append(Violation(4, f"summary: {name} {float(v):.4g} not in [0, 1]", numbers={"value": float(v)}))
    st = report.steps
    for col in ("hfu", "mfu"):
        if st.height and col in st.columns:
            for rank, step, v in st.select("rank", "step", col).iter_rows():
                if _bad_share(v):
                    out.append(Violation(4, f"{_where(rank, step)}: {col.upper()} {v:.4g} not in [0, 1]",
                                         rank=rank, step=step, numbers={"value": float(v)}))
    flagged = {i.op for i in report.inconsistencies if i.op is not None}
    out += _above_one(report.ranking, "label", "ranking row", flagged)
    if report.ops is not None and report.ops.height and "efficiency" in report.ops.columns:
        # the label only on the few rows above 1, not on the whole op table
        ops = report.ops.filter(pl.col("efficiency") > 1.0 + REL_TOL)
        by = report.filters.group_by or "op"
        out += _above_one(ops.with_columns(group_label_expr(by).alias("label")), "label", "op", flagged)
    return out


def _above_one(df: pl.DataFrame, label: str, what: str, flagged: set[str]) -> list[Violation]:
    """Rows of ``df`` with ``efficiency`` > 1 whose ``label`` is not ``flagged``: one
    violation per label (the count and the largest efficiency)."""
    if df.height == 0 or "efficiency" not in df.columns:
        return []
    bad = df.filter(pl.col("efficiency") > 1.0 + REL_TOL, ~pl.col(label).is_in(sorted(flagged)))
    if bad.height == 0:
        return []
    g = (bad.group_by(label).agg(pl.len().alias("n"), pl.col("efficiency").max().alias("eff"))
         .sort(["eff", label], descending=[True, False]))
    return [Violation(4, f"{what} {units.short(lab, 60)}: efficiency {eff:.4g} > 1 ({n} row(s)), "
                         "not reported as an inconsistency", numbers={"efficiency": float(eff), "rows": float(n)})
            for lab, n, eff in g.iter_rows()]


# --------------------------------------------------------------------------- rule 5


def check_step_time(report: Report) -> list[Violation]:
    """Rule 5: a step time only from complete steps: with no complete step there is no step
    time, and the step time is the mean wall of the complete (non-partial) steps."""
    st = report.summary.step
    if st is None or st.step_time_ns is None:
        return []
    steps = report.steps
    full = steps.filter(~pl.col("partial")) if steps.height and "partial" in steps.columns else steps
    if st.complete_steps == 0 or full.height == 0:
        return [Violation(5, f"step time {units.ms(st.step_time_ns)} from 0 complete steps "
                             f"({steps.height} step(s), all partial)", numbers={"step_time_ns": float(st.step_time_ns)})]
    mean = float(full["wall_ns"].mean())
    if abs(mean - st.step_time_ns) > ABS_TOL_NS + REL_TOL * mean:
        return [Violation(5, f"step time {units.ms(st.step_time_ns)} != mean of the {full.height} complete steps {units.ms(mean)}",
                          numbers={"step_time_ns": float(st.step_time_ns), "complete_mean_ns": mean})]
    return []


# --------------------------------------------------------------------------- rule 6


@dataclass(frozen=True)
class _RankTime:
    """What a rank's device time can give back, ns, summed over its devices: ``room`` (window
    length × devices), ``idle`` (window − busy union, per device) and ``comm`` (union of
    its collectives, per device); ``per_device``: the same three of each device (``room`` the
    window length), keyed by device (-1 for a null device)."""

    room: int
    idle: int
    comm: int
    devices: int
    per_device: dict[Any, tuple[int, int, int]] = field(default_factory=dict)


def _rank_times(ops: pl.DataFrame | None, unions: _PlacedUnions | None = None) -> dict[Any, _RankTime]:
    """:class:`_RankTime` per rank of the op table (the window is the rank's first device-op
    start to last end, as the detectors' ``windows``); ``unions``: :class:`_PlacedUnions` of
    ``ops`` when the caller has it."""
    if ops is None or ops.height == 0:
        return {}
    unions = unions or _PlacedUnions(ops)
    placed = unions.table
    if placed.height == 0:
        return {}
    spans = _op_spans(placed)
    lengths = unions.lengths()
    if any(dv is None and (rank, -1) in lengths for rank, dv in lengths):
        # rule 6 reads a null device as device -1 (one device with the ops of both): a rank
        # with both gets the union of their ops together, not one of the two (rare: a table
        # built by hand; the readers give every device op a device)
        lengths = _PlacedUnions(placed.with_columns(pl.col("device").fill_null(-1))).lengths()
    per_rank: dict[Any, dict[Any, tuple[int, int, int]]] = defaultdict(dict)
    for (rank, dv), (b, c) in lengths.items():
        s, e = spans[rank]
        per_rank[rank][-1 if dv is None else dv] = (e - s, (e - s) - b, c)
    out = {}
    for rank, per in per_rank.items():
        s, e = spans[rank]
        out[rank] = _RankTime(room=(e - s) * len(per), idle=sum(p[1] for p in per.values()),
                              comm=sum(p[2] for p in per.values()), devices=len(per), per_device=per)
    return out


def check_findings(report: Report, unions: _PlacedUnions | None = None) -> list[Violation]:
    """Rule 6: findings never claim more than they explain, on the devices they name. Per
    rank: all claims ≤ the rank's window × its devices; ``device_idle`` claims ≤ the rank's
    idle (window − busy union, summed over its devices); ``exposed_collectives`` claims ≤ its
    communication union (per device, summed). Per device, for the findings that name one
    (:attr:`~traceroof.findings.Finding.device`: a rank driving several devices): the same
    three bounds with that device's window, idle and communication. Each finding ≤ the
    evidence that bounds it (:data:`EVIDENCE_BOUND`)."""
    out: list[Violation] = []
    if not report.findings:  # no claim: nothing to bound (and no query for the bounds)
        return out
    times = _rank_times(report.ops, unions)
    claims: dict[Any, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    on_device: dict[tuple[Any, Any], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for f in report.findings:
        rec = float(f.recoverable_ns or 0.0)
        claims[f.rank]["all"] += rec
        claims[f.rank][f.kind] += rec
        if f.device is not None:
            on_device[(f.rank, f.device)]["all"] += rec
            on_device[(f.rank, f.device)][f.kind] += rec
        key = EVIDENCE_BOUND.get(f.kind)
        bound = f.evidence.get(key) if key else None
        if rec < 0 or (isinstance(bound, (int, float)) and _over(rec, float(bound))):
            out.append(Violation(6, f"{f.kind} (rank {f.rank}): recoverable {units.ms(rec)} > its {key} "
                                    f"{units.ms(float(bound or 0))}", rank=f.rank, device=f.device, step=f.step,
                                 numbers={"recoverable_ns": rec, "bound_ns": float(bound or 0)}))
    everything = sum(t.room for t in times.values())
    for rank, c in claims.items():
        t = times.get(rank)
        limits = {"all": ("its window × devices", t.room if t else everything)}
        if t is not None:
            limits["device_idle"] = ("its idle", t.idle)
            limits["exposed_collectives"] = ("its communication", t.comm)
        out += _over_limits(f"rank {rank}", c, limits, rank=rank)
    for (rank, dev), c in on_device.items():
        t = times.get(rank)
        room, idle, comm = t.per_device.get(dev, (0, 0, 0)) if t else (0, 0, 0)
        limits = {"all": ("its window", room), "device_idle": ("its idle", idle),
                  "exposed_collectives": ("its communication", comm)}
        out += _over_limits(f"rank {rank} device {dev}", c, limits, rank=rank, device=dev)
    return out


def _over_limits(where: str, claimed: dict[str, float], limits: dict[str, tuple[str, float]],
                 **at: Any) -> list[Violation]:
    """Rule 6 violations of one scope (``where``: its words): each ``claimed[kind]`` (ns; kind
    ``all``: every finding) above ``limits[kind] = (what, ns)``."""
    out = []
    for kind, (what, lim) in limits.items():
        if kind in claimed and _over(claimed[kind], lim):
            name = "findings" if kind == "all" else f"{kind} findings"
            out.append(Violation(6, f"{where}: {name} claim {units.ms(claimed[kind])} > {what} {units.ms(lim)}",
                                 numbers={"claimed_ns": claimed[kind], "limit_ns": float(lim)}, **at))
    return out


# --------------------------------------------------------------------------- rule 7


def check_ranking(ranking: pl.DataFrame) -> list[Violation]:
    """Rule 7: a ranking row's measured, expected, gap and efficiency cover the same (costed)
    ops: gap = measured − expected and efficiency = expected / measured on every row with a
    gap; measured ≤ the row's total time; its costed share = measured / total. A row of an
    older report without ``total_ns`` is checked for the first two only."""
    out: list[Violation] = []
    need = {"label", "measured_ns", "expected_ns", "gap_ns", "efficiency"}
    if ranking.height == 0 or not need <= set(ranking.columns):
        return out
    has_total = {"total_ns", "costed"} <= set(ranking.columns)
    cols = ["label", "measured_ns", "expected_ns", "gap_ns", "efficiency"] + (["total_ns", "costed"] if has_total else [])
    for row in ranking.select(cols).iter_rows(named=True):
        out += _ranking_row(row)
    return out


def _ranking_row(r: dict[str, Any]) -> list[Violation]:
    """The rule-7 violations of one ranking row (see :func:`check_ranking`)."""
    name, meas, exp, gap, eff = units.short(r["label"], 60), r["measured_ns"], r["expected_ns"], r["gap_ns"], r["efficiency"]
    total = r.get("total_ns")
    if gap is None or exp is None:
        return []
    if meas is None:
        return [Violation(7, f"ranking row {name}: gap {units.ms(gap)} with no measured time of its costed ops",
                          numbers={"gap_ns": float(gap)})]
    tol = ABS_TOL_NS + REL_TOL * abs(float(meas))
    if abs(float(gap) - (float(meas) - float(exp))) > tol:
        return [Violation(7, f"ranking row {name}: gap {units.ms(gap)} != measured {units.ms(meas)} − expected "
                             f"{units.ms(exp)}", numbers={"gap_ns": float(gap), "measured_ns": float(meas),
                                                          "expected_ns": float(exp)})]
    if meas and eff is not None and abs(float(eff) - float(exp) / float(meas)) > 1e-6:
        return [Violation(7, f"ranking row {name}: efficiency {eff:.4g} != expected / measured "
                             f"{float(exp) / float(meas):.4g}", numbers={"efficiency": float(eff)})]
    if total is not None and float(meas) > float(total) + tol:
        return [Violation(7, f"ranking row {name}: measured {units.ms(meas)} (costed ops) > total {units.ms(total)}",
                          numbers={"measured_ns": float(meas), "total_ns": float(total)})]
    costed = r.get("costed")
    if total and costed is not None and abs(float(costed) - float(meas) / float(total)) > 1e-6:
        return [Violation(7, f"ranking row {name}: costed share {costed:.4g} != measured / total "
                             f"{float(meas) / float(total):.4g}", numbers={"costed": float(costed)})]
    return []


# --------------------------------------------------------------------------- all


# --------------------------------------------------------------------------- rule 9


def check_light(report: Report) -> list[Violation]:
    """Rule 9: the waterfall's terms add up exactly (int ns) to measured − speed of light; the
    speed of light is never above the measured step (per step and on the mean), and the model
    floor is never above the speed of light unless the report says why."""
    s = getattr(report, "speed_of_light", None)
    if s is None:
        return []
    out = []
    terms = sum(int(t.total_ns) for t in s.waterfall)
    gap = int(s.measured_total_ns) - int(s.speed_of_light_total_ns)
    if terms != gap:
        out.append(Violation(9, f"waterfall terms sum to {terms:,} ns, measured − speed of light is {gap:,} ns",
                             numbers={"terms_ns": terms, "gap_ns": gap}))
    for p in [*s.per_step, s]:
        light, measured = p.speed_of_light_ns, p.measured_ns
        if light is not None and measured is not None and _over(light, measured):
            where = _where(p.rank, p.step) if hasattr(p, "rank") else "mean step"
            out.append(Violation(9, f"{where}: speed of light {units.ns(light)} > measured {units.ns(measured)}",
                                 rank=getattr(p, "rank", None), step=getattr(p, "step", None),
                                 numbers={"speed_of_light_ns": light, "measured_ns": measured}))
    if (s.model_floor_ns is not None and s.speed_of_light_ns is not None and not s.model_floor_note
            and _over(s.model_floor_ns, s.speed_of_light_ns)):
        out.append(Violation(9, f"model floor {units.ns(s.model_floor_ns)} > speed of light "
                                f"{units.ns(s.speed_of_light_ns)} with no reason given",
                             numbers={"model_floor_ns": s.model_floor_ns, "speed_of_light_ns": s.speed_of_light_ns}))
    return out


def check(report: Report) -> list[Violation]:
    """Every accounting rule the report lets one check (rules 1 to 7, and 9), in rule order.

    Args:
        report: an analysed report (its ``ops`` may be None: the op-table checks are skipped).

    Returns:
        The violations, empty when the report's accounting holds. Never raises on a
        well-formed report; a table missing a column skips that rule's check.
    """
    unions = _PlacedUnions(report.ops) if report.ops is not None else None  # (made on first use)
    return [
        *check_windows(report.steps, report.ops, report.summary.timeline), *check_buckets(report, unions),
        *check_steps(report.steps), *check_shares(report),
        *check_step_time(report), *check_findings(report, unions), *check_ranking(report.ranking),
        *check_light(report),
    ]


def warnings_for(violations: list[Violation], per_rule: int = LINES_PER_RULE) -> list[str]:
    """One warning line per violation (``accounting rule 3: step 7 rank 0: ...``), at most
    ``per_rule`` lines per rule, then one line counting the rest of that rule."""
    by_rule: dict[int, list[Violation]] = defaultdict(list)
    for v in violations:
        by_rule[v.rule].append(v)
    out = []
    for rule in sorted(by_rule):
        vs = by_rule[rule]
        out += [v.line() for v in vs[:per_rule]]
        if len(vs) > per_rule:
            out.append(f"accounting rule {rule}: {len(vs) - per_rule} more violation(s) of this rule "
                       "(docs/accounting.md)")
    return out


__all__ = ["Violation", "check", "warnings_for"]
