"""The session-9 speed-ups of the analysis tail (steps, timeline, detectors; issue 19) give
the results of the code they replace.

Each test compares the fast path with an independent oracle: the per-rank code path the fast
one replaces (forced), plain Python interval unions over the op table, or Python's ``sum``;
and checks that the fast path was really taken, so that no
test compares a path with itself.
"""

from __future__ import annotations

import random
from pathlib import Path

import polars as pl
import pytest
from conftest import real
from make_multirank import rank_builder
from polars.testing import assert_frame_equal
from tracegen import Kernel, TraceBuilder

from traceroof import analyze, read_trace, step_windows, timeline
from traceroof.chips import get_chip
from traceroof.costing import apply_costs
from traceroof.findings._unfused_chains import _sums_in_order
from traceroof.roofline import add_roofline

BF16 = ["c10::BFloat16", "c10::BFloat16"]


def _comm_trace(path: Path, *, markers: bool = True, steps: int = 3) -> Path:
    """One rank whose steps run a GEMM (stream 7), an all-reduce launched right after it on
    stream 20 (so it overlaps the GEMM's tail), an add queued behind the GEMM on stream 7, and,
    after a pause of the host, a mul: compute before, across and after every collective, and
    a compute union that starts before the collectives' span and ends after it."""
    b = TraceBuilder(rank=0, world_size=2, device_markers=markers)
    for s in range(steps):
        b.begin_step(s)
        b.op("aten::mm", [[512, 512], [512, 512]], BF16, [Kernel("gemm_bf16_tile", 60_000 + 5_000 * s, stream=7)])
        b.op("nccl:all_reduce", [[4096]], ["c10::BFloat16"],
             [Kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 90_000, stream=20)])
        b.op("aten::add", [[512, 512], [512, 512]], BF16, [Kernel("vectorized_elementwise_add", 20_000, stream=7)])
        b.idle_host(120_000)
        b.op("aten::mul", [[512, 512], [512, 512]], BF16, [Kernel("vectorized_elementwise_mul", 10_000, stream=7)])
        b.end_step()
    return b.write(path)


def _union(iv: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for s, e in sorted(iv):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def _length(iv: list[tuple[int, int]]) -> int:
    return sum(e - s for s, e in iv)


def _minus(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    """|a − b| for disjoint sorted lists, by brute force over their boundary points."""
    pts = sorted({p for s, e in a + b for p in (s, e)})
    inside = lambda x, u: any(s <= x < e for s, e in u)  # noqa: E731
    return sum(q - p for p, q in zip(pts, pts[1:]) if inside(p, a) and not inside(p, b))


def test_exposed_collectives_match_plain_unions(tmp_path):
    rep = analyze(read_trace(_comm_trace(tmp_path / "r0.json")), "h100")
    found = [f for f in rep.findings if f.kind == "exposed_collectives"]
    assert found, "the trace must give an exposed-collective finding"
    ops = rep.ops.filter(pl.col("bucket") == "step")  # what the detectors see (rule 2)
    rows = ops.select("kind", "start_ns", (pl.col("start_ns") + pl.col("dur_ns")).alias("e")).rows()
    comm = _union([(s, e) for k, s, e in rows if k == "collective"])
    comp = _union([(s, e) for k, s, e in rows if k not in ("collective", "memcpy", "memset")])
    ev = found[0].evidence
    # the compute union reaches before the first collective and past the last: the part the
    # detector now keeps near the collectives is a strict subset of it
    assert comp[0][0] < comm[0][0] and comp[-1][1] > comm[-1][1]
    assert ev["rank_compute_union_ns"] == _length(comp)
    assert ev["rank_comm_union_ns"] == _length(comm)
    assert ev["rank_comm_exposed_ns"] == _minus(comm, comp) > 0
    # the three all-reduces form one group; their shares sum to the exposed total
    assert ev["count"] == 3 and ev["exposed_ns"] == pytest.approx(_minus(comm, comp), abs=1e-6)


def _partition_both_ways(path: Path, monkeypatch) -> tuple[timeline.Timeline, timeline.Timeline, pl.DataFrame]:
    """The partition of ``path``'s trace as it is, and with every rank through the per-rank
    code (the code before session 9), and the ranks the fast path took."""
    t = read_trace(path)
    ops, host = _roofline_ops(t), t.host
    seen: list[pl.DataFrame] = []
    fast = step_windows._common_starts

    def spy(devs, gpu, by_ops):
        parts, slow = fast(devs, gpu, by_ops)
        seen.append(devs.select("rank").unique().filter(~pl.col("rank").is_in(slow)))
        return parts, slow

    monkeypatch.setattr(step_windows, "_common_starts", spy)
    got = timeline.partition(ops, host, t.meta)
    monkeypatch.setattr(step_windows, "_common_starts", lambda devs, gpu, by_ops: ([], devs["rank"].unique().to_list()))
    want = timeline.partition(ops, host, read_trace(path).meta)
    return got, want, seen[0]


def _roofline_ops(t):
    """The op table as the partition gets it in ``analyze`` (costed, with the roofline's ``bound``)."""
    return add_roofline(apply_costs(t)[0], get_chip("h100"))


def _assert_same_partition(got: timeline.Timeline, want: timeline.Timeline) -> None:
    assert_frame_equal(got.segments, want.segments)
    assert_frame_equal(got.pieces, want.pieces)
    assert_frame_equal(got.ops.select("bucket", "step"), want.ops.select("bucket", "step"))


@pytest.mark.parametrize("markers", [True, False], ids=["device-markers", "no-markers"])
def test_step_windows_of_all_ranks_at_once_equal_rank_by_rank(tmp_path, monkeypatch, markers):
    folder = tmp_path / "ranks"
    folder.mkdir()
    for r in range(3):
        b = rank_builder(r, steps=3)
        b.device_markers = markers
        b.write(folder / f"rank{r}.json")
    got, want, fast = _partition_both_ways(folder, monkeypatch)
    assert fast.height == 3  # every rank in the common case: marked devices / attributed ops
    assert got.segments.filter(pl.col("bucket") == "step")["step"].n_unique() == 3
    _assert_same_partition(got, want)


def test_step_windows_mixed_ranks_equal_rank_by_rank(tmp_path, monkeypatch):
    """Rank 0: device markers on device 0 only, kernels on devices 0 and 1 (device 1 takes the
    rank's windows: the per-rank path); rank 1: markers on its one device (the fast path)."""
    folder = tmp_path / "ranks"
    folder.mkdir()
    b = TraceBuilder(rank=0, world_size=2)
    for s in range(2):
        b.begin_step(s)
        b.op("aten::mm", [[64, 64], [64, 64]], BF16, [Kernel("gemm_bf16_tile", 20_000)])
        b.op("aten::add", [[64, 64], [64, 64]], BF16, [Kernel("vectorized_elementwise_add", 9_000, device=1)])
        b.end_step()
    b.write(folder / "rank0.json")
    rank_builder(1, steps=2).write(folder / "rank1.json")
    got, want, fast = _partition_both_ways(folder, monkeypatch)
    assert fast["rank"].to_list() == [1]
    assert got.segments.filter(pl.col("rank") == 0)["device"].n_unique() == 2
    _assert_same_partition(got, want)


@pytest.mark.parametrize("parts", [
    ("HolisticTraceAnalysis", "tests", "data", "trace_filter", "sampled_rank-0.json.gz"),  # no device markers
    ("TraceLens", "tests", "traces", "h100", "gaunernst_bert-small-uncased__1016001.json.gz"),  # device markers
], ids=["hta-sampled-rank0", "bert-h100"])
def test_step_windows_real_trace_equal_rank_by_rank(monkeypatch, parts):
    got, want, fast = _partition_both_ways(real(*parts), monkeypatch)
    assert fast.height == 1
    _assert_same_partition(got, want)


def test_bucket_busy_from_the_shared_pass_equals_a_union_per_bucket(tmp_path):
    """The buckets' busy time now sums the per-step unions of one pass; the oracle is one
    Python union per (rank, device, bucket) of the pieces."""
    t = read_trace(_comm_trace(tmp_path / "r0.json", steps=4))
    tl = timeline.partition(_roofline_ops(t), t.host, t.meta)
    rows = timeline.bucket_rows(tl)
    want: dict[tuple, list] = {}
    for r, d, b, s, e in tl.pieces.select("rank", "device", "bucket", "start_ns", "end_ns").rows():
        want.setdefault((r, d, b), []).append((s, e))
    got = {(x["rank"], x["device"], x["bucket"]): x["busy_ns"] for x in rows if x["bucket"] != "outside_recording"}
    assert {k: _length(_union(v)) for k, v in want.items()} == {k: v for k, v in got.items() if k in want}
    assert sum(1 for k in got if k[2] == "step") == 1 and len(tl.segments.filter(pl.col("bucket") == "step")) == 4


def test_sums_in_order_are_pythons_sum():
    rng = random.Random(19)
    values = [10 ** rng.uniform(-3, 15) for _ in range(4_000)]
    lo, n, i = [], [], 0
    while i < len(values):
        k = min(rng.choice([1, 1, 2, 3, 5, 8, 9, 17]), len(values) - i)
        lo.append(i)
        n.append(k)
        i += k
    got = _sums_in_order(pl.Series(values, dtype=pl.Float64), pl.Series(lo), pl.Series(n)).to_list()
    want = [sum(values[a:a + k]) for a, k in zip(lo, n)]
    assert got == want  # float equality: the same additions in the same order
    # the data is such that the order matters: the same segments added last to first differ
    assert any(sum(reversed(values[a:a + k])) != w for a, k, w in zip(lo, n, want))
    assert max(n) == 17 and min(n) == 1  # segments of one value and long ones
