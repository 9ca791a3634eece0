"""``exposed_collectives`` and collectives whose device is null: left out of the check (they
cannot be set against a device's compute), counted, and said in the report's warnings."""

from __future__ import annotations

import json
import re

import polars as pl
from tracegen import Kernel, TraceBuilder

from traceroof import analysis, analyze, read_trace
from traceroof.chips import get_chip
from traceroof.findings import FindingContext, run_detectors

BF16 = ["c10::BFloat16", "c10::BFloat16"]
NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"


def _trace(path):
    """Three steps, each a GEMM then an all-reduce (90 µs, step s's all-reduce longer by s µs)."""
    b = TraceBuilder(rank=0, world_size=2)
    for s in range(3):
        b.begin_step(s)
        b.op("aten::mm", [[512, 512], [512, 512]], BF16, [Kernel("gemm_bf16_tile", 60_000, stream=7)])
        b.op("nccl:all_reduce", [[4096]], ["c10::BFloat16"], [Kernel(NCCL, 90_000 + 1_000 * s, stream=20)])
        b.end_step()
    return b.write(path)


def _null_first_two(ops: pl.DataFrame) -> pl.DataFrame:
    """``ops`` with the device of its first two all-reduces (in start order) set to null."""
    ops = ops.with_row_index("_i")
    first_two = ops.filter(pl.col("name") == NCCL).sort("start_ns")["_i"].head(2)
    return ops.with_columns(pl.when(pl.col("_i").is_in(first_two.implode())).then(None)
                            .otherwise(pl.col("device")).alias("device")).drop("_i")


def test_collectives_without_device_are_counted_in_a_warning(tmp_path):
    path = _trace(tmp_path / "r0.json")
    # the oracle, from the raw JSON: the all-reduce kernels and their durations (µs → ns)
    events = json.loads(path.read_text())["traceEvents"]
    nccl = sorted((e for e in events if e.get("cat") == "kernel" and e["name"] == NCCL), key=lambda e: e["ts"])
    assert len(nccl) == 3
    lost_dur_ns = [round(e["dur"] * 1000) for e in nccl[:2]]  # the first two lose their device
    assert lost_dur_ns == [90_000, 91_000]

    trace = read_trace(path)
    whole = analyze(trace, "h100")
    assert not [w for w in whole.warnings if w.startswith("exposed_collectives:")]
    union_whole = next(f for f in whole.findings if f.kind == "exposed_collectives").evidence["rank_comm_union_ns"]
    assert union_whole == 90_000 + 91_000 + 92_000  # three disjoint all-reduces

    # the op table the detectors see (every op in a step), two all-reduces with no device
    ops = _null_first_two(whole.ops)
    ctx = FindingContext(ops=ops, host=trace.host, steps=whole.steps, chip=get_chip("h100"), meta=trace.meta)
    found = run_detectors(ctx, ["exposed_collectives"])
    assert len(ctx.warnings) == 1, ctx.warnings
    m = re.fullmatch(r"exposed_collectives: (\d+) collective kernel\(s\) \(([\d.]+) µs of device time\) on rank\(s\) "
                     r"0 record no device and are left out of the exposed-communication check \(neither exposed nor "
                     r"overlapped\)", ctx.warnings[0])
    assert m, ctx.warnings[0]
    assert int(m.group(1)) == 2
    assert float(m.group(2)) == sum(lost_dur_ns) / 1000  # 181 µs
    # and they are really left out: only the third all-reduce is in the rank's comm union
    assert found and found[0].evidence["rank_comm_union_ns"] == 92_000

    # analysis.detect_findings hands the detectors' warnings on (the bucket filter aside: a
    # device-less op is in no bucket of the timeline, so analyze's detectors never see it)
    got, warned = analysis.detect_findings(ops.drop("bucket"), trace.host, whole.steps, get_chip("h100"),
                                           trace.meta, None, None, ["exposed_collectives"])
    assert warned == ctx.warnings and got[0].evidence["rank_comm_union_ns"] == 92_000


def test_analyze_puts_the_detectors_warnings_in_the_report(tmp_path, monkeypatch):
    trace = read_trace(_trace(tmp_path / "r0.json"))
    run = analysis.detect_findings
    said = "exposed_collectives: a line a detector wrote"

    def spy(*a, **k):
        found, warned = run(*a, **k)
        return found, [*warned, said]

    monkeypatch.setattr(analysis, "detect_findings", spy)
    rep = analyze(trace, "h100")
    assert rep.warnings.count(said) == 1
