"""Oracle: xprof's own converter (hlo_stats tool) on the TPU v6e profile must report the same
per-HLO-op occurrences, time, FLOPs and bytes as traceroof's op table."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import polars as pl
import pytest

from traceroof.parsers import xplane

REAL = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "real"
TPU = REAL / "xprof/xprof/convert/test_xplanes/tpu_inference_2.xplane.pb"


def _hlo_stats(path: Path) -> list[dict]:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    raw = pytest.importorskip("xprof.convert.raw_to_tool_data")
    data, _ctype = raw.xspace_to_tool_data([str(path)], "hlo_stats", {})
    table = json.loads(data)
    ids = [c["id"] for c in table["cols"]]
    return [dict(zip(ids, [c.get("v") for c in row["c"]])) for row in table["rows"]]


def test_tpu_per_op_matches_xprof_hlo_stats(tmp_path):
    assert TPU.exists(), f"fixture missing: {TPU}"
    copy = tmp_path / TPU.name  # the converter writes cache files beside its input
    shutil.copyfile(TPU, copy)
    rows = _hlo_stats(copy)
    assert len(rows) == 17
    ours = xplane.read(TPU).ops.group_by("name").agg(
        pl.len().alias("n"), pl.col("dur_ns").sum(), pl.col("flops").sum(), pl.col("bytes").sum(),
        pl.col("program_id").first(), pl.col("hlo_category").first())
    ours = {r["name"]: r for r in ours.iter_rows(named=True)}
    assert set(ours) == {r["hlo_op_name"] for r in rows}
    for r in rows:
        o = ours[r["hlo_op_name"]]
        n = int(r["occurrences"])
        assert o["n"] == n
        assert str(o["program_id"]) == r["program_id"]
        assert o["hlo_category"] == r["category"]
        # total time: xprof in us (float); ours ns floor-images of ps intervals, so within
        # 1 ns per occurrence
        xprof_ns = r["total_time"] * 1e3
        assert abs(o["dur_ns"] - xprof_ns) <= n, r["hlo_op_name"]
        # FLOPs: model_flop_rate [GFLOP/s] * total_time [us] * 1e3
        xprof_flops = r["model_flop_rate"] * r["total_time"] * 1e3
        assert o["flops"] == pytest.approx(xprof_flops, rel=1e-9, abs=1e-3)
        # bytes: measured_memory_bw [GiB/s] * total_time [us] * 2**30 / 1e6
        xprof_bytes = r["measured_memory_bw"] * r["total_time"] * 2**30 / 1e6
        assert o["bytes"] == pytest.approx(xprof_bytes, rel=1e-9)
    # the non-trivial part: at least the fusions carry real FLOPs
    assert sum(ours[k]["flops"] for k in ours if "fusion" in k) == 3 * 400 * 1342177280
