"""Output fits the terminal it is printed in (80 and 120 columns): no line wider, no
trailing padding, the lowest-value columns dropped first and said so, names shortened at
template arguments and word boundaries, warnings wrapped, left-out findings counted."""

from __future__ import annotations

import pytest
from conftest import FIXTURES, MODELS, real
from hypothesis import given
from hypothesis import strategies as st

import traceroof
from traceroof import units
from traceroof.render import chips as rchips
from traceroof.render import estimate as restimate
from traceroof.render import table

TRACES = {
    "example": lambda: FIXTURES / "example_h100_decoder.json.gz",
    "b200": lambda: real("TraceLens", "tests", "traces", "b200", "eager_trace.json.gz"),
    "qwen": lambda: real("TraceLens", "tests", "traces", "h100", "Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"),
    "mi300x-jax": lambda: real("TraceLens", "tests", "traces", "mi300", "jax08_gemm", "tw003.xplane.pb"),
}


@pytest.fixture(scope="module", params=sorted(TRACES))
def report(request):
    return traceroof.analyze(traceroof.read_trace(TRACES[request.param]()))


def _check_fits(text: str, width: int) -> list[str]:
    lines = text.splitlines()
    assert lines, "nothing rendered"
    too_wide = [(len(ln), ln) for ln in lines if len(ln) > width]
    assert not too_wide, f"{len(too_wide)} lines wider than {width}: {too_wide[:2]}"
    assert all(ln == ln.rstrip() for ln in lines), "trailing spaces"
    return lines


@pytest.mark.parametrize("width", [80, 120])
def test_analyze_fits_the_terminal(report, width):
    text = table.render(report, top=8, width=width)
    _check_fits(text, width)
    # every ranked op is on the table, its label whole or shortened at a sensible point; where
    # two shortened labels would read the same, each shows pieces of its own label, in order
    # (render.table._tell_apart: "aten::_scaled…_backward")
    body = text.split("Top ", 1)[1]
    cells = [ln.split("│")[1].strip() for ln in body.split("└", 1)[0].splitlines() if ln.startswith("│")]
    for label, cell in zip(report.ranking.head(8)["label"].to_list(), cells):
        if any(units.short_name(label, n) == cell for n in range(24, 61)):
            continue
        pos = 0
        for piece in (p for p in cell.split("…") if p):
            pos = label.find(piece, pos)
            assert pos >= 0, (label, cell)
            pos += len(piece)
    assert len(set(cells)) == len(cells), cells


def test_narrow_terminals_drop_low_value_columns_first_and_say_so(report):
    wide = table.render(report, top=5, width=200)
    narrow = table.render(report, top=5, width=80)
    assert "intensity (FLOP/B)" in wide and "left out" not in wide.split("Findings")[0]
    assert "left out at 80 columns:" in narrow and "intensity (FLOP/B)" in narrow.split("left out")[1]
    head = next(ln for ln in narrow.splitlines() if ln.startswith("┃ op"))
    for kept in ("op", "measured", "gap"):  # what the ranking is about stays
        assert kept in head


def test_left_out_findings_are_counted():
    r = traceroof.analyze(traceroof.read_trace(TRACES["example"]()), chip="h100")
    n = len(r.findings)
    assert n > 2
    text = table.render(r, top=2, width=120)
    assert f"2 of {n} findings shown; --top {n} shows them all" in text
    assert "findings shown" not in table.render(r, top=n, width=120)


def test_warnings_wrap_at_words(report):
    text = table.render(report, top=3, width=80)
    warn = text.split("Warnings:", 1)
    if len(warn) == 2:
        for ln in warn[1].strip("\n").splitlines():
            assert ln.startswith(("  - ", "    ")), ln


@pytest.mark.parametrize("width", [80, 120])
def test_chips_and_estimate_fit(width):
    lines = _check_fits(rchips.render_chips(traceroof.list_chips(), width=width), width)
    assert any("h100_sxm" in ln for ln in lines)
    from traceroof.estimate import estimate
    from traceroof.model import load_model_config

    est = estimate(load_model_config(MODELS / "llama2-7b.json"), traceroof.get_chip("h100"))
    lines = _check_fits(restimate.render_estimate(est, "table", width=width), width)
    assert any("6,738,149,376" in ln for ln in lines)


def test_piped_output_is_not_padded(tmp_path):
    from click.testing import CliRunner

    from traceroof.cli import cli

    res = CliRunner().invoke(cli, ["analyze", str(TRACES["example"]()), "-q", "--top", "3"],
                             env={"COLUMNS": ""})
    assert res.exit_code == 0
    assert all(ln == ln.rstrip() for ln in res.output.splitlines())


KERNEL = ("void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous)::Mul<float>, "
          "at::detail::Array<char*, 3> >(int, at::native::Mul<float>, at::detail::Array<char*, 3>)")


def test_short_name_cuts_at_template_arguments_and_words():
    assert units.short_name("aten::mm", 8) == "aten::mm"
    assert units.short_name(KERNEL, 60) == "at::native::vectorized_elementwise_kernel<…>(…)"
    assert units.short_name(KERNEL, 40) == "vectorized_elementwise_kernel<…>(…)"
    assert units.short_name("aten::_scaled_dot_product_flash_attention_backward", 30) == "aten::_scaled_dot_product…"
    # words before the parenthesis: not a signature
    assert units.short_name("Memcpy DtoD (Device -> Device)", 20) == "Memcpy DtoD (Device…"
    assert units.short_name(None, 10) == "—"


@given(st.text(alphabet="ab_:<>(), ", min_size=0, max_size=120), st.integers(1, 80))
def test_short_name_never_exceeds_its_width(name, n):
    out = units.short_name(name, n)
    assert len(out) <= n or out == name and len(name) <= n
    if len(name) <= n:
        assert out == name


def test_plural():
    assert (units.plural(1, "op"), units.plural(2, "op"), units.plural(1707, "op")) == ("1 op", "2 ops", "1,707 ops")
