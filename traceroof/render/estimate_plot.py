"""The serving latency-throughput curve of ``traceroof estimate --serve --plot FILE.html``:
tokens/s per chip (x) against tokens/s per user (y), one point per batch of the sweep, as one
self-contained HTML file (plotly.js inlined: it opens offline). Only presents numbers that
:func:`traceroof.estimate_serve.serving_plan` computed."""

from __future__ import annotations

from pathlib import Path

from ..errors import UsageError
from ..estimate_plan import EstimatePlan


def sweep_figure(plan: EstimatePlan):  # noqa: ANN201 - plotly is imported lazily
    """A plotly Figure of the plan's decode sweep (x: tok/s per chip, y: tok/s per user).

    Raises:
        UsageError: the plan has no serving section or its sweep is empty (no sequence fits).
    """
    import plotly.graph_objects as go

    s = plan.serving
    if s is None or not s.sweep:
        raise UsageError("--plot needs a serving sweep: --serve, and a KV budget that holds at "
                         "least one sequence")
    e = plan.estimate
    fig = go.Figure()
    fig.add_trace(go.Scatter(
        x=[d.tokens_per_s_per_chip for d in s.sweep], y=[d.tokens_per_s_per_user for d in s.sweep],
        mode="lines+markers+text", text=[f"B={d.batch}" for d in s.sweep],
        textposition="top right", name="decode floor",
        customdata=[[d.batch, d.time_s * 1e3, d.bound] for d in s.sweep],
        hovertemplate="batch %{customdata[0]}<br>%{customdata[1]:.2f} ms/token "
                      "(%{customdata[2]}-bound)<br>%{x:,.0f} tok/s/chip<br>%{y:,.1f} tok/s/user"
                      "<extra></extra>"))
    best = s.at_max_batch
    if best is not None:
        fig.add_trace(go.Scatter(
            x=[best.tokens_per_s_per_chip], y=[best.tokens_per_s_per_user], mode="markers+text",
            text=[f"largest within target: B={best.batch}"], textposition="bottom left",
            marker={"symbol": "star", "size": 16}, name="largest batch within the target",
            hovertemplate=f"largest batch within the target: {best.batch}<extra></extra>"))
    if s.tpot_target_s is not None:
        fig.add_hline(y=1 / s.tpot_target_s, line_dash="dash",
                      annotation_text=f"target {s.tpot_target_s * 1e3:g} ms/token")
    fig.update_layout(
        title=(f"{e.model} on {e.chip}: decode at position {s.position:,} (weights "
               f"{s.weight_dtype}, KV {s.kv_dtype}, tp={s.tp})"),
        xaxis_title="throughput per chip (tokens/s)", yaxis_title="speed per user (tokens/s)",
        template="plotly_white", showlegend=False)
    fig.update_xaxes(type="log")
    return fig


def write_sweep_html(plan: EstimatePlan, path: str | Path) -> None:
    """Write :func:`sweep_figure` to ``path`` as one HTML file with plotly.js inlined.

    Raises:
        UsageError: as :func:`sweep_figure`.
    """
    sweep_figure(plan).write_html(str(path), include_plotlyjs=True, full_html=True)
