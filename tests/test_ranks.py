"""The cross-rank view (traceroof/ranks.py, the ``ranks`` report section, the straggler finding).

Synthetic per-rank sets come from fixtures/tracegen.py: 4 ranks, 6 steps, each step 4 matmuls
(400 µs each) then one all-reduce (300 µs transfer) on stream 20, which ends for every rank
at ``last arrival + 300 µs + jitter[rank][step]`` on the true clock (``collective_across``).
Rank r's clock reads ``true + CLOCK[r]``. The real pair is HTA's ``trace_filter`` (ranks 0 and
1 of 128, 10 NCCL SendRecv kernels each), cross-checked against plain ``json`` arithmetic.
"""

from __future__ import annotations

import gzip
import json
import statistics
from decimal import Decimal
from pathlib import Path

import polars as pl
import pytest
from conftest import real
from tracegen import Kernel, TraceBuilder, collective_across, write_ranks

import traceroof
from traceroof import rank_clock as RC
from traceroof import ranks as R
from traceroof.analysis import analyze
from traceroof.render import render
from traceroof.report import Report

BF = "c10::BFloat16"
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas"
NCCL_AR = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"

#: injected clock error per rank (ns): rank 1 +3 ms, rank 2 −1.25 ms, rank 3 +0.7 ms
CLOCK = (0, 3_000_000, -1_250_000, 700_000)
#: completion skew of the all-reduce per [rank][step], ns (rank 0 is the reference: 0)
JITTER = [
    [0, 0, 0, 0, 0, 0],
    [100, -200, 300, 0, -100, 200],
    [-300, 100, 0, 200, -100, 400],
    [200, 200, -200, -200, 0, 0],
]
LATE_NS = 2_000_000  # the straggler's host starts every step's compute 2 ms late
STEPS = 6

# Hand arithmetic of the expected offsets (end_r − end_0 = CLOCK[r] + JITTER[r][k]):
#   rank 1: jitter sorted [-200, -100, 0, 100, 200, 300] → median (0 + 100)/2 = 50
#           residuals |j − 50| = 50, 250, 250, 50, 150, 150 → sorted 50 50 150 150 250 250 → MAD 150
#   rank 2: sorted [-300, -100, 0, 100, 200, 400] → median 50; |j − 50| = 350 50 50 150 150 350 → MAD 150
#   rank 3: sorted [-200, -200, 0, 0, 200, 200] → median 0; |j| = 200 200 200 200 0 0 → MAD 200
EXPECTED_OFFSET = {0: 0, 1: 3_000_050, 2: -1_249_950, 3: 700_000}
EXPECTED_MAD = {0: 0, 1: 150, 2: 150, 3: 200}
# Waits: on the aligned clock rank r's arrivals read true − (offset estimate − CLOCK[r]), i.e.
# 50 ns early on ranks 1 and 2, exact on 0 and 3; rank 3 arrives last at every all-reduce, so
# each of the 6 instances shows 2 × 50 = 100 ns more wait than the truth: +600 ns in total.
# The truth (generator oracle) is 6 × 3 × 2 ms = 36 ms exactly: each step's arrivals inherit
# the previous all-reduce's jitter, and Σ_{k<5} Σ_{r<3} (j3,k − jr,k) = 0 − 100 + 100 = 0.
EXPECTED_WAIT_TOTAL = 36_000_000 + 600


def _build(world: int = 4, *, late: dict[int, int] | None = None, clock: tuple[int, ...] = CLOCK) -> tuple[list[TraceBuilder], list[dict]]:
    late = late or {}
    bs = [TraceBuilder(rank=r, world_size=world, clock_offset_ns=clock[r]) for r in range(world)]
    oracle = []
    for st in range(STEPS):
        for r, b in enumerate(bs):
            b.begin_step(st)
            if late.get(r):
                b.idle_host(late[r])
            for _ in range(4):
                b.op("aten::mm", [[4096, 4096], [4096, 4096]], [BF, BF], [Kernel(GEMM, 400_000)])
            b.wait_stream(20, 7)
        oracle.append(collective_across(
            bs, NCCL_AR, 300_000, stream=20, dims=[[1 << 24], [1 << 24]], types=[BF, BF],
            args={"Collective name": "allreduce", "In msg nelems": 1 << 24, "Out msg nelems": 1 << 24,
                  "Group size": world, "dtype": "BFloat16"},
            end_jitter_ns=[JITTER[r][st] for r in range(world)],
        ))
        for b in bs:
            b.end_step()
    return bs, oracle


def _read(d: Path) -> traceroof.Trace:
    return traceroof.read_trace(d, jobs=1)


@pytest.fixture(scope="module")
def straggler(tmp_path_factory):
    bs, oracle = _build(late={3: LATE_NS})
    d = tmp_path_factory.mktemp("straggler")
    write_ranks(bs, d)
    rep = analyze(_read(d), "h100")
    return rep, oracle, d


@pytest.fixture(scope="module")
def balanced(tmp_path_factory):
    bs, oracle = _build()
    d = tmp_path_factory.mktemp("balanced")
    write_ranks(bs, d)
    return analyze(_read(d), "h100"), oracle


def _per_rank(rep: Report) -> dict[int, dict]:
    return {p["rank"]: p for p in rep.ranks.per_rank}


# --------------------------------------------------------------------------- alignment


def test_injected_clock_offsets_are_recovered(straggler):
    rep, _, _ = straggler
    al = rep.ranks.alignment
    assert al["applied"] is True and al["method"] == "collectives" and al["clock"] == "collectives"
    assert al["reference_rank"] == 0
    assert al["matched_collectives"] == STEPS
    pr = _per_rank(rep)
    assert {r: p["offset_ns"] for r, p in pr.items()} == EXPECTED_OFFSET
    assert {r: p["mad_ns"] for r, p in pr.items()} == EXPECTED_MAD
    assert al["uncertainty_ns"] == 200
    # every recovered offset is within the generated jitter (±400 ns) of the injected clock error
    assert all(abs(pr[r]["offset_ns"] - CLOCK[r]) <= 400 for r in pr)
    # the origins the alignment started from are the injected clocks (first event at true t=0)
    assert {r: p["origin_ns"] - pr[0]["origin_ns"] for r, p in pr.items()} == dict(enumerate(CLOCK))


def _inst(rows: list[tuple[int, int, int]]) -> pl.DataFrame:
    """(instance, rank, end_ns) rows → a match_collectives-shaped table."""
    return pl.DataFrame(
        [(i, r, 0, 20, "nccl", None, e - 10, e, 0, e - 10) for i, r, e in rows], schema=RC.INSTANCE_SCHEMA, orient="row"
    )


def test_alignment_refused_with_too_few_collectives():
    offs = RC.estimate_offsets(_inst([(0, 0, 1000), (0, 1, 5000), (1, 0, 2000), (1, 1, 6000)]))
    assert offs["offset_ns"].to_list() == [0, 4000]
    d = RC.decide_alignment(offs, [0, 1], "origins")
    assert d["applied"] is False and d["method"] == "origins"
    assert d["matched_collectives"] == 2 and "need ≥ 3" in d["reason"]


def test_alignment_refused_when_ends_disagree():
    # offsets 0, 100 µs, 200 µs: median 100 µs, MAD 100 µs > 20 µs
    rows = [(k, 0, k * 10**6) for k in range(3)] + [(k, 1, k * 10**6 + (k * 100_000)) for k in range(3)]
    offs = RC.estimate_offsets(_inst(rows))
    assert offs.filter(pl.col("rank") == 1)["mad_ns"][0] == 100_000
    d = RC.decide_alignment(offs, [0, 1], "origins")
    assert d["applied"] is False and "MAD" in d["reason"] and d["uncertainty_ns"] == 100_000


def test_alignment_not_applied_when_offsets_are_within_uncertainty():
    # differences 0, +500, −500: median 0, MAD 500 → |0| ≤ 3 × 500: the clocks already agree
    rows = [(k, 0, k * 10**6) for k in range(3)] + [(k, 1, k * 10**6 + d) for k, d in enumerate((0, 500, -500))]
    d = RC.decide_alignment(RC.estimate_offsets(_inst(rows)), [0, 1], "none")
    assert d["applied"] is False and d["method"] == "none" and "already agree" in d["reason"]


def test_matching_skips_buckets_with_different_counts_and_subgroups():
    ops = pl.DataFrame({
        "rank": [0, 0, 1, 0, 1, 1],
        "step": [1, 1, 1, 2, 2, 2],
        "stream": [20] * 6,
        "name": ["ar"] * 6,
        "group_size": [None, None, None, 2, 2, 2],
        "kind": ["collective"] * 6,
        "abs_start_ns": [0, 10, 5, 100, 101, 200],
        "abs_end_ns": [5, 20, 20, 110, 111, 210],
        "device": [0] * 6,
    }).with_columns(pl.col("rank").cast(pl.Int32), pl.col("group_size").cast(pl.Int32),
                    pl.col("device").cast(pl.Int32), pl.col("abs_start_ns").alias("start_ns"))
    # step 1: rank 0 has 2 instances, rank 1 has 1 → unmatched; step 2: rank 0 ×1, rank 1 ×2 → unmatched
    assert RC.match_collectives(ops).height == 0
    # a group of 2 within a 3-rank trace involves an unknown subset: never matched
    three = pl.concat([ops, ops.head(1).with_columns(pl.lit(2, dtype=pl.Int32).alias("rank"))])
    assert RC.match_collectives(three.filter(pl.col("step") == 2)).height == 0
    # equal counts → k-th with k-th, instance ids in rank 0's start order
    ok = ops.filter(~((pl.col("rank") == 0) & (pl.col("abs_start_ns") == 10))).filter(pl.col("step") == 1)
    m = RC.match_collectives(ok)
    assert m.select("instance", "rank", "abs_end_ns").rows() == [(0, 0, 5), (0, 1, 20)]


# --------------------------------------------------------------------------- straggler


def test_straggler_rank_and_wait_total_equal_the_injected(straggler):
    rep, oracle, _ = straggler
    # the generator's own truth: rank 3 last at all 6 all-reduces, others wait 36 ms in total
    assert [o["last_rank"] for o in oracle] == [3] * STEPS
    truth = sum(sum(o["wait_ns"]) for o in oracle)
    assert truth == 36_000_000
    st = rep.ranks.straggler
    assert st["rank"] == 3 and st["last_arrivals"] == STEPS and st["instances"] == STEPS and st["sufficient"] is True
    assert st["wait_caused_ns"] == EXPECTED_WAIT_TOTAL
    assert st["mean_wait_per_rank_ns"] == EXPECTED_WAIT_TOTAL / 3
    pr = _per_rank(rep)
    # per waiting rank: the oracle's waits + 50 ns per instance on the ranks whose offset is 50 ns high
    for r in (0, 1, 2):
        bias = 0 if r == 0 else 50 * STEPS
        assert pr[r]["wait_ns"] == sum(o["wait_ns"][r] for o in oracle) + bias
        assert pr[r]["wait_caused_ns"] == 0 and pr[r]["last_arrivals"] == 0
    assert pr[3]["wait_ns"] == 0 and pr[3]["wait_caused_ns"] == EXPECTED_WAIT_TOTAL
    assert rep.ranks.collectives["compared"] == STEPS
    assert rep.ranks.collectives["total_wait_ns"] == EXPECTED_WAIT_TOTAL
    assert [s["last_rank"] for s in rep.ranks.per_step] == [3] * STEPS
    # a step runs from where the device starts it to where it starts the next (the period):
    # the straggler's device idles 2 ms of every step waiting on its host, so it is busy
    # 2 ms less per step than the others, who spend those 2 ms in the all-reduce
    assert pr[3]["busy_ns"] == pytest.approx(pr[0]["busy_ns"] - LATE_NS, abs=1_000)
    walls = rep.steps.filter(pl.col("step") < STEPS - 1).group_by("step").agg(
        (pl.col("wall_ns").max() - pl.col("wall_ns").min()).alias("spread"))
    assert walls["spread"].max() <= 1_000  # steps 0-4: one period on every rank
    assert rep.ranks.slowest_rank["rank"] != 3


def test_straggler_finding(straggler):
    rep, _, _ = straggler
    f = [x for x in rep.findings if x.kind == "straggler"]
    assert len(f) == 1
    f = f[0]
    assert f.rank == 3
    assert f.recoverable_ns == pytest.approx(EXPECTED_WAIT_TOTAL / 3)
    assert f.title.startswith("rank 3 arrives last at 6 of 6 collectives; other ranks wait 36 ms in total (6 ms per step)")
    assert f.evidence["alignment_applied"] is True
    assert f.evidence["critical_path_ns"] == pytest.approx(12_000_000, abs=2_000)
    assert f.docs == "docs/findings/straggler.md"


def test_without_alignment_the_clock_error_would_blame_rank_1(straggler):
    """Why alignment matters: on the raw origins, rank 1's +3 ms clock makes it look last."""
    rep, _, _ = straggler
    ops = rep.ops
    org = RC.origins(rep.trace.stats, rep.trace.ranks)
    a, method = RC.absolute(ops, org)
    assert method == "origins"
    w = R.collective_waits(RC.match_collectives(a))
    assert set(w["last_rank"].unique().to_list()) == {1}


def test_balanced_ranks_give_no_straggler_finding(balanced):
    rep, oracle = balanced
    assert rep.ranks is not None and rep.ranks.alignment["applied"] is True
    assert not [x for x in rep.findings if x.kind == "straggler"]
    # the only waits left are the generated completion jitter (≤ 700 ns per rank and instance)
    for p in rep.ranks.per_rank:
        assert p["wait_ns"] <= 700 * STEPS
    assert max(max(o["wait_ns"]) for o in oracle) <= 700


def test_single_rank_has_no_ranks_section(tmp_path, straggler):
    bs, _ = _build(world=1, clock=(0,))
    write_ranks(bs, tmp_path)
    rep = analyze(_read(tmp_path), "h100")
    assert rep.ranks is None and "ranks" not in rep.to_dict()
    assert not [x for x in rep.findings if x.kind == "straggler"]
    # --rank keeps it off on a multi-rank trace
    _, _, d = straggler
    one = analyze(_read(d), "h100", rank=1)
    assert one.ranks is None and "ranks" not in one.to_dict()
    assert not [x for x in one.findings if x.kind == "straggler"]


# --------------------------------------------------------------------------- report


def test_render_table_and_markdown_show_the_ranks_block(straggler):
    rep, _, _ = straggler
    table = render(rep, "table", top=5)
    assert "Ranks (docs/ranks.md)" in table
    assert "offsets: r1 +3 ms, r2 −1.25 ms, r3 +700 µs" in table
    assert "rank 3: last at 6 of 6 compared collectives; others waited 36 ms" in table
    row3 = next(line for line in table.splitlines() if line.startswith("│ 3 "))
    assert "36 ms" in row3 and "+700 µs" in row3
    md = render(rep, "markdown", top=5)
    assert "## Ranks" in md
    # rank 3: walls 3.9087 + 3.9087 + 3.9083 + 3.9083 + 3.9085 + 1.9 (the last step ends at
    # its last kernel) = 21.4425 ms / 6 = 3.57 ms; busy 1.9 ms per step → 1.9 / 3.57375 = 53.2 %
    assert "| 3 | 3.57 ms | 53.2 % | 300 µs | 0 ns | 36 ms | 6 | +700 µs |" in md
    assert "last to arrive at collectives: rank 3 ×6" in md
    assert "## Ranks" not in render(analyze(_read(straggler[2]), "h100", rank=0), "markdown")


def test_json_round_trip_and_older_reports(straggler, tmp_path):
    rep, _, _ = straggler
    p = tmp_path / "report.json"
    rep.save(p)
    back = Report.load(p)
    assert back.ranks.to_dict() == json.loads(json.dumps(rep.to_dict()["ranks"]))
    assert back.ranks.straggler["wait_caused_ns"] == EXPECTED_WAIT_TOTAL
    assert json.loads(render(back, "json"))["ranks"]["alignment"]["applied"] is True
    assert "Ranks (docs/ranks.md)" in render(back, "table")
    old = rep.to_dict()
    del old["ranks"]
    assert Report.from_dict(old).ranks is None


# --------------------------------------------------------------------------- the real pair


TRACE_FILTER = ("HolisticTraceAnalysis", "tests", "data", "trace_filter")


def _ns(v) -> int:
    return int(Decimal(str(v)) * 1000)


def _raw_nccl(path: Path) -> tuple[int, list[dict]]:
    """NCCL kernels of one raw Kineto file with their step (the ProfilerStep window holding the
    launch call with the same correlation), plain json; and the file's origin (first ts, ns)."""
    d = json.loads(gzip.decompress(path.read_bytes()))
    ev = [e for e in d["traceEvents"] if e.get("ph") == "X"]
    # the trace's origin: its first event, not counting the profiler's own "Trace" span
    origin = min(_ns(e["ts"]) for e in ev if e.get("cat") not in (None, "Trace"))
    steps = [(int(e["name"].split("#")[1]), _ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"]))
             for e in ev if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")]
    launch = {e["args"]["correlation"]: _ns(e["ts"]) for e in ev if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    out = []
    for e in ev:
        if e.get("cat") == "kernel" and "nccl" in e["name"].lower():
            t = launch[e["args"]["correlation"]]
            step = next(n for n, a, b in steps if a <= t < b)
            s = _ns(e["ts"])
            out.append({"step": step, "stream": e["args"]["stream"], "name": e["name"], "start": s, "end": s + _ns(e["dur"])})
    return origin, out


@pytest.fixture(scope="module")
def real_pair():
    d = real(*TRACE_FILTER)
    files = [d / "sampled_rank-0.json.gz", d / "sampled_rank-1.json.gz"]
    for f in files:
        assert f.is_file(), f
    return analyze(_read(d), "h100"), [_raw_nccl(f) for f in files]


def test_real_pair_alignment_matches_plain_python(real_pair):
    rep, raw = real_pair
    (o0, k0), (o1, k1) = raw
    assert len(k0) == len(k1) == 10
    # bucket by (step, stream, name), k-th with k-th by start; every bucket has equal counts here
    def buckets(ks):
        b: dict = {}
        for k in sorted(ks, key=lambda k: k["start"]):
            b.setdefault((k["step"], k["stream"], k["name"]), []).append(k)
        return b
    b0, b1 = buckets(k0), buckets(k1)
    assert {k: len(v) for k, v in b0.items()} == {k: len(v) for k, v in b1.items()}
    pairs = [(a, b) for key in b0 for a, b in zip(b0[key], b1[key])]
    diffs = [b["end"] - a["end"] for a, b in pairs]  # raw ts are absolute on each host's clock
    med = statistics.median(diffs)
    mad = statistics.median(abs(x - med) for x in diffs)
    pr = _per_rank(rep)
    assert pr[1]["matched"] == 10
    assert pr[1]["offset_ns"] == round(med) and pr[1]["mad_ns"] == round(mad)
    assert pr[0]["offset_ns"] == 0 and pr[0]["origin_ns"] == o0 and pr[1]["origin_ns"] == o1
    al = rep.ranks.alignment
    assert mad > RC.MAX_MAD_NS  # sampled p2p kernels: the k-th instances are not one transfer
    assert al["applied"] is False and al["clock"] == "origins" and "MAD" in al["reason"]
    # compared instances: ends within 20 µs on the hosts' clocks; wait = the start difference
    close = [(a, b) for a, b in pairs if abs(b["end"] - a["end"]) <= R.END_TOLERANCE_NS]
    coll = rep.ranks.collectives
    assert coll["matched"] == 10 and coll["compared"] == len(close) >= 1
    assert coll["total_wait_ns"] == sum(abs(b["start"] - a["start"]) for a, b in close)
    late1 = sum(b["start"] - a["start"] for a, b in close if b["start"] > a["start"])
    late0 = sum(a["start"] - b["start"] for a, b in close if a["start"] > b["start"])
    assert pr[1]["wait_caused_ns"] == late1 and pr[0]["wait_caused_ns"] == late0
    # one compared instance is too little evidence for a straggler finding
    assert rep.ranks.straggler["sufficient"] is False
    assert not [x for x in rep.findings if x.kind == "straggler"]
    assert "too few to call it a straggler" in " ".join(render(rep, "markdown").split())


def test_real_pair_per_rank_summary_matches_plain_python(real_pair):
    rep, raw = real_pair
    pr = _per_rank(rep)
    for r, (_, ks) in enumerate(raw):
        # comm time per step: union of the rank's NCCL kernels launched in the step, mean of 2 steps
        per_step = {}
        for st in sorted({k["step"] for k in ks}):
            iv = sorted((k["start"], k["end"]) for k in ks if k["step"] == st)
            tot, cur_s, cur_e = 0, None, None
            for s, e in iv:
                if cur_e is None or s > cur_e:
                    tot += 0 if cur_e is None else cur_e - cur_s
                    cur_s, cur_e = s, e
                else:
                    cur_e = max(cur_e, e)
            per_step[st] = tot + (cur_e - cur_s)
        assert pr[r]["steps"] == 2 and pr[r]["complete_steps"] == 2
        assert pr[r]["comm_ns"] == pytest.approx(sum(per_step.values()) / len(per_step), abs=1)
        steps = rep.steps.filter(pl.col("rank") == r)
        assert pr[r]["step_time_ns"] == pytest.approx(float(steps["wall_ns"].mean()))
        assert pr[r]["comm_exposed_ns"] <= pr[r]["comm_ns"] <= pr[r]["busy_ns"] <= pr[r]["step_time_ns"]
    spread = rep.ranks.per_step
    assert [s["step"] for s in spread] == [551, 552]
    for s in spread:
        walls = rep.steps.filter(pl.col("step") == s["step"])["wall_ns"].to_list()
        assert (s["step_time_min_ns"], s["step_time_max_ns"]) == (min(walls), max(walls))
        assert s["max_over_median"] == pytest.approx(max(walls) / statistics.median(walls))


def test_waits_on_the_straggler_are_claimed_once(straggler):
    """The waiting ranks' wait inside the all-reduce is the straggler finding's claim; the
    exposed-collectives findings of those ranks leave it out, and together the two account
    for exactly the exposed communication that exposed_collectives alone claims (BC-33)."""
    rep, _, d = straggler
    alone = analyze(_read(d), "h100", findings=["exposed_collectives"])
    for rank in (0, 1, 2):
        both = [f for f in rep.findings if f.kind == "exposed_collectives" and f.rank == rank]
        solo = [f for f in alone.findings if f.kind == "exposed_collectives" and f.rank == rank]
        assert both and solo
        ev, ev_solo = both[0].evidence, solo[0].evidence
        # alone, no wait is set aside; with the straggler detector, 6 waits of ~2 ms are
        waiting = ev["rank_comm_waiting_on_straggler_ns"]
        assert ev_solo["rank_comm_waiting_on_straggler_ns"] == 0
        assert waiting == pytest.approx(6 * LATE_NS, rel=0.01)
        assert ev["rank_comm_exposed_ns"] + waiting == ev_solo["rank_comm_exposed_ns"]
        assert sum(f.recoverable_ns for f in both) == pytest.approx(
            sum(f.recoverable_ns for f in solo) - waiting, abs=1.0)
