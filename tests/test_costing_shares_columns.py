"""The costing stage hands the op table's unchanged columns on as they are (issue 19: the 1 GB
trace's peak RSS): ``_fill_from_formulas`` collects only the columns it makes, so on polars'
default engine the columns it passes through are not copied (collected whole, the default
engine wrote every column again: a second op table while the trace's own is alive)."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from traceroof import costing, frames
from traceroof.io import read_trace

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "example_h100_decoder.json.gz"


def _address(s: pl.Series) -> int:
    return s._s.as_single_ptr()


def test_compute_costs_shares_the_columns_it_does_not_change(monkeypatch):
    trace = read_trace(FIXTURE)
    # the large-table path of the 1 GB trace (per-op windows, eager steps) on a small fixture
    monkeypatch.setattr(frames, "SMALL_ROWS", 0)
    ops, cov = costing.compute_costs(trace)  # outside analyze: polars' default engine
    assert ops.height == trace.ops.height > 0
    assert ops.columns == trace.ops.columns
    for c in ("start_ns", "dur_ns", "correlation", "stream", "launch_start_ns"):
        assert _address(ops[c]) == _address(trace.ops[c]), c
    assert ops["flops"].n_chunks() == 1 and ops["kind"].n_chunks() == 1
    assert ops["cost_source"].is_in(["shapes", "trace", "name", "unknown"]).all()
    assert (ops["cost_source"] == "shapes").sum() > 0
