"""Many per-rank traces read in parallel (issue 7 item 3).

A directory, a glob and a list of 16 generated per-rank Kineto traces read with ``jobs=2``
(spawned worker processes) equal a sequential ``jobs=1`` read exactly, on every column and
on the metadata; ranks come out in numeric order whatever the file names' order; a file
that is not a trace is an error naming it (exit 4, one line), while a damaged trace is
recovered and the other ranks kept.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from polars.testing import assert_frame_equal
from tracegen import Kernel, TraceBuilder

from traceroof.cli import cli
from traceroof.errors import InputNotFoundError, TraceFormatError
from traceroof.io import read_trace, resolve_inputs
from traceroof.merge import merge

N = 16


def write_ranks(d: Path, n: int, *, first: int = 0, steps: int = 2, ops: int = 12,
                world: int | None = None) -> list[Path]:
    """``n`` synthetic per-rank traces ``d/rank-R.json.gz`` (R from ``first``), each rank's
    kernels a little longer than the previous rank's (so ranks differ in content)."""
    d.mkdir(parents=True, exist_ok=True)
    out = []
    for r in range(first, first + n):
        b = TraceBuilder(rank=r, world_size=world or first + n)
        for s in range(steps):
            b.begin_step(s)
            for k in range(ops):
                b.op("aten::mm", [[64, 128], [128, 256]], ["c10::BFloat16", "c10::BFloat16"],
                     [Kernel("sm90_xmma_gemm_bf16", 5_000 + 37 * r + 11 * k)])
                b.op("aten::add", [[64, 256], [64, 256]], ["c10::BFloat16", "c10::BFloat16"],
                     [Kernel("vectorized_elementwise_kernel", 1_000 + r)])
            b.end_step()
        out.append(b.write(d / f"rank-{r}.json.gz"))
    return out


def assert_same(a, b) -> None:
    for name in ("ops", "host"):
        assert_frame_equal(getattr(a, name), getattr(b, name), check_exact=True, check_dtypes=True,
                           check_row_order=True, check_column_order=True)
    assert dataclasses.asdict(a.meta) == dataclasses.asdict(b.meta)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("many") / "run"
    write_ranks(d, N)
    return d


@pytest.fixture(scope="module")
def sequential(run_dir):
    return read_trace(run_dir, jobs=1)


def test_sequential_read_is_ordered_by_rank(sequential, run_dir):
    t = sequential
    assert t.meta.ranks == list(range(N))
    # rows grouped by rank in numeric order (file-name order would put rank-10 after rank-1)
    assert t.ops["rank"].unique(maintain_order=True).to_list() == list(range(N))
    assert t.host["rank"].unique(maintain_order=True).to_list() == list(range(N))
    assert t.meta.sources == [str(run_dir / f"rank-{r}.json.gz") for r in range(N)]
    assert t.meta.stats["events"] == sum(read_trace(run_dir / f"rank-{r}.json.gz").meta.stats["events"]
                                         for r in range(N))
    assert t.ops.height == N * 2 * 12 * 2


def test_directory_with_two_jobs_equals_sequential(run_dir, sequential):
    assert_same(read_trace(run_dir, jobs=2), sequential)


def test_glob_with_two_jobs_equals_sequential(run_dir, sequential):
    assert_same(read_trace(str(run_dir / "rank-*.json.gz"), jobs=2), sequential)


def test_order_of_the_inputs_does_not_matter(run_dir, sequential):
    files = [run_dir / f"rank-{r}.json.gz" for r in range(N)]
    assert_same(read_trace(list(reversed(files)), jobs=1), sequential)


def test_glob_subset_and_recursive_glob(run_dir, sequential):
    assert resolve_inputs(str(run_dir / "rank-1?.json.gz")) == [str(run_dir / f"rank-1{r}.json.gz") for r in range(6)]
    assert len(resolve_inputs(str(run_dir.parent / "**" / "*.json.gz"))) == N
    t = read_trace(str(run_dir / "rank-1?.json.gz"), jobs=1)
    assert t.meta.ranks == list(range(10, 16))


def test_glob_matching_nothing_names_the_pattern(run_dir):
    pattern = str(run_dir / "rank-*.xplane.pb")
    with pytest.raises(InputNotFoundError, match="no file matches"):
        read_trace(pattern)
    res = CliRunner().invoke(cli, ["analyze", pattern, "--chip", "h100"])
    assert res.exit_code == 3
    assert res.stderr.strip() == f"traceroof: error: {pattern}: no file matches this pattern"


def _analyze_json(args: list[str]) -> dict:
    res = CliRunner().invoke(cli, ["analyze", *args, "--chip", "h100", "--format", "json", "-q"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    d.pop("created_at", None)
    return d


def test_cli_jobs_2_equals_jobs_1_and_takes_several_paths(run_dir):
    one = _analyze_json([str(run_dir), "--jobs", "1"])
    assert len(one["trace"]["sources"]) == N
    assert _analyze_json([str(run_dir), "--jobs", "2"]) == one
    assert _analyze_json([str(run_dir / "rank-*.json.gz"), "--jobs", "2"]) == one
    files = [str(run_dir / f"rank-{r}.json.gz") for r in range(N)]
    assert _analyze_json([*files, "--jobs", "2"]) == one


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_file_that_is_not_a_trace_names_the_file(tmp_path, jobs):
    write_ranks(tmp_path / "run", 4)
    bad = tmp_path / "run" / "rank-9.json.gz"
    bad.write_bytes(b"this is not gzip and not a trace")
    with pytest.raises(TraceFormatError) as ei:
        read_trace(tmp_path / "run", jobs=int(jobs))
    assert ei.value.path == str(bad)
    res = CliRunner().invoke(cli, ["analyze", str(tmp_path / "run"), "--chip", "h100", "--jobs", jobs])
    assert res.exit_code == TraceFormatError.exit_code == 4
    lines = [x for x in res.stderr.splitlines() if x.strip() and not x.startswith("traceroof: read")]
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith(f"traceroof: error: {bad}: ")
    assert "Traceback" not in res.output


def test_a_json_that_is_not_a_trace_in_a_directory_is_an_error(tmp_path):
    write_ranks(tmp_path / "run", 2)
    (tmp_path / "run" / "config.json").write_text('{"hidden_size": 64}')
    res = CliRunner().invoke(cli, ["analyze", str(tmp_path / "run"), "--chip", "h100", "--jobs", "2", "-q"])
    assert res.exit_code == 4
    assert res.stderr.startswith(f"traceroof: error: {tmp_path / 'run' / 'config.json'}: ")
    # a glob selects the traces and leaves the other file out
    res = CliRunner().invoke(cli, ["analyze", str(tmp_path / "run" / "rank-*.json.gz"), "--chip", "h100", "-q"])
    assert res.exit_code == 0, res.output


def test_a_damaged_trace_is_recovered_and_the_other_ranks_kept(tmp_path):
    files = write_ranks(tmp_path / "run", 3)
    data = gzip.decompress(files[1].read_bytes())
    files[1].write_bytes(gzip.compress(data[: len(data) * 2 // 3]))  # cut mid-event
    t = read_trace(tmp_path / "run", jobs=2)
    assert t.meta.ranks == [0, 1, 2]
    assert any(str(files[1]) in w and "truncated" in w for w in t.meta.warnings), t.meta.warnings
    whole = read_trace(files[0]).ops.height
    assert t.ops.filter(t.ops["rank"] == 1).height < whole
    assert t.ops.filter(t.ops["rank"] == 2).height == whole


def test_a_duplicated_rank_is_renumbered_once_past_the_largest(tmp_path):
    write_ranks(tmp_path / "a", 2)
    # b/rank-0 claims a/rank-0's rank but is another recording (1 s later: no op in common;
    # an exact copy would be read once, tests/test_ranks_multirank.py)
    b = TraceBuilder(rank=0, world_size=1, clock_offset_ns=1_000_000_000)
    b.op("aten::mm", [[64, 128], [128, 256]], ["c10::BFloat16", "c10::BFloat16"], [Kernel("sm90_xmma_gemm_bf16", 5_000)])
    (tmp_path / "b").mkdir()
    b.write(tmp_path / "b" / "rank-0.json.gz")
    t = read_trace([tmp_path / "a", tmp_path / "b"], jobs=1)
    assert t.meta.ranks == [0, 1, 2]
    renumbered = [w for w in t.meta.warnings if "already seen" in w]
    assert renumbered == [f"{tmp_path / 'b' / 'rank-0.json.gz'}: rank 0 already seen; renumbered as rank 2"]
    assert t.ops["rank"].unique(maintain_order=True).to_list() == [0, 2, 1]
    # merge does not depend on the order it is given the traces in
    parts = [read_trace(p) for p in resolve_inputs([tmp_path / "b", tmp_path / "a"])]
    assert_same(merge(parts), t)


def test_tar_of_ranks_still_reads(tmp_path):
    import tarfile

    files = write_ranks(tmp_path / "run", 3)
    tar = tmp_path / "run.tar.gz"
    with tarfile.open(tar, "w:gz") as tf:
        for f in files:
            tf.add(f, arcname=f.name)
    t = read_trace(tar)
    assert t.meta.ranks == [0, 1, 2]
    assert t.ops.height == read_trace(tmp_path / "run", jobs=1).ops.height


def test_copies_are_found_from_the_identities_the_workers_computed(tmp_path):
    from make_multirank import sglang_run

    from traceroof.duplicates import find_copies, op_identities

    run = sglang_run(tmp_path)  # 4 per-rank files and their merged copy
    two = read_trace(tmp_path, jobs=2)  # each file's op identities computed where it was read
    inputs = [read_trace(p, jobs=1) for p in resolve_inputs(tmp_path)]
    here = find_copies(inputs)  # the identities computed here, from the traces themselves
    assert here.skip == [resolve_inputs(tmp_path).index(str(run["merged"]))]  # the merged copy
    given = find_copies(inputs, [op_identities(t, 0) for t in inputs])  # as input 0, renumbered
    assert given == here
    assert [w for w in two.meta.warnings if "a copy" in w] == here.warnings
    assert two.meta.stats["duplicate_device_ops_skipped"] == here.device_ops == 36  # 6 + 8 + 10 + 12 kernels
    assert_frame_equal(two.ops, read_trace(tmp_path, jobs=1).ops)
