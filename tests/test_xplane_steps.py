"""Steps inferred from repeated XLA program executions in jax profiles without step
annotations (traceroof/parsers/xplane_steps.py), on real MI300 profiles and the generated
CPU one; the oracle is the profile's own ``XLA Modules`` events, walked in plain Python."""

from __future__ import annotations

import bisect

import polars as pl
import pytest
from conftest import FIXTURES, real

from traceroof import analyze
from traceroof.parsers import xplane

GEMM = ("TraceLens", "tests", "traces", "mi300", "jax08_gemm", "tw003.xplane.pb")
ATTN = ("TraceLens", "tests", "traces", "mi300", "jax08_attention", "tw003.xplane.pb")
TPU = ("xprof", "xprof", "convert", "test_xplanes", "tpu_inference_2.xplane.pb")


def _module_starts(trace, module: str) -> list[int]:
    """Starts (ns) of the executions of ``module``: the events of the first device's
    ``XLA Modules`` line (``<module>(<program id>)``) when there is one, else the host's
    outermost ``PjitFunction(<fn>)`` calls of ``jit_<fn>`` (jax nests two rows per call)."""
    host = trace.host.sort("start_ns")
    mods = host.filter(pl.col("thread") == "XLA Modules")
    if mods.height:
        first = min(mods["pid"].to_list())
        return [s for p, n, s in zip(mods["pid"], mods["name"], mods["start_ns"])
                if p == first and n.split("(")[0] == module]
    starts, open_until = [], None
    for n, s, d in zip(host["name"], host["start_ns"], host["dur_ns"]):
        if not n.startswith("PjitFunction("):
            continue
        if open_until is None or s >= open_until:  # not inside the previous call
            if "jit_" + n[len("PjitFunction("):-1] == module:
                starts.append(s)
        open_until = s + d if open_until is None else max(open_until, s + d)
    return starts


@pytest.mark.parametrize("parts, module", [(GEMM, "jit_dot"), (ATTN, "jit_matmul"), (TPU, "jit_f")])
def test_steps_are_the_executions_of_the_busiest_repeated_program(parts, module):
    trace = xplane.read(real(*parts))
    starts = _module_starts(trace, module)
    assert len(starts) >= 5  # the benchmark loop ran the program many times
    # every op's step: the last execution start at or before it (k), if a later one closes it
    for start, step in zip(trace.ops["start_ns"], trace.ops["step"]):
        k = bisect.bisect_right(starts, start) - 1
        assert step == (k if 0 <= k < len(starts) - 1 else None)
    marks = trace.host.filter(pl.col("name").str.starts_with("ProfilerStep#"))
    assert marks["start_ns"].to_list() == starts[:-1]
    assert (marks["start_ns"] + marks["dur_ns"]).to_list() == starts[1:]
    assert set(marks["annotation"]) == {f"inferred: {module} execution"}
    [warning] = [w for w in trace.meta.warnings if "inferred" in w]
    assert f"{len(starts) - 1} steps inferred from the {len(starts)} executions of {module}" in warning
    assert "StepTraceAnnotation" in warning
    assert trace.meta.stats["xplane.steps_inferred"] == len(starts) - 1


def test_the_report_counts_the_inferred_steps():
    trace = xplane.read(real(*GEMM))
    starts = _module_starts(trace, "jit_dot")
    report = analyze(trace, chip="mi300x")
    assert report.summary.steps == len(starts) - 1  # 18 executions -> 17 steps
    assert report.steps["step"].to_list() == list(range(len(starts) - 1))
    # not BC-14's "no step markers ...: the whole trace is analysed as one step" any more
    assert not [w for w in report.warnings if w.startswith("no step markers")]


def test_annotated_profiles_keep_their_own_steps():
    trace = xplane.read(FIXTURES / "jax_cpu" / "train_step.xplane.pb")
    assert not [w for w in trace.meta.warnings if "inferred" in w]
    assert "xplane.steps_inferred" not in trace.meta.stats
    marks = trace.host.filter(pl.col("name").str.starts_with("ProfilerStep#"))
    assert marks.height and marks["annotation"].null_count() == 0
    assert not any(str(a).startswith("inferred") for a in marks["annotation"])
