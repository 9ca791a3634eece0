"""The detectors' whole-table passes (session 13): what they compute for every rank at once
equals what the per-rank code computed.

* ``exposed_collectives._near``: the compute-union intervals that overlap a collective, by one
  as-of join, against a brute-force overlap test; and the detector's findings with them
  against its findings with every union interval inside the collectives' span (what it read
  before), on a 4-rank set with a straggler (waits inside the collectives) and exposed
  all-reduces.
* ``_common.scope_devices`` against ``_common.scopes`` (a rank driving two devices, a null device).
* ``fp32_matmul._best_per_rank``: the best label sum per rank, a NaN rank left out.
"""

from __future__ import annotations

import random

import polars as pl
import pytest
from test_ranks import LATE_NS, _build, _read
from tracegen import write_ranks

from traceroof.analysis import analyze
from traceroof.chips import get_chip
from traceroof.findings import FindingContext, exposed_collectives, fp32_matmul
from traceroof.findings._common import scope_devices, scopes
from traceroof.trace import TraceMeta

KEY = ["rank", "device"]


def _union_rows(rng: random.Random, n: int) -> list[tuple[int, int]]:
    out, t = [], 0
    for _ in range(n):
        t += rng.randint(1, 50)
        e = t + rng.randint(1, 40)
        out.append((t, e))
        t = e
    return out


def test_near_is_the_overlapping_intervals():
    rng = random.Random(13)
    u_rows, c_rows = [], []
    for rank in range(3):
        for dev in (0, 1):
            u_rows += [(rank, dev, s, e) for s, e in _union_rows(rng, 60)]
            for _ in range(rng.randint(0, 6)):  # collectives overlapping each other, some empty
                s = rng.randint(0, 3000)
                c_rows.append((rank, dev, s, s + rng.choice([0, 5, 80, 400])))
    u = pl.DataFrame(u_rows, schema={"rank": pl.Int32, "device": pl.Int32, "start_ns": pl.Int64, "end_ns": pl.Int64},
                     orient="row").sort(KEY + ["start_ns"])
    c = pl.DataFrame(c_rows, schema=u.schema, orient="row").sort(KEY + ["start_ns"], maintain_order=True)
    got = exposed_collectives._near(u, c, KEY)
    want = [r for r in u.iter_rows() if any(cr[:2] == r[:2] and cr[2] < r[3] and cr[3] > r[2] for cr in c_rows)]
    assert got.rows() == want
    assert 0 < len(want) < u.height  # some kept, some left out: the test can tell


@pytest.fixture(scope="module")
def straggler_set(tmp_path_factory):
    bs, _ = _build(late={3: LATE_NS})
    d = tmp_path_factory.mktemp("batched")
    write_ranks(bs, d)
    return _read(d)


def _span_near(u: pl.DataFrame, c: pl.DataFrame, key: list[str]) -> pl.DataFrame:
    """What the detector read before: every union interval inside its device's collectives' span."""
    span = c.group_by(key).agg(pl.col("start_ns").min().alias("_lo"), pl.col("end_ns").max().alias("_hi"))
    return (u.join(span, on=key).filter(pl.col("end_ns") > pl.col("_lo"), pl.col("start_ns") < pl.col("_hi"))
            .select(u.columns))


def test_exposed_collectives_same_with_the_overlapping_intervals(straggler_set, monkeypatch):
    now = [f.to_dict() for f in analyze(straggler_set, "h100").findings if f.kind == "exposed_collectives"]
    monkeypatch.setattr(exposed_collectives, "_near", _span_near)
    before = [f.to_dict() for f in analyze(straggler_set, "h100").findings if f.kind == "exposed_collectives"]
    assert now and now == before
    assert any(f["evidence"]["rank_comm_waiting_on_straggler_ns"] > 0 for f in now)  # waits inside: the union path


def _ctx(ops: pl.DataFrame) -> FindingContext:
    return FindingContext(ops=ops, host=pl.DataFrame(), steps=pl.DataFrame(), chip=get_chip("h100"),
                          meta=TraceMeta())


def test_scope_devices_matches_scopes():
    ops = pl.DataFrame({
        "rank": pl.Series([2, 0, 0, 1, 1, 1, 2], dtype=pl.Int32),
        "device": pl.Series([5, 0, 0, 1, 3, None, 5], dtype=pl.Int32),
        "start_ns": [0, 0, 10, 0, 5, 7, 20], "dur_ns": [3, 4, 4, 2, 2, 2, 1],
    })
    ctx = _ctx(ops)
    want = [(r, d, sorted(g["device"].unique().to_list(), key=lambda v: (v is None, v or 0)))
            for r, d, g in scopes(ctx, ops)]
    got = scope_devices(ctx, ops)
    assert [(r, d, sorted(v, key=lambda x: (x is None, x or 0))) for r, d, v in got] == want
    assert [(r, d) for r, d, _ in got] == [(0, None), (1, 1), (1, 3), (1, None), (2, None)]


def test_best_per_rank():
    ops = pl.DataFrame({"rank": pl.Series([0, 0, 0, 1, 1], dtype=pl.Int32),
                        "label": ["a", "a", "b", "a", "b"],
                        "rec": [1.0, 2.5, 3.0, float("nan"), 1.0]})
    assert fp32_matmul._best_per_rank(ops) == {0: 3.5}



def test_while_waiting_imports_the_tail_modules():
    """What the parent imports while the workers read (analysis._while_waiting): the detectors
    and the modules the analysis of several ranks would otherwise import after the last
    worker result (a fresh interpreter: none of them imported before)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[1])  # this checkout's traceroof
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))

    mods = ["traceroof.accounting", "traceroof.ranks", "traceroof.speed_of_light", "traceroof.waterfall",
            "traceroof.findings.exposed_collectives"]
    code = ("import sys, traceroof.analysis as a\n"
            f"mods = {mods!r}\n"
            "before = [m in sys.modules for m in mods]\n"
            "a._while_waiting()\n"
            "print(before, [m in sys.modules for m in mods])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=env).stdout.split("] [")
    assert out[0].count("True") == 0  # not imported by the analysis module itself
    assert out[1].count("True") == len(mods)


def _plain_union_ns(spans: list[tuple[int, int]]) -> int:
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted(spans):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return total + (cur_e - cur_s if cur_e is not None else 0)


def test_placed_unions_shared_by_rules_2_and_6():
    """accounting._PlacedUnions (one union_lengths pass for rule 2's busy check and rule 6's
    bounds) against plain Python unions per (rank, device), ops outside the recording left
    out, a null device keyed None (rule 6 keys it -1)."""
    from traceroof import accounting as acc

    rng = random.Random(7)
    rows = []
    for rank in (0, 1):
        for dev in (0, 1, None):
            t = 0
            for _ in range(40):
                t += rng.randint(0, 30)
                rows.append((rank, dev, t, rng.randint(1, 60), rng.choice(["matmul", "collective", "memcpy"]),
                             rng.choice(["step", "step", "outside_recording"])))
    ops = pl.DataFrame(rows, orient="row", schema={"rank": pl.Int32, "device": pl.Int32, "start_ns": pl.Int64,
                                                   "dur_ns": pl.Int64, "kind": pl.String, "bucket": pl.String})
    placed = [r for r in rows if r[5] != "outside_recording"]
    want = {}
    for key in {(r[0], r[1]) for r in placed}:
        mine = [r for r in placed if (r[0], r[1]) == key]
        want[key] = (_plain_union_ns([(r[2], r[2] + r[3]) for r in mine]),
                     _plain_union_ns([(r[2], r[2] + r[3]) for r in mine if r[4] == "collective"]))
    u = acc._PlacedUnions(ops)
    assert u.lengths() == want
    times = acc._rank_times(ops, u)
    for rank in (0, 1):
        mine = [r for r in placed if r[0] == rank]
        s, e = min(r[2] for r in mine), max(r[2] + r[3] for r in mine)
        per = {(-1 if d is None else d): (e - s, (e - s) - want[(rank, d)][0], want[(rank, d)][1]) for d in (0, 1, None)}
        assert times[rank].per_device == per
        assert times[rank].room == (e - s) * 3 and times[rank].comm == sum(p[2] for p in per.values())
    assert acc._rank_times(ops) == times  # made there when not handed over


def test_copy_blockers_remove_what_every_kernel_removes():
    """host_device_copies._blockers (the kernels overlapping a copy of their device, by an
    as-of join) against the union of every kernel of the device: each device's copies minus
    either give the same intervals; a null device is a device of its own."""
    from traceroof.findings._common import subtract, subtract_sorted, union
    from traceroof.findings.host_device_copies import _blockers

    rng = random.Random(19)
    rows = []
    for rank in (0, 1):
        for dev in (0, 3, None):
            t = 0
            for _ in range(80):
                t += rng.randint(0, 40)
                kind = rng.choice(["matmul", "elementwise", "collective", "memset", "memcpy"])
                rows.append((rank, dev, t, rng.randint(0, 70), kind))
    ops = pl.DataFrame(rows, orient="row", schema={"rank": pl.Int32, "device": pl.Int32, "start_ns": pl.Int64,
                                                   "dur_ns": pl.Int64, "kind": pl.String})
    ctx = _ctx(ops)
    copies = ops.filter(pl.col("kind") == "memcpy").with_columns((pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns"))
    got = _blockers(ctx, copies)
    for rank in (0, 1):
        for dev in (0, 3, None):
            mine = [r for r in rows if r[0] == rank and r[1] == dev]
            u_cp = union((r[2], r[2] + r[3]) for r in mine if r[4] == "memcpy")
            every = union((r[2], r[2] + r[3]) for r in mine if r[4] not in ("memcpy", "memset"))
            starts, ends = got.get((rank, dev), ([], []))
            assert subtract_sorted(u_cp, starts, ends) == subtract(u_cp, every)
            assert len(starts) < len(every)  # fewer intervals than the device's whole union


def test_rule6_reads_a_null_device_as_device_minus_one():
    """Rule 6's bounds (accounting._rank_times) read a null device as device -1, as before the
    shared unions: a rank with ops on both gets one device with the union of all of them, not
    one of the two (the shared unions key them apart; keying both -1 kept only the last).
    Hand arithmetic: window [0, 200); ops [0, 100) ∪ [100, 120) ∪ [150, 200) = 170 ns busy,
    so 30 ns idle; the collective [150, 200): 50 ns of communication."""
    from traceroof import accounting as acc

    ops = pl.DataFrame({"rank": [0, 0, 0], "device": [None, -1, -1], "start_ns": [0, 100, 150],
                        "dur_ns": [100, 20, 50], "kind": ["matmul", "matmul", "collective"],
                        "bucket": ["step"] * 3}, schema_overrides={"device": pl.Int32})
    t = acc._rank_times(ops)[0]
    assert t.per_device == {-1: (200, 30, 50)}
    assert (t.room, t.idle, t.comm, t.devices) == (200, 30, 50, 1)
