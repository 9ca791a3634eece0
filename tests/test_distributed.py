"""Ingest on a Dask cluster (issue 7 item 5): independent workers write one dataset.

A local Dask cluster (2 worker processes) runs ``client.map(ingest_file, paths,
out_dir=...)`` over real per-rank traces (HolisticTraceAnalysis ``trace_filter``) and
generated ones; the dataset read back, before and after ``finalize``, equals ``read_trace``
of the same files exactly on every column and on the metadata. A missing fixture or a
missing ``distributed`` package fails the test (it never skips): ``pip install -e '.[test]'``.
"""

from __future__ import annotations

import json
import logging
import os
import time

import pytest
from click.testing import CliRunner
from conftest import real
from distributed import Client, LocalCluster
from test_many_ranks import assert_same, write_ranks

from traceroof.cache import read_cache
from traceroof.cli import cli
from traceroof.errors import TraceFormatError
from traceroof.ingest import finalize, fragment_key, ingest_file
from traceroof.io import read_trace

HTA = ("HolisticTraceAnalysis", "tests", "data", "trace_filter")


@pytest.fixture(scope="module")
def client():
    t0 = time.perf_counter()
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                      silence_logs=logging.ERROR) as cluster, Client(cluster) as c:
        c.wait_for_workers(2, timeout=60)
        print(f"dask LocalCluster up in {time.perf_counter() - t0:.1f} s")
        yield c


def test_dask_ingest_equals_read_trace(client, tmp_path):
    files = [str(real(*HTA, "sampled_rank-0.json.gz")), str(real(*HTA, "sampled_rank-1.json.gz"))]
    files += [str(f) for f in write_ranks(tmp_path / "gen", 6, first=2, world=8)]
    out = tmp_path / "dataset"

    # the workers are other processes than this one
    pids = client.run(os.getpid)
    assert len(pids) == 2 and os.getpid() not in pids.values()

    written = client.gather(client.map(ingest_file, files, out_dir=str(out)))
    assert len(written) == len(files)
    for f, paths in zip(files, written):
        key = fragment_key(f)
        assert paths[-1] == out / "meta" / f"{key}.json"
        assert all(p.is_file() for p in paths)
        assert any(p.parts[-3] == "ops" and p.name == f"part-{key}.parquet" for p in paths)
    assert not (out / "meta.json").exists()  # the workers wrote no shared file

    ref = read_trace(files, jobs=1)
    assert ref.meta.ranks == list(range(8))
    assert_same(read_cache(out), ref)  # before finalize: from the fragments

    finalize(out)
    doc = json.loads((out / "meta.json").read_text())
    assert doc["cache_version"] == 2 and len(doc["fragments"]) == len(files)
    assert doc["tables"]["ops"]["rows"] == ref.ops.height
    assert doc["meta"]["ranks"] == ref.meta.ranks and doc["meta"]["stats"] == ref.meta.stats
    assert_same(read_trace(out), ref)  # after: through the manifest

    res = CliRunner().invoke(cli, ["analyze", str(out), "--chip", "h100", "--format", "json", "-q"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["trace"]["sources"] == ref.meta.sources


def test_a_bad_file_on_a_dask_worker_raises_naming_it(client, tmp_path):
    bad = tmp_path / "rank-3.json.gz"
    bad.write_bytes(b"not a trace")
    fut = client.submit(ingest_file, str(bad), out_dir=str(tmp_path / "ds"))
    with pytest.raises(TraceFormatError) as ei:
        fut.result()
    assert ei.value.path == str(bad) and ei.value.exit_code == 4
    assert str(ei.value).startswith(f"{bad}: byte 0: ")
    assert not (tmp_path / "ds" / "meta").exists()
