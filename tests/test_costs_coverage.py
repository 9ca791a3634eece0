"""Coverage of real traces: how much linked kernel time gets a cost (FLOPs and bytes).

Reads the third-party TraceLens traces in place (``../shared/fixtures/real``, see its
MANIFEST.md) with gzip + json, links each kernel to the framework op that launched it
(kernel ``args.correlation`` → runtime call → its ``External id`` → the innermost ``cpu_op``
with that ``External id``), and applies ``cost_of`` to that op's recorded arguments.
A missing fixture is a failure, not a skip.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path

import pytest

from traceroof.costs import cost_of

REAL = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "real"
TRACES = REAL / "TraceLens" / "tests" / "traces"

COVERAGE_TRACES = [
    "h100/gaunernst_bert-small-uncased__1016001.json.gz",
    "h100/Falconsai_nsfw_image_detection__1016002.json.gz",
    "mi300/ddp_resnet18_no_pool/train_resnet18.json.gz",
    "perf_model/normalization/normalization_layer_test.json.gz",
]


def _load(rel: str) -> list[dict]:
    path = TRACES / rel
    assert path.is_file(), f"fixture missing: {path} (the real traces live beside the repo, see MANIFEST.md)"
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    return doc["traceEvents"] if isinstance(doc, dict) else doc


def linked_kernels(events: list[dict]) -> list[tuple[dict | None, dict]]:
    """(innermost cpu_op or None, kernel) for every kernel event."""
    ops: dict[object, list[dict]] = defaultdict(list)
    launch_ext: dict[object, object] = {}
    kernels = []
    for e in events:
        if e.get("ph") != "X":
            continue
        cat, args = e.get("cat", ""), e.get("args") or {}
        if cat == "cpu_op":
            ops[args.get("External id")].append(e)
        elif cat.endswith("_runtime") or cat.endswith("_driver"):
            if "correlation" in args:
                launch_ext[args["correlation"]] = args.get("External id")
        elif cat == "kernel":
            kernels.append(e)
    out = []
    for k in kernels:
        ext = launch_ext.get(k["args"].get("correlation"))
        candidates = ops.get(ext) if ext is not None else None
        out.append((min(candidates, key=lambda e: e.get("dur", 0)) if candidates else None, k))
    return out


def coverage(rel: str) -> tuple[float, dict[str, float]]:
    """Share of linked kernel time whose op has flops and bytes; and the unmodeled time by op."""
    total = modeled = 0.0
    missing: dict[str, float] = defaultdict(float)
    for op, k in linked_kernels(_load(rel)):
        if op is None:
            continue
        dur = float(k.get("dur", 0))
        total += dur
        a = op.get("args") or {}
        c = cost_of(op["name"], a.get("Input Dims"), a.get("Input type"), a.get("Concrete Inputs"))
        if c is not None and c.flops is not None and c.bytes is not None:
            modeled += dur
        else:
            missing[op["name"]] += dur
    assert total > 0, f"{rel}: no kernel linked to a cpu_op"
    return modeled / total, {n: t / total for n, t in missing.items()}


@pytest.mark.parametrize("rel", COVERAGE_TRACES)
def test_kernel_time_coverage_at_least_90_percent(rel):
    share, missing = coverage(rel)
    worst = sorted(missing.items(), key=lambda kv: -kv[1])[:5]
    assert share >= 0.90, f"{rel}: {share:.1%} of linked kernel time modeled; unmodeled: {worst}"


def test_flash_attention_records_are_b_s_h_d():
    """``aten::_flash_attention_forward`` receives ``[b, s, h, d]`` views: dim 1 equals the
    recorded ``max_q`` (Concrete Inputs position 5). The attention formula relies on this."""
    seen = 0
    for rel in ("h100/gaunernst_bert-small-uncased__1016001.json.gz",
                "h100/Falconsai_nsfw_image_detection__1016002.json.gz"):
        for e in _load(rel):
            if e.get("cat") == "cpu_op" and e.get("name") == "aten::_flash_attention_forward":
                a = e["args"]
                assert a["Input Dims"][0][1] == int(a["Concrete Inputs"][5]), a
                seen += 1
    assert seen >= 10


def test_every_linked_op_of_the_bert_trace_is_modeled_exactly():
    """bert-small: every kernel-launching op has a formula; spot-check the per-op totals."""
    flops: dict[str, float] = defaultdict(float)
    seen_ext = set()
    for op, _k in linked_kernels(_load(COVERAGE_TRACES[0])):
        assert op is not None
        key = (op["name"], op["args"].get("External id"))
        if key in seen_ext:  # one op, several kernels: count it once
            continue
        seen_ext.add(key)
        a = op["args"]
        c = cost_of(op["name"], a["Input Dims"], a["Input type"], a.get("Concrete Inputs"))
        assert c is not None and c.flops is not None and c.bytes is not None, op["name"]
        flops[op["name"]] += c.flops
    # 4 layers, 8 heads of 64, 141 tokens, not causal
    assert flops["aten::_flash_attention_forward"] == 4 * (4 * 8 * 141 * 141 * 64)
    # 141 tokens through 17 [512 -> 512] (4 layers x q, k, v, out + the MLM transform),
    # 4 [512 -> 2048] + 4 [2048 -> 512] (FFN) and the [512 -> 30522] decoder
    assert flops["aten::addmm"] == 2 * 141 * (17 * 512 * 512 + 8 * 512 * 2048 + 512 * 30522) == 8_029_194_240


def _uncosted_families(rel: str, chip: str):
    from traceroof import analyze, read_trace

    r = analyze(read_trace(TRACES / rel), chip)
    assert r.coverage is not None and r.coverage.uncosted_families
    return r.coverage


@pytest.mark.parametrize("rel,chip,why,runtime", [
    # every kernel of this decode window is replayed by one hipGraphLaunch (no capture recorded)
    ("inference/vllm_decode_full/graph_execution.json.gz", "mi300x", "replayed by a CUDA/HIP graph, no framework op",
     "hipGraphLaunch"),
])
def test_uncosted_families_name_the_reason_for_the_time_they_hold(rel, chip, why, runtime):
    events = _load(rel)
    runtime_of = {e["args"]["correlation"]: e["name"] for e in events
                  if e.get("cat", "").endswith("_runtime") and "correlation" in (e.get("args") or {})}
    # the oracle, from the raw JSON: kernel µs whose correlation's runtime call is `runtime`
    # (a graph launch) or, for None, has no runtime call at all
    want_us = sum(e["dur"] for e in events if e.get("cat") == "kernel"
                  and runtime_of.get(e["args"].get("correlation")) == runtime)
    cov = _uncosted_families(rel, chip)
    got_ns = sum(f["device_time_ns"] for f in cov.uncosted_families if f["why"] == why)
    # the graph window's few costed kernels (a copy the op table links) are not in the family
    assert got_ns == pytest.approx(want_us * 1000, rel=0.02)
    assert got_ns > 0.25 * cov.device_time_ns
    # the families partition the uncosted time
    assert sum(f["device_time_ns"] for f in cov.uncosted_families) == pytest.approx(
        (1 - cov.costed_share) * cov.device_time_ns, abs=1000)
