"""Accounting rule 7: a ranking row's measured, expected, gap and efficiency cover the same
(costed) ops; the row's total time and its costed share are their own columns; one label rule
(``roofline.group_label_expr``) for the ranking, the dashboard's groups, the above-roof
inconsistencies and the rule-4 check."""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from pathlib import Path

import polars as pl
import pytest
from conftest import REAL, real

from traceroof.accounting import check, check_ranking, check_shares
from traceroof.analysis import check_roofs, load_report
from traceroof.chips import get_chip
from traceroof.errors import UnknownChipError
from traceroof.render import csv as csv_r
from traceroof.render import markdown, table
from traceroof.roofline import group_label_expr, rank_ops
from traceroof.schema import KIND
from traceroof.sections import Filters
from traceroof.web import views

TW003 = ("TraceLens", "tests", "traces", "mi300", "jax08_gemm", "tw003.xplane.pb")

_COLS = {"name": pl.String, "op": pl.String, "kind": KIND, "dur_ns": pl.Int64, "expected_ns": pl.Float64,
         "bound": pl.String, "flops": pl.Float64, "bytes": pl.Float64, "dtype": pl.String}


def _ops(rows: list[tuple]) -> pl.DataFrame:
    df = pl.DataFrame(rows, schema=_COLS, orient="row")
    return df.with_columns((pl.col("dur_ns") - pl.col("expected_ns")).alias("gap_ns"),
                           (pl.col("expected_ns") / pl.col("dur_ns")).alias("efficiency"))


@pytest.fixture()
def mixed() -> pl.DataFrame:
    return _ops([
        # name, op, kind, dur_ns, expected_ns, bound, flops, bytes, dtype
        ("gemm_a", "aten::mm", "matmul", 100, 40.0, "compute", 1e6, 1e3, "bf16"),
        ("gemm_b", "aten::mm", "matmul", 50, 10.0, "compute", 1e5, 1e3, "bf16"),
        ("gemm_c", "aten::mm", "matmul", 30, None, "unknown", None, None, "bf16"),
        ("Memcpy DtoH", "aten::copy_", "memcpy", 70, None, "unknown", None, None, None),
        ("Memcpy DtoD", "aten::copy_", "memcpy", 20, 5.0, "memory", None, 100.0, None),
        ("mystery", None, "other", 500, None, "unknown", None, None, None),
    ])


def test_a_row_covers_its_costed_ops_and_shows_its_total(mixed):
    r = rank_ops(mixed).filter(pl.col("label") == "aten::mm").row(0, named=True)
    # every op 100 + 50 + 30 = 180; costed (with an expected time) 100 + 50 = 150
    assert (r["count"], r["costed_count"], r["total_ns"], r["measured_ns"]) == (3, 2, 180, 150)
    # expected 40 + 10 = 50; gap 150 − 50 = 100 (not 180 − 50 = 130, the old mixed row)
    assert r["expected_ns"] == pytest.approx(50.0) and r["gap_ns"] == pytest.approx(100.0)
    assert r["efficiency"] == pytest.approx(50 / 150) and r["costed"] == pytest.approx(150 / 180)


def test_a_row_with_no_costed_op_has_unknown_numbers_and_sorts_last(mixed):
    ranked = rank_ops(mixed)
    r = ranked.filter(pl.col("label") == "mystery").row(0, named=True)
    assert r["total_ns"] == 500 and r["costed"] == 0.0
    assert [r[k] for k in ("measured_ns", "expected_ns", "gap_ns", "efficiency")] == [None] * 4
    # the uncosted rows (mystery 500 ns, Memcpy DtoH 70 ns) last, larger total first
    assert ranked["label"].to_list()[-2:] == ["mystery", "Memcpy DtoH"]


def test_copies_keep_their_own_name_and_kernel_grouping_uses_names(mixed):
    by_op = set(rank_ops(mixed)["label"].to_list())
    assert by_op == {"aten::mm", "Memcpy DtoH", "Memcpy DtoD", "mystery"}
    by_kernel = set(rank_ops(mixed, by="kernel")["label"].to_list())
    assert by_kernel == {"gemm_a", "gemm_b", "gemm_c", "Memcpy DtoH", "Memcpy DtoD", "mystery"}
    with pytest.raises(ValueError, match="group_by"):
        group_label_expr("stream")


def test_the_dashboard_groups_by_the_same_rule(mixed):
    for by in ("op", "kernel"):
        assert (mixed.select(views.label_expr(by)).to_series().to_list()
                == mixed.select(group_label_expr(by)).to_series().to_list())
    g = views.op_groups(mixed.with_columns(pl.lit("bf16").alias("peak_dtype")))
    mm = g.filter(pl.col("label") == "aten::mm").row(0, named=True)
    # share of the table's time: the row's total 180 of 100+50+30+70+20+500 = 770
    assert mm["share"] == pytest.approx(180 / 770)
    rec = next(r for r in views.table_records(g) if r["id"] == "aten::mm")
    assert rec["total_us"] == pytest.approx(0.180) and rec["costed_pct"] == pytest.approx(100 * 150 / 180)
    assert "costed_pct" in [c for c, _, _ in views.TABLE_COLUMNS]


def test_check_ranking_catches_a_row_whose_measured_covers_other_ops(mixed):
    ranked = rank_ops(mixed)
    assert check_ranking(ranked) == []
    # the old row: measured over every op (180) while gap/expected cover the costed ones
    old = ranked.with_columns(pl.when(pl.col("label") == "aten::mm").then(pl.col("total_ns"))
                              .otherwise(pl.col("measured_ns")).alias("measured_ns"))
    got = check_ranking(old)
    assert [v.rule for v in got] == [7] and "aten::mm" in got[0].text and "gap" in got[0].text
    bad_share = ranked.with_columns(pl.when(pl.col("label") == "aten::mm").then(pl.lit(1.0))
                                    .otherwise(pl.col("costed")).alias("costed"))
    assert [v.rule for v in check_ranking(bad_share)] == [7]


def _ops_above_roof() -> pl.DataFrame:
    """Two kernels of one framework op, at 150 % and at 103 % of their roof: both
    inconsistencies (any efficiency above 1 is, accounting rule 4)."""
    df = _ops([
        ("fast_gemm", "aten::mm", "matmul", 100, 150.0, "compute", 1e6, 1e3, "bf16"),
        ("ok_gemm", "aten::mm", "matmul", 100, 103.0, "compute", 1e6, 1e3, "bf16"),
    ])
    return df.with_columns(pl.lit("bf16").alias("peak_dtype"), pl.lit("shapes").alias("cost_source"))


def test_above_roof_inconsistencies_are_labelled_as_the_ranking_rows():
    ops = _ops_above_roof()
    spec = get_chip("h100")
    assert sorted(i.op for i in check_roofs(ops, spec, "kernel")) == ["fast_gemm", "ok_gemm"]
    assert [(i.op, i.count) for i in check_roofs(ops, spec, "op")] == [("aten::mm", 2)]
    assert set(rank_ops(ops, by="kernel")["label"]) >= {i.op for i in check_roofs(ops, spec, "kernel")}


def test_rule4_labels_ops_as_the_report_grouped_them():
    base = load_report(real(*TW003), jobs=1)
    ops = _ops_above_roof()
    spec = get_chip("h100")
    flagged = check_roofs(ops, spec, "kernel")
    assert sorted(i.op for i in flagged) == ["fast_gemm", "ok_gemm"]
    rep = dataclasses.replace(base, ops=ops, ranking=rank_ops(ops, by="kernel").head(0), inconsistencies=flagged,
                              filters=Filters(group_by="kernel"))
    # both kernels flagged under their kernel labels: nothing to report. The old rule (the
    # framework op, "aten::mm") would not find them flagged and report rule 4
    assert [v for v in check_shares(rep) if "op " in v.text] == []
    rep_op = dataclasses.replace(rep, filters=Filters(group_by="op"))
    assert any("aten::mm" in v.text for v in check_shares(rep_op))


def test_80_columns_keep_op_kind_measured_gap_efficiency_and_say_what_went():
    rep = load_report(real(*TW003), jobs=1)
    text = table.render(rep, top=8, width=80)
    head = next(line for line in text.splitlines() if line.startswith("┃ op"))
    cols = [c.strip() for c in head.strip("┃").split("┃")]
    assert cols == ["op", "kind", "measured", "gap", "efficiency"]
    assert max(len(line) for line in text.split("Findings")[0].splitlines()) <= 80
    note = " ".join(text.split("(left out at 80 columns: ")[1].split(";")[0].split())  # unwrapped
    assert note.split(", ") == ["count", "total", "costed", "expected", "bound", "intensity (FLOP/B)"]
    wide = table.render(rep, top=8, width=200)
    head = next(line for line in wide.splitlines() if line.startswith("┃ op"))
    assert "costed" in head and "total" in head


def test_every_renderer_has_the_costed_share():
    rep = load_report(real(*TW003), jobs=1)
    row = rep.ranking.filter(pl.col("label") == "__amd_rocclr_copyBuffer.kd").row(0, named=True)
    # the copy row is partly costed: measured (its costed ops) < total, gap = measured − expected
    assert row["measured_ns"] < row["total_ns"]
    assert row["gap_ns"] == pytest.approx(row["measured_ns"] - row["expected_ns"])
    md = markdown.render(rep, top=20)
    line = next(x for x in md.splitlines() if x.startswith("| __amd_rocclr_copyBuffer.kd"))
    pct = f"{100 * row['costed']:.1f} %"
    assert pct in line and "| costed |" in md
    csv = pl.read_csv(csv_r.render(rep, top=20).encode())
    assert csv.filter(pl.col("label") == "__amd_rocclr_copyBuffer.kd")["costed"][0] == pytest.approx(row["costed"])
    js = json.loads(rep.to_json(top=20))
    jrow = next(r for r in js["ranking"] if r["label"] == "__amd_rocclr_copyBuffer.kd")
    assert jrow["total_ns"] == row["total_ns"] and jrow["costed"] == pytest.approx(row["costed"])
    assert js["schema_version"] == 2
    assert not [v for v in check(rep) if v.rule == 7]


# --------------------------------------------------------------------------- every real trace


def _real_traces() -> list[Path]:
    return sorted(p for p in REAL.rglob("*") if p.is_file() and p.name != "MANIFEST.md"
                  and "/golden/" not in str(p) and "utf8-mangled" not in str(p))


def _label(name: str, op: str | None, kind: str, by: str) -> str:
    if by == "kernel":
        return name
    return name if kind in ("memcpy", "memset") or op is None else op


def _oracle(ops: pl.DataFrame, by: str) -> dict[str, list[float]]:
    """Per label, from the op table row by row: [total, measured, expected] (ns), the last two
    over the ops with an expected time."""
    acc: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0])
    for name, op, kind, dur, exp in ops.select("name", "op", pl.col("kind").cast(pl.String), "dur_ns",
                                               "expected_ns").iter_rows():
        a = acc[_label(name, op, kind, by)]
        a[0] += dur
        if exp is not None:
            a[1] += dur
            a[2] += exp
            a[3] += 1
    return acc


@pytest.mark.parametrize("path", _real_traces(), ids=lambda p: str(p.relative_to(REAL)))
def test_every_real_ranking_row_covers_the_same_ops(path: Path):
    try:
        rep = load_report(path, jobs=1)
    except UnknownChipError:
        rep = load_report(path, "h100", jobs=1)
    if rep.ops is None or rep.ops.height == 0:
        assert rep.ranking.height == 0
        return
    want = _oracle(rep.ops, rep.filters.group_by)
    assert rep.ranking.height == len(want)
    for r in rep.ranking.iter_rows(named=True):
        total, meas, exp, n = want[r["label"]]
        assert r["total_ns"] == total and r["costed_count"] == n
        if n == 0:
            assert r["measured_ns"] is None and r["gap_ns"] is None and r["efficiency"] is None
            continue
        assert r["measured_ns"] == meas
        assert r["expected_ns"] == pytest.approx(exp, rel=1e-9, abs=1e-6)
        assert r["gap_ns"] == pytest.approx(meas - exp, rel=1e-9, abs=1e-3)
        if meas:
            assert r["efficiency"] == pytest.approx(exp / meas, rel=1e-9)
        assert r["costed"] == pytest.approx(meas / total if total else 0.0, rel=1e-9)


def test_above_roof_suspects_name_the_roof_the_ops_were_judged_against():
    import polars as pl

    from traceroof import analyze, read_trace

    r = analyze(read_trace(real("HolisticTraceAnalysis/tests/data/trace_diff/control/control.json.gz")), "a100")
    above = [i for i in r.inconsistencies if i.what.startswith("op above its roof")]
    assert above
    for inc in above:
        ops = r.ops.filter((pl.col("op") == inc.op) | (pl.col("name") == inc.op)).filter(pl.col("efficiency") > 1)
        compute = (ops["bound"].cast(pl.String) == "compute").any()
        # elementwise ops and copies (memory-bound) beat the HBM roof, not a FLOP peak
        bw = f"bandwidth roof: {r.chip.hbm_bytes_per_s / 1e12:.3f} TB/s HBM"  # 2.039 TB/s: --chip a100 is the 80 GB SXM
        assert inc.suspects[0].startswith("peak taken" if compute else bw), inc
