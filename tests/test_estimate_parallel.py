"""Parallel layouts (traceroof.estimate_parallel, issue 18 item 4) against hand arithmetic:
the count, bytes, link and time of every collective of a step, the pipeline bubble, the
compute-bound conditions, and the layout search. H100 SXM: 989.4 TFLOP/s dense bf16, NVLink
450 GB/s per direction inside the 8-GPU scale-up domain, 50 GB/s network per GPU (chip
database); GB200: a 72-GPU NVLink domain."""

from __future__ import annotations

import pytest
from conftest import MODELS

from traceroof.chips import get_chip
from traceroof.errors import UsageError
from traceroof.estimate_memory import Layout
from traceroof.estimate_parallel import plan_layout, search_layouts
from traceroof.model import load_model_config

PEAK = 989.4e12


@pytest.fixture(scope="module")
def h100():
    return get_chip("h100")


@pytest.fixture(scope="module")
def m70():
    return load_model_config(MODELS / "llama3-70b.json")


def _by(plan, strategy, kind):
    (c,) = [c for c in plan.collectives if c.strategy == strategy and c.kind == kind]
    return c


def test_70b_tp8_pp4_fsdp32(m70, h100) -> None:
    assert (h100.intra_node_bytes_per_s, h100.inter_node_bytes_per_s) == (450e9, 50e9)
    p = plan_layout(m70, h100, Layout(tp=8, pp=4, fsdp=32), peak_flops_per_s=PEAK,
                    global_batch_tokens=4_194_304, seq_len=8192, mfu=0.4)
    # 4,194,304 tokens = 512 sequences of 8,192; / 32 data-parallel ranks = 16 micro-batches
    assert p.micro_batches == 16
    # step FLOPs (6N + 3·4·80·8192·8193/2) · 4,194,304 = 455,530,512,384 · 4,194,304
    assert p.step_flops == 455_530_512_384 * 4_194_304
    # compute = 1.9106e18 / (1,024 · 989.4e12 · 0.4) = 4.7146 s; bubble (4-1)/16 of it
    assert p.compute_s == pytest.approx(455_530_512_384 * 4_194_304 / (1024 * PEAK * 0.4))
    assert p.bubble_s == pytest.approx(3 / 16 * p.compute_s)
    tp = _by(p, "tp", "all-reduce")
    # 4 all-reduces per layer per micro-batch: 4 · 20 layers · 16 = 1,280, each of
    # [1, 8192, 8192] bf16 = 134,217,728 B, on NVLink: 1,280 · 2 · 134,217,728 / 450e9 = 0.7635 s
    assert (tp.count, tp.bytes_each, tp.link) == (1280, 134_217_728, "scale-up")
    assert tp.time_s == pytest.approx(1280 * 2 * 134_217_728 / 450e9) and tp.exposed
    ag = _by(p, "fsdp", "all-gather weights")
    # the fsdp group spans tp·fsdp = 256 GPUs > 8: network. Shard 2 B · 70,553,706,496 / (8·4)
    # = 4,409,606,656 B, gathered twice per micro-batch: 32 · 4,409,606,656 / 50e9 = 2.822 s
    assert (ag.count, ag.bytes_each, ag.link) == (32, 4_409_606_656, "network")
    assert ag.time_s == pytest.approx(32 * 4_409_606_656 / 50e9) and not ag.exposed
    rs = _by(p, "fsdp", "reduce-scatter grads")
    assert rs.time_s == pytest.approx(4_409_606_656 / 50e9)
    pp = _by(p, "pp", "send/recv")
    # 2 per micro-batch of [1, 8192, 8192] / tp bf16 = 16,777,216 B on the network
    assert pp.time_s == pytest.approx(32 * 16_777_216 / 50e9)
    # exposed: tp 0.7635 + pp 0.0107 + max(0, fsdp 2.910 - compute 4.715) = 0.7743 s
    assert p.exposed_comm_s == pytest.approx(tp.time_s + pp.time_s)
    assert p.step_s == pytest.approx(p.compute_s + p.bubble_s + p.exposed_comm_s)
    assert round(p.step_s, 2) == 6.37
    th = {t.strategy: t for t in p.thresholds}
    # tp <= 6·P_layer·W / (16·h·C) = 6·855,638,016·450e9 / (16·8192·395.76e12) = 44.5
    assert th["tp"].limit == pytest.approx(6 * 855_638_016 * 450e9 / (16 * 8192 * PEAK * 0.4))
    assert th["tp"].met is True
    # fsdp: tokens per micro-batch >= C/W = 395.76e12 / 50e9 = 7,915.2; 8,192 meets it
    assert th["fsdp"].limit == pytest.approx(7915.2) and th["fsdp"].met is True
    # bubble <= 10 % needs m >= 10·(pp-1) = 30; 16 does not
    assert th["pp"].limit == 30 and th["pp"].met is False


def test_all_reduce_cost_does_not_depend_on_shard_count(ref7b, h100) -> None:
    # DDP over 8 GPUs (one scale-up domain): 2 · 13,476,831,232 B / 450e9 = 59.9 ms; over 2
    # GPUs the same: the ring's bytes per device are ~2·B whatever n
    for dp in (2, 8):
        p = plan_layout(ref7b, h100, Layout(dp=dp), peak_flops_per_s=PEAK,
                        global_batch_tokens=dp * 4096, seq_len=4096)
        c = _by(p, "dp", "all-reduce grads")
        assert c.bytes_each == 2 * 6_738_415_616 and c.link == "scale-up"
        assert c.time_s == pytest.approx(2 * 13_476_831_232 / 450e9)
        assert round(c.time_s * 1e3, 1) == 59.9


def test_link_follows_the_scale_up_domain(m70) -> None:
    kw = dict(peak_flops_per_s=PEAK, global_batch_tokens=2 * 8192, seq_len=8192)
    h = plan_layout(m70, get_chip("h100"), Layout(tp=16), **kw)
    assert _by(h, "tp", "all-reduce").link == "network"  # 16 GPUs > the 8 of an HGX board
    gb = get_chip("gb200")
    assert gb.scale_up_domain == 72
    g = plan_layout(m70, gb, Layout(tp=16), **kw)
    c = _by(g, "tp", "all-reduce")
    assert c.link == "scale-up" and c.bytes_per_s == gb.intra_node_bytes_per_s


def test_moe_expert_all_to_all(h100) -> None:
    mix = load_model_config(MODELS / "mixtral-8x7b.json")
    p = plan_layout(mix, h100, Layout(fsdp=8, ep=8), peak_flops_per_s=PEAK,
                    global_batch_tokens=2_097_152, seq_len=4096)
    # 512 sequences / 8 ranks = 64 micro-batches; 4 all-to-alls per MoE layer: 4·32·64 = 8,192
    # each sends top-2 copies of [4096, 4096] bf16 = 67,108,864 B, 7/8 of it leaves the GPU:
    # 8,192 · 7/8 · 67,108,864 / 450e9 = 1.069 s
    a2a = _by(p, "ep", "all-to-all")
    assert (a2a.count, a2a.bytes_each, a2a.link) == (8192, 67_108_864, "scale-up")
    assert a2a.time_s == pytest.approx(8192 * 7 / 8 * 67_108_864 / 450e9)
    assert {t.strategy for t in p.thresholds} >= {"ep"}


def test_search_7b_on_8_gpus(ref7b, h100) -> None:
    found, tried, rejected = search_layouts(ref7b, h100, 8, peak_flops_per_s=PEAK,
                                            global_batch_tokens=1_048_576, seq_len=4096)
    # tp in {1,2,4,8}; pp divides 8/tp and 32; rest all-fsdp or all-dp (one layout when 1):
    # tp1: pp 1,2,4,8 -> 2+2+2+1; tp2: pp 1,2,4 -> 2+2+1; tp4: pp 1,2 -> 2+1; tp8: 1 = 16
    assert tried == 16
    assert len(found) + rejected == tried
    assert found and all(p.memory.fits for p in found)
    steps = [p.step_s for p in found]
    assert steps == sorted(steps)
    # 7B does not fit on one GPU unsharded: plain DDP over 8 (107.8 GB of state each) is out
    assert all(p.layout.describe() != "dp=8" for p in found)


def test_batch_too_small_for_the_layout(ref7b, h100) -> None:
    with pytest.raises(UsageError, match="fewer than one micro-batch"):
        plan_layout(ref7b, h100, Layout(dp=8), peak_flops_per_s=PEAK,
                    global_batch_tokens=4096, seq_len=4096)


def test_a_layout_does_not_tell_the_user_to_shard_what_it_shards():
    from traceroof.chips import get_chip
    from traceroof.estimate_plan import plan_estimate
    from traceroof.model_config import load_model_config

    cfg = load_model_config(MODELS / "llama3-70b.json")
    alone = plan_estimate(cfg, get_chip("h100"))
    # 70B in bf16 (141 GB) does not fit one 80 GB H100: without a layout, shard them
    assert any(n.endswith(": shard them") for n in alone.to_dict()["notes"])
    laid = plan_estimate(cfg, get_chip("h100"), layout={"tp": 8, "pp": 4, "fsdp": 32}, global_batch_tokens=4e6)
    notes = laid.to_dict()["notes"]
    assert not any(n.endswith(": shard them") for n in notes)
    assert any("the parallel section gives the memory per device of the layout" in n for n in notes)
