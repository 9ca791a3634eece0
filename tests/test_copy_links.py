"""Memory movers at their link and collectives at their domain (issue 14 item 5): host<->device
copies at the host link (pinned and pageable), peer copies at the scale-up link, device copies
at HBM with both the read and the write counted; collectives over more devices than the chip's
scale-up domain at the scale-out network; an fp64 matmul at the fp64 peak. Every expected time
is hand arithmetic (bytes / link bandwidth) in a comment, or computed here from the raw events."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import polars as pl
import pytest
from conftest import real
from tracegen import TraceBuilder

from traceroof import read_trace
from traceroof.chips import get_chip, load_chip_file
from traceroof.costing import apply_costs
from traceroof.costs.memory import copy_hbm_bytes, copy_route
from traceroof.roofline import (
    add_roofline,
    collective_link_bytes_per_s,
    copy_link_bytes_per_s,
    scale_up_domain,
)
from traceroof.schema import OP_SCHEMA, conform


def _roofline(path: Path, chip):
    ops, _ = apply_costs(read_trace(path))
    return add_roofline(ops, chip)


def _named(r: pl.DataFrame, name: str) -> dict:
    rows = r.filter(pl.col("name") == name)
    assert rows.height == 1, (name, rows.height)
    return rows.row(0, named=True)


# --------------------------------------------------------------------------- routes


@pytest.mark.parametrize(
    "name, route",
    [
        ("Memcpy HtoD (Pinned -> Device)", "host"),
        ("Memcpy HtoD (Pageable -> Device)", "host"),
        ("Memcpy DtoH (Device -> Pageable)", "host"),
        ("Memcpy DtoH (Device -> Host)", "host"),
        ("Memcpy HtoD (Host -> Device)", "host"),
        ("Memcpy DtoD (Device -> Device)", "device"),
        ("Memcpy PtoP (Device -> Device)", "peer"),
        ("MemcpyH2D", "host"),
        ("MemcpyD2D", "device"),
        ("MemcpyP2P", "peer"),
        ("Memcpy", None),
    ],
)
def test_copy_route_from_the_kineto_name(name: str, route: str | None):
    assert copy_route(name) == route


def test_device_copy_reads_and_writes():
    assert copy_hbm_bytes("Memcpy DtoD (Device -> Device)", 1000.0) == 2000.0
    assert copy_hbm_bytes("Memcpy HtoD (Pinned -> Device)", 1000.0) == 1000.0
    assert copy_hbm_bytes("Memcpy PtoP (Device -> Device)", 1000.0) == 1000.0


# --------------------------------------------------------------------------- built trace


def _copies_trace(tmp_path: Path) -> Path:
    """Four copies on an H100 SXM (HBM 3.35e12, host link PCIe Gen5 64e9, NVLink 450e9 B/s)."""
    tb = TraceBuilder()
    tb.memcpy("HtoD", 64_000_000, 2_000_000)
    tb.memcpy("HtoD", 64_000_000, 4_000_000)
    tb.memcpy("HtoD", 100_000_000, 100_000)
    tb.memcpy("HtoD", 45_000_000, 200_000)
    copies = [e for e in tb.events if e.get("cat") == "gpu_memcpy"]
    copies[1]["name"] = "Memcpy HtoD (Pageable -> Device)"
    copies[2]["name"] = "Memcpy DtoD (Device -> Device)"
    copies[3]["name"] = "Memcpy PtoP (Device -> Device)"
    return tb.write(tmp_path / "copies.json.gz")


def test_copies_are_judged_at_their_link(tmp_path: Path):
    chip = get_chip("h100_sxm")
    r = _roofline(_copies_trace(tmp_path), chip)
    pinned = _named(r, "Memcpy HtoD (Pinned -> Device)")
    # 64e6 B / 64e9 B/s = 1 ms = 1,000,000 ns; measured 2 ms -> 50 %
    assert pinned["expected_ns"] == pytest.approx(1_000_000)
    assert pinned["efficiency"] == pytest.approx(0.5)
    assert pinned["bound"] == "memory"
    pageable = _named(r, "Memcpy HtoD (Pageable -> Device)")
    # the same bound (the staging copy is the gap): 1,000,000 ns of 4 ms -> 25 %
    assert pageable["expected_ns"] == pytest.approx(1_000_000)
    assert pageable["efficiency"] == pytest.approx(0.25)
    dtod = _named(r, "Memcpy DtoD (Device -> Device)")
    # reads and writes 100e6 B: bytes 2e8; 2e8 / 3.35e12 = 59,701.49 ns
    assert dtod["bytes"] == 200_000_000
    assert dtod["expected_ns"] == pytest.approx(2e8 / 3.35e12 * 1e9)
    peer = _named(r, "Memcpy PtoP (Device -> Device)")
    # 45e6 B / 450e9 B/s = 100,000 ns of 200,000 -> 50 %
    assert peer["bytes"] == 45_000_000
    assert peer["expected_ns"] == pytest.approx(100_000)
    assert peer["efficiency"] == pytest.approx(0.5)


def test_host_copy_on_a_chip_without_a_host_link_is_unknown_not_hbm(tmp_path: Path):
    f = tmp_path / "mychip.toml"
    f.write_text(
        'name = "My GPU"\nvendor = "nvidia"\nhbm_bytes = 80e9\nhbm_bytes_per_s = 3e12\n'
        "[peak_flops_per_s]\nbf16 = 1e15\nfp32 = 5e13\n"
    )
    chip = load_chip_file(f)
    assert chip.host_link_bytes_per_s is None and copy_link_bytes_per_s(chip, "host") is None
    r = _roofline(_copies_trace(tmp_path), chip)
    pinned = _named(r, "Memcpy HtoD (Pinned -> Device)")
    assert pinned["expected_ns"] is None and pinned["bound"] == "unknown"
    # the device copy still has its HBM roof: 2e8 / 3e12 = 66,666.67 ns
    assert _named(r, "Memcpy DtoD (Device -> Device)")["expected_ns"] == pytest.approx(2e8 / 3e12 * 1e9)


# --------------------------------------------------------------------------- real traces

HTA = ("HolisticTraceAnalysis", "tests", "data")


def _raw_copies(path: Path, word: str) -> tuple[int, int, int]:
    """(count, bytes, duration ns) of the raw ``gpu_memcpy`` events whose name contains
    ``word``, read straight from the JSON (durations are µs with ns decimals)."""
    ev = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    hits = [e for e in ev if e.get("cat") == "gpu_memcpy" and word in e.get("name", "")]
    return len(hits), sum(e["args"]["bytes"] for e in hits), sum(round(e["dur"] * 1000) for e in hits)


@pytest.mark.parametrize(
    "rel, name",
    [
        # 150 pinned HtoD copies: 423,923,260 B in 50.656 ms; / 32e9 B/s = 13.248 ms -> 26.2 %
        (("trace_diff", "control", "control.json.gz"), "Memcpy HtoD (Pinned -> Device)"),
        # 16 pageable HtoD copies: 244,403,360 B in 55.503 ms; / 32e9 = 7.638 ms -> 13.8 %
        (("critical_path", "alexnet", "benchmark_result_2869224_1695835535_trace.json.gz"),
         "Memcpy HtoD (Pageable -> Device)"),
    ],
)
def test_real_host_copies_are_judged_at_the_host_link(rel: tuple[str, ...], name: str):
    path = real(*HTA, *rel)
    trace = read_trace(path)
    from traceroof.chips import detect_chip

    chip, _ = detect_chip(trace.meta.devices)
    assert chip.key == "a100_sxm_40gb"  # 'NVIDIA A100-PG509-200'
    link = chip.host_link_bytes_per_s
    assert link == 32e9  # PCIe Gen4 x16, one direction
    n, nbytes, dur_ns = _raw_copies(path, "HtoD")
    ops, _ = apply_costs(trace)
    r = add_roofline(ops, chip).filter(pl.col("name") == name)
    assert r.height == n
    assert r["bytes"].sum() == nbytes
    oracle = nbytes / link * 1e9 / dur_ns
    got = r["expected_ns"].sum() / r["dur_ns"].sum()
    assert got == pytest.approx(oracle, rel=1e-9)
    # tens of percent, not the 0.2 % the HBM roof gave (244 MB / 1.555e12 = 157 µs of 55.5 ms)
    assert 0.10 < got < 0.5
    assert (r["efficiency"] <= 1.0).all()


# --------------------------------------------------------------------------- collectives


def _collective(group_size: int, comm_bytes: float, dur_ns: int) -> pl.DataFrame:
    row = {"rank": 0, "device": 0, "stream": 1, "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL",
           "op": "nccl:all_reduce", "kind": "collective", "start_ns": 0, "dur_ns": dur_ns,
           "comm_bytes": comm_bytes, "group_size": group_size, "cost_source": "trace"}
    return conform(pl.DataFrame([row]), OP_SCHEMA)


def test_nvl72_all_reduce_runs_on_nvlink_not_the_nic():
    gb200 = get_chip("gb200")
    assert scale_up_domain(gb200) == 72
    assert collective_link_bytes_per_s(gb200, 72) == 900e9
    assert collective_link_bytes_per_s(gb200, 144) == 50e9
    r = add_roofline(_collective(72, 1e9, 3_000_000), gb200).row(0, named=True)
    # ring factor 2·71/72; 1.97222e9 B / 900e9 B/s = 2,191,358 ns (the NIC would say 39.4 ms)
    assert r["comm_ns"] == pytest.approx(2 * 71 / 72 * 1e9 / 900e9 * 1e9)
    assert r["efficiency"] == pytest.approx(2 * 71 / 72 * 1e9 / 900e9 * 1e9 / 3_000_000)
    h100 = get_chip("h100_sxm")
    r = add_roofline(_collective(16, 1e9, 3_000_000), h100).row(0, named=True)
    # 16 GPUs on HGX (domain 8): the 400 Gb/s NIC, 2·15/16 · 1e9 / 50e9 = 37.5 ms
    assert r["comm_ns"] == pytest.approx(2 * 15 / 16 * 1e9 / 50e9 * 1e9)


# --------------------------------------------------------------------------- fp64


def _matmul(dtype: str, flops: float, nbytes: float, dur_ns: int) -> pl.DataFrame:
    row = {"rank": 0, "device": 0, "stream": 7, "name": "gemm_fp64", "op": "aten::mm", "kind": "matmul",
           "start_ns": 0, "dur_ns": dur_ns, "dtype": dtype, "flops": flops, "bytes": nbytes,
           "cost_source": "shapes"}
    return conform(pl.DataFrame([row]), OP_SCHEMA)


def test_fp64_matmul_on_l4_gets_the_fp64_peak():
    l4 = get_chip("l4")
    # an 8192^3 fp64 matmul: 2·8192^3 = 1.0995e12 FLOP; fp64 = fp32/64 = 0.473e12 FLOP/s
    flops = 2 * 8192**3
    r = add_roofline(_matmul("fp64", flops, 3 * 8192**2 * 8, 2_500_000_000), l4).row(0, named=True)
    assert r["peak_dtype"] == "fp64" and r["peak_flops_per_s"] == 0.473e12
    assert r["compute_ns"] == pytest.approx(flops / 0.473e12 * 1e9)  # 2.325 s, not 9.1 ms at fp16
    assert r["bound"] == "compute"


def test_fp64_never_falls_back_to_the_fp16_peak():
    v5e = get_chip("tpu_v5e")  # no fp64 (nor fp16/fp32) peak
    r = add_roofline(_matmul("fp64", 1e12, 1e6, 1_000_000), v5e).row(0, named=True)
    assert r["peak_flops_per_s"] is None and r["compute_ns"] is None
    a100 = get_chip("a100_sxm_80gb")  # fp8 still falls back to the fp16 tensor peak
    r = add_roofline(_matmul("fp8", 312e9, 1e6, 2_000_000), a100).row(0, named=True)
    assert r["peak_dtype"] == "fp16" and r["compute_ns"] == pytest.approx(1_000_000)
