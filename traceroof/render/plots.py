"""``report.figures``: a report's figures as plotly figures, for notebooks and the HTML report.

``report.figures.roofline()``, ``.timeline()``, ``.steps()`` are the dashboard's builders
(:mod:`traceroof.web.figures`) applied to the report; ``.waterfall()`` is built here. Needs
plotly (the ``web`` extra).

The waterfall (:meth:`ReportFigures.waterfall`) walks one step from its measured wall time
down to the **sum of expected op times** of its ops, in terms that add up exactly (issue 16's
step speed of light is not built; this is a sum of per-op roofline times, not a bound on the
step):

====================================  =====================================================
step wall time                        ``end_ns − start_ns`` of the step (the steps table)
idle, net of stream overlap           ``Σ dur_ns − wall`` = −(idle − overlap): the step's op
                                      time summed over streams minus its wall time (positive
                                      when streams overlap more than the device idles)
ops without a cost model              ``− Σ dur_ns`` of the step's ops with no
                                      ``expected_ns``
gap of <kind> ops                     ``− Σ gap_ns`` of the costed ops of that kind
                                      (``gap_ns = dur_ns − expected_ns``, DESIGN §6)
sum of expected op times              ``Σ expected_ns`` of the step's costed ops (total)
====================================  =====================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import polars as pl

from .. import units

if TYPE_CHECKING:
    import plotly.graph_objects as go

    from ..report import Report


def typical_step(report: Report, rank: int | None = None) -> tuple[int | None, int | None]:
    """The (rank, step) a one-step figure shows by default: of ``rank`` (default: the lowest
    rank with ops), the complete step whose wall time is the lower median of its complete
    steps (the first of equals; of its partial steps when it has only those); (rank, None)
    when the rank has no step (its ops outside any step are then shown), (None, None) with
    no ops at all."""
    ops = report.ops
    if ops is None or ops.height == 0:
        return None, None
    r = int(ops["rank"].min()) if rank is None else int(rank)
    st = report.steps
    if st.height == 0 or "step" not in st.columns:
        return r, None
    steps = st.filter((pl.col("rank") == r) & pl.col("step").is_not_null())
    full = steps.filter(~pl.col("partial"))
    full = full if full.height else steps  # only partial steps: the median of those
    if full.height == 0:
        return r, None
    walls = sorted((e - s, s, k) for s, e, k in full.select("start_ns", "end_ns", "step").iter_rows())
    return r, int(walls[(len(walls) - 1) // 2][2])


def step_ops(ops: pl.DataFrame, rank: int | None, step: int | None) -> pl.DataFrame:
    """The ops of ``rank`` in ``step`` (``step`` None: the rank's ops outside any step)."""
    sub = ops if rank is None else ops.filter(pl.col("rank") == rank)
    return sub.filter(pl.col("step").is_null() if step is None else (pl.col("step") == step))


@dataclass(frozen=True)
class WaterfallTerm:
    """One bar of the waterfall: ``name``, ``value_ns`` (signed for relative terms) and
    ``measure`` (``absolute``, ``relative`` or ``total``)."""

    name: str
    value_ns: float
    measure: str


def waterfall_terms(report: Report, rank: int | None = None, step: int | None = None) -> tuple[list[WaterfallTerm], str]:
    """The terms of :meth:`ReportFigures.waterfall` (module docstring) and the step's name.

    ``step`` None: :func:`typical_step`. Without a step row (no steps table, or ops outside
    any step) the wall time is the span of the ops shown (first start to last end).

    Raises:
        ValueError: the report holds no op table, or the step has no ops.
    """
    if report.ops is None:
        raise ValueError("the report holds no op table (saved without ops): no waterfall")
    if step is None:
        rank, step = typical_step(report, rank)
    elif rank is None:
        rank = int(report.ops["rank"].min())
    ops = step_ops(report.ops, rank, step)
    if ops.height == 0:
        raise ValueError(f"rank {rank} step {step}: no device ops")
    row = report.steps.filter((pl.col("rank") == rank) & (pl.col("step") == step)) if (
        step is not None and report.steps.height) else report.steps.head(0)
    if row.height:
        wall = int(row["end_ns"][0]) - int(row["start_ns"][0])
        name = f"rank {rank} · step {step}" + (" (partial)" if "partial" in row.columns and row["partial"][0] else "")
    else:
        wall = int((ops["start_ns"] + ops["dur_ns"]).max()) - int(ops["start_ns"].min())
        name = f"rank {rank} · ops outside any step (span of the ops)"
    dur = int(ops["dur_ns"].sum())
    costed = ops.filter(pl.col("expected_ns").is_not_null())
    # an empty sum is 0 (a saved report's all-null column loads as dtype Null, whose sum is None)
    costed_dur, expected = float(costed["dur_ns"].sum() or 0), float(costed["expected_ns"].sum() or 0)
    terms = [WaterfallTerm("step wall time", float(wall), "absolute"),
             WaterfallTerm("idle, net of stream overlap", float(dur - wall), "relative"),
             WaterfallTerm("ops without a cost model", costed_dur - dur, "relative")]
    gaps = costed.group_by(pl.col("kind").cast(pl.String)).agg(pl.col("gap_ns").sum()).sort("gap_ns", descending=True)
    terms += [WaterfallTerm(f"gap of {k} ops", -float(g or 0), "relative") for k, g in gaps.iter_rows() if costed.height]
    terms.append(WaterfallTerm("sum of expected op times", expected, "total"))
    return terms, name


class ReportFigures:
    """The figures of one report (``report.figures``); each method returns a new plotly
    ``go.Figure``. Needs plotly (``pip install 'traceroof[web]'``)."""

    def __init__(self, report: Report) -> None:
        self.report = report

    def _by(self) -> str:
        return (self.report.filters.group_by if self.report.filters else None) or "op"

    def _ops(self) -> pl.DataFrame:
        if self.report.ops is None:
            raise ValueError("the report holds no op table (saved without ops): no figure of its ops")
        return self.report.ops

    def roofline(self, *, selected: str | None = None) -> go.Figure:
        """Log-log roofline of the op groups: arithmetic intensity (FLOP/byte) vs achieved
        FLOP/s under the chip's roofs (:func:`traceroof.web.figures.roofline_figure`).

        Raises:
            ValueError: the report holds no op table.
        """
        from ..web.figures import roofline_figure

        return roofline_figure(self._ops(), self.report.chip, by=self._by(), selected=selected)

    def timeline(self, *, rank: int | None = None, step: int | None = None, all_steps: bool = False) -> go.Figure:
        """Gantt of the device streams (ms since the trace origin) of one step, findings
        shaded (:func:`traceroof.web.figures.timeline_figure`). ``step`` None:
        :func:`typical_step`; ``all_steps``: every op (merged into time buckets above 4,000).

        Raises:
            ValueError: the report holds no op table.
        """
        from ..web.figures import timeline_figure

        ops = self._ops()
        if not all_steps:
            if step is None:
                rank, step = typical_step(self.report, rank)
            ops = step_ops(ops, rank, step) if ops.height else ops
        return timeline_figure(ops, findings=self.report.findings, by=self._by())

    def steps(self) -> go.Figure:
        """Stacked device time per step (ms) with HFU/MFU (:func:`traceroof.web.figures.steps_figure`)."""
        from ..web.figures import steps_figure

        return steps_figure(self.report.steps)

    def waterfall(self, *, rank: int | None = None, step: int | None = None) -> go.Figure:
        """One step from its wall time down to the sum of expected op times (module docstring;
        values in ms, ``layout.meta.terms_ns`` has each term in ns and ``total_ns`` their sum).

        Raises:
            ValueError: the report holds no op table, or the step has no ops.
        """
        import plotly.graph_objects as go

        terms, name = waterfall_terms(self.report, rank, step)
        total = sum(t.value_ns for t in terms if t.measure != "total")
        fig = go.Figure(go.Waterfall(
            x=[t.name for t in terms], y=[(total if t.measure == "total" else t.value_ns) / 1e6 for t in terms],
            measure=[t.measure for t in terms], textposition="outside",
            text=[units.ns(total if t.measure == "total" else t.value_ns) for t in terms],
            hovertemplate="%{x}: %{text}<extra></extra>", connector={"line": {"color": "#999"}},
            increasing={"marker": {"color": "#ff7f0e"}}, decreasing={"marker": {"color": "#1f77b4"}},
            totals={"marker": {"color": "#2ca02c"}}, meta={"role": "waterfall"},
        ))
        fig.update_layout(
            template="plotly_white", title={"text": f"Waterfall · {name}", "subtitle": {"text": (
                "from the measured wall time to the sum of the ops' roofline times (not a bound on the step: "
                "ops that could overlap are summed)")}},
            yaxis={"title": "time (ms)"}, showlegend=False,
            meta={"terms_ns": {t.name: t.value_ns for t in terms if t.measure != "total"}, "total_ns": total,
                  "step": name})
        return fig

    def light(self) -> go.Figure:
        """The waterfall from the measured step to its speed of light, as the dashboard and the
        terminal show it (:func:`traceroof.web.light_view.waterfall_figure`; docs/speed-of-light.md):
        its steps down add up to measured − speed of light."""
        from ..web.light_view import waterfall_figure

        return waterfall_figure(self.report)

    def _repr_html_(self) -> str:  # pragma: no cover - what Jupyter shows for ``report.figures``
        return ("<p>report.figures: roofline(), timeline(), steps(), light() (measured step → speed of "
                "light), waterfall() (one step's wall → Σ expected op times) — each a plotly figure</p>")


def figure_list(report: Report) -> list[tuple[str, Any]]:
    """(section title, figure) of every figure the HTML report embeds, in page order."""
    figs = ReportFigures(report)
    out: list[tuple[str, Any]] = [("Steps", figs.steps())]
    if report.ops is not None and report.ops.height:
        rank, step = typical_step(report)
        row = report.steps.filter((pl.col("rank") == rank) & (pl.col("step") == step)) if step is not None else None
        partial = ", partial" if row is not None and row.height and row["partial"][0] else ""
        which = f"rank {rank} · step {step}{partial}" if step is not None else f"rank {rank} · ops outside any step"
        # the waterfall the terminal and the dashboard show: measured step → speed of light
        # (traceroof.waterfall); the one-step wall → Σ expected waterfall where there is none
        last = (("From the measured step to its speed of light", figs.light()) if _has_light(report)
                else (f"Waterfall ({which})", figs.waterfall()))
        out = [("Roofline", figs.roofline()), (f"Timeline ({which})", figs.timeline()), *out, last]
    return out


def _has_light(report: Report) -> bool:
    s = report.speed_of_light
    return s is not None and s.measured_ns is not None
