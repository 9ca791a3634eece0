"""Pure data views for the dashboard: op table in, small tables / records / strings out.

Nothing here imports Dash or plotly; every function is a pure function of its inputs so it
can be unit-tested without a browser. Figures are built from these in :mod:`.figures`.

Selector values are strings because that is what Dash dropdowns carry: ``rank`` is
``"all"`` or a rank number; ``step`` is ``"all"``, ``"none"`` (device ops outside any
``ProfilerStep#N``) or a step number.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import polars as pl

from .. import units
from ..findings import Finding
from ..roofline import group_label_expr, rank_ops
from ..schema import KINDS
from . import numbers

ALL = "all"
NO_STEP = "none"

#: Columns of the Ops tab table, in order: (id, header, kind of number). ``time`` columns are
#: in the table's :class:`~traceroof.web.numbers.TimeUnit` (:func:`table_columns` spells
#: their id and header with it: ``total_ms``, "total (ms)").
TABLE_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("sel", "", "text"),
    ("label", "op", "text"),
    ("kind", "kind", "text"),
    ("count", "count", "int"),
    ("total", "total", "time"),
    ("costed_pct", "costed (%)", "pct"),
    ("measured", "measured", "time"),
    ("expected", "roofline", "time"),
    ("gap", "gap", "time"),
    ("share_pct", "share of time (%)", "pct"),
    ("efficiency_pct", "efficiency (%)", "pct"),
    ("bound", "bound", "text"),
    ("intensity", "intensity (FLOP/B)", "float"),
    ("achieved_tflops", "achieved (TFLOP/s)", "float"),
    ("peak_dtype", "peak dtype", "text"),
)
#: the time columns: (column id stem, the op-group column in ns)
_TIME_COLUMNS = (("total", "total_ns"), ("measured", "measured_ns"), ("expected", "expected_ns"), ("gap", "gap_ns"))


def table_unit(groups: pl.DataFrame) -> numbers.TimeUnit:
    """The Ops table's time unit: from its largest time (:func:`numbers.time_unit`), so a
    92 s trace reads in s, a 2 ms one in µs."""
    if groups.height == 0:
        return numbers.MICROSECONDS
    biggest = max((groups[c].abs().max() or 0) for _, c in _TIME_COLUMNS if c in groups.columns)
    return numbers.time_unit(biggest)


def ops_table_unit(ops: pl.DataFrame) -> numbers.TimeUnit:
    """The Ops table's unit for a whole op table: :func:`table_unit` of its op groups (by
    framework op). Chosen once per dashboard, so a narrower selection keeps its columns."""
    return table_unit(op_groups(ops)) if ops.height else numbers.MICROSECONDS


def table_columns(unit: numbers.TimeUnit) -> list[tuple[str, str, str]]:
    """:data:`TABLE_COLUMNS` with the time columns spelled in ``unit``: (id, header, kind)."""
    return [(f"{cid}_{unit.key}", f"{name} ({unit.name})", kind) if kind == "time" else (cid, name, kind)
            for cid, name, kind in TABLE_COLUMNS]


#: d3-format specifiers of the table's number kinds (the Dash DataTable formats with d3):
#: ``~r`` is plain decimal notation rounded to significant digits, never an exponent
TABLE_FORMATS = {"int": ",d", "time": ",.4~r", "pct": ",.3~r", "float": ",.3~r"}


# --------------------------------------------------------------------- selection
def label_expr(by: str = "op") -> pl.Expr:
    """The op-group label of a row: :func:`traceroof.roofline.group_label_expr`, the one
    rule :func:`traceroof.roofline.rank_ops` groups by.

    ``by="op"``: the framework op, falling back to the kernel name (copies and memsets keep
    their own name); ``by="kernel"``: the kernel name.

    Raises:
        ValueError: ``by`` is neither ``op`` nor ``kernel``.
    """
    return group_label_expr(by)


def filter_ops(ops: pl.DataFrame, rank: str | int | None = ALL, step: str | int | None = ALL) -> pl.DataFrame:
    """The rows of ``ops`` for one rank and/or one step (``"all"`` keeps everything)."""
    if rank not in (None, ALL, ""):
        ops = ops.filter(pl.col("rank") == int(rank))
    if step == NO_STEP:
        ops = ops.filter(pl.col("step").is_null())
    elif step not in (None, ALL, ""):
        ops = ops.filter(pl.col("step") == int(step))
    return ops


def rank_options(ops: pl.DataFrame) -> list[dict[str, str]]:
    """Dropdown options for the rank selector (``all`` first)."""
    ranks = sorted(r for r in ops["rank"].unique().to_list() if r is not None)
    return [{"label": "all ranks", "value": ALL}] + [{"label": f"rank {r}", "value": str(r)} for r in ranks]


def step_options(ops: pl.DataFrame) -> list[dict[str, str]]:
    """Dropdown options for the step selector: all, each step, and ops outside any step."""
    steps = sorted(s for s in ops["step"].unique().to_list() if s is not None)
    out = [{"label": "all steps" if steps else "whole trace (no steps)", "value": ALL}]
    out += [{"label": f"step {s}", "value": str(s)} for s in steps]
    n_none = ops["step"].null_count()
    if steps and n_none:
        out.append({"label": f"outside steps ({units.plural(n_none, 'op')})", "value": NO_STEP})
    return out


def stream_options(ops: pl.DataFrame) -> list[dict[str, str]]:
    streams = sorted(s for s in ops["stream"].unique().to_list() if s is not None)
    return [{"label": f"stream {s}", "value": str(s)} for s in streams]


def present_kinds(ops: pl.DataFrame) -> list[str]:
    """The op kinds present, in the schema's order."""
    have = set(ops["kind"].cast(pl.String).unique().to_list())
    return [k for k in KINDS if k in have]


def present_bounds(ops: pl.DataFrame) -> list[str]:
    order = ["compute", "memory", "comm", "latency", "unknown"]
    have = set(ops["bound"].fill_null("unknown").unique().to_list())
    return [b for b in order if b in have] + sorted(have - set(order))


def filter_table_ops(
    ops: pl.DataFrame,
    kinds: list[str] | None = None,
    bounds: list[str] | None = None,
    streams: list[str] | None = None,
) -> pl.DataFrame:
    """The Ops tab's filters (empty or None keeps everything)."""
    if kinds:
        ops = ops.filter(pl.col("kind").cast(pl.String).is_in(list(kinds)))
    if bounds:
        ops = ops.filter(pl.col("bound").fill_null("unknown").is_in(list(bounds)))
    if streams:
        ops = ops.filter(pl.col("stream").is_in([int(s) for s in streams]))
    return ops


# --------------------------------------------------------------------- op groups
def op_groups(ops: pl.DataFrame, by: str = "op") -> pl.DataFrame:
    """One row per op group, ranked by lost time (``gap_ns``) like the report's ranking.

    Args:
        ops: an op table with roofline columns (``expected_ns``, ``gap_ns``, ``bound`` ...).
        by: ``op`` or ``kernel`` (see :func:`label_expr`).

    Returns:
        The columns of :func:`traceroof.roofline.rank_ops` plus ``peak_dtype`` (the most
        common dtype of a peak the group's ops were costed against: ops with FLOPs > 0 and
        a peak; null when none was: a copy, an fp32 op on a chip with no fp32 peak, or any op
        of a table without a ``peak_dtype`` column), ``share`` (of the table's device time), ``roof_flops`` /
        ``roof_bytes`` / ``roof_ns`` (sums over the ops that have both FLOPs and bytes: the
        ones a roofline can place), ``achieved_flops_per_s = roof_flops / roof_ns`` (FLOP/s),
        ``roof_intensity = roof_flops / roof_bytes`` (FLOP/byte), and for the memory movers
        (ops with bytes > 0 and FLOPs zero or unknown: copies, memsets, bytes-only kernels)
        ``move_bytes`` / ``move_ns`` (their sums) and ``move_bytes_per_s = move_bytes /
        move_ns`` (B/s, achieved bandwidth). Sorted by ``gap_ns`` descending, nulls last.
    """
    if ops.height == 0:
        return rank_ops(ops, by=by).with_columns(
            pl.lit(None, dtype=pl.String).alias("peak_dtype"),
            *(pl.lit(None, dtype=pl.Float64).alias(c) for c in
              ("share", "roof_flops", "roof_bytes", "roof_ns", "achieved_flops_per_s", "roof_intensity",
               "move_bytes", "move_ns", "move_bytes_per_s")),
        )
    ranking = rank_ops(ops, by=by)
    placed = pl.col("flops").is_not_null() & pl.col("bytes").is_not_null()
    used_peak = (pl.col("flops") > 0).fill_null(False) & (
        pl.col("peak_flops_per_s").is_not_null() if "peak_flops_per_s" in ops.columns else pl.lit(True))
    mover = (pl.col("bytes") > 0) & (pl.col("flops").is_null() | (pl.col("flops") == 0))
    if "peak_dtype" not in ops.columns:  # an op table the roofline stage has not seen: no peak taken
        ops = ops.with_columns(pl.lit(None, dtype=pl.String).alias("peak_dtype"))
    extra = (
        ops.with_columns(label_expr(by).alias("label"))
        .group_by("label")
        .agg(
            # the dtype of a peak actually used: not the dtype of an op with no FLOPs or of a
            # chip with no peak for it (an H100 memcpy, an fp32 op on a TPU)
            pl.col("peak_dtype").filter(used_peak).drop_nulls().mode().first().alias("peak_dtype"),
            pl.col("bytes").filter(mover).sum().alias("move_bytes"),
            pl.col("dur_ns").filter(mover).sum().cast(pl.Float64).alias("move_ns"),
            pl.col("flops").filter(placed).sum().alias("roof_flops"),
            pl.col("bytes").filter(placed).sum().alias("roof_bytes"),
            pl.col("dur_ns").filter(placed).sum().cast(pl.Float64).alias("roof_ns"),
        )
    )
    total = float(ops["dur_ns"].sum() or 0)
    out = ranking.join(extra, on="label", how="left").with_columns(
        (pl.col("total_ns") / total if total else pl.lit(None, dtype=pl.Float64)).alias("share"),
        pl.when(pl.col("roof_ns") > 0).then(pl.col("roof_flops") / (pl.col("roof_ns") * 1e-9)).alias("achieved_flops_per_s"),
        pl.when(pl.col("roof_bytes") > 0).then(pl.col("roof_flops") / pl.col("roof_bytes")).alias("roof_intensity"),
        pl.when(pl.col("move_ns") > 0).then(pl.col("move_bytes") / (pl.col("move_ns") * 1e-9)).alias("move_bytes_per_s"),
    )
    return out.sort(["gap_ns", "total_ns", "label"], descending=[True, True, False], nulls_last=True)


def roofline_groups(groups: pl.DataFrame) -> pl.DataFrame:
    """The op groups a log-log roofline can place: FLOPs > 0, bytes > 0, time > 0."""
    return groups.filter(_placed())


def mover_groups(groups: pl.DataFrame) -> pl.DataFrame:
    """The op groups the roofline cannot place that move bytes (FLOPs zero or unknown,
    bytes > 0, time > 0): the bandwidth panel's points (:mod:`traceroof.web.bandwidth`)."""
    placed = _placed()
    return groups.filter(~placed, pl.col("move_bytes") > 0, pl.col("move_ns") > 0)


def _placed() -> pl.Expr:
    """The :func:`roofline_groups` condition as an expression (nulls are not placed)."""
    return ((pl.col("roof_flops") > 0) & (pl.col("roof_bytes") > 0) & (pl.col("roof_ns") > 0)).fill_null(False)


def roofline_note(groups: pl.DataFrame, shown: int) -> str:
    """One line saying how many groups are plotted and where the others' time is: on the
    bandwidth panel (memory movers: :func:`mover_groups`) or nowhere (no bytes, no time)."""
    placed = roofline_groups(groups)
    movers = mover_groups(groups)
    total = float(groups["total_ns"].sum() or 0) if groups.height else 0.0
    line = f"{units.plural(shown, 'op group')} plotted"
    if shown < placed.height:
        line += f" (the {placed.height - shown:,} smallest of {placed.height:,} left out)"

    def part(df_height: int, df_ns: float) -> str:
        share = df_ns / total if total else 0.0
        return f"{units.plural(df_height, 'group')} ({100 * share:.1f} % of device time)"

    if movers.height:
        verb = "moves" if movers.height == 1 else "move"
        line += (f"; {part(movers.height, float(movers['total_ns'].sum() or 0))} {verb} bytes with no FLOPs: "
                 "on the bandwidth panel below")
    off = groups.height - placed.height - movers.height
    if off:
        off_ns = total - float(placed["total_ns"].sum() or 0) - float(movers["total_ns"].sum() or 0)
        line += f"; {part(off, off_ns)} {'has' if off == 1 else 'have'} no bytes and cannot be placed"
    return line


def table_records(groups: pl.DataFrame, selected: str | None = None,
                  unit: numbers.TimeUnit | None = None) -> list[dict[str, Any]]:
    """Rows for the Ops tab table: numbers in display units (times in ``unit``, default
    :func:`table_unit` of ``groups``; ids as :func:`table_columns` spells them), ``id`` = the
    group label, ``sel`` = "★" on the selected group."""
    if groups.height == 0:
        return []
    unit = unit or table_unit(groups)
    df = groups.select(
        pl.col("label").alias("id"),
        (pl.when(pl.col("label") == selected).then(pl.lit("★")).otherwise(pl.lit("")) if selected is not None
         else pl.lit("")).alias("sel"),
        "label",
        "kind",
        "count",
        *((pl.col(col) / unit.ns).alias(f"{stem}_{unit.key}") for stem, col in _TIME_COLUMNS),
        (pl.col("costed") * 100).alias("costed_pct"),
        (pl.col("share") * 100).alias("share_pct"),
        (pl.col("efficiency") * 100).alias("efficiency_pct"),
        "bound",
        "intensity",
        (pl.col("achieved_flops_per_s") / 1e12).alias("achieved_tflops"),
        "peak_dtype",
    )
    return [{k: _num(v) for k, v in r.items()} for r in df.iter_rows(named=True)]


def table_summary(groups: pl.DataFrame, ops: pl.DataFrame) -> str:
    """The line above the Ops table: how many groups, ops and how much time it holds (each
    time in its own unit: ``315 s of device time``, not ``315117.904 ms``)."""
    t = float(ops["dur_ns"].sum() or 0) if ops.height else 0.0
    gap = float(groups["gap_ns"].sum() or 0) if groups.height else 0.0
    return (f"{units.plural(groups.height, 'op group')} · {units.plural(ops.height, 'op')} · "
            f"{units.ns(t)} of device time · {units.ns(gap)} lost against the roofline")


def groups_csv(groups: pl.DataFrame) -> str:
    """The Ops table as CSV (raw units: ns, FLOP, bytes, FLOP/s)."""
    cols = ["label", "kind", "count", "measured_ns", "expected_ns", "gap_ns", "share", "efficiency", "bound",
            "flops", "bytes", "intensity", "achieved_flops_per_s", "peak_dtype", "costed_count", "total_ns", "costed"]
    return groups.select([c for c in cols if c in groups.columns]).write_csv()


def ops_csv(ops: pl.DataFrame) -> str:
    """The filtered op table (one row per device op) as CSV."""
    return ops.with_columns(pl.col(pl.Enum, pl.Categorical).cast(pl.String)).write_csv()


# --------------------------------------------------------------------- timeline
class RowKeys(NamedTuple):
    """What the timeline's row names must tell apart: several ranks (``rank r · ``), several
    devices of one rank (``device d · ``, one row per (rank, device, stream): a process driving
    4 chips gets 4 rows, never one)."""

    ranks: bool
    devices: bool


def row_keys(ops: pl.DataFrame) -> RowKeys:
    """The :class:`RowKeys` of the ops drawn: several ranks; a rank with several devices."""
    if ops.height == 0:
        return RowKeys(False, False)
    per_rank = ops.group_by("rank").agg(pl.col("device").n_unique().alias("n"))
    return RowKeys(per_rank.height > 1, bool((per_rank["n"] > 1).any()))


def row_expr(keys: RowKeys) -> pl.Expr:
    """The row name of each op (see :func:`row_name`) as an expression."""
    s = pl.lit("stream ") + pl.col("stream").cast(pl.String)
    if keys.devices:
        s = pl.lit("device ") + pl.col("device").cast(pl.String).fill_null("?") + pl.lit(" · ") + s
    return (pl.lit("rank ") + pl.col("rank").cast(pl.String) + pl.lit(" · ") + s) if keys.ranks else s


def timeline_rows(ops: pl.DataFrame, *, launches: bool = True) -> list[str]:
    """The row names of the timeline, top to bottom: per rank, its host launches then its
    streams (per device, for a rank driving several: :class:`RowKeys`)."""
    keys = row_keys(ops)
    ranks = sorted(ops["rank"].unique().to_list()) if ops.height else []
    rows: list[str] = []
    for r in ranks:
        sub = ops.filter(pl.col("rank") == r)
        if launches and sub["launch_start_ns"].drop_nulls().len():
            rows.append(row_name(r, None, keys.ranks))
        if keys.devices:
            pairs = sub.select("device", "stream").unique().sort("device", "stream", nulls_last=True)
            rows += [row_name(r, st, keys.ranks, device="?" if d is None else d) for d, st in pairs.iter_rows()]
        else:
            rows += [row_name(r, st, keys.ranks) for st in sorted(sub["stream"].unique().to_list())]
    return rows


def row_name(rank: int, stream: int | None, multi: bool, device: int | str | None = None) -> str:
    """A timeline row's name: ``host launches`` (``stream`` None) or ``stream s``, after
    ``device d · `` when ``device`` is given and ``rank r · `` when ``multi`` (several ranks)."""
    base = "host launches" if stream is None else f"stream {stream}"
    if device is not None and stream is not None:
        base = f"device {device} · {base}"
    return f"rank {rank} · {base}" if multi else base


def timeline_unit(ops: pl.DataFrame) -> numbers.TimeUnit:
    """The timeline's x unit for ``ops``: from the latest op end (ns since the trace start),
    so a 92 s trace reads in s (not on a ``20k`` ms axis). Zooming keeps it."""
    if ops.height == 0:
        return numbers.MILLISECONDS
    return numbers.time_unit((ops["start_ns"] + ops["dur_ns"]).max())


def window_ops(ops: pl.DataFrame, window: tuple[float, float] | None) -> pl.DataFrame:
    """The ops overlapping ``window`` = (start_ns, end_ns); all when None."""
    if window is None:
        return ops
    t0, t1 = window
    return ops.filter(pl.col("start_ns") < t1, (pl.col("start_ns") + pl.col("dur_ns")) > t0)


def aggregate_bars(ops: pl.DataFrame, rows_key: pl.Expr, bins: int) -> pl.DataFrame:
    """Merge the ops of each row into at most ``bins`` time buckets (for huge steps).

    Returns one row per (row, bucket): ``row, start_ns, end_ns, busy_ns`` (sum of op
    durations), ``count``, ``kind`` (the kind with the most time) and ``name`` (and
    ``label``, when ``ops`` has one) of the op with the most time.
    """
    t0 = int(ops["start_ns"].min())
    t1 = int((ops["start_ns"] + ops["dur_ns"]).max())
    width = max(1, math.ceil((t1 - t0 + 1) / bins))
    df = ops.with_columns(rows_key.alias("row"), ((pl.col("start_ns") - t0) // width).alias("_bin"),
                          pl.col("kind").cast(pl.String))
    top = pl.col("dur_ns").arg_max()
    return (
        df.group_by("row", "_bin")
        .agg(
            pl.col("start_ns").min(),
            (pl.col("start_ns") + pl.col("dur_ns")).max().alias("end_ns"),
            pl.col("dur_ns").sum().alias("busy_ns"),
            pl.len().alias("count"),
            pl.col("kind").get(top).alias("kind"),
            pl.col("name").get(top).alias("name"),
            *([pl.col("label").get(top).alias("label")] if "label" in ops.columns else []),
        )
        .drop("_bin")
        .sort("row", "start_ns")
    )


def findings_in_view(findings: list[Finding], ranks: list[int], t0: int, t1: int) -> list[tuple[int, Finding]]:
    """(index, finding) of the findings with a time window (ns) overlapping [t0, t1] on ``ranks``."""
    out = []
    for i, f in enumerate(findings):
        s, e = f.start_ns, f.end_ns
        if s is None or e is None:
            continue
        if f.rank is not None and ranks and f.rank not in ranks:
            continue
        if e >= t0 and s <= t1:
            out.append((i, f))
    return out


def step_values(ops: pl.DataFrame) -> set[str]:
    """The step selector's values for ``ops``."""
    return {o["value"] for o in step_options(ops)}


def finding_target(finding: Finding, valid_steps: set[str] | None = None) -> dict[str, Any]:
    """Where "show on the timeline" goes: rank and step selector values and a time window (ns).

    The window is the finding's own, padded by 10 % on each side (at least 1 µs). A step
    the selector does not offer (``valid_steps``) becomes ``all``.
    """
    s, e = finding.start_ns, finding.end_ns
    window = None
    if s is not None and e is not None:
        pad = max(1_000, (e - s) // 10)
        window = [s - pad, e + pad]
    rank = finding.rank
    step = finding.step
    step_v = ALL if step is None else str(step)
    if valid_steps is not None and step_v not in valid_steps:
        step_v = ALL
    return {"rank": ALL if rank is None else str(rank), "step": step_v, "window": window}


def stored_window(store: dict[str, Any] | None, key: str) -> list[float] | None:
    """The window kept in the timeline's store, if it was drawn for the same rank/step ``key``."""
    if not store or store.get("key") != key:
        return None
    return store.get("window")


#: :func:`timeline_window` result meaning "leave the timeline as it is".
UNCHANGED = object()


def timeline_window(triggered: list[str], focus: dict[str, Any] | None, relayout: dict[str, Any] | None,
                    current: list[float] | None, *, n_ops: int, max_bars: int, unit_ns: float = 1e6) -> Any:
    """The time window (ns) the timeline should draw after an event, or :data:`UNCHANGED`.

    Args:
        triggered: the ``component.property`` ids that fired (``ctx.triggered_prop_ids``).
        focus: the focus store (``{"window": [s, e], ...}`` set by "show on timeline").
        relayout: the graph's ``relayoutData`` (zoom/pan/reset).
        current: the window drawn now.
        n_ops: ops in the selection; zoom events re-draw (with the ops of the new window)
            only when they exceed ``max_bars``: otherwise every op is drawn already and plotly
            zooms by itself.
        unit_ns: ns per unit of the timeline's x axis (:func:`timeline_unit`), which the
            relayout ranges are in.
    """
    trig = set(triggered)
    if "focus.data" in trig:
        return (focus or {}).get("window")
    if trig & {"rank-select.value", "step-select.value", "group-by.value"} or not trig:
        return None
    if "timeline-graph.relayoutData" in trig:
        r = relayout or {}
        if "xaxis.range[0]" in r and "xaxis.range[1]" in r:
            rng = [r["xaxis.range[0]"], r["xaxis.range[1]"]]
        elif isinstance(r.get("xaxis.range"), list):
            rng = r["xaxis.range"]
        elif r.get("xaxis.autorange"):
            rng = None
        else:
            return UNCHANGED
        if n_ops <= max_bars:
            return UNCHANGED  # every op is drawn: plotly zooms by itself
        return None if rng is None else [float(rng[0]) * unit_ns, float(rng[1]) * unit_ns]
    return current


def selection_from_event(trigger: Any, roof_click: dict[str, Any] | None, cell: dict[str, Any] | None,
                         timeline_click: dict[str, Any] | None,
                         bandwidth_click: dict[str, Any] | None = None) -> str | None:
    """The op-group label selected by a click on the roofline, the bandwidth panel, the ops
    table or the timeline.

    Returns :data:`UNCHANGED` for clicks on things that are not op groups (roofs, ridge
    points); None (no selection) for ``clear`` and a change of grouping.
    """
    if trigger in ("roofline-graph", "timeline-graph", "bandwidth-graph"):
        click = {"roofline-graph": roof_click, "timeline-graph": timeline_click}.get(trigger, bandwidth_click)
        label = _clicked_label(click)
        return UNCHANGED if label is None else label
    if trigger == "ops-table":
        label = (cell or {}).get("row_id")
        return UNCHANGED if label is None else label
    return None


def _clicked_label(click: dict[str, Any] | None) -> str | None:
    pts = (click or {}).get("points") or []
    for p in pts:
        cd = p.get("customdata")
        if isinstance(cd, list):
            cd = cd[0] if cd else None
        if isinstance(cd, str):
            return cd
    return None


def selection_banner(selected: str | None) -> tuple[str, dict[str, str]]:
    """Text and style of the "selected op" banner in the header."""
    if selected is None:
        return "", {"display": "none"}
    return f"selected: {selected}", {"display": "block"}


# --------------------------------------------------------------------- steps
def steps_view(steps: pl.DataFrame, rank: str | int | None = ALL) -> pl.DataFrame:
    """The step table of one rank (or all), with a display ``label`` and ``comm_only_ns``.

    ``comm_only_ns = busy_ns − compute_bound_ns − memory_bound_ns − unknown_bound_ns``: the
    time only communication ran (no other kernel, copies included), so that compute-bound +
    memory/latency-bound + no cost model + comm-only + idle partition the step's wall time
    exactly. The
    step table's ``comm_exposed_ns`` (communication not hidden by compute kernels; copies do
    not hide it) can be larger by the time copies overlapped communication.
    """
    if steps.height == 0:
        return steps
    if rank not in (None, ALL, ""):
        steps = steps.filter(pl.col("rank") == int(rank))
    multi = steps["rank"].n_unique() > 1
    step_txt = pl.when(pl.col("step").is_null()).then(pl.lit("whole trace")).otherwise(
        pl.lit("step ") + pl.col("step").cast(pl.String))
    label = (pl.lit("rank ") + pl.col("rank").cast(pl.String) + pl.lit(" · ") + step_txt) if multi else step_txt
    return steps.sort("rank", "start_ns").with_columns(
        label.alias("label"),
        (pl.col("busy_ns") - pl.col("compute_bound_ns") - pl.col("memory_bound_ns")
         - (pl.col("unknown_bound_ns").fill_null(0) if "unknown_bound_ns" in steps.columns else pl.lit(0))
         ).clip(lower_bound=0).alias("comm_only_ns"),
    )


# --------------------------------------------------------------------- findings
def evidence_rows(evidence: dict[str, Any]) -> list[tuple[str, str]]:
    """A finding's evidence as (key, formatted value) rows, units read from the key suffix."""
    rows = []
    for k, v in evidence.items():
        if isinstance(v, float) and (k.endswith("_ns")):
            txt = units.ns(v)
        elif isinstance(v, int) and k.endswith("_ns"):
            txt = units.ns(v)
        elif isinstance(v, float) and (k.endswith("share") or k.endswith("fraction") or k.endswith("_pct")):
            txt = units.pct(v) if not k.endswith("_pct") else f"{v:.1f} %"
        elif isinstance(v, float) and k.endswith("bytes_per_s"):
            txt = units.bytes_per_s(v)
        elif isinstance(v, float) and k.endswith("flops_per_s"):
            txt = units.flops_per_s(v)
        elif isinstance(v, float) and k.endswith("bytes"):
            txt = units.count(v, "B")
        elif isinstance(v, float):
            txt = numbers.plain(v, 4)
        elif isinstance(v, (list, tuple)):
            txt = ", ".join(units.short(x, 60) for x in v[:12]) + (f", … ({len(v)})" if len(v) > 12 else "")
        elif v is None:
            txt = "—"
        else:
            txt = units.short(v, 120)
        rows.append((k, txt))
    return rows


def _num(v: Any) -> Any:
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return None
    return v
