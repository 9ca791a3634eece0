"""The per-rank half of the analysis done by the processes that read the ranks (issue 19 item 4).

``analyze`` of a folder of per-rank files takes the eager match of unlaunched kernels and the
costing from the workers (``traceroof.rank_prep``) instead of doing them on the merged trace.
The oracle of every test here is the analysis doing them itself on the same merged trace
(``read_trace(..., prepare=False)``, the path every single-file input takes): the two reports
must be equal whole, and ``--jobs 1`` must equal ``--jobs 2``. Each test also checks that the
prepared path was taken (else it would compare the old path with itself), and the lent ids and
counts against the generated layout, counted by hand.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner
from conftest import real
from make_multirank import rank_builder, sglang_run
from make_unlaunched_ranks import write as write_unlaunched
from polars.testing import assert_frame_equal

from traceroof import analyze, read_trace
from traceroof.cli import cli
from traceroof.rank_prep import Prepared


def report_json(trace, chip: str = "h100") -> dict:
    """The report as the CLI's ``--format json`` writes it (``created_at`` left out)."""
    d = json.loads(analyze(trace, chip).to_json(include_ops=True))
    d.pop("created_at", None)
    return d


def cli_json(path: Path | str, jobs: int, chip: str = "h100") -> dict:
    """The full report ``analyze -o report.json`` writes (with the op table)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.json"
        res = CliRunner().invoke(cli, ["analyze", str(path), "--chip", chip, "-o", str(out), "-q",
                                       "--jobs", str(jobs)])
        assert res.exit_code == 0, res.output
        d = json.loads(out.read_text())
    d.pop("created_at", None)
    return d


def assert_prepared_equals_fresh(path: Path | str, chip: str = "h100") -> dict:
    """The report of ``path`` with the workers' per-rank stages equals the one without, and
    ``--jobs 2`` equals ``--jobs 1``; returns the report."""
    prepared = read_trace(path, jobs=1, prepare=True)
    assert isinstance(prepared.prepared, Prepared), "the per-rank stages were not done by the readers"
    fresh = read_trace(path, jobs=1)
    assert fresh.prepared is None
    want = report_json(fresh, chip)
    assert report_json(prepared, chip) == want
    one = cli_json(path, 1, chip)
    assert cli_json(path, 2, chip) == one
    assert one == want
    return want


@pytest.fixture(scope="module")
def unlaunched_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("unlaunched") / "run"
    write_unlaunched(d)
    return d


def test_unlaunched_kernels_of_every_rank_are_matched_as_on_the_merged_trace(unlaunched_dir):
    r = assert_prepared_equals_fresh(unlaunched_dir)
    u = r["coverage"]["unlaunched"]
    # by hand from LAYOUT: ranks 0, 1, 3 keep 4 unlaunched kernels (a run of 4: matched), rank 2
    # keeps 3 (under MIN_RUN = 4: not matched)
    assert (u["kernels"], u["kernels_matched"], u["method"]) == (4 + 4 + 3 + 4, 12, "eager_match")


def test_lent_ids_count_down_rank_after_rank_as_one_match_over_the_merge(unlaunched_dir):
    t = read_trace(unlaunched_dir, jobs=2, prepare=True)
    ops = t.prepared.ops
    lent = ops.filter(pl.col("external_id") < 0).sort("rank", "start_ns")
    # every matched kernel is one op instance (one kernel per op): ids -1, -2, ... in rank order,
    # 4 per matched rank (ranks 0, 1, 3; rank 2's run is too short), the Kineto ids all positive
    assert lent["external_id"].to_list() == list(range(-1, -13, -1))
    assert lent["rank"].to_list() == [0] * 4 + [1] * 4 + [3] * 4
    # the host rows to cost them by are under the same ids, on the same ranks
    rows = t.prepared.shape_rows.sort("external_id", descending=True)
    assert rows.select("rank", "external_id").rows() == lent.select("rank", "external_id").rows()


def test_the_prepared_tables_are_the_merged_ones(unlaunched_dir):
    t = read_trace(unlaunched_dir, jobs=2, prepare=True)
    # the prepared op table is the trace's, row for row, but for the lent op and External id
    assert_frame_equal(t.prepared.ops.drop("op", "external_id"), t.ops.drop("op", "external_id"))
    changed = t.prepared.ops["external_id"].ne_missing(t.ops["external_id"])
    assert int(changed.sum()) == 12  # the matched kernels, and only they (hand count above)


def test_ranks_renumbered_by_the_merge_keep_their_lent_ids_in_rank_order(tmp_path):
    # two files claiming rank 0: the second is renumbered past the largest rank (2 → rank 3)
    write_unlaunched(tmp_path / "a", [(4, 2), (4, 2), (4, 3)])
    (tmp_path / "a" / "rank-2.json").rename(tmp_path / "a" / "rank-2-as-0.json")
    doc = json.loads((tmp_path / "a" / "rank-2-as-0.json").read_text())
    doc["distributedInfo"]["rank"] = 0
    (tmp_path / "a" / "rank-2-as-0.json").write_text(json.dumps(doc))
    r = assert_prepared_equals_fresh(tmp_path / "a")
    assert r["trace"]["ranks"] == [0, 1, 2]
    t = read_trace(tmp_path / "a", jobs=2, prepare=True)
    lent = t.prepared.ops.filter(pl.col("external_id") < 0).sort("external_id", descending=True)
    assert lent["rank"].to_list() == [0] * 4 + [1] * 4 + [2] * 4


def test_generated_multirank_layouts_equal_with_one_and_two_jobs(tmp_path):
    # per-rank files with their SGLang merged copy: the copy is left out, the ranks prepared
    sglang_run(tmp_path / "sg", tp=2, pp=2)
    r = assert_prepared_equals_fresh(tmp_path / "sg")
    assert len(r["trace"]["ranks"]) == 4
    # a folder of per-rank builders of make_multirank (ranks issue different ops)
    d = tmp_path / "ranks"
    d.mkdir()
    for rank in range(3):
        rank_builder(rank).write(d / f"rank-{rank}.json.gz")
    assert_prepared_equals_fresh(d)


def test_a_merged_file_of_several_ranks_is_analysed_by_the_parent(tmp_path):
    # SGLang's merged copy alone holds 4 ranks: not preparable, the parent does the stages
    sglang_run(tmp_path / "sg", tp=2, pp=2)
    merged = next((tmp_path / "sg").glob("merged-*"))
    other = tmp_path / "other"
    other.mkdir()
    rank_builder(0).write(other / "rank-9.json.gz")
    t = read_trace([merged, other / "rank-9.json.gz"], jobs=2, prepare=True)
    assert t.prepared is None
    assert read_trace(merged, prepare=True).prepared is None  # one input: never prepared


def test_real_hta_two_ranks_equal_prepared_or_not():
    d = real("HolisticTraceAnalysis", "tests", "data", "trace_filter")
    r = assert_prepared_equals_fresh(d, chip="a100")
    assert len(r["trace"]["sources"]) == 2


def test_real_dlrm_ranks_as_a_folder_equal_the_tar(tmp_path):
    tar = real("param", "et_replay", "tests", "inputs", "dlrm_kineto.tar.gz")
    with tarfile.open(tar) as tf:
        members = [m for m in tf.getmembers() if m.isfile() and m.name.endswith((".json", ".json.gz"))]
        tf.extractall(tmp_path / "dlrm", members=members, filter="data")
    assert len(members) >= 2
    folder = assert_prepared_equals_fresh(tmp_path / "dlrm", chip="a100")
    whole = read_trace(tar)  # the tar is one input: its members merged in this process
    want = report_json(whole, "a100")
    for r in (want, folder):  # the inputs are named differently; all else is the same
        r["trace"].pop("sources")
        r["trace"]["stats"] = {k: v for k, v in r["trace"]["stats"].items() if "tar" not in k}
    assert folder == want


def test_a_trace_whose_tables_are_replaced_drops_what_was_prepared(unlaunched_dir):
    t = read_trace(unlaunched_dir, jobs=1, prepare=True)
    assert t.prepared is not None
    t.host = t.host.head(10)
    assert t.prepared is None  # the analysis then does the stages itself, on the new tables


def test_ranks_costed_with_another_world_size_are_costed_again_by_the_parent(tmp_path):
    # rank 1's header has no distributedInfo.world_size: it was costed with None, the merged
    # trace has rank 0's 2 (collectives' group size), so the parent costs the merged table
    write_unlaunched(tmp_path / "w", [(4, 2), (4, 2)])
    doc = json.loads((tmp_path / "w" / "rank-1.json").read_text())
    del doc["distributedInfo"]["world_size"]
    (tmp_path / "w" / "rank-1.json").write_text(json.dumps(doc))
    t = read_trace(tmp_path / "w", jobs=2, prepare=True)
    assert t.meta.world_size == 2
    assert t.prepared is None
    assert report_json(t) == report_json(read_trace(tmp_path / "w", jobs=1))
