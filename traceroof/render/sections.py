"""The sections every human-readable renderer shows, as plain data (title, key/value rows,
tables). Table and markdown renderers format these; neither computes anything."""

from __future__ import annotations

from typing import Any

from .. import units
from ..report import Report
from ..sections import ChipInfo, RanksInfo, StepStats, TraceInfo

#: the ranking's columns (header, ranking column). ``measured``, ``expected``, ``gap`` and
#: ``efficiency`` cover the row's costed ops (accounting rule 7); ``total`` is every op's time
#: and ``costed`` the share of it that is costed
RANK_COLUMNS = (
    ("op", "label"),
    ("kind", "kind"),
    ("count", "count"),
    ("total", "total_ns"),
    ("costed", "costed"),
    ("measured", "measured_ns"),
    ("expected", "expected_ns"),
    ("gap", "gap_ns"),
    ("efficiency", "efficiency"),
    ("bound", "bound"),
    ("intensity (FLOP/B)", "intensity"),
)


def header(report: Report) -> list[tuple[str, str]]:
    t, c, cov = report.trace, report.chip, report.coverage
    src = t.sources
    files = src[0] if len(src) == 1 else f"{len(src)} files ({src[0]}, …)"
    rows = [
        ("trace", f"{t.format}: {files}" + ("  [SYNTHETIC]" if t.synthetic else "")),
    ]
    if not c:
        return rows + [
            ("ranks", ", ".join(str(r) for r in t.ranks)),
            ("device ops", _no_device_ops_line(t)),
        ]
    rows += [
        ("ranks", _rank_names(t) + (f" of world size {t.world_size}" if t.world_size else "")),
        ("steps", _steps_line(report)),
        ("device ops", f"{units.plural(t.device_ops, 'op')}, {units.ns(t.device_time_ns)} of device time"),
        ("chip", f"{c.name} ({c.reason})"),
        ("peaks (dense)", ", ".join(f"{k} {units.flops_per_s(v)}" for k, v in _peaks(c))),
        ("HBM bandwidth", f"{units.bytes_per_s(c.hbm_bytes_per_s)}"
         + (f"; ridge point {c.ridge_point_bf16:.0f} FLOP/byte (bf16)" if c.ridge_point_bf16 else "")),
        ("chip sources", _sources(c)),
    ]
    if c.trace_says:
        ts = c.trace_says
        rows.append(("trace says", f"{ts.device}: {units.flops_per_s(ts.peak_flops_per_s)}, {units.bytes_per_s(ts.peak_hbm_bytes_per_s)}"))
    cov_line = (
        f"{units.pct(cov.costed_share)} of device time costed: FLOPs and bytes, or a collective's message size "
        f"({units.pct(cov.shapes_share)} from shapes, {units.pct(cov.trace_share)} from the trace)"
    )
    if cov.bytes_only_share:
        cov_line += (f"; {units.pct(cov.bytes_only_share)} of it by bytes alone (FLOPs unknown: "
                     "memory-bound roofline time, not in HFU)")
    if cov.linked_device_time_ns and cov.linked_device_time_ns != t.device_time_ns:
        # the linked time is kernel time: its share is of the kernels (copies and fills are
        # never linked), said with the kernel time it is a share of
        kern_ns = cov.kernel_time_ns or cov.device_time_ns
        linked_share = cov.linked_device_time_ns / kern_ns if kern_ns else 0.0
        whose = f"kernel time ({units.ns(kern_ns)})" if cov.kernel_time_ns else "device time"
        cov_line += (f"; {units.pct(linked_share)} of {whose} linked to a framework op, "
                     f"{units.pct(cov.linked_costed_share)} of that linked time costed")
    f = report.filters
    if f is not None and (f.step is not None or f.rank is not None):
        cov_line += " (of the whole trace: --step/--rank narrow the ops shown, not the costing)"
    rows.append(("cost coverage", cov_line))
    if cov.graphs:
        rows.append(("graph replays", _graphs_line(cov.graphs)))
    return rows


def _graphs_line(graphs: list) -> str:
    """The replayed CUDA/HIP graphs in one line: how many, how each was attributed
    (``GraphInfo.method``), the share of their kernels' device time given framework ops."""
    by: dict[str, int] = {}
    for g in graphs:
        by[g.method] = by.get(g.method, 0) + 1
    total = sum(g.device_time_ns for g in graphs)
    done = sum(g.attributed_ns for g in graphs)
    how = ", ".join(f"{n} by {m.replace('_', ' ')}" if m != "unattributed" else f"{n} unattributed"
                    for m, n in sorted(by.items()))
    return (f"{units.plural(len(graphs), 'graph')} ({how}): {units.pct(done / total if total else 0.0)} of "
            "their kernels' device time attributed to framework ops (coverage.graphs)")


def _no_device_ops_line(t: TraceInfo) -> str:
    """The header's words for a trace without device ops: which kind it is."""
    launches = int(t.stats.get("device_launches", 0) or 0)
    if t.stats.get("truncated"):
        kind = "the file is truncated (see the first warning); the device ops may be in the lost part"
    elif launches and t.stats.get("profiler_ranges"):
        kind = f"{launches:,} kernel launches / copies recorded, kernels in CUPTI profiler-range mode (no times)"
    elif launches:
        kind = (f"{launches:,} kernel launches / copies recorded but no device activity "
                "(the GPU activity was not recorded)")
    elif t.host_events:
        kind = "a CPU-only trace (no kernel launch)"
    else:
        kind = "a metadata-only trace (no timed events)"
    return f"none: {kind}; nothing to put against a roofline, no step time, busy or idle"


def _peaks(c: ChipInfo) -> list[tuple[str, float]]:
    order = ["fp8", "int8", "bf16", "fp16", "tf32", "fp32", "fp64"]
    p = c.peak_flops_per_s
    return [(k, p[k]) for k in order if p.get(k)]


def _refs(text: str | None) -> str:
    import re

    ids = list(dict.fromkeys(re.findall(r"\[([\w.-]+)\]", text or "")))
    return ", ".join(ids) if ids else (text or "—")


def _sources(c: ChipInfo) -> str:
    return (
        f"peaks: {_refs(c.peak_source)}; HBM: {_refs(c.hbm_source)} "
        "(full citations: `traceroof chips --format json`, docs/chips.md)"
    )


def _steps_line(report: Report) -> str:
    s = report.steps
    if s.height == 0:
        return "none"
    if s["step"].null_count() == s.height:
        return "unsegmented (no step markers): one step"
    ids = sorted(x for x in s["step"].unique().to_list() if x is not None)
    partial = s.filter("partial")["step"].to_list()
    line = f"{len(ids)} ({ids[0]}…{ids[-1]})" if len(ids) > 1 else f"1 (#{ids[0]})"
    if partial:
        line += f"; partial, excluded from averages: {partial}"
    return line


def _step_mean_of(report: Report) -> str:
    """What the step time is the mean of: complete steps, counted per rank."""
    s = report.summary
    n = s.step.complete_steps if s.step else s.steps
    ranks = report.steps["rank"].n_unique() if report.steps is not None and report.steps.height else 1
    if ranks > 1:
        return f"mean of {n} complete (rank, step) rows over {ranks} ranks"
    return f"mean of {units.plural(n, 'complete step')}, per rank"


def _lag_line(st: StepStats) -> str:
    """The device's lag behind the host, per step (means over complete steps)."""
    parts = []
    if st.queue_lag_ns is not None:
        parts.append(f"launch → device start {units.ns(st.queue_lag_ns)} (median per step)")
    if st.device_lag_ns is not None:
        parts.append(f"device step start − host ProfilerStep start {units.ns(st.device_lag_ns)}")
    return "; ".join(parts)


#: what the text calls each bucket that is not a step
_BUCKET_WORDS = {"before_first_step": "before the first step", "after_last_step": "after the last step",
                 "graph_capture": "under graph capture", "outside_recording": "outside the recording"}


#: above this share of device time with unknown FLOPs, the HFU line says it is a lower bound
HFU_BOUND_SHARE = 0.05


def _hfu_bound(report: Report) -> str:
    """``"; a lower bound: …"`` when the FLOPs of more than :data:`HFU_BOUND_SHARE` of the
    device time are unknown (no cost model, or costed by bytes alone: the HFU leaves them
    out, never counts them as 0); else ``""``."""
    unknown = report.coverage.flops_unknown_share if report.coverage is not None else None
    if unknown is None or unknown <= HFU_BOUND_SHARE:
        return ""
    return f"; a lower bound: the FLOPs of {units.pct(unknown)} of device time are unknown (cost coverage)"


def _bucket_rows(tl: Any) -> list[tuple[str, str]]:
    """One line for the device time outside the steps (rule 2): per bucket, its time and
    ops, summed over the devices; none when all the recorded time is in steps."""
    if tl is None or not tl.buckets:
        return []
    tot: dict[str, list[int]] = {}
    devices = {(b["rank"], b["device"]) for b in tl.buckets}
    for b in tl.buckets:
        t = tot.setdefault(b["bucket"], [0, 0])
        t[0] += b["wall_ns"] if b["wall_ns"] is not None else b["busy_ns"]
        t[1] += b["ops"]
    order = list(_BUCKET_WORDS)
    parts = [f"{_BUCKET_WORDS[k]} {units.ns(v[0])} ({units.plural(v[1], 'op')})"
             for k, v in sorted(tot.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order))
             if k in _BUCKET_WORDS and (v[0] or v[1])]
    if not parts:
        return []
    over = f" of device-time, summed over {len(devices)} devices" if len(devices) > 1 else ""
    return [("not in steps", "; ".join(parts) + over + " (outside the step time, not counted as idle)")]


def summary(report: Report) -> list[tuple[str, str]]:
    s = report.summary
    if not s.steps:
        return [("summary", "no device ops to summarise")]
    st = s.step or StepStats()
    per_dev = _per_device(report)
    if st.step_time_ns is None and s.step is not None and st.complete_steps == 0:
        rows = [("step time", f"none: no complete step ({units.plural(s.steps, 'step')}, all partial; "
                              "accounting rule 5)")]
    else:
        rows = [
            ("step time", f"{units.ns(st.step_time_ns)} ({_step_mean_of(report)})"),
            ("device busy", f"{units.pct(st.busy_fraction)} ({units.ns(st.busy_ns)} per step, union over streams)"
             if per_dev is None else f"{units.pct(st.busy_fraction)} ({per_dev['busy']}; {units.ns(st.busy_ns)} per step "
                                     "and device, union over its streams)"),
            ("breakdown", f"compute-bound {units.ns(st.compute_bound_ns)}, memory/latency-bound "
                          f"{units.ns(st.memory_bound_ns)}, "
                          + (f"no cost model {units.ns(st.unknown_bound_ns)}, " if st.unknown_bound_ns else "")
                          + f"communication {units.ns(st.comm_ns)} "
                          f"({units.ns(st.comm_exposed_ns)} exposed), idle {units.ns(st.idle_ns)}"
                          + ("" if per_dev is None else f" (means of {per_dev['what']}; {per_dev['idle']})")),
        ]
    if st.queue_lag_ns is not None or st.device_lag_ns is not None:
        rows.append(("queue lag", _lag_line(st)))
    rows += _bucket_rows(s.timeline)
    h = s.hfu
    if h is not None and h.value is not None:
        rows.append((
            "HFU",
            f"{units.pct(h.value)}: {units.flops_per_s(h.achieved_flops_per_s)} achieved of "
            f"{units.flops_per_s(h.peak_flops_per_s)} {h.peak_dtype} dense peak "
            + ("(hardware FLOPs from the op table)" if per_dev is None else
               f"per device (op-table FLOPs / (step time × {per_dev['n']} devices × peak); {per_dev['hfu']})")
            + _hfu_bound(report),
        ))
    else:
        from ..gate import why_unknown

        rows.append(("HFU", why_unknown(report, "hfu").replace(" in this report", "")))
    if s.mfu is not None and s.mfu.value is not None:
        rows.append(("MFU", f"{units.pct(s.mfu.value)} (model FLOPs, {s.mfu.note or ''})"))
    return rows


def _per_device(report: Report) -> dict[str, str] | None:
    """The header's per-device words when a rank drives several devices (``summary.devices``):
    how many devices the means are over, busy share and idle per device with their range
    across devices, and the per-device HFU range; None when every rank drives one device."""
    every = report.summary.devices
    if not every:
        return None
    rows = [r for r in every if r.steps]
    n = len(rows)
    ranks = len({r.rank for r in rows})
    what = units.plural(n, "device") + ("" if ranks == 1 else f" of {ranks} ranks")
    left = [r for r in every if not r.steps]
    if left:
        ids = ", ".join(str(r.device) for r in left)
        what += (f" with ops in the complete steps (device {ids} has none)" if len(left) == 1 else
                 f" with ops in the complete steps (devices {ids} have none)")
    busy = [r.busy_fraction for r in rows if r.busy_fraction is not None]
    idle = [r.idle_ns for r in rows if r.idle_ns is not None]
    hfu = [r.hfu for r in rows if r.hfu is not None]
    return {
        "n": str(n), "what": what,
        "busy": (f"busy time over device-time of {what}, {units.pct(min(busy))}–{units.pct(max(busy))} per device"
                 if busy else f"busy time over device-time of {what}"),
        "idle": (f"idle {units.ns(min(idle))}–{units.ns(max(idle))} per device, {units.ns(sum(idle))} of "
                 f"{units.ns(sum(r.wall_ns or 0 for r in rows))} device-time") if idle else "idle unknown",
        "hfu": (f"devices {units.pct(min(hfu))}–{units.pct(max(hfu))}" if hfu else "per-device HFU unknown"),
    }


#: the per-device table's columns (a rank driving several devices)
DEVICE_COLUMNS = ("rank", "device", "busy", "busy share", "idle", "communication", "exposed comm", "HFU")


def device_rows(report: Report) -> list[list[str]]:
    """One row per (rank, device) of ``summary.devices`` (:data:`DEVICE_COLUMNS`; means per
    complete step); empty when every rank drives one device."""
    return [
        [str(r.rank), "—" if r.device is None else str(r.device), units.ns(r.busy_ns), units.pct(r.busy_fraction),
         units.ns(r.idle_ns), units.ns(r.comm_ns), units.ns(r.comm_exposed_ns), units.pct(r.hfu)]
        for r in report.summary.devices or []
    ]


def ranking_rows(report: Report, top: int) -> list[list[str]]:
    out = []
    for r in report.ranking.head(top).iter_rows(named=True):
        out.append([
            units.short(r["label"], 60),
            str(r["kind"]),
            f"{r['count']:,}",
            units.ns(r.get("total_ns")),
            units.pct(r.get("costed")),
            units.ns(r["measured_ns"]),
            units.ns(r["expected_ns"]),
            units.ns(r["gap_ns"]),
            _efficiency(r["efficiency"]),
            str(r["bound"]),
            units.ratio(r["intensity"]),
        ])
    return out


def _efficiency(v: Any) -> str:
    """Efficiency as a percentage; above 100 % it is not a result (an inconsistency: see that
    section, accounting rule 4), so it is never printed as one."""
    from ..roofline import ABOVE_ROOF_TOLERANCE

    if v is not None and v > ABOVE_ROOF_TOLERANCE:
        return "above roof (!)"
    return units.pct(v)


def findings_rows(report: Report, top: int) -> list[list[str]]:
    out = []
    # several ranks: say whose finding it is (one rank's findings are all its own)
    multi = len({f.rank for f in report.findings if f.rank is not None}) > 1 or len(
        report.trace.ranks or []) > 1
    for f in report.findings[:top]:
        title = str(f.title)
        if multi and f.rank is not None and f.kind != "straggler":
            title = f"rank {f.rank}: {title}"
        out.append([
            str(f.kind),
            str(f.severity),
            units.ns(f.recoverable_ns),
            units.short_name(title, 90),  # cut at a word boundary, not inside a number or word
        ])
    return out


#: ops-above-roof labels printed before the rest are counted in one line
INCONSISTENT_OPS_SHOWN = 10


def inconsistency_lines(report: Report) -> list[str]:
    """One line per inconsistency; of the ops above their roof, the first
    :data:`INCONSISTENT_OPS_SHOWN` labels, then one line counting the rest (the JSON has all)."""
    lines = []
    ops = [i for i in report.inconsistencies if i.op is not None]
    for i in report.inconsistencies:
        what = i.what
        if i.op is not None:
            if ops.index(i) >= INCONSISTENT_OPS_SHOWN:
                continue
            what += f": {units.short(i.op, 60)} ×{i.count} (up to {units.pct(i.max_efficiency)} of roofline)"
        lines.append(what + " — suspects: " + "; ".join(i.suspects))
    rest = ops[INCONSISTENT_OPS_SHOWN:]
    if rest:
        lines.append(f"{units.plural(len(rest), 'more op label')} above their roof "
                     f"({units.plural(sum(i.count or 0 for i in rest), 'op')}); --format json lists them all")
    return lines


# --------------------------------------------------------------------------- ranks

RANKS_COLUMNS = ("rank", "step time", "busy", "exposed comm", "waited", "wait caused", "last at", "clock offset")


def ranks_lines(report: Report) -> list[tuple[str, str]]:
    """The cross-rank block's key/value lines (empty when the report has no ``ranks``)."""
    r = report.ranks
    if not r:
        return []
    al, coll = r.alignment, r.collectives
    if al.get("applied"):
        offs = ", ".join(
            f"r{p['rank']} {_signed_ns(p.get('offset_ns'))}" for p in r.per_rank if p["rank"] != al.get("reference_rank")
        )
        align = (f"clocks aligned on {al['matched_collectives']} matched collectives (median end difference to rank "
                 f"{al['reference_rank']}), uncertainty ±{units.ns(al.get('uncertainty_ns'))} (MAD); offsets: {offs}")
    else:
        align = f"not aligned ({al.get('clock')} clock): {al.get('reason')}"
    rows = [("ranks", f"{len(r.ranks)} ranks compared: " + _rank_list(r.ranks)), ("alignment", align)]
    line = f"{coll['matched']} matched, {coll['compared']} compared"
    if coll.get("total_wait_ns") is not None:
        line += f"; ranks waited {units.ns(coll['total_wait_ns'])} in total at them"
    rows.append(("collectives", line + f" ({coll.get('note')})"))
    st = r.straggler
    if st:
        rows.append(("straggler", f"rank {st['rank']}: last at {st['last_arrivals']} of {st['instances']} compared collectives; "
                                  f"others waited {units.ns(st['wait_caused_ns'])} ({units.ns(st['wait_caused_per_step_ns'])} per step, "
                                  f"{units.ns(st['mean_wait_per_rank_ns'])} per waiting rank)"
                                  + ("" if st.get("sufficient", True) else
                                     f" — only {st['instances']} compared instance(s): too few to call it a straggler")))
    rows.append(("per step", _per_step_line(r)))
    return rows


def _rank_names(t: TraceInfo) -> str:
    """``rank 0`` for one rank, ``0, 1 (2 ranks)`` for several; when the trace labels its
    ranks, ``0 (TP00-PP00), 1 (TP01-PP00) (2 ranks)``."""
    labels = t.rank_labels or {}
    names = [f"{r} ({labels[str(r)]})" if str(r) in labels else str(r) for r in t.ranks]
    if len(names) == 1:
        return f"rank {names[0]}"
    return ", ".join(names) + f" ({len(names)} ranks)"


def ranks_rows(report: Report, top: int) -> tuple[list[list[str]], str | None]:
    """Per-rank rows (:data:`RANKS_COLUMNS`) and a note when rows were left out (more than ``top`` ranks:
    the ranks causing the most wait, then the longest steps, are shown)."""
    r = report.ranks
    if not r:
        return [], None
    per = list(r.per_rank)
    note = None
    if len(per) > top:
        per = sorted(per, key=lambda p: (-(p.get("wait_caused_ns") or 0), -(p.get("step_time_ns") or 0), p["rank"]))[:top]
        per = sorted(per, key=lambda p: p["rank"])
        note = f"{len(r.per_rank) - top} more ranks in the JSON report"
    out = []
    for p in per:
        out.append([
            str(p["rank"]) + (f" {p['label']}" if p.get("label") else ""),
            units.ns(p.get("step_time_ns")),
            units.pct(p.get("busy_fraction")),
            units.ns(p.get("comm_exposed_ns")),
            units.ns(p.get("wait_ns")),
            units.ns(p.get("wait_caused_ns")),
            "—" if p.get("last_arrivals") is None else str(p["last_arrivals"]),
            _signed_ns(p.get("offset_ns")) + ("" if r.alignment.get("applied") else " (not applied)")
            if p.get("offset_ns") is not None else "—",
        ])
    return out, note


def _signed_ns(v: Any) -> str:
    if v is None:
        return "—"
    return ("+" if v > 0 else "−" if v < 0 else "") + units.ns(abs(v))


def _rank_list(ranks: list[int]) -> str:
    return ", ".join(str(x) for x in ranks) if len(ranks) <= 8 else f"{ranks[0]}…{ranks[-1]}"


def _per_step_line(r: RanksInfo) -> str:
    steps = [s for s in r.per_step if (s.get("ranks") or 0) >= 2]
    if not steps:
        return "no step is complete on 2 or more ranks"
    ratios = [s["max_over_median"] for s in steps if s.get("max_over_median") is not None]
    longest: dict[int, int] = {}
    last: dict[int, int] = {}
    for s in steps:
        longest[s["slowest_rank"]] = longest.get(s["slowest_rank"], 0) + 1
        if s.get("last_rank") is not None:
            last[s["last_rank"]] = last.get(s["last_rank"], 0) + 1
    def top3(d: dict[int, int]) -> str:
        return ", ".join(f"rank {k} ×{v}" for k, v in sorted(d.items(), key=lambda kv: (-kv[1], kv[0]))[:3])
    line = units.plural(len(steps), "step")
    if ratios:
        line += f"; step time max/median {min(ratios):.4f}–{max(ratios):.4f}"
    line += f"; longest step: {top3(longest)}"
    line += f"; last to arrive at collectives: {top3(last)}" if last else "; no late arrival measured"
    return line
