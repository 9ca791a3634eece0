"""The terminal, continued (issue 17, item 2): piped output fits the terminal the user
watches (``analyze | head`` in an 80-column terminal), ops whose shortened names collide
stay told apart, and counts agree with their noun ("1 op").

Oracles: the ranking's own labels (which are distinct), a pseudo-terminal set to a known
size here, and the op count of the example read from its raw JSON.
"""

from __future__ import annotations

import fcntl
import gzip
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios

import pytest
from conftest import FIXTURES, REPO, real
from hypothesis import given
from hypothesis import strategies as st

import traceroof
from traceroof import units
from traceroof.render import table

EXAMPLE = FIXTURES / "example_h100_decoder.json.gz"


@pytest.fixture(scope="module")
def example():
    return traceroof.analyze(traceroof.read_trace(EXAMPLE), chip="h100")


def _op_cells(text: str) -> list[str]:
    """The first cell of each row of the ranked-ops table."""
    body = text.split("Top ", 1)[1].split("└", 1)[0]
    return [ln.split("│")[1].strip() for ln in body.splitlines() if ln.startswith("│")]


@pytest.mark.parametrize("width", [80, 120])
def test_shortened_op_names_stay_distinct(example, width):
    labels = example.ranking.head(10)["label"].to_list()
    assert len(set(labels)) == len(labels)  # the ranking's groups are distinct ops
    cells = _op_cells(table.render(example, top=10, width=width))
    assert len(cells) == 10 and len(set(cells)) == 10, cells
    # the forward and backward flash attention differ in their ends only: at 80 columns both
    # are shortened, and the backward one keeps "_backward" (before the change both read
    # "aten::_scaled_dot_product…")
    fwd = "aten::_scaled_dot_product_flash_attention"
    assert fwd in labels and fwd + "_backward" in labels
    if width == 80:
        assert any(c.endswith("…_backward") and c.startswith("aten::_scaled") for c in cells), cells
        assert all(len(c) <= 60 for c in cells)


def test_one_op_is_one_op(example):
    text = table.render(example, top=1, width=120)
    assert "Top 1 op by time lost" in text and "Top 1 ops" not in text
    assert "Top 3 ops by time lost" in table.render(example, top=3, width=120)


def _pty(cols: int, rows: int = 50) -> tuple[int, int]:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    return master, slave


@pytest.mark.parametrize("cols", [80, 120])
def test_piped_output_fits_the_terminal_on_stderr(cols):
    """``traceroof analyze T | head`` in a terminal of ``cols`` columns: stdout is a pipe,
    stderr the terminal; the output fits the terminal and has no trailing spaces."""
    master, slave = _pty(cols)
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env["PYTHONPATH"] = str(REPO)
    try:
        res = subprocess.run([sys.executable, "-m", "traceroof.cli", "analyze", str(EXAMPLE), "-q", "--top", "5"],
                             stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL, env=env,
                             text=True, timeout=300, cwd=REPO)
    finally:
        os.close(slave)
        os.close(master)
    assert res.returncode == 0
    lines = res.stdout.splitlines()
    assert max(map(len, lines)) <= cols and all(ln == ln.rstrip() for ln in lines)
    # the example's 11 ranking columns do not fit at 80 or 120: the note names the width used
    assert f"left out at {cols} columns" in res.stdout
    # the device-op count from the raw JSON: kernel + gpu_memcpy + gpu_memset events
    with gzip.open(EXAMPLE, "rt") as f:
        events = json.load(f)["traceEvents"]
    n_ops = sum(1 for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    assert re.search(rf"^device ops +{n_ops:,} ops", res.stdout, re.M)


def test_no_terminal_at_all_renders_at_the_pipe_width():
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env["PYTHONPATH"] = str(REPO)
    res = subprocess.run([sys.executable, "-m", "traceroof.cli", "analyze", str(EXAMPLE), "-q", "--top", "5"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env,
                         text=True, timeout=300, cwd=REPO)
    assert res.returncode == 0
    from traceroof.render.terminal import PIPE_WIDTH

    widths = [len(ln) for ln in res.stdout.splitlines()]
    assert max(widths) <= PIPE_WIDTH == 120 and max(widths) > 80  # the wide layout, not 80


@given(st.lists(st.text(alphabet="ab_:<>(), ", min_size=1, max_size=90), min_size=2, max_size=5, unique=True),
       st.integers(16, 60))
def test_told_apart_labels_fit_and_come_from_their_label(labels, room):
    """Whatever the names, a label made to tell two ops apart fits its column and shows
    pieces of its own name, in order (so it never shows another op's name)."""
    before = [units.short_name(lab, room) for lab in labels]
    rows = [[b] for b in before]
    table._tell_apart(rows, labels, room)
    for (cell,), label, was in zip(rows, labels, before):
        assert len(cell) <= room
        if cell == was:
            continue  # not rewritten: units.short_name's own label (its "(…)" is no piece of the name)
        pos = 0
        for piece in (p for p in cell.split("…") if p):
            pos = label.find(piece, pos)
            assert pos >= 0, (label, cell)
            pos += len(piece)


def test_real_tensile_gemms_show_their_macro_tile():
    # five Tensile GEMM kernels of the MI300X jax trace share their first 22 characters; what
    # tells them apart first is the macro tile (MT256x224x64 ...), read here from the names
    r = traceroof.analyze(traceroof.read_trace(real("TraceLens", "tests", "traces", "mi300", "jax08_gemm",
                                                     "tw003.xplane.pb")))
    labels = r.ranking.head(8)["label"].to_list()
    tiles = {lab: re.search(r"_(MT\d+x\d+x\d+)_", lab).group(1) for lab in labels if lab.startswith("Cijk_")}
    assert len(tiles) == len(set(tiles.values())) == 5
    cells = _op_cells(table.render(r, top=8, width=80))
    for label, cell in zip(labels, cells):
        if label in tiles:
            assert tiles[label] in cell, (tiles[label], cell)


def test_hfu_line_says_why_it_is_unknown_or_only_a_lower_bound():
    from traceroof import analyze, read_trace
    from traceroof.render import sections

    # every step of the Falconsai trace is partial: HFU unknown for that reason (it has FLOPs)
    r = analyze(read_trace(real("TraceLens/tests/traces/h100/Falconsai_nsfw_image_detection__1016002.json.gz")))
    assert r.coverage.costed_share == 1.0 and r.steps["partial"].all()
    hfu = dict(sections.summary(r))["HFU"]
    assert hfu == "unknown: no complete step, every step is partial (accounting rule 5)"
    # SGLang's graph-replayed decode: 1.1 % costed, so the HFU is a lower bound and says so
    r = analyze(read_trace(real("TraceLens/tests/traces/inference/sglang_decode/sglang_Qwen3-8B_decode.json.gz")))
    unknown = 1 - r.coverage.costed_share + (r.coverage.bytes_only_share or 0)
    assert unknown > 0.9
    assert dict(sections.summary(r))["HFU"].endswith(
        f"; a lower bound: the FLOPs of {100 * unknown:.1f} % of device time are unknown (cost coverage)")


@pytest.mark.parametrize("cols", [80, 120])
def test_a_number_stays_on_the_line_of_its_unit(cols):
    from traceroof import analyze, read_trace
    from traceroof.render.table import render as render_table

    out = render_table(analyze(read_trace(real("TraceLens/tests/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"))),
                       width=cols)
    # no line (after its indent) starts with a unit whose number ended the line before
    units_re = re.compile(r"^\s+(%|[kMGTPµmn]?(FLOP/s|B/s|s)|[KMGT]iB)(\s|$|[),;])")
    assert not [ln for ln in out.splitlines() if units_re.match(ln)]
    assert max(len(ln) for ln in out.splitlines()) <= cols
