"""XLA loops, custom calls and costs without jax (issue 14 item 4).

Fixtures: ``fixtures/jax_cpu/loops.xplane.pb`` (``python fixtures/make_jax_profile.py
--loops``: a ``fori_loop`` of 5 ``tanh(c @ w)`` and a ``scan`` of 3 ``0.5 * (c @ w_i)``,
c f32[64,128], w f32[128,128], 2 steps) and the real MI300X jax traces.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl

from traceroof.costs import hlo as hlo_costs
from traceroof.costs.hlo_model import cost_estimate
from traceroof.parsers import xplane

REPO = Path(__file__).resolve().parents[1]
LOOPS = REPO / "fixtures" / "jax_cpu" / "loops.xplane.pb"
LOOPS_ORACLE = REPO / "fixtures" / "jax_cpu" / "loops.oracle.json"
REAL = REPO.parent / "shared" / "fixtures" / "real"
JAX08_ATTENTION = REAL / "TraceLens/tests/traces/mi300/jax08_attention/tw003.xplane.pb"
JAX08_GEMM = REAL / "TraceLens/tests/traces/mi300/jax08_gemm/tw003.xplane.pb"

MATMUL = 2 * 64 * 128 * 128  # one [64,128] @ [128,128]: 2*M*K*N = 2,097,152 FLOPs


def _loops():
    assert LOOPS.exists(), "run python fixtures/make_jax_profile.py --loops"
    return xplane.read(LOOPS), json.loads(LOOPS_ORACLE.read_text())


def test_loop_body_ops_counted_once_per_iteration():
    trace, oracle = _loops()
    assert oracle["config"]["fori_iterations"] == 5 and oracle["config"]["scan_length"] == 3
    per_step = trace.ops.group_by("step").agg(
        pl.col("flops").filter(pl.col("kind") == "matmul").sum().alias("mm"),
        (pl.col("kind") == "matmul").sum().alias("n_mm"),
        pl.col("flops").sum().alias("flops"))
    assert per_step.height == oracle["steps"] == 2
    for _step, mm, n_mm, flops in per_step.rows():
        # hand count: 5 fori iterations + 3 scan iterations of one matmul each
        assert n_mm == 5 + 3
        assert mm == (5 + 3) * MATMUL == 16_777_216
        # per fori iteration: the matmul + the counter add (tanh is a transcendental, 0
        # FLOPs); per scan iteration: matmul + 64*128 multiplies + 64*128-1 adds of the sum
        # + the counter add. cost_analysis() counts each body once, plus each loop
        # condition's one compare (conditions are not op events of the trace):
        fori_body, scan_body = MATMUL + 1, MATMUL + 8192 + 8191 + 1
        assert oracle["flops"] == fori_body + scan_body + 2 == 4_210_691
        assert flops == 5 * fori_body + 3 * scan_body == 16_826_373
        assert flops == oracle["flops"] - 2 + (5 - 1) * fori_body + (3 - 1) * scan_body


def test_loop_container_is_not_an_op_row():
    trace, _ = _loops()
    assert trace.ops.filter(pl.col("op") == "while").height == 0
    assert trace.meta.stats["xplane.loop_containers"] == 2 * 2  # two loops, two steps
    assert any("control-flow container" in w for w in trace.meta.warnings)
    # the busy union is the body ops' alone: no op row spans another one on the line
    ops = trace.ops.sort("start_ns")
    end = (ops["start_ns"] + ops["dur_ns"]).to_list()
    start = ops["start_ns"].to_list()
    assert all(start[i + 1] >= end[i] for i in range(len(start) - 1))


def test_while_not_enclosing_its_body_costs_trip_count_passes():
    text = """HloModule m

%body (p: (s32[], f32[8,8])) -> (s32[], f32[8,8]) {
  %p = (s32[], f32[8,8]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[8,8] get-tuple-element(%p), index=1
  %d = f32[8,8] dot(%x, %x), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %t = (s32[], f32[8,8]) tuple(%i, %d)
}

%cond (q: (s32[], f32[8,8])) -> pred[] {
  %q = (s32[], f32[8,8]) parameter(0)
  ROOT %c = pred[] constant(true)
}

ENTRY %main (a: (s32[], f32[8,8])) -> (s32[], f32[8,8]) {
  %a = (s32[], f32[8,8]) parameter(0)
  ROOT %w = (s32[], f32[8,8]) while(%a), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"7"}}
}
"""
    info = hlo_costs.module_info_from_text(text, "m")
    assert info.cost("d").flops == 2 * 8 * 8 * 8
    assert info.cost("w").flops == 7 * 2 * 8 * 8 * 8  # 7 iterations, hand count
    no_trip = text.replace(', backend_config={"known_trip_count":{"n":"7"}}', "")
    assert hlo_costs.module_info_from_text(no_trip, "m").cost("w").flops is None


def test_triton_gemm_fusion_bytes_are_operands_plus_output():
    trace = xplane.read(JAX08_ATTENTION)
    g = trace.ops.filter(pl.col("hlo_op") == "gemm_fusion_dot_general.1")
    assert g.height == 3
    # f32[4,4,2048,1024] result + bf16[4,2048,4,512] and bf16[4,4,512,1024] operands
    out, a, b = 4 * 4 * 2048 * 1024 * 4, 4 * 2048 * 4 * 512 * 2, 4 * 4 * 512 * 1024 * 2
    assert set(g["bytes"].unique()) == {float(out + a + b)} == {184_549_376.0}
    # batch 4*4, M 2048, N 1024, K 512
    assert set(g["flops"].unique()) == {2.0 * 16 * 2048 * 1024 * 512}


CUDNN = """HloModule c

ENTRY %main (x: f16[8,32,32,64], w: f16[3,3,64,128], dy: f16[8,32,32,128]) -> f16[8,32,32,128] {
  %x = f16[8,32,32,64]{3,2,1,0} parameter(0)
  %w = f16[3,3,64,128]{3,2,1,0} parameter(1)
  %dy = f16[8,32,32,128]{3,2,1,0} parameter(2)
  %fwd = (f16[8,32,32,128]{3,2,1,0}, u8[1024]{0}) custom-call(%x, %w), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f, custom_call_target="__cudnn$convForward"
  %bi = (f16[8,32,32,64]{3,2,1,0}, u8[1024]{0}) custom-call(%dy, %w), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f, custom_call_target="__cudnn$convBackwardInput"
  ROOT %bf = (f16[3,3,64,128]{3,2,1,0}, u8[1024]{0}) custom-call(%x, %dy), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f, custom_call_target="__cudnn$convBackwardFilter"
}
"""


def test_cudnn_convolution_custom_calls_costed_from_the_hlo():
    info = hlo_costs.module_info_from_text(CUDNN, "c")
    # 3x3 conv, 64 -> 128 channels, 8x32x32 outputs: 2 * (8*32*32*128) * (3*3*64)
    conv = 2.0 * (8 * 32 * 32 * 128) * (3 * 3 * 64)
    for name in ("fwd", "bi", "bf"):
        assert info.cost(name).flops == conv, name
    # bytes: operands + the result, not the u8 workspace
    x, w, y = 8 * 32 * 32 * 64 * 2, 3 * 3 * 64 * 128 * 2, 8 * 32 * 32 * 128 * 2
    assert info.cost("fwd").bytes_accessed == x + w + y
    assert info.cost("bi").bytes_accessed == y + w + x
    assert info.cost("bf").bytes_accessed == x + y + w


def test_pallas_cost_estimate():
    cfg = '{"custom_call_config": {"body": "...", "cost_estimate": {"flops": 1000, ' \
          '"transcendentals": 0, "bytes_accessed": "4096"}}}'
    assert cost_estimate(cfg) == (1000.0, 4096.0)
    assert cost_estimate('{"custom_call_config": {"body": "..."}}') == (None, None)
    text = ("HloModule p\n\nENTRY %main (a: f32[32]) -> f32[32] {\n  %a = f32[32]{0} parameter(0)\n"
            f"  ROOT %k = f32[32]{{0}} custom-call(%a), custom_call_target=\"tpu_custom_call\", "
            f"backend_config={cfg}\n}}\n")
    c = hlo_costs.module_info_from_text(text, "p").cost("k")
    assert (c.flops, c.bytes_accessed) == (1000.0, 4096.0)
    unknown = text.replace('"cost_estimate": {"flops": 1000, "transcendentals": 0, '
                           '"bytes_accessed": "4096"}', '"x": 1')
    c = hlo_costs.module_info_from_text(unknown, "p").cost("k")
    assert c.flops is None and c.bytes_accessed == 32 * 4 * 2  # operand + result


def test_xplane_costs_do_not_import_jax():
    code = (
        "import sys, polars as pl\n"
        "from traceroof.parsers import xplane\n"
        f"t = xplane.read({str(JAX08_GEMM)!r})\n"
        "mm = t.ops.filter(pl.col('kind') == 'matmul')\n"
        "print(mm.height, mm['flops'].null_count(), 'jax' in sys.modules, 'jaxlib' in sys.modules)\n"
    )
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120)
    assert got.returncode == 0, got.stderr
    # 18 matmul kernels (6 GEMM programs x 3 runs), all costed, jax never imported
    assert got.stdout.split() == ["18", "0", "False", "False"]


def test_te_fused_attention_forward_from_backend_config():
    trace = xplane.read(REAL / "TraceLens/tests/test_data_jax_te_fused_attn_categorization"
                        / "934987a2fc2f.xplane.pb")
    fwd = trace.ops.filter(pl.col("hlo_op") == "te_fused_attn_forward_ffi.10")
    assert fwd.height == 10  # 5 executions x 2 kernels
    # b=2, h=16, causal s=2048 (mask_type 2): 2048*2049/2 pairs, d_qk = d_v = 128
    per_exec = 2 * 2 * 16 * (2048 * 2049 // 2) * (128 + 128)
    assert per_exec == 34_376_515_584
    assert fwd["flops"].sum() == 5 * per_exec
