"""kineto_link's lower-peak formulations against the old ones (kept here as oracles): the
column-at-a-time gather by an integer sort key against ``DataFrame.sort`` (ties included),
and the steps put in row order by their key against the old join and full-table sort."""

from __future__ import annotations

import random

import polars as pl
import pytest
from conftest import FIXTURES, real
from polars.testing import assert_frame_equal

from traceroof.io import read_trace
from traceroof.parsers import kineto_link
from traceroof.schema import OP_SCHEMA
from traceroof.step_markers import device_and_host_windows


@pytest.mark.parametrize("at_once_bytes", [0, kineto_link.GATHER_AT_ONCE_BYTES], ids=["by-column", "at-once"])
def test_gather_by_column_equals_a_full_sort_with_ties(at_once_bytes, monkeypatch):
    """Both ways of gathering (a column at a time; a small frame, every frame here, in one
    operation) give the frame ``DataFrame.sort`` gives."""
    monkeypatch.setattr(kineto_link, "GATHER_AT_ONCE_BYTES", at_once_bytes)
    rng = random.Random(5)
    for _ in range(30):
        n = rng.randint(0, 3000)
        df = pl.DataFrame({"device": [rng.randrange(3) for _ in range(n)],
                           "stream": [rng.choice([7, 8, None]) for _ in range(n)],
                           "start_ns": [rng.randrange(40) for _ in range(n)],  # many ties
                           "name": [f"k{rng.randrange(9)}" for _ in range(n)], "i": list(range(n))},
                          schema_overrides={"device": pl.Int32, "stream": pl.Int64})
        want = df.sort(["device", "stream", "start_ns"])
        got = kineto_link._gather_by_column([df], df.select(pl.arg_sort_by(["device", "stream", "start_ns"]))[:, 0])
        assert_frame_equal(got, want, check_exact=True)
    box = [df]
    kineto_link._gather_by_column(box, pl.Series([], dtype=pl.UInt32).append(pl.Series(range(df.height),
                                                                                        dtype=pl.UInt32)))
    assert box == []  # the source frame was handed over


def _old_assign_steps(ops: pl.DataFrame, host: pl.DataFrame) -> pl.DataFrame:
    """assign_steps as it was (commit fa36e88): the steps joined back, then every column sorted."""
    gpu_steps, cpu_steps = device_and_host_windows(host)
    if cpu_steps.height == 0:
        return ops
    ops = ops.with_row_index("_row")

    def lookup(times, steps):
        s = steps.select(pl.col("start_ns").alias("_t"), "step", "end_ns")
        j = times.sort("_t").join_asof(s, on="_t", strategy="backward")
        return j.with_columns(pl.when(pl.col("_t") < pl.col("end_ns")).then(pl.col("step")).alias("step")).select(
            "_row", "step")

    t_launch = ops.filter(pl.col("launch_start_ns").is_not_null()).select("_row", pl.col("launch_start_ns").alias("_t"))
    t_dev = ops.filter(pl.col("launch_start_ns").is_null()).select("_row", pl.col("start_ns").alias("_t"))
    parts = []
    if t_launch.height:
        parts.append(lookup(t_launch, cpu_steps))
    if t_dev.height:
        parts.append(lookup(t_dev, gpu_steps if gpu_steps.height else cpu_steps))
    found = pl.concat(parts) if parts else pl.DataFrame(schema={"_row": pl.UInt32, "step": pl.Int32})
    return ops.drop("step").join(found, on="_row", how="left").sort("_row").drop("_row").select(list(OP_SCHEMA))


@pytest.mark.parametrize("path", [
    real("TraceLens", "tests", "traces", "h100", "Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"),
    FIXTURES / "faults" / "train_clean_h100.json.gz",
    FIXTURES / "example_h100_decoder.json.gz",
], ids=lambda p: p.name)
def test_assign_steps_equals_the_old_join_and_sort(path):
    t = read_trace(path)
    ops = t.ops.with_columns(pl.lit(None, OP_SCHEMA["step"]).alias("step"))
    want = _old_assign_steps(ops, t.host)
    got = kineto_link.assign_steps(ops, t.host, t.meta)
    assert_frame_equal(got, want, check_exact=True)
    assert got["step"].drop_nulls().len() > 0  # the traces have steps: the oracle is not all null
