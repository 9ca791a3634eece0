"""The project's own jax CPU profile (fixtures/jax_cpu, made by fixtures/make_jax_profile.py):
per-op FLOPs from the trace's HLO (costed without jax: traceroof.costs.hlo_model) must add up
to XLA's whole-module cost analysis."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import polars as pl
import pytest

from traceroof.costs import hlo_text
from traceroof.parsers import hlo_modules, xplane

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
XPLANE = FIXTURES / "jax_cpu" / "train_step.xplane.pb"
ORACLE = FIXTURES / "jax_cpu" / "train_step.oracle.json"


@pytest.fixture(scope="module")
def oracle():
    assert ORACLE.exists(), "run fixtures/make_jax_profile.py"
    return json.loads(ORACLE.read_text())


@pytest.fixture(scope="module")
def trace():
    assert XPLANE.exists(), "run fixtures/make_jax_profile.py"
    return xplane.read(XPLANE)


def test_fixture_is_small_and_real(oracle):
    assert XPLANE.stat().st_size < 1_000_000
    assert oracle["steps"] == 3 and oracle["module"] == "jit_train_step"


def test_per_op_flops_sum_to_cost_analysis(trace, oracle):
    per_step = trace.ops.group_by("step").agg(
        pl.len(), pl.col("flops").sum(), pl.col("flops").null_count().alias("unknown"))
    assert per_step.height == oracle["steps"]
    for _step, n, flops, unknown in per_step.rows():
        assert unknown == 0
        assert n == 159
        assert flops == oracle["flops"]  # exact: same HLO, same cost model
    assert set(trace.ops["cost_source"].unique()) == {"shapes"}
    # bytes: the per-op sum misses only the entry's parameters/tuple bookkeeping
    b = trace.ops.filter(pl.col("step") == 0)["bytes"].sum()
    assert b == pytest.approx(oracle["bytes_accessed"], rel=1e-4)


def test_matches_a_fresh_cost_analysis(trace, oracle):
    jax = pytest.importorskip("jax")
    if jax.__version__ != oracle["jax_version"]:
        pytest.skip(f"fixture made with jax {oracle['jax_version']}, running {jax.__version__}: "
                    "the compiled HLO may differ")
    spec = importlib.util.spec_from_file_location("make_jax_profile", FIXTURES / "make_jax_profile.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    fresh = mod.cost_analysis()
    assert fresh["flops"] == oracle["flops"]
    step0 = trace.ops.filter(pl.col("step") == 0)["flops"].sum()
    assert step0 == fresh["flops"]


def test_kinds_of_transformer_ops(trace):
    kinds = dict(trace.ops.filter(pl.col("step") == 0).group_by("kind").len().rows())
    # qkv/out/MLP matmuls and attention score/context matmuls, forward and backward
    assert kinds["matmul"] == 36
    assert kinds.get("reduction", 0) > 0 and kinds.get("elementwise", 0) > 0
    mm = trace.ops.filter(pl.col("kind") == "matmul")
    assert set(mm["op"].unique()) <= {"fusion", "dot"} and set(mm["dtype"].unique()) == {"fp32"}
    assert mm["flops"].sum() / trace.ops["flops"].sum() > 0.9  # matmuls dominate FLOPs


def test_unreadable_hlo_costs_are_unknown_not_zero(monkeypatch):
    def unreadable(proto, name=""):
        raise ValueError("simulated: not an HloProto")

    monkeypatch.setattr(hlo_modules, "module_info", unreadable)
    trace = xplane.read(XPLANE)
    assert trace.ops.height == 477
    assert trace.ops["flops"].null_count() == 477
    assert trace.ops["bytes"].null_count() == 477
    assert set(trace.ops["cost_source"].unique()) == {"unknown"}
    assert any("HLO module not costed" in w and "simulated" in w for w in trace.meta.warnings)


def test_hlo_cost_module_api():
    from traceroof.parsers import xplane_proto as xp

    space = xp.XSpace()
    space.ParseFromString(XPLANE.read_bytes())
    meta = next(p for p in space.planes if p.name == "/host:metadata")
    names = {k: v.name for k, v in meta.stat_metadata.items()}
    proto = next(s.bytes_value for m in meta.event_metadata.values() if m.name == "jit_train_step(40)"
                 for s in m.stats if names[s.metadata_id] == "Hlo Proto")
    info = hlo_modules.module_info(proto, "jit_train_step")
    ops = [i for i in info.instructions.values()
           if i.in_entry and i.opcode not in hlo_text.TRIVIAL_OPCODES]
    assert len(ops) == 159
    assert sum(info.cost(i.name).flops for i in ops) == 43373056.0
    assert info.cost("no-such-instruction") is None
    assert hlo_text.shape_bytes("(bf16[8,4]{1,0}, s8[16]{0})") == 8 * 4 * 2 + 16
