"""Pure figure builders: an op table (or step table) and the chip in, a plotly Figure out.

No Dash here and no state: the callbacks in :mod:`.callbacks` are one-line adapters to these
functions, and the tests call them directly on real traces. Every trace a figure carries has
``meta = {"role": ...}`` (``ops``, ``roof``, ``hbm``, ``ridge``, ``selected``, ``bars``,
``launches``, ``breakdown``, ``utilization``) so tests and callbacks can tell them apart.

Units: roofline axes are FLOP/byte (x) and FLOP/s (y), ticks at every decade in one notation;
the bandwidth panel's x is B/s (:mod:`.bandwidth`); timeline x is time since the trace origin
and step bars are durations, each in the unit its largest value calls for (s, ms or µs:
:func:`.numbers.time_unit`), named in the axis title and ``layout.meta``, in plain numbers.
"""

from __future__ import annotations

import math
from typing import Any

import plotly.graph_objects as go
import polars as pl

from .. import units
from ..dtypes import LOW_PRECISION_FIRST
from ..findings import Finding
from ..sections import ChipInfo
from . import numbers, views

#: One colour per op kind (stable across figures and pages).
KIND_COLORS: dict[str, str] = {
    "matmul": "#1f77b4",
    "attention": "#9467bd",
    "conv": "#17becf",
    "elementwise": "#ff7f0e",
    "reduction": "#bcbd22",
    "norm": "#e377c2",
    "collective": "#d62728",
    "memcpy": "#8c564b",
    "memset": "#7f7f7f",
    "other": "#2ca02c",
}
SELECT_COLOR = "#111111"
FINDING_FILL = "rgba(214, 39, 40, 0.10)"
FOCUS_FILL = "rgba(214, 39, 40, 0.28)"
DTYPE_ORDER = list(LOW_PRECISION_FIRST)
_BASE_LAYOUT: dict[str, Any] = {
    "template": "plotly_white",
    "margin": {"l": 70, "r": 30, "t": 70, "b": 60},
    "font": {"family": "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", "size": 12},
    "hoverlabel": {"align": "left"},
}


# --------------------------------------------------------------------- roofline
def positive(v: Any) -> float:
    """``v`` as a float when it is a finite number > 0 (a peak, a bandwidth), else 0.0: the
    figures' "no such roof" (a chip built by hand may hold anything; a saved report's chip
    is checked by :func:`traceroof.report_schema.check_report`)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return 0.0
    try:
        x = float(v)
    except OverflowError:  # an int past the float range
        return 0.0
    return x if math.isfinite(x) and x > 0 else 0.0


def roofs(chip: ChipInfo | None) -> list[tuple[list[str], float]]:
    """The chip's distinct compute roofs: (dtypes sharing the peak, peak FLOP/s), highest
    first; peaks that are not a positive number (:func:`positive`) draw no roof."""
    table = chip.peak_flops_per_s if chip and isinstance(chip.peak_flops_per_s, dict) else {}
    peaks = {k: positive(v) for k, v in table.items() if positive(v)}
    by_value: dict[float, list[str]] = {}
    for k in sorted(peaks, key=lambda d: DTYPE_ORDER.index(d) if d in DTYPE_ORDER else 99):
        by_value.setdefault(peaks[k], []).append(k)
    return sorted(((d, p) for p, d in by_value.items()), key=lambda x: -x[1])


def ridge_point(peak_flops_per_s: float, hbm_bytes_per_s: float) -> float:
    """Arithmetic intensity (FLOP/byte) where the HBM slope meets a compute roof: peak ÷ bandwidth."""
    return peak_flops_per_s / hbm_bytes_per_s


def roofline_figure(
    ops: pl.DataFrame,
    chip: ChipInfo | None,
    *,
    by: str = "op",
    selected: str | None = None,
    max_points: int = 20_000,
) -> go.Figure:
    """Log-log roofline: arithmetic intensity vs achieved FLOP/s, one point per op group.

    Args:
        ops: op table with roofline columns (already filtered to the rank/step shown).
        chip: ``Report.chip``: ``peak_flops_per_s`` (dense FLOP/s per dtype),
            ``hbm_bytes_per_s`` (B/s), ``name``; None (no device ops): an empty figure.
        by: op-group key, ``op`` or ``kernel`` (:func:`views.label_expr`).
        selected: label of the selected op group (ringed).
        max_points: most groups drawn (largest measured time first); the rest are named in
            the subtitle. One point per group keeps 10^5+ ops fast; points are WebGL.

    Returns:
        A figure whose ``ops`` traces (one per kind) hold one point per placeable op group:
        x = Σflops/Σbytes, y = Σflops/Σdur over the group's ops with both numbers; marker
        area ∝ the group's device time; ``customdata`` = the group label. One ``roof`` trace
        per distinct dtype peak (horizontal from its ridge), the ``hbm`` slope and the
        ``ridge`` points (x = peak ÷ bandwidth).
    """
    fig = go.Figure()
    fig.update_layout(**_BASE_LAYOUT)
    W = positive(chip.hbm_bytes_per_s if chip else None)
    roof_list = roofs(chip)
    if chip is None or not roof_list or not W:
        return _empty(fig, "No chip peaks: nothing to put against a roofline (CPU-only or metadata-only trace).")
    groups = views.op_groups(ops, by)
    placed = views.roofline_groups(groups).sort("measured_ns", descending=True)
    shown = placed.head(max_points)
    used = set(shown["peak_dtype"].drop_nulls().to_list()) if shown.height else set()

    ridges = [ridge_point(p, W) for _, p in roof_list]
    xs = shown["roof_intensity"].to_list() + ridges
    ys = shown["achieved_flops_per_s"].to_list()
    # the padded ends clamped into the floats (numbers.log_bound): a peak or a bandwidth at
    # the edge of the float range must not make the axis log10(0) or log10(inf)
    x_lo, x_hi = numbers.log_bound(min(xs) / 4), numbers.log_bound(max(xs) * 4)
    y_hi = numbers.log_bound(roof_list[0][1] * 2.5)
    y_lo = numbers.log_bound(min(ys + [W * x_lo, roof_list[-1][1]]) / 3)
    _add_roofs(fig, roof_list, W, used, x_lo, x_hi)
    if shown.height:
        _add_op_groups(fig, shown, chip, W, selected)
    else:
        fig.add_annotation(text="No op has both FLOPs and bytes: nothing to place under the roofs.",
                           xref="paper", yref="paper", x=0.5, y=0.5, showarrow=False, font={"size": 14})
    fig.update_layout(
        title={"text": f"Roofline · {chip.name}", "subtitle": {"text": views.roofline_note(groups, shown.height)}},
        xaxis={"type": "log", "title": "arithmetic intensity (FLOP/byte)", "range": [math.log10(x_lo), math.log10(x_hi)],
               **numbers.log_ticks(x_lo, x_hi)},
        yaxis={"type": "log", "title": "achieved FLOP/s", "range": [math.log10(y_lo), math.log10(y_hi)],
               **numbers.log_ticks(y_lo, y_hi, units.flops_per_s)},
        legend={"itemsizing": "constant"},
        clickmode="event",
        hovermode="closest",
        uirevision="roofline",
        meta={"points": shown.height, "groups": groups.height},
    )
    return fig


def _add_roofs(fig: go.Figure, roof_list: list[tuple[list[str], float]], W: float, used: set[str],
               x_lo: float, x_hi: float) -> None:
    """The roofs: the HBM slope (``W`` B/s) up to the highest ridge, then one flat roof per
    distinct peak (solid when an op shown uses one of its dtypes), and the ridge points."""
    ridges = [ridge_point(p, W) for _, p in roof_list]
    fig.add_trace(go.Scatter(
        x=[x_lo, max(ridges)], y=[W * x_lo, W * max(ridges)], mode="lines",
        line={"color": "#444", "width": 2}, name=f"HBM {units.bytes_per_s(W)}", legendgroup="roofs",
        hovertemplate=f"HBM slope: {units.bytes_per_s(W)} × intensity<extra></extra>",
        meta={"role": "hbm", "hbm_bytes_per_s": W},
    ))
    for dtypes, peak in roof_list:
        on = bool(used & set(dtypes))
        r = ridge_point(peak, W)
        name = "/".join(dtypes)
        fig.add_trace(go.Scatter(
            x=[r, x_hi], y=[peak, peak], mode="lines",
            line={"color": "#444" if on else "#9a9a9a", "width": 2 if on else 1, "dash": "solid" if on else "dot"},
            name=f"{name} roof {units.flops_per_s(peak)}", legendgroup="roofs",
            hovertemplate=f"{name} dense peak {units.flops_per_s(peak)}<extra></extra>",
            meta={"role": "roof", "dtypes": dtypes, "peak_flops_per_s": peak, "used": on},
        ))
        fig.add_annotation(x=math.log10(x_hi), y=math.log10(peak), text=f"{name} {units.flops_per_s(peak)}",
                           xanchor="right", yanchor="bottom", showarrow=False,
                           font={"size": 10, "color": "#333" if on else "#888"})
    fig.add_trace(go.Scatter(
        x=ridges, y=[p for _, p in roof_list], mode="markers",
        marker={"symbol": "diamond", "size": 9, "color": "#444"}, name="ridge points", legendgroup="roofs",
        text=[f"ridge point {'/'.join(d)}: {numbers.plain(ridge_point(p, W))} FLOP/byte ({units.flops_per_s(p)} ÷ {units.bytes_per_s(W)})"
              for d, p in roof_list],
        hovertemplate="%{text}<extra></extra>",
        meta={"role": "ridge", "ridges": ridges},
    ))


def _add_op_groups(fig: go.Figure, shown: pl.DataFrame, chip: ChipInfo, W: float, selected: str | None) -> None:
    """The op groups ``shown``: one WebGL trace per kind, and a ring around ``selected``."""
    tmax = float(shown["measured_ns"].max())
    for kind in [k for k in KIND_COLORS if k in set(shown["kind"].to_list())] + sorted(
            set(shown["kind"].to_list()) - set(KIND_COLORS)):
        sub = shown.filter(pl.col("kind") == kind)
        fig.add_trace(go.Scattergl(
            x=sub["roof_intensity"].to_list(), y=sub["achieved_flops_per_s"].to_list(), mode="markers",
            name=kind,
            marker={"color": KIND_COLORS.get(kind, "#2ca02c"), "opacity": 0.75,
                    "size": [5 + 35 * math.sqrt(t / tmax) for t in sub["measured_ns"].to_list()],
                    "line": {"width": 0.5, "color": "#ffffff"}},
            customdata=sub["label"].to_list(),
            text=[_roof_hover(r, chip, W) for r in sub.iter_rows(named=True)],
            hovertemplate="%{text}<extra></extra>",
            meta={"role": "ops", "kind": kind},
        ))
    if selected is None:
        return
    sel = shown.filter(pl.col("label") == selected)
    if sel.height:
        fig.add_trace(go.Scatter(
            x=sel["roof_intensity"].to_list(), y=sel["achieved_flops_per_s"].to_list(), mode="markers",
            marker={"symbol": "circle-open", "size": 5 + 35 * math.sqrt(float(sel["measured_ns"][0]) / tmax) + 10,
                    "color": SELECT_COLOR, "line": {"width": 3}},
            name="selected", customdata=sel["label"].to_list(), hoverinfo="skip",
            meta={"role": "selected", "label": selected},
        ))


def _roof_hover(r: dict[str, Any], chip: ChipInfo, W: float) -> str:
    peak = positive(chip.peak_flops_per_s.get(r["peak_dtype"])) if r["peak_dtype"] else None
    attain = min(peak, W * r["roof_intensity"]) if peak else None
    lines = [
        f"<b>{_esc(units.short(r['label'], 90))}</b>",
        f"{r['kind']} · {units.plural(r['count'], 'op')} · {units.ns(r['measured_ns'])} ({units.pct(r['share'])} of device time)",
        f"intensity {numbers.plain(r['roof_intensity'])} FLOP/byte · achieved {units.flops_per_s(r['achieved_flops_per_s'])}",
        f"FLOPs {units.count(r['roof_flops'])} · bytes {units.count(r['roof_bytes'], 'B')}",
    ]
    if attain:
        lines.append(f"roof here ({r['peak_dtype']}): {units.flops_per_s(attain)} → {units.pct(r['achieved_flops_per_s'] / attain)} of it")
    lines.append(f"roofline {units.ns(r['expected_ns'])} · gap {units.ns(r['gap_ns'])} · efficiency {units.pct(r['efficiency'])} · {r['bound']}-bound")
    return "<br>".join(lines)


# --------------------------------------------------------------------- timeline
def timeline_figure(
    ops: pl.DataFrame,
    *,
    findings: list[Finding] | tuple[()] = (),
    selected: str | None = None,
    by: str = "op",
    window: tuple[float, float] | list[float] | None = None,
    focus: int | None = None,
    max_bars: int = 4000,
    launches: bool = True,
    uirevision: str = "timeline",
) -> go.Figure:
    """A Gantt of device streams (and host launches) for the ops given (one step, usually).

    Args:
        ops: op table rows to draw (filtered to the rank(s)/step chosen).
        findings: ``Report.findings``; those overlapping the time drawn are shaded.
        selected: label of the selected op group; its ops get a ``selected`` trace on top.
        by: op-group key (``op``/``kernel``) that ``selected`` refers to.
        window: (start_ns, end_ns) to show; None = all of ``ops``. The x axis is set to it;
            when ``ops`` has more than ``max_bars`` rows, only the window's ops are drawn.
        focus: index (into ``findings``) of a finding to emphasise.
        max_bars: above this many ops in view, each row's ops are merged into time buckets
            (:func:`views.aggregate_bars`); zooming in (a smaller ``window``) shows single ops.
        launches: add a "host launches" row from ``launch_start_ns``/``launch_dur_ns``.
        uirevision: plotly ``uirevision`` (keeps the user's zoom while it is unchanged).

    Returns:
        A figure with horizontal ``bars`` traces (one per kind; x = duration, base =
        start since the trace origin, both in ``layout.meta["x_unit"]``, y = row), a ``launches`` trace, a ``selected`` trace
        and one shaded rectangle per finding in view. ``layout.meta`` has ``ops_in_view``,
        ``bars`` and ``aggregated``.
    """
    fig = go.Figure()
    fig.update_layout(**_BASE_LAYOUT)
    if ops.height == 0:
        return _empty(fig, "No device ops in this selection.")
    rows = views.timeline_rows(ops, launches=launches)
    multi = views.row_keys(ops)
    order = list(reversed(rows))  # plotly puts the first category at the bottom
    win = tuple(window) if window is not None else None
    # all ops when they fit (plotly zooms by itself); else only the window's, merged if still too many
    vis = (ops if ops.height <= max_bars else views.window_ops(ops, win)).with_columns(views.label_expr(by).alias("label"))
    row_key = _row_expr(multi)
    unit = views.timeline_unit(ops)
    n_dev_rows = max(1, sum(1 for r in rows if not r.endswith("host launches")))
    aggregated = vis.height > max_bars
    if aggregated:
        bars = views.aggregate_bars(vis, row_key, max(20, max_bars // n_dev_rows))
    else:
        bars = vis.with_columns(row_key.alias("row"), pl.col("kind").cast(pl.String),
                                (pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns"),
                                pl.lit(1).alias("count"), pl.col("dur_ns").alias("busy_ns"))
    n_bars = _add_bars(fig, bars, aggregated, unit.ns)
    if launches:
        _add_launches(fig, vis, multi, max_bars, n_dev_rows, unit.ns)
    if selected is not None:
        _add_selected(fig, vis.filter(pl.col("label") == selected).head(max_bars), selected, multi, unit.ns)
    t0 = int(ops["start_ns"].min())
    t1 = int((ops["start_ns"] + ops["dur_ns"]).max())
    ranks = sorted(ops["rank"].unique().to_list())
    _add_findings(fig, views.findings_in_view(list(findings), ranks, *(win or (t0, t1)))[:60], order, multi, focus,
                  unit.ns)
    sub_txt = f"{units.plural(vis.height, 'op')} in view"
    if aggregated:
        sub_txt += f", merged into {n_bars:,} bars (zoom in to see single ops)"
    sub_txt += " · shaded: findings" if findings else ""
    _timeline_layout(fig, sub_txt, win, order, uirevision, unit,
                     {"ops_in_view": vis.height, "bars": n_bars, "aggregated": aggregated, "rows": rows,
                      "x_unit": unit.name, "x_unit_ns": unit.ns})
    return fig


def _timeline_layout(fig: go.Figure, sub_txt: str, win: tuple[float, ...] | None, order: list[str],
                     uirevision: str, unit: numbers.TimeUnit, meta: dict[str, Any]) -> None:
    """Title, axes (x in ``unit``, plain numbers, the window ``win`` in ns if given; y the
    rows ``order``), legend."""
    height = max(420, 205 + 46 * len(order))
    fig.update_layout(
        title={"text": "Timeline", "subtitle": {"text": sub_txt}},
        barmode="overlay",
        xaxis={"title": f"time since trace start ({unit.name})", "showgrid": True, "zeroline": False,
               **numbers.LINEAR_AXIS, **({"range": [win[0] / unit.ns, win[1] / unit.ns]} if win else {})},
        yaxis={"type": "category", "categoryorder": "array", "categoryarray": order, "range": [-0.6, len(order) - 0.4],
               "fixedrange": True, "automargin": True},
        height=height,
        dragmode="zoom",
        hovermode="closest",
        clickmode="event",
        uirevision=uirevision,
        margin={"l": 70, "r": 30, "t": 95, "b": 110},
        legend={"orientation": "h", "x": 0, "y": -62 / (height - 205), "yanchor": "top"},  # below the axis title
        meta=meta,
    )


def _add_bars(fig: go.Figure, bars: pl.DataFrame, aggregated: bool, unit_ns: float) -> int:
    """One horizontal bar trace per kind (x: duration, base: start, both in units of
    ``unit_ns`` ns); the bars drawn."""
    n_bars = 0
    for kind in [k for k in KIND_COLORS if k in set(bars["kind"].to_list())] + sorted(
            set(bars["kind"].to_list()) - set(KIND_COLORS)):
        sub = bars.filter(pl.col("kind") == kind)
        n_bars += sub.height
        fig.add_trace(go.Bar(
            orientation="h", name=kind, y=sub["row"].to_list(),
            base=[s / unit_ns for s in sub["start_ns"].to_list()],
            x=[max(e - s, 1) / unit_ns for s, e in zip(sub["start_ns"].to_list(), sub["end_ns"].to_list())],
            marker={"color": KIND_COLORS.get(kind, "#2ca02c"), "line": {"width": 0}},
            customdata=sub["label"].to_list(),
            text=[_bar_hover(r, aggregated) for r in sub.iter_rows(named=True)],
            textposition="none", hovertemplate="%{text}<extra></extra>", width=0.72,
            meta={"role": "bars", "kind": kind, "ops": int(sub["count"].sum())},
        ))
    return n_bars


def _add_selected(fig: go.Figure, sel: pl.DataFrame, selected: str, multi: views.RowKeys, unit_ns: float) -> None:
    """Diamonds on the ops ``sel`` of the selected op group (none when it has no ops in view)."""
    if not sel.height:
        return
    fig.add_trace(go.Scatter(
        x=[(s + d / 2) / unit_ns for s, d in zip(sel["start_ns"].to_list(), sel["dur_ns"].to_list())],
        y=_row_values(sel, multi), mode="markers", name=f"selected: {units.short(selected, 40)}",
        marker={"symbol": "diamond", "size": 11, "color": "#ffd400", "line": {"width": 1.5, "color": SELECT_COLOR}},
        customdata=sel["label"].to_list(),
        text=[f"<b>selected</b>: {_esc(units.short(n, 90))}<br>{units.ns(d)}" for n, d in
              zip(sel["name"].to_list(), sel["dur_ns"].to_list())],
        hovertemplate="%{text}<extra></extra>",
        meta={"role": "selected", "label": selected, "ops": sel.height},
    ))


def _add_findings(fig: go.Figure, in_view: list[tuple[int, Finding]], order: list[str], multi: views.RowKeys,
                  focus: int | None, unit_ns: float) -> None:
    """A shaded rectangle (over its rank's rows) and a ``#n`` marker per finding in view."""
    for n_marked, (i, f) in enumerate(in_view):
        y0, y1 = _finding_rows(f, order, multi)
        fig.add_shape(type="rect", xref="x", yref="y" if y0 is not None else "paper",
                      x0=f.start_ns / unit_ns, x1=f.end_ns / unit_ns,
                      y0=y0 if y0 is not None else 0, y1=y1 if y1 is not None else 1,
                      fillcolor=FOCUS_FILL if i == focus else FINDING_FILL,
                      line={"width": 1.5 if i == focus else 0, "color": "#d62728"}, layer="below")
        fig.add_annotation(x=f.start_ns / unit_ns, y=1 + 0.035 * (n_marked % 3), yref="paper", xanchor="left",
                           yanchor="bottom", text=f"#{i + 1}", showarrow=False, font={"size": 10, "color": "#b22222"},
                           hovertext=_esc(f"#{i + 1} {f.title or f.kind} · recoverable "
                                          f"{units.ns(f.recoverable_ns)}"))


def _row_expr(multi: views.RowKeys) -> pl.Expr:
    """Each op's timeline row (:func:`views.row_expr`)."""
    return views.row_expr(multi)


def _row_values(df: pl.DataFrame, multi: views.RowKeys) -> list[str]:
    return df.select(_row_expr(multi).alias("row"))["row"].to_list()


def _add_launches(fig: go.Figure, vis: pl.DataFrame, multi: views.RowKeys, max_bars: int, n_rows: int,
                  unit_ns: float) -> None:
    la = vis.filter(pl.col("launch_start_ns").is_not_null()).select(
        "rank", "label", "name", "kind",
        pl.col("launch_start_ns").alias("start_ns"), pl.col("launch_dur_ns").fill_null(0).alias("dur_ns"),
    )
    if la.height == 0:
        return
    key = (pl.lit("rank ") + pl.col("rank").cast(pl.String) + pl.lit(" · host launches")) if multi.ranks else pl.lit("host launches")
    if la.height > max_bars:
        b = views.aggregate_bars(la, key, max(20, max_bars // n_rows))
    else:
        b = la.with_columns(key.alias("row"), (pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns"),
                            pl.lit(1).alias("count"), pl.col("dur_ns").alias("busy_ns"))
    fig.add_trace(go.Bar(
        orientation="h", name="host launch", y=b["row"].to_list(),
        base=[s / unit_ns for s in b["start_ns"].to_list()],
        x=[max(e - s, 1) / unit_ns for s, e in zip(b["start_ns"].to_list(), b["end_ns"].to_list())],
        marker={"color": "#555555", "line": {"width": 0}}, width=0.5,
        customdata=b["label"].to_list(),
        text=[f"launch of {_esc(units.short(r['name'], 80))}<br>{units.ns(r['busy_ns'])}" + (f" ({r['count']:,} launches)" if r["count"] > 1 else "")
              for r in b.iter_rows(named=True)],
        textposition="none", hovertemplate="%{text}<extra></extra>",
        meta={"role": "launches", "launches": int(b["count"].sum())},
    ))


def _bar_hover(r: dict[str, Any], aggregated: bool) -> str:
    if aggregated and r["count"] > 1:
        return (f"<b>{r['count']:,} ops</b> {numbers.window_text(r['start_ns'], r['end_ns'])}, busy {units.ns(r['busy_ns'])}"
                f"<br>most time: {_esc(units.short(r['name'], 90))} ({r['kind']})")
    lines = [f"<b>{_esc(units.short(r['name'], 90))}</b>"]
    if r.get("label") and r["label"] != r["name"]:
        lines.append(f"op: {_esc(units.short(r['label'], 60))}")
    lines.append(f"{r['kind']} · {numbers.window_text(r['start_ns'], r['end_ns'])} · "
                 f"{units.ns(r['dur_ns'] if 'dur_ns' in r else r['busy_ns'])}")
    if r.get("bound") is not None:
        lines.append(f"{r['bound']}-bound · roofline {units.ns(r.get('expected_ns'))} · gap {units.ns(r.get('gap_ns'))} · "
                     f"efficiency {units.pct(r.get('efficiency'))}")
    return "<br>".join(lines)


def _finding_rows(f: Finding, order: list[str], multi: views.RowKeys) -> tuple[float | None, float | None]:
    """The y extent (category positions) of a finding: its rank's rows when several ranks are
    drawn, its device's rows when it names one (:attr:`Finding.device`) of a rank drawn with several."""
    on_dev = multi.devices and f.device is not None
    if not (multi.ranks or on_dev) or (multi.ranks and f.rank is None):
        return None, None
    prefix = f"rank {f.rank} · " if multi.ranks else ""
    if on_dev:
        prefix += f"device {f.device} · "
    idx = [i for i, r in enumerate(order) if r.startswith(prefix)]
    if not idx:
        return None, None
    return min(idx) - 0.5, max(idx) + 0.5


# --------------------------------------------------------------------- steps
BREAKDOWN = (
    ("compute_bound_ns", "compute-bound", "#1f77b4"),
    ("memory_bound_ns", "memory / latency-bound", "#ff7f0e"),
    ("unknown_bound_ns", "no cost model", "#9467bd"),
    ("comm_only_ns", "communication only", "#d62728"),
    ("idle_ns", "idle", "#c7c7c7"),
)


def steps_figure(steps: pl.DataFrame, *, rank: str | int | None = views.ALL) -> go.Figure:
    """Per-step stacked device time (compute / memory / communication only / idle) with HFU/MFU.

    Args:
        steps: ``Report.steps`` (one row per (rank, step); ``traceroof.steps.STEP_SCHEMA``
            plus ``hfu``, ``mfu``).
        rank: one rank, or ``"all"``.

    Returns:
        A stacked bar figure (in ``layout.meta["y_unit"]``; the parts of a step add up to its wall time, all
        unions over streams) with HFU and MFU (%, right axis) as lines where known.
    """
    fig = go.Figure()
    fig.update_layout(**_BASE_LAYOUT)
    v = views.steps_view(steps, rank)
    if v.height == 0:
        return _empty(fig, "No steps (no device ops).")
    labels = v["label"].to_list()
    wall = v["wall_ns"].to_list()
    unit = numbers.time_unit(max((w or 0) for w in wall))
    exposed = v["comm_exposed_ns"].to_list()
    for col, name, color in BREAKDOWN:
        if col not in v.columns:  # a report saved before the column existed
            continue
        vals = v[col].to_list()
        text = [f"{name}: {units.ns(x)} ({units.pct((x or 0) / w if w else None)} of the step)" for x, w in zip(vals, wall)]
        if col == "comm_only_ns":
            text = [t + f"<br>exposed communication (not hidden by compute): {units.ns(e)}" for t, e in zip(text, exposed)]
        fig.add_trace(go.Bar(
            x=labels, y=[(x or 0) / unit.ns for x in vals], name=name, marker={"color": color},
            text=text, textposition="none", hovertemplate="%{x}<br>%{text}<extra></extra>",
            meta={"role": "breakdown", "column": col},
        ))
    for col, name, dash in (("hfu", "HFU", "solid"), ("mfu", "MFU", "dash")):
        if col in v.columns and v[col].drop_nulls().len():
            fig.add_trace(go.Scatter(
                x=labels, y=[None if x is None else 100 * x for x in v[col].to_list()], name=name, yaxis="y2",
                mode="lines+markers", line={"color": "#111", "dash": dash}, marker={"size": 7},
                hovertemplate=f"%{{x}}<br>{name} %{{y:.1f}} %<extra></extra>",
                meta={"role": "utilization", "column": col},
            ))
    for lab, part in zip(labels, v["partial"].to_list()):
        if part:
            fig.add_annotation(x=lab, y=1, yref="paper", text="partial", showarrow=False, font={"size": 10, "color": "#b22222"})
    n_dev = int(v["devices"].max() or 1) if "devices" in v.columns and v["devices"].drop_nulls().len() else 1
    per_dev = "" if n_dev <= 1 else f", means of each rank's {n_dev} devices (the Devices table has each one)"
    fig.update_layout(
        title={"text": "Steps", "subtitle": {"text": f"device time per step (unions over streams{per_dev}): the parts "
                                                     "add up to the step's wall time; communication hidden under other "
                                                     "kernels counts with them"}},
        barmode="stack",
        xaxis={"type": "category", "title": ""},
        yaxis={"title": f"time ({unit.name})", **numbers.LINEAR_AXIS},
        yaxis2={"title": "HFU / MFU (%)", "overlaying": "y", "side": "right", "range": [0, 100], "showgrid": False,
                "tickmode": "linear", "tick0": 0, "dtick": 20, "ticksuffix": " %"},
        legend={"orientation": "h", "y": -0.15, "x": 0},
        hovermode="x unified" if len(labels) <= 64 else "closest",
        meta={"steps": len(labels), "y_unit": unit.name, "y_unit_ns": unit.ns},
    )
    return fig


# --------------------------------------------------------------------- helpers
def _empty(fig: go.Figure, text: str) -> go.Figure:
    fig.add_annotation(text=text, xref="paper", yref="paper", x=0.5, y=0.5, showarrow=False, font={"size": 14})
    fig.update_layout(xaxis={"visible": False}, yaxis={"visible": False}, meta={"points": 0, "bars": 0, "ops_in_view": 0})
    return fig


def _esc(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
