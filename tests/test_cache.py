"""The columnar cache (issue 7 item 2): the Parquet cache reads back exactly what a fresh parse gives.

Every real Kineto fixture and the XPlane TPU trace: the tables are equal on every column
(dtype, row order and values exactly), the metadata is equal, and ``analyze DIR`` prints
the same JSON report as ``analyze TRACE``. A missing fixture fails (``real()`` raises).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from polars.testing import assert_frame_equal

from traceroof.cache import CACHE_VERSION, read_cache
from traceroof.cli import cli
from traceroof.costing import apply_costs, compute_costs, cost_model_id
from traceroof.errors import TraceFormatError
from traceroof.ingest import write_cache
from traceroof.io import read_trace

REAL = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "real"
XPLANE_TPU = "xprof/xprof/convert/test_xplanes/tpu_inference_2.xplane.pb"

#: the real Kineto corpus (28 files + the dlrm tar.gz); listed, so a missing file fails
KINETO = [
    "HolisticTraceAnalysis/tests/data/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "HolisticTraceAnalysis/tests/data/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
    "HolisticTraceAnalysis/tests/data/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz",
    "HolisticTraceAnalysis/tests/data/critical_path/cuda_event_sync_multi_stream/event_sync_trace.json.gz",
    "HolisticTraceAnalysis/tests/data/cupti_profiler/benchmark_result_924719_1679055439_trace.json.gz",
    "HolisticTraceAnalysis/tests/data/distributed_info_unavailable/distributed_info_not_found.json.gz",
    "HolisticTraceAnalysis/tests/data/large_integer_trace/rank-70.Mar_25_20_48_12.2861.pt.trace.json.gz",
    "HolisticTraceAnalysis/tests/data/mtia_inference_trace/mtia_inference_rank_0.json.gz",
    "HolisticTraceAnalysis/tests/data/nccl_parser_config/nccl_data.json.gz",
    "HolisticTraceAnalysis/tests/data/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
    "HolisticTraceAnalysis/tests/data/trace_diff/control/control.json.gz",
    "HolisticTraceAnalysis/tests/data/trace_diff/test/test.json.gz",
    "HolisticTraceAnalysis/tests/data/trace_file_list/inference_rank_1.json.gz",
    "HolisticTraceAnalysis/tests/data/trace_filter/sampled_rank-0.json.gz",
    "HolisticTraceAnalysis/tests/data/trace_filter/sampled_rank-1.json.gz",
    "HolisticTraceAnalysis/tests/data/triton_example/triton_example.json.gz",
    "HolisticTraceAnalysis/tests/data/with_gpu_user_annotation/step_based_trace_2543932.json.gz",
    "TraceLens/tests/traces/b200/eager_trace.json.gz",
    "TraceLens/tests/traces/h100/Falconsai_nsfw_image_detection__1016002.json.gz",
    "TraceLens/tests/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
    "TraceLens/tests/traces/h100/gaunernst_bert-small-uncased__1016001.json.gz",
    "TraceLens/tests/traces/inference/sglang_decode/sglang_Qwen3-8B_decode.json.gz",
    "TraceLens/tests/traces/inference/vllm_decode_full/graph_execution.json.gz",
    "TraceLens/tests/traces/mi300/ddp_resnet18_no_pool/train_resnet18.json.gz",
    "TraceLens/tests/traces/perf_model/normalization/normalization_layer_test.json.gz",
    "TraceLens/tests/traces/torch_compile_triton/trace.json.gz",
    "kineto/tb_plugin/samples/resnet50_num_workers_0/worker0.pt.trace.json.gz",
    "kineto/tb_plugin/test/gpu_metrics_input.json",
    "param/et_replay/tests/inputs/dlrm_kineto.tar.gz",
]
ALL = KINETO + [XPLANE_TPU]


def fixture(rel: str) -> Path:
    p = REAL / rel
    if not p.exists():
        raise FileNotFoundError(f"real fixture missing: {p} (CI must have ../shared beside the checkout)")
    return p


def test_the_listed_corpus_is_every_real_kineto_fixture():
    found = sorted(
        str(p.relative_to(REAL)) for p in REAL.rglob("*")
        if p.is_file() and p.name.endswith((".json", ".json.gz", ".tar.gz")) and "integration_tests" not in str(p)
    )
    assert found == sorted(KINETO)


def assert_same_trace(a, b) -> None:
    for name in ("ops", "host"):
        assert_frame_equal(getattr(a, name), getattr(b, name), check_exact=True, check_dtypes=True,
                           check_row_order=True, check_column_order=True)
    assert dataclasses.asdict(a.meta) == dataclasses.asdict(b.meta)
    assert a.meta == b.meta


@pytest.mark.parametrize("rel", ALL)
def test_cache_round_trip_is_exact(rel, tmp_path):
    fresh = read_trace(fixture(rel))
    out = write_cache(fresh, tmp_path / "c")
    doc = json.loads((out / "meta.json").read_text())
    assert doc["cache_version"] == CACHE_VERSION and doc["format"] == "traceroof-cache"
    ranks = sorted({int(r) for r in fresh.ops["rank"].unique().drop_nulls()})
    for r in ranks:
        assert (out / "ops" / f"rank={r}" / "part.parquet").is_file()
    cached = read_cache(out)
    assert_same_trace(fresh, cached)
    assert_same_trace(fresh, read_trace(out))  # read_trace dispatches to the cache
    assert_same_costs(cached, fresh)


def assert_same_costs(cached, fresh) -> None:
    """The costs stored at ingest are what the costing of a fresh parse computes, exactly."""
    assert cached.stored_costs is not None and cached.stored_costs.model_id == cost_model_id()
    ops_c, cov_c = apply_costs(cached)
    ops_f, cov_f = compute_costs(fresh)
    assert_frame_equal(ops_c, ops_f, check_exact=True, check_dtypes=True, check_row_order=True)
    assert cov_c == cov_f


def _analyze_json(path: str, chip: list[str]) -> tuple[int, dict | str]:
    res = CliRunner().invoke(cli, ["analyze", path, "--format", "json", "-q", *chip])
    if res.exit_code != 0:
        return res.exit_code, res.output
    d = json.loads(res.stdout)
    d.pop("created_at", None)
    tr = d.get("trace")
    if isinstance(tr, dict):
        tr.pop("sources", None)
    d.pop("sources", None)
    # Reports are reproducible (every ranking and mode has a tie-breaker), so the JSON of the
    # cache's report must equal the fresh parse's exactly, ties and all.
    return 0, d


@pytest.mark.parametrize("rel", ALL)
def test_analyze_cache_dir_equals_analyze_trace(rel, tmp_path):
    src = fixture(rel)
    res = CliRunner().invoke(cli, ["ingest", str(src), "-o", str(tmp_path / "c")])
    assert res.exit_code == 0, res.output
    assert "meta.json" in res.output and "ops" in res.output
    chip = [] if rel == XPLANE_TPU else ["--chip", "h100"]
    code_trace, out_trace = _analyze_json(str(src), chip)
    code_cache, out_cache = _analyze_json(str(tmp_path / "c"), chip)
    assert code_trace == 0, out_trace
    assert code_cache == code_trace, out_cache
    # compared as canonical JSON text: NaN equals NaN, every other value exactly
    a = json.dumps(out_trace, sort_keys=True, indent=0).splitlines()
    b = json.dumps(out_cache, sort_keys=True, indent=0).splitlines()
    assert a == b, "\n".join(difflib.unified_diff(a, b, "trace", "cache", n=1, lineterm=""))[:3000]


def test_ingest_several_traces_writes_a_dataset_that_merges_ranks(tmp_path):
    a = fixture("HolisticTraceAnalysis/tests/data/trace_filter/sampled_rank-0.json.gz")
    b = fixture("HolisticTraceAnalysis/tests/data/trace_filter/sampled_rank-1.json.gz")
    res = CliRunner().invoke(cli, ["ingest", str(a), str(b), "-o", str(tmp_path / "c")])
    assert res.exit_code == 0, res.output
    assert "(dataset)" in res.output
    for r in (0, 1):
        assert len(list((tmp_path / "c" / "ops" / f"rank={r}").glob("part-*.parquet"))) == 1
    assert len(list((tmp_path / "c" / "meta").glob("*.json"))) == 2
    doc = json.loads((tmp_path / "c" / "meta.json").read_text())
    assert doc["cache_version"] == 2 and doc["layout"] == "dataset"
    assert doc["source_paths"] == [str(a), str(b)]
    t = read_cache(tmp_path / "c")
    assert t.meta.ranks == [0, 1]
    assert_same_trace(t, read_trace([a, b], jobs=1))


def test_a_version_1_cache_still_reads(tmp_path):
    """The single-cache layout is unchanged: cache_version 1, read by read_cache as before."""
    assert CACHE_VERSION == 1
    src = fixture(KINETO[0])
    out = write_cache(read_trace(src), tmp_path / "c")
    doc = json.loads((out / "meta.json").read_text())
    assert doc["cache_version"] == 1 and "fragments" not in doc
    assert not (out / "meta").exists()
    assert_same_trace(read_cache(out), read_trace(src))


def _one_error_line(res) -> str:
    err = res.stderr if hasattr(res, "stderr") else res.output
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("traceroof: error:") and "Traceback" not in res.output
    return lines[0]


@pytest.fixture
def cache_dir(tmp_path) -> Path:
    return write_cache(read_trace(fixture(KINETO[0])), tmp_path / "c")


def test_corrupted_meta_json_exits_4_with_one_line(cache_dir):
    (cache_dir / "meta.json").write_text('{"format": "traceroof-cache", "cache_ver')
    res = CliRunner().invoke(cli, ["analyze", str(cache_dir), "--chip", "h100"])
    assert res.exit_code == 4
    assert "meta.json" in _one_error_line(res)


def test_unknown_cache_version_exits_4(cache_dir):
    doc = json.loads((cache_dir / "meta.json").read_text())
    doc["cache_version"] = 999
    (cache_dir / "meta.json").write_text(json.dumps(doc))
    res = CliRunner().invoke(cli, ["analyze", str(cache_dir), "--chip", "h100"])
    assert res.exit_code == 4
    line = _one_error_line(res)
    assert "meta.json" in line and "999" in line and "1 or 2" in line


def test_damaged_parquet_part_names_the_file(cache_dir):
    part = cache_dir / "ops" / "rank=0" / "part.parquet"
    part.write_bytes(b"not parquet at all")
    with pytest.raises(TraceFormatError, match="part.parquet"):
        read_cache(cache_dir)
    res = CliRunner().invoke(cli, ["analyze", str(cache_dir), "--chip", "h100"])
    assert res.exit_code == 4
    assert "part.parquet" in _one_error_line(res)


def test_ingest_refuses_a_non_cache_directory(tmp_path):
    (tmp_path / "keep.txt").write_text("x")
    res = CliRunner().invoke(cli, ["ingest", str(fixture(KINETO[0])), "-o", str(tmp_path)])
    assert res.exit_code == 2
    assert (tmp_path / "keep.txt").exists()


def test_ingest_replaces_an_earlier_cache(cache_dir):
    res = CliRunner().invoke(cli, ["ingest", str(fixture(XPLANE_TPU)), "-o", str(cache_dir)])
    assert res.exit_code == 0, res.output
    assert read_cache(cache_dir).meta.format == "xplane"
    assert not (cache_dir / "ops" / "rank=0" / "part.parquet").read_bytes() == b""


# -- the dataset layout (issue 7 item 5): ingest_file per file, finalize, read back ----------

SAMPLED = [
    "HolisticTraceAnalysis/tests/data/trace_filter/sampled_rank-0.json.gz",
    "HolisticTraceAnalysis/tests/data/trace_filter/sampled_rank-1.json.gz",
]
CPU_ONLY = "HolisticTraceAnalysis/tests/data/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"


@pytest.fixture
def dataset(tmp_path) -> tuple[Path, list[str]]:
    from traceroof.ingest import ingest_file

    files = [str(fixture(r)) for r in SAMPLED]
    for f in files:
        ingest_file(f, tmp_path / "ds")
    return tmp_path / "ds", files


def test_dataset_reads_back_as_read_trace_of_its_files(dataset):
    from traceroof.cache import is_cache
    from traceroof.ingest import finalize

    out, files = dataset
    assert is_cache(out)
    ref = read_trace(files, jobs=1)
    assert_same_trace(read_cache(out), ref)
    # each fragment stored its own rank's costs and coverage; merged, they are the whole's
    assert_same_costs(read_cache(out), ref)
    finalize(out, source_paths=["x"])
    doc = json.loads((out / "meta.json").read_text())
    assert doc["source_paths"] == ["x"] and doc["meta"]["sources"] == files
    assert_same_trace(read_trace(out), ref)


def test_dataset_with_an_empty_op_table(tmp_path):
    from traceroof.ingest import ingest_file

    files = [str(fixture(CPU_ONLY)), str(fixture(SAMPLED[0]))]
    for f in files:
        ingest_file(f, tmp_path / "ds")
    cpu = read_trace(files[0])
    assert cpu.ops.height == 0
    assert_same_trace(read_cache(tmp_path / "ds"), read_trace(files, jobs=1))


def test_ingest_file_again_replaces_its_own_parts(dataset):
    from traceroof.ingest import ingest_file

    out, files = dataset
    before = sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())
    again = ingest_file(files[0], out)
    after = sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())
    assert before == after and all(p.is_file() for p in again)
    assert_same_trace(read_cache(out), read_trace(files, jobs=1))


def test_same_file_name_in_two_folders_does_not_collide(tmp_path):
    import shutil

    from traceroof.ingest import fragment_key, ingest_file

    src = fixture(SAMPLED[0])
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, b = shutil.copy(src, tmp_path / "a" / "t.json.gz"), shutil.copy(src, tmp_path / "b" / "t.json.gz")
    assert fragment_key(a) != fragment_key(b) and fragment_key(a).startswith("t-")
    ingest_file(a, tmp_path / "ds")
    ingest_file(b, tmp_path / "ds")
    t = read_cache(tmp_path / "ds")
    assert len(list((tmp_path / "ds" / "meta").glob("*.json"))) == 2
    # b is a copy of a: read once (traceroof.duplicates), as read_trace reads them
    assert t.meta.ranks == [0] and t.meta.sources == [str(a)]
    assert any(w.startswith(f"{b}: skipped, a copy") for w in t.meta.warnings)
    assert_same_trace(t, read_trace([a, b], jobs=1))


def test_ingest_file_after_finalize_drops_the_stale_manifest(dataset, tmp_path):
    from traceroof.ingest import finalize, ingest_file

    out, files = dataset
    finalize(out)
    extra = tmp_path / "rank-7.json.gz"
    import shutil

    shutil.copy(fixture(SAMPLED[0]), extra)
    ingest_file(extra, out)
    assert not (out / "meta.json").exists()
    t = read_cache(out)
    # the new fragment is read: extra is a copy of files[0], so one of the two is left out
    # (traceroof.duplicates: the last by path), as read_trace leaves it out
    assert sorted(t.meta.sources) == sorted([files[1], min(files[0], str(extra))])
    assert t.meta.stats["duplicate_inputs_skipped"] == 1
    assert_same_trace(t, read_trace([*files, str(extra)], jobs=1))


def test_finalized_dataset_missing_a_fragment_exits_4_naming_it(dataset):
    from traceroof.ingest import finalize

    out, _ = dataset
    finalize(out)
    gone = sorted((out / "meta").glob("*.json"))[0]
    gone.unlink()
    res = CliRunner().invoke(cli, ["analyze", str(out), "--chip", "h100"])
    assert res.exit_code == 4
    assert gone.name in _one_error_line(res)


def test_damaged_fragment_exits_4_naming_it(dataset):
    out, _ = dataset
    frag = sorted((out / "meta").glob("*.json"))[1]
    frag.write_text('{"format": "traceroof-fragm')
    res = CliRunner().invoke(cli, ["analyze", str(out), "--chip", "h100"])
    assert res.exit_code == 4
    assert str(frag) in _one_error_line(res)


def test_missing_dataset_part_exits_4_naming_it(dataset):
    from traceroof.ingest import finalize

    out, _ = dataset
    part = next((out / "ops" / "rank=1").glob("part-*.parquet"))
    part.unlink()
    with pytest.raises(TraceFormatError, match=part.name):
        finalize(out)
    res = CliRunner().invoke(cli, ["analyze", str(out), "--chip", "h100"])
    assert res.exit_code == 4
    assert part.name in _one_error_line(res)


def test_ingest_file_refuses_a_single_cache(cache_dir):
    from traceroof.errors import UsageError
    from traceroof.ingest import ingest_file

    with pytest.raises(UsageError, match="single-trace cache"):
        ingest_file(fixture(SAMPLED[0]), cache_dir)
    assert not (cache_dir / "meta").exists()


def test_write_cache_replaces_a_dataset(dataset):
    out, _ = dataset
    write_cache(read_trace(fixture(KINETO[0])), out)
    assert not (out / "meta").exists()
    assert json.loads((out / "meta.json").read_text())["cache_version"] == 1
    assert_same_trace(read_cache(out), read_trace(fixture(KINETO[0])))


def test_costs_of_another_cost_model_are_computed_again(cache_dir, monkeypatch):
    """A cache ingested by a different cost model (another traceroof) is costed afresh."""
    import traceroof.costing as costing

    calls = []
    real = costing.compute_costs
    monkeypatch.setattr(costing, "compute_costs", lambda t: calls.append(1) or real(t))
    apply_costs(read_cache(cache_dir))
    assert calls == []  # the stored costs were used
    doc = json.loads((cache_dir / "meta.json").read_text())
    doc["costs"]["model_id"] = "0" * 16
    (cache_dir / "meta.json").write_text(json.dumps(doc))
    t = read_cache(cache_dir)
    ops, cov = apply_costs(t)
    assert calls == [1]
    assert_frame_equal(ops, real(read_trace(fixture(KINETO[0])))[0], check_exact=True)


def test_stored_costs_are_not_used_for_a_replaced_op_table(cache_dir):
    import polars as pl

    t = read_cache(cache_dir)
    assert t.stored_costs is not None
    t.ops = t.ops.filter(pl.col("dur_ns") > 0)
    assert t.stored_costs is None  # they belonged to the old table
    ops, cov = apply_costs(t)  # costed afresh
    assert_frame_equal(ops, compute_costs(t)[0], check_exact=True)
    assert cov.device_ns == int(t.ops["dur_ns"].sum())


def test_a_damaged_costs_entry_exits_4_naming_the_file(cache_dir):
    doc = json.loads((cache_dir / "meta.json").read_text())
    doc["costs"]["coverage"] = {"device_ns": "x"}
    (cache_dir / "meta.json").write_text(json.dumps(doc))
    res = CliRunner().invoke(cli, ["analyze", str(cache_dir), "--chip", "h100"])
    assert res.exit_code == 4
    line = _one_error_line(res)
    assert "meta.json" in line and "costs" in line


def test_a_cache_without_costs_still_reads_and_is_costed(cache_dir):
    """A cache written before costs were stored (no __cost_ columns, no entry) reads as before."""
    import polars as pl

    for f in (cache_dir / "ops").rglob("*.parquet"):
        pl.read_parquet(f).select(pl.exclude("^__cost_.*$")).write_parquet(f)
    doc = json.loads((cache_dir / "meta.json").read_text())
    del doc["costs"]
    for entry in doc["tables"].values():
        del entry["crc32"]  # nor the parts' CRC-32s (the parts were rewritten above)
    (cache_dir / "meta.json").write_text(json.dumps(doc))
    t = read_cache(cache_dir)
    fresh = read_trace(fixture(KINETO[0]))
    assert t.stored_costs is None
    assert_same_trace(t, fresh)
    assert_frame_equal(apply_costs(t)[0], compute_costs(fresh)[0], check_exact=True)


def test_stored_costs_are_used_without_costing_again(cache_dir, monkeypatch):
    """Re-analysis of a cache takes its stored costs as data: the costing does not run."""
    import traceroof.costing as C

    t = read_cache(cache_dir)
    assert t.stored_costs is not None and t.stored_costs.columns.height == t.ops.height

    def boom(trace):
        raise AssertionError("costed again although stored costs were there")

    monkeypatch.setattr(C, "compute_costs", boom)
    ops, cov = C.apply_costs(t)
    assert ops.height == t.ops.height and cov.device_ns == int(t.ops["dur_ns"].sum())
