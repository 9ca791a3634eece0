"""docs/extending.md, done from a test file alone: a toy detector, a toy renderer and a toy
chip are each one piece of code plus one registry entry, and ``analyze`` uses them.

(The toy input format is in ``tests/test_formats.py``.)
"""

from __future__ import annotations

import polars as pl
import pytest

import traceroof
from traceroof import findings as F
from traceroof import render as R


@pytest.fixture()
def example(example_trace):
    return traceroof.read_trace(example_trace)


@pytest.fixture()
def toy_detector():
    """Long kernels: one finding per op name whose kernels take over 30 % of device time,
    claiming their gap to the roofline (never more than measured − expected)."""

    @F.register("toy_long_kernels")
    def detect(ctx: F.FindingContext) -> list[F.Finding]:
        total = float(ctx.ops["dur_ns"].sum())
        g = (ctx.ops.filter(pl.col("gap_ns").is_not_null())
             .group_by(pl.coalesce("op", "name").alias("label"))
             .agg(pl.col("dur_ns").sum().alias("dur"), pl.col("gap_ns").sum().alias("gap"))
             .filter(pl.col("dur") > 0.3 * total).sort("label"))
        return [F.Finding(kind="toy_long_kernels", title=f"{r['label']} is long", severity="low",
                          recoverable_ns=float(r["gap"]), explanation="toy",
                          evidence={"measured_ns": float(r["dur"])}, ops=[r["label"]])
                for r in g.iter_rows(named=True)]

    yield detect
    del F.DETECTORS["toy_long_kernels"]


def test_a_toy_detector_registered_from_a_test_runs_in_analyze(example, toy_detector):
    report = traceroof.analyze(example, chip="h100", findings=["toy_long_kernels"])
    found = [f for f in report.findings if _get(f, "kind") == "toy_long_kernels"]
    # independent arithmetic on the op table: which op names hold > 30 % of device time
    ops = report.ops
    total = ops["dur_ns"].sum()
    by = ops.group_by(pl.coalesce("op", "name").alias("label")).agg(pl.col("dur_ns").sum(), pl.col("gap_ns").sum())
    want = sorted(r["label"] for r in by.iter_rows(named=True) if r["dur_ns"] > 0.3 * total)
    assert want, "the example has a dominant op (aten::mm)"
    assert sorted(_get(f, "ops")[0] for f in found) == want
    for f in found:
        label = _get(f, "ops")[0]
        gap = by.filter(pl.col("label") == label)["gap_ns"][0]
        assert _get(f, "recoverable_ns") == pytest.approx(gap)
    # only the chosen detector ran
    assert {_get(f, "kind") for f in report.findings} == {"toy_long_kernels"}


def test_an_unknown_detector_name_is_a_usage_error(example):
    from traceroof.errors import UsageError

    with pytest.raises(UsageError, match="toy_nothing"):
        traceroof.analyze(example, chip="h100", findings=["toy_nothing"])


def test_a_toy_renderer_is_one_function_and_one_entry(example):
    def render(report, *, top: int = 20) -> str:
        """One line per ranked op: its label only."""
        return "\n".join(str(v) for v in report.ranking.head(top).to_series(0))

    R.RENDERERS["toy"] = render
    try:
        report = traceroof.analyze(example, chip="h100")
        out = R.render(report, "toy", top=3)
        assert len(out.splitlines()) == 3
        first_col = report.ranking.columns[0]
        assert out.splitlines()[0] == str(report.ranking[first_col][0])
        # the command line offers it with no change of its own
        from click.testing import CliRunner

        from traceroof.cli import cli

        res = CliRunner().invoke(cli, ["analyze", str(example.meta.sources[0]), "-q", "--format", "toy", "--top", "2"])
        assert res.exit_code == 0, res.output
        assert res.output.splitlines() == out.splitlines()[:2]
    finally:
        del R.RENDERERS["toy"]


def test_a_toy_chip_from_a_toml_file(example, tmp_path):
    """A chip is one TOML table; a file of it is a chip for ``--chip``."""
    p = tmp_path / "toy.toml"
    p.write_text(
        "[chips.toy]\nname = 'Toy accelerator'\nvendor = 'toy'\n"
        "hbm_bytes = 80e9\nhbm_bytes_per_s = 1e12\n"
        "[chips.toy.peak_flops_per_s]\nbf16 = 100e12\nfp32 = 10e12\n"
    )
    chip = traceroof.get_chip(str(p))
    assert chip.peak("bf16") == 100e12 and chip.hbm_bytes_per_s == 1e12
    report = traceroof.analyze(example, chip=str(p))
    ops = report.ops.filter(pl.col("flops").is_not_null() & pl.col("bytes").is_not_null()
                            & (pl.col("peak_dtype") == "bf16"))
    row = ops.row(0, named=True)
    # the roofline against the toy's numbers: max(F / 100 TFLOP/s, B / 1 TB/s), in ns
    want = max(row["flops"] / 100e12, row["bytes"] / 1e12) * 1e9
    assert row["expected_ns"] == pytest.approx(want, rel=1e-9)


def _get(f, key):
    return f[key] if isinstance(f, dict) else getattr(f, key)


def _doc_snippet(marker: str) -> str:
    """The python block of docs/extending.md whose first line is ``# <marker>``."""
    import re

    from conftest import REPO

    text = (REPO / "docs" / "extending.md").read_text()
    for block in re.findall(r"```python\n(.+?)\n```", text, re.S):
        if block.startswith(f"# {marker}"):
            return block
    raise AssertionError(f"docs/extending.md has no python block starting '# {marker}'")


def test_the_docs_cost_formula_and_detector_work_as_written(example):
    """The page's examples, run as written (relative imports made absolute)."""
    import types

    from traceroof.costs import cost_of

    def load(marker: str, package: str) -> types.ModuleType:
        mod = types.ModuleType(f"{package}._doc_example")
        mod.__package__ = package
        exec(compile(_doc_snippet(marker), marker, "exec"), mod.__dict__)
        return mod

    if cost_of("aten::toy_scale", [[4, 8]], ["c10::BFloat16"], [""]) is None:
        load("traceroof/costs/toy.py", "traceroof.costs")
    c = cost_of("aten::toy_scale", [[4, 8]], ["c10::BFloat16"], [""])
    # 4·8 = 32 elements: 32 FLOPs; 32 · 2 B read and written
    assert (c.flops, c.bytes_read, c.bytes_written, c.kind) == (32.0, 64.0, 64.0, "elementwise")

    load("traceroof/findings/long_kernels.py", "traceroof.findings")
    try:
        report = traceroof.analyze(example, chip="h100", findings=["long_kernels"])
        ops = report.ops.filter(pl.col("gap_ns") > 20_000)
        assert ops.height, "the example has ops losing over 20 µs"
        worst = ops.sort("gap_ns", descending=True).row(0, named=True)
        found = report.findings
        assert len(found) == 1 and found[0].ops == [worst["name"]]
        assert found[0].recoverable_ns == pytest.approx(worst["gap_ns"])
    finally:
        F.DETECTORS.pop("long_kernels", None)
