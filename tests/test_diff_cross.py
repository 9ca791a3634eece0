"""The cross-framework and cross-chip must-show of issue 16 (docs/diff.md, "Across frameworks
and chips"): each TraceLens H100 trace against its jax CPU twin (recorded,
fixtures/make_jax_twins.py) and against its MI300X twin (generated, fixtures/make_chip_twin.py);
and the matmul+attention group of traceroof.op_match on a generated pair."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from functools import lru_cache

import make_chip_twin
import polars as pl
import pytest
from conftest import FIXTURES, REAL
from tracegen import Kernel, TraceBuilder

from traceroof import read_trace
from traceroof.analysis import analyze, load_report
from traceroof.op_match import FAMILIES, GROUP_TOLERANCE, match

H100 = REAL / "TraceLens" / "tests" / "traces" / "h100"
MODELS = {"bert": "gaunernst_bert-small-uncased__1016001.json.gz",
          "vit": "Falconsai_nsfw_image_detection__1016002.json.gz",
          "qwen": "Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"}
JAX = FIXTURES / "jax_twins"
CHIP = FIXTURES / "chip_twins"
CPU = FIXTURES / "jax_cpu" / "cpu_chip.toml"
BF16 = ["c10::BFloat16"] * 2


def _exists(path):
    assert path.is_file(), f"{path} is missing: regenerate it (fixtures/make_jax_twins.py, fixtures/make_chip_twin.py)"
    return path


@lru_cache(maxsize=None)
def _report(path, chip):
    return load_report(_exists(path), chip, jobs=1)


def _h100(model):
    return _report(H100 / MODELS[model], "h100")


def _per_step_flops(r) -> float:
    """The oracle from the report alone: FLOPs of its step-bucket ops in complete steps (all its
    steps when none is complete: the diff's partial-step fallback), per device-step."""
    ops = r.ops.filter(pl.col("bucket") == "step")
    done = r.steps.filter(~pl.col("partial")).select("step")
    if done.height:
        ops = ops.join(done, on="step", how="semi")
    n = ops.select("rank", "step", "device").unique().height
    return float(ops["flops"].sum()) / n


def _check_groups(m):
    """Every matched group (a kind, or a family of kinds matched as one) agrees within 1 %."""
    fams: dict[str, list[float]] = {}
    for g in m.groups:
        if g.matched:
            f = fams.setdefault(g.family or g.kind, [0.0, 0.0])
            f[0] += g.flops_a
            f[1] += g.flops_b
    for name, (fa, fb) in fams.items():
        assert abs(fa - fb) <= GROUP_TOLERANCE * max(fa, fb), (name, fa, fb)
    return fams


@lru_cache(maxsize=None)
def _h100_gemms(model) -> Counter:
    """(M, K, N) -> count of the H100 trace's GEMMs, from its raw cpu_op events."""
    with gzip.open(H100 / MODELS[model], "rt") as f:
        events = json.load(f)["traceEvents"]
    out = Counter()
    for e in events:
        dims = (e.get("args") or {}).get("Input Dims")
        if e.get("cat") == "cpu_op" and e["name"] in ("aten::addmm", "aten::mm"):
            (m, k), (_, n) = dims[-2:] if e["name"] == "aten::mm" else dims[1:3]
            out[(m, k, n)] += 1
    return out


@pytest.mark.parametrize("model", list(MODELS))
def test_the_twins_run_what_the_h100_trace_ran(model):
    """The jax twin's matmul shapes and counts (traced from the jax program) are the H100
    trace's GEMMs, read from its raw cpu_op events: addmm [bias], [M, K], [K, N] and mm
    [M, K], [K, N]."""
    h100 = _h100_gemms(model)
    oracle = json.loads(_exists(JAX / f"{model}.oracle.json").read_text())
    twin = Counter({(r["m"], r["k"], r["n"]): r["count"] for r in oracle["matmuls"] if r["batch"] == 1})
    assert twin == h100 and sum(h100.values()) > 20


@lru_cache(maxsize=None)
def _h100_cpu_ops(model, name) -> list[dict]:
    """The args of the H100 trace's ``name`` cpu_op events, from the raw JSON."""
    with gzip.open(H100 / MODELS[model], "rt") as f:
        events = json.load(f)["traceEvents"]
    return [e["args"] for e in events if e.get("cat") == "cpu_op" and e["name"] == name]


@pytest.mark.parametrize("model", list(MODELS))
def test_the_twins_attention_dots_are_the_h100_attention_shapes(model):
    """The twin's batched dots (oracle.json, batch > 1) against the H100's
    ``aten::scaled_dot_product_attention`` q, k, v [b, h, s, d] and is_causal, from the raw
    trace: one op per layer; not causal, Q·Kᵀ [b·h, s, d]·[d, s] and P·V [b·h, s, s]·[s, d]
    once per layer each; causal (qwen), blocks of the lower triangle: each Q·Kᵀ
    [b·h·n, r, d]·[d, c] has its P·V [b·h·n, r, c]·[c, d] (n blocks of r query rows × c keys),
    once per layer, and their score pairs ``Σ n·r·c`` cover the causal ``s(s+1)/2`` with
    under 1 % more (the diagonal blocks computed whole)."""
    oracle = json.loads(_exists(JAX / f"{model}.oracle.json").read_text())
    sdpa = _h100_cpu_ops(model, "aten::scaled_dot_product_attention")
    layers = oracle["config"]["layers"]
    assert len(sdpa) == layers
    (b, h, s, d), = {tuple(x["Input Dims"][0]) for x in sdpa}
    causal, = {x["Concrete Inputs"][5] == "True" for x in sdpa}
    twin = Counter({(r["batch"], r["m"], r["k"], r["n"]): r["count"] for r in oracle["matmuls"] if r["batch"] > 1})
    assert causal == (model == "qwen")
    if not causal:
        assert twin == Counter({(b * h, s, d, s): layers, (b * h, s, s, d): layers})
        return
    qk = Counter({(bb, m, n): c for (bb, m, k, n), c in twin.items() if k == d})
    pv = Counter({(bb, m, k): c for (bb, m, k, n), c in twin.items() if n == d and k != d})
    assert qk == pv and set(qk.values()) == {layers} and sum(qk.values()) + sum(pv.values()) == sum(twin.values())
    assert all(bb % (b * h) == 0 for bb, _, _ in qk)
    pairs = sum(bb // (b * h) * m * n for bb, m, n in qk)
    causal_pairs = s * (s + 1) // 2  # 559·560/2 = 156 520
    assert causal_pairs <= pairs < 1.01 * causal_pairs


def test_causal_blocks_tile_the_lower_triangle_once():
    """fixtures/make_jax_twins.causal_blocks at the twin's s = 559 (and an odd small one):
    counted on a grid, every pair (i, j <= i) lies in exactly one block, no pair above the
    diagonal outside a diagonal block; the excess pairs are the diagonal blocks' upper halves:
    at s = 559, 81 leaves of 4 rows (6 each) and 47 of 5 (10 each) = 956, 0.61 % of 156 520."""
    import numpy as np
    from make_jax_twins import causal_blocks

    for s in (559, 37):
        grid = np.zeros((s, s), int)
        for r0, c0, rows, cols, diag in causal_blocks(s):
            grid[r0:r0 + rows, c0:c0 + cols] += 1
            assert diag == (r0 == c0)
            if not diag:
                assert c0 + cols <= r0  # a full block lies wholly below the diagonal
        lower = np.tril(np.ones((s, s), bool))
        assert (grid[lower] == 1).all() and grid.max() == 1
        excess = int(grid[~lower].sum())
        if s == 559:
            assert excess == 81 * 6 + 47 * 10 == 956
            assert sum(r * c for _, _, r, c, _ in causal_blocks(s)) == 156_520 + 956


@pytest.mark.parametrize("dtype, tol", [("float32", 1e-5), ("bfloat16", 2e-2)])
def test_the_twins_blocked_causal_attention_is_dense_attention(dtype, tol):
    """The twin's causal attention (blocks of one shape in one dot pair, each query row's
    partial softmaxes combined by log-sum-exp) against a plain dense masked softmax attention
    in f32 (``make_jax_twins.dense_attention``: one einsum, ``jnp.where`` mask,
    ``jax.nn.softmax``), q, k, v [1, 2, 559, 64] N(0, 1): the largest absolute difference
    within ``tol`` (outputs are O(1); bf16 rounds to 2⁻⁸ relative)."""
    import jax
    import jax.numpy as jnp
    from make_jax_twins import _attention, dense_attention

    keys = jax.random.split(jax.random.PRNGKey(1), 3)
    q, k, v = (jax.random.normal(x, (1, 2, 559, 64), jnp.float32).astype(dtype) for x in keys)
    got = jax.jit(lambda q, k, v: _attention(q, k, v, True))(q, k, v).astype(jnp.float32)
    want = dense_attention(q, k, v, True)
    assert float(jnp.abs(want).max()) > 0.5  # not a zero output
    assert float(jnp.abs(got - want).max()) < tol


def test_the_vit_twins_conv_is_the_h100_conv():
    """vit's patch convolution: the H100's ``aten::_convolution`` [4, 3, 224, 224]·[768, 3, 16,
    16], stride 16 (raw trace) is 2·(4·768·14·14)·(3·16·16) = 924 844 032 FLOPs; the twin's one
    conv op in the report (XLA's HLO convolution) is the same."""
    conv, = _h100_cpu_ops("vit", "aten::_convolution")
    (n, c, hh, ww), (o, _, kh, kw) = conv["Input Dims"][:2]
    stride = json.loads(conv["Concrete Inputs"][3])
    out = n * o * (hh // stride[0]) * (ww // stride[1])
    want = 2 * out * c * kh * kw
    assert want == 924_844_032
    ops = _report(JAX / "vit.xplane.pb", CPU).ops.filter(pl.col("kind") == "conv")
    assert ops.height == 1
    assert ops.select(pl.coalesce("dot_flops", "flops")).item() == want


@pytest.mark.parametrize("model", list(MODELS))
def test_jax_twin_matmuls_are_cost_analysis(model):
    """XLA's per-op matmul FLOPs in traceroof's report of the jax twin against
    ``cost_analysis()`` of each dot alone (the oracle json). A bare dot is one report op of
    exactly its oracle FLOPs (2·M·K·N); XLA fuses some dots with their neighbours (bert's and
    vit's attention dots with their softmax's elementwise ops): such a fusion's ``flops``
    count the fused ops too, its ``dot_flops`` the dots alone, and those sum to the oracle's
    dots exactly."""
    r = _report(JAX / f"{model}.xplane.pb", CPU)
    oracle = json.loads(_exists(JAX / f"{model}.oracle.json").read_text())
    mm = r.ops.filter(pl.col("kind") == "matmul")
    for row in oracle["matmuls"]:
        assert row["flops_per_op"] == 2 * row["batch"] * row["m"] * row["k"] * row["n"]
    assert sum(r_["flops_per_op"] * r_["count"] for r_ in oracle["matmuls"]) == oracle["matmul_flops"]
    dots = mm.select(pl.coalesce("dot_flops", "flops")).to_series()
    assert float(dots.sum()) == oracle["matmul_flops"]
    # the fusions' own FLOPs hold the dots plus their fused elementwise work (bert, vit: the
    # softmax's into P·V); qwen's blocked attention keeps its softmax out of its dots (each
    # dot's operands behind barriers), so there each fusion's FLOPs are its dots' alone
    fused = mm.filter(pl.col("dot_flops").is_not_null())
    assert fused.height and (fused["flops"] >= fused["dot_flops"]).all()
    extra = float(fused["flops"].sum()) - float(fused["dot_flops"].sum())
    assert extra > 0 if model != "qwen" else extra == 0
    # and the whole step: the report's per-op FLOPs sum to compiled.cost_analysis()'s
    # (to 1e-5: on qwen the per-op sum is 4.4e-6 above it, 25.7 MFLOP of 5.83 TFLOP, not traced down)
    assert float(r.ops["flops"].sum()) == pytest.approx(oracle["flops"], rel=1e-5)


@lru_cache(maxsize=None)
def _h100_attention_per_layer(model) -> float:
    """FLOPs of one H100 attention op from the raw trace: each ``aten::scaled_dot_product_attention``
    cpu_op's q, k, v [b, h, s, d] and its is_causal flag (Concrete Inputs[5]): Q·Kᵀ and P·V are
    2·b·h·s²·d each, 4·b·h·s²·d together, over the s·(s+1)/2 causal pairs instead of s² when
    causal. All of one trace's attention ops have one shape (asserted)."""
    with gzip.open(H100 / MODELS[model], "rt") as f:
        events = json.load(f)["traceEvents"]
    per_op = set()
    for e in events:
        if e.get("cat") == "cpu_op" and e["name"] == "aten::scaled_dot_product_attention":
            (b, h, s, d), causal = e["args"]["Input Dims"][0], e["args"]["Concrete Inputs"][5] == "True"
            per_op.add(4 * b * h * d * (s * (s + 1) // 2 if causal else s * s))
    assert len(per_op) == 1, per_op
    return float(per_op.pop())


def _twin_attention_per_layer(oracle) -> float:
    """The twin's attention dots (batch > 1: the per-head Q·Kᵀ and P·V) from ``cost_analysis()``
    of each dot alone (oracle.json), per layer."""
    dots = sum(r["flops_per_op"] * r["count"] for r in oracle["matmuls"] if r["batch"] > 1)
    return dots / oracle["config"]["layers"]


def _coverage_from_tables(m, a, b):
    """Coverage recomputed from the two reports' own op tables (:func:`_per_step_flops`) and
    the matching's list of matched pairs (one to one: count × FLOPs) and matched groups."""
    one = sum(r.matched * r.flops_per_op for r in m.signatures if r.flops_per_op)
    grp_a = sum(g.flops_a for g in m.groups if g.matched)
    grp_b = sum(g.flops_b for g in m.groups if g.matched)
    return (one + grp_a) / _per_step_flops(a), (one + grp_b) / _per_step_flops(b)


@pytest.mark.parametrize("model", list(MODELS))
def test_the_twins_attention_is_the_h100_attention(model):
    """The twin's attention dots against the H100's attention ops, both from raw sources (the
    oracle json, the trace's cpu_op shapes): bert's and vit's are exact; qwen's twin computes
    the lower triangle in blocks with its diagonal blocks whole: 956 pairs above the causal
    156 520 (test_causal_blocks_tile_the_lower_triangle_once), +0.61 %."""
    oracle = json.loads(_exists(JAX / f"{model}.oracle.json").read_text())
    a, t = _h100_attention_per_layer(model), _twin_attention_per_layer(oracle)
    excess = t / a - 1
    assert excess == pytest.approx({"bert": 0.0, "vit": 0.0, "qwen": 956 / 156_520}[model], abs=1e-12)


@pytest.mark.parametrize("model", list(MODELS))
def test_pytorch_h100_against_jax_cpu(model):
    """The H100 trace against its jax twin, each kind graded against raw sources. The
    projections meet one to one by FLOPs (bf16 on the H100, f32 dots on the CPU). The attention
    ops of the H100 (flash) meet the twin's batched dots (their dot FLOPs, not the softmax fused
    with them) as one matmul+attention group: on bert and vit the twin's dots are the attention
    formula exactly, on qwen 0.61 % above the causal formula (the diagonal blocks computed
    whole), inside the 1 % rule: ≥ 95 % of each side's FLOPs matched on all three."""
    a, b = _h100(model), _report(JAX / f"{model}.xplane.pb", CPU)
    m = match(a, b)
    assert m.flops_a == pytest.approx(_per_step_flops(a), rel=1e-9)
    assert m.flops_b == pytest.approx(_per_step_flops(b), rel=1e-9)
    assert (m.coverage_a, m.coverage_b) == pytest.approx(_coverage_from_tables(m, a, b), rel=1e-4)
    fams = _check_groups(m)
    oracle = json.loads(_exists(JAX / f"{model}.oracle.json").read_text())
    attn = next(g for g in m.groups if g.kind == "attention")
    mm = next(g for g in m.groups if g.kind == "matmul")
    layers = oracle["config"]["layers"]
    # A's attention in the report is the raw trace's, per step (one step, `layers` ops)
    assert attn.flops_a == pytest.approx(layers * _h100_attention_per_layer(model), rel=1e-9)
    assert attn.flops_b == 0
    # B's matmul FLOPs left over beyond A's are the twin's attention dots (oracle.json)
    # (to 1e-6: on qwen A's matmul leftover is 35 776 FLOPs (8944·4) of its projections above
    # 2·M·K·N, not traced down)
    attention_part_b = mm.flops_b - mm.flops_a
    assert attention_part_b == pytest.approx(layers * _twin_attention_per_layer(oracle), rel=1e-6)
    # the attention part itself within 1 %: exact on bert and vit, qwen's twin +956/156 520
    want = {"bert": 0.0, "vit": 0.0, "qwen": 956 / 156_520}[model]
    assert attention_part_b / attn.flops_a - 1 == pytest.approx(want, abs=1e-6)
    assert abs(attention_part_b - attn.flops_a) <= GROUP_TOLERANCE * attn.flops_a
    assert fams["matmul+attention"] == pytest.approx([attn.flops_a + mm.flops_a, mm.flops_b], rel=1e-12)
    assert attn.matched and mm.matched and attn.family == mm.family == "matmul+attention"
    assert m.coverage_a >= 0.95 and m.coverage_b >= 0.95
    # the projections meet one to one by FLOPs: per step as many on both sides, their FLOPs
    # the trace's GEMMs' 2·M·K·N, and counted as matched
    paired = [r for r in m.signatures if r.kind == "matmul" and r.dtype == "bf16" and r.dtype_b == "fp32"]
    assert paired and all(r.count_b == r.count_a for r in paired)
    gemm_flops = sum(2 * mm_ * k * n * c for (mm_, k, n), c in _h100_gemms(model).items())
    assert sum(r.flops_per_op * r.count_a for r in paired) == pytest.approx(gemm_flops, rel=1e-6)
    assert m.matched_flops_a >= sum(r.flops_per_op * r.matched for r in paired)
    # with no projection fused into another on the twin (qwen's last layer is kept out of
    # XLA's root fusion: fixtures/make_jax_twins.py), A's matched FLOPs are its GEMMs (one to
    # one), vit's patch conv (2·(4·768·14·14)·(3·16·16) = 924 844 032, one to one), and its
    # attention and matmul leftover (the group), and elementwise signatures met by chance
    # (qwen: one aten::add over 16·559·1024 = 9 158 656 bf16 elements meets an XLA bf16
    # convert of as many: same kind, dtype, FLOPs and bytes), a sliver of A
    conv = {"vit": 924_844_032}.get(model, 0)
    other = sum(r.matched * r.flops_per_op for r in m.signatures if r.flops_per_op and r.kind not in ("matmul", "conv"))
    assert other <= 1e-5 * m.flops_a
    assert m.matched_flops_a == pytest.approx(gemm_flops + conv + attn.flops_a + mm.flops_a + other, rel=1e-9)


@pytest.mark.parametrize("model", list(MODELS))
def test_h100_against_generated_mi300x(model):
    a = _h100(model)
    b = _report(CHIP / f"{model}_mi300x.json.gz", None)
    assert b.chip.name == "AMD Instinct MI300X"  # detected from the twin's deviceProperties
    m = match(a, b)
    assert m.flops_a == pytest.approx(_per_step_flops(a), rel=1e-9)
    assert m.flops_b == pytest.approx(_per_step_flops(b), rel=1e-9)
    assert m.coverage_a >= 0.95 and m.coverage_b >= 0.95
    _check_groups(m)
    # one flash kernel on the H100 is two CK kernels on the MI300X: the attention ops count
    # twice, their FLOPs split by duration, so they match as a group, not one to one
    n_a = a.ops.filter(pl.col("kind") == "attention").height
    assert b.ops.filter(pl.col("kind") == "attention").height == 2 * n_a > 0
    attn = next(g for g in m.groups if g.kind == "attention")
    assert attn.matched and attn.family == "attention" and attn.flops_a == pytest.approx(attn.flops_b, rel=1e-9)


def test_chip_twin_is_what_the_generator_writes(tmp_path):
    """The committed MI300X twins are the generator's output (regenerated here)."""
    for model in MODELS:
        new = make_chip_twin.write(model, tmp_path)
        with gzip.open(new, "rt") as f, gzip.open(_exists(CHIP / f"{model}_mi300x.json.gz"), "rt") as g:
            assert json.load(f) == json.load(g), model


def _attention_pair(tmp_path, causal_a: bool):
    """A: SDPA (not causal) over q, k, v [2, 8, 256, 64] plus a projection matmul. B: the same
    attention as two bmm (Q·Kᵀ [16, 256, 64]·[16, 64, 256], P·V [16, 256, 256]·[16, 256, 64]),
    the same projection; ``causal_a`` makes A's SDPA causal instead (half the score pairs)."""
    out = []
    for side in ("a", "b"):
        tb = TraceBuilder(queue_ns=0)
        tb.begin_step(0)
        tb.op("aten::mm", [[512, 512], [512, 512]], BF16, [Kernel("sm90_gemm_bf16", 30_000)])
        if side == "a":
            flag = "True" if causal_a else "False"
            tb.op("aten::scaled_dot_product_attention", [[2, 8, 256, 64]] * 3 + [[], [], [], [], []],
                  ["c10::BFloat16"] * 3 + ["", "Scalar", "Scalar", "", "Scalar"],
                  [Kernel("flash_fwd_kernel", 20_000)], ["", "", "", "", "0.", flag, "", "False"])
        else:
            tb.op("aten::bmm", [[16, 256, 64], [16, 64, 256]], BF16, [Kernel("sm90_gemm_bf16_batched", 9_000)])
            tb.op("aten::bmm", [[16, 256, 256], [16, 256, 64]], BF16, [Kernel("sm90_gemm_bf16_batched", 9_000)])
        tb.end_step(sync=True)
        out.append(analyze(read_trace(tb.write(tmp_path / f"{side}.json.gz")), "h100"))
    return out


def test_attention_meets_its_matmuls_as_one_group(tmp_path):
    a, b = _attention_pair(tmp_path, causal_a=False)
    m = match(a, b)
    assert ("matmul", "attention") in FAMILIES
    # by hand: attention 4·2·8·256²·64 = 268 435 456 = B's two bmm 2 · 2·16·256·256·64
    g = {x.kind: x for x in m.groups}
    assert g["attention"].flops_a == 4 * 2 * 8 * 256**2 * 64 == 268_435_456
    assert g["matmul"].flops_b == 2 * (2 * 16 * 256 * 256 * 64)
    assert g["attention"].matched and g["matmul"].matched and g["matmul"].family == "matmul+attention"
    assert m.coverage_a == m.coverage_b == 1.0


def test_causal_attention_is_not_the_full_square(tmp_path):
    # A's SDPA is causal: 4·2·8·64·(256·257/2) = 134 742 016 FLOPs against B's full-square dots
    # (268 435 456): the group differs by ~50 %, far past 1 %: unmatched, and said so
    a, b = _attention_pair(tmp_path, causal_a=True)
    m = match(a, b)
    g = {x.kind: x for x in m.groups}
    assert g["attention"].flops_a == 4 * 2 * 8 * 64 * (256 * 257 // 2)
    assert not g["attention"].matched and not g["matmul"].matched
    # the projection mm still matches one to one: 2·512³ FLOPs are what each side has matched
    assert m.matched_flops_a == m.matched_flops_b == 2 * 512**3


def test_cli_json_says_how_the_ops_matched():
    """``traceroof diff H100 twin --format json``: the matching section carries the coverage
    of :func:`match` on the same reports, the family of each group and B's dtype where ops met
    by FLOPs."""
    from click.testing import CliRunner

    from traceroof.cli import cli

    h100, twin = H100 / MODELS["bert"], _exists(JAX / "bert.xplane.pb")
    res = CliRunner().invoke(cli, ["diff", str(h100), str(twin), "--chip", "h100", "--chip-b", str(CPU),
                                   "--format", "json", "-q"])
    assert res.exit_code == 0, res.output
    j = json.loads(res.stdout)["matching"]
    m = match(_h100("bert"), _report(twin, CPU))
    assert (j["coverage_a"], j["coverage_b"]) == pytest.approx((m.coverage_a, m.coverage_b), rel=1e-12)
    assert {g["kind"]: g["family"] for g in j["groups"] if g["matched"]} == {
        "matmul": "matmul+attention", "attention": "matmul+attention"}
    # bert's 4 + 4 + 17 + 1 projections (2 FLOP counts among the 4 + 4), all bf16 → fp32
    fp32 = [s for s in j["signatures"] if s["kind"] == "matmul" and s["dtype_b"] == "fp32"]
    assert sorted(s["count_a"] for s in fp32) == [1, 8, 17]


def _side(tmp_path, name, mms, dtypes, attention=None, bmm_n=None):
    """One generated step: ``mms`` matmuls ([M, K], [K, N]) in ``dtypes``, an SDPA over q, k, v
    ``attention`` [b, h, s, d] (not causal) and/or the two bmm of an unfused attention
    [16, 256, 64]·[16, 64, bmm_n], [16, 256, bmm_n]·[16, bmm_n, 64]."""
    tb = TraceBuilder(queue_ns=0)
    tb.begin_step(0)
    for shapes in mms:
        tb.op("aten::mm", shapes, dtypes, [Kernel("sm90_gemm", 300_000)])
    if attention:
        tb.op("aten::scaled_dot_product_attention", [attention] * 3 + [[], [], [], [], []],
              ["c10::BFloat16"] * 3 + ["", "Scalar", "Scalar", "", "Scalar"],
              [Kernel("flash_fwd_kernel", 20_000)], ["", "", "", "", "0.", "False", "", "False"])
    if bmm_n:
        tb.op("aten::bmm", [[16, 256, 64], [16, 64, bmm_n]], dtypes, [Kernel("gemm_batched", 9_000)])
        tb.op("aten::bmm", [[16, 256, bmm_n], [16, bmm_n, 64]], dtypes, [Kernel("gemm_batched", 9_000)])
    tb.end_step(sync=True)
    return analyze(read_trace(tb.write(tmp_path / f"{name}.json.gz")), "h100")


def test_a_big_matmul_does_not_hide_a_missing_attention(tmp_path):
    """A: bf16 mm 4096³ + SDPA [2, 8, 256, 64]; B: the same mm in f32, no attention. The mm
    pair one to one by FLOPs (2·4096³ = 137 438 953 472 each); A's attention
    (4·2·8·256²·64 = 268 435 456) has nothing on B: unmatched, and A's coverage says so."""
    n = 4096
    a = _side(tmp_path, "a", [[[n, n], [n, n]]], BF16, attention=[2, 8, 256, 64])
    b = _side(tmp_path, "b", [[[n, n], [n, n]]], ["float", "float"])
    m = match(a, b)
    attn = next(g for g in m.groups if g.kind == "attention")
    assert attn.flops_a == 268_435_456 and not attn.matched
    assert m.matched_flops_a == m.matched_flops_b == 2 * n**3
    assert m.coverage_a == pytest.approx(2 * n**3 / (2 * n**3 + 268_435_456), rel=1e-12)
    assert m.coverage_b == 1.0


def test_a_matching_total_does_not_hide_an_attention_mismatch(tmp_path):
    """Different dtypes, projections of other shapes and an attention that is 2.3 % off: A is
    bf16 mm [4096, 4096]·[4096, 4096] + SDPA [2, 8, 256, 64] (268 435 456 FLOPs); B is f32
    2 × mm [2048, 4096]·[4096, 4096] (the same 137 438 953 472 FLOPs, other shapes) and
    attention as two bmm over 250 keys: 2 · 2·16·256·64·250 = 262 144 000 FLOPs, 2.34 % under
    A's. The matmul+attention totals agree within 1 % (the projections dominate), the attention
    does not: no family group, attention unmatched."""
    n = 4096
    a = _side(tmp_path, "a", [[[n, n], [n, n]]], BF16, attention=[2, 8, 256, 64])
    b = _side(tmp_path, "b", [[[n // 2, n], [n, n]]] * 2, ["float", "float"], bmm_n=250)
    m = match(a, b)
    g = {x.kind: x for x in m.groups}
    assert g["attention"].flops_a == 268_435_456 and g["matmul"].flops_b == 2 * n**3 + 262_144_000
    total_a, total_b = 2 * n**3 + 268_435_456, 2 * n**3 + 262_144_000
    assert abs(total_a - total_b) <= GROUP_TOLERANCE * total_a  # the total alone would pass
    assert not g["attention"].matched and g["attention"].family == "attention"
    assert g["matmul"].family == "matmul"
    assert m.coverage_a == pytest.approx(2 * n**3 / total_a, rel=1e-12)


def test_80_columns_keep_the_op_names():
    """``traceroof diff H100 twin`` at 80 columns: every line fits (counted in characters), the
    Ops table drops its expected, gap and FLOPs columns (said in its title) and keeps each op's
    whole name: the top op of the JSON rows appears on one line."""
    from traceroof.diff import compare
    from traceroof.render.diff import NARROW_DROP, table

    d = compare(_h100("bert"), _report(JAX / "bert.xplane.pb", CPU))
    out = table(d, width=80)
    lines = out.splitlines()
    assert max(len(x) for x in lines) <= 80
    ops_at = next(i for i, x in enumerate(lines) if x.startswith("Ops (per step"))
    assert all(h in lines[ops_at] for h in NARROW_DROP)
    header = next(x for x in lines[ops_at:] if "┃ op" in x)
    assert "FLOPs" not in header and "gap" not in header and "Δ measured" in header
    assert any(f"│ {d.ops[0].label} " in x for x in lines[ops_at:])
    wide = table(d, width=160)
    assert "gap" in next(x for x in wide.splitlines() if "┃ op" in x)


def test_a_step_change_far_from_its_base_is_a_factor():
    """The headline's change: a percentage while B is within ten times A, a factor beyond
    (qwen's 34.9 ms → 174 s would be "+499599.3 %")."""
    from traceroof.render.diff import _pct

    assert _pct(100.0, 150.0) == "+50.0 %"
    assert _pct(34.9, 174_400.0) == "×4,997"  # 174 400 / 34.9 = 4997.1
    assert _pct(100.0, 5.0) == "×0.05"
    assert _pct(100.0, 11.0) == "-89.0 %"
    assert _pct(0.0, 5.0) == "—"


def test_committed_twins_hold_no_machine_paths():
    """No absolute path of the machine that recorded or generated them (``/work/``, ``/root``,
    ``/home/``, ``/tmp/``) in any committed twin; their source locations are relative."""
    files = sorted(JAX.glob("*")) + sorted(CHIP.glob("*"))
    assert len(files) == 9, files
    for f in files:
        raw = f.read_bytes()
        if f.suffix == ".gz":
            raw = gzip.decompress(raw)
        for bad in (b"/work/", b"/root", b"/home/", b"/tmp/"):
            assert bad not in raw, (f.name, bad)
    locs = _report(JAX / "bert.xplane.pb", CPU).ops["source_location"].drop_nulls()
    assert locs.len() and locs.str.starts_with("fixtures/make_jax_twins.py:").all()


def test_scrub_rewrites_a_path_and_nothing_else(tmp_path):
    """fixtures/xplane_scrub.py on a committed twin: a longer path in place of the relative one
    re-encodes every length prefix (the file grows by 11 bytes per occurrence) and the report
    is the same but for the source locations, which carry the new path."""
    import xplane_scrub

    src = JAX / "bert.xplane.pb"
    raw = src.read_bytes()
    old, new = b"fixtures/make_jax_twins.py", b"/elsewhere/fixtures/make_jax_twins.py"
    n = raw.count(old)
    out = tmp_path / "bert.xplane.pb"
    out.write_bytes(xplane_scrub.scrub(raw, old, new))
    assert n > 0 and out.stat().st_size == len(raw) + n * (len(new) - len(old))
    a, b = _report(src, CPU).ops, load_report(out, CPU, jobs=1).ops
    assert a.drop("source_location").equals(b.drop("source_location"))
    want = a["source_location"].str.replace("fixtures/", "/elsewhere/fixtures/", literal=True)
    assert want.equals(b["source_location"])


def test_the_signature_table_says_how_each_row_was_matched():
    """The "how" column (docs/diff.md, "Limit of group matching"): bert's projections pair one
    to one by FLOPs (as many as the row's ``matched``), the twin's attention dots (on A's side only as the flash op) go through
    the matmul+attention group, and the twin's converts (the CPU's bf16 → f32, no A op) stay
    unmatched. Each expectation is derived from the row's own counts and the group's flag."""
    from traceroof.render.diff import _how

    a, b = _h100("bert"), _report(JAX / "bert.xplane.pb", CPU)
    m = match(a, b)
    groups = {g.kind: g for g in m.groups}
    seen = set()
    for r in m.signatures:
        how = _how(r, m.groups)
        if r.matched > 0 and r.matched == max(r.count_a, r.count_b):
            assert how == f"{r.matched:.4g} one to one"
            seen.add("one")
        elif r.matched == 0 and r.kind in ("matmul", "attention") and groups[r.kind].matched:
            assert how == f"all via the {groups[r.kind].family or r.kind} group"
            seen.add("group")
        elif r.matched == 0 and (r.kind not in groups or not groups[r.kind].matched):
            assert how == "all unmatched"
            seen.add("unmatched")
    assert seen == {"one", "group", "unmatched"}
