"""Chip database, lookup and detection (traceroof.chips). DESIGN §5, BC-29, BC-31."""

from __future__ import annotations

import gzip
import json
import re
import struct
from pathlib import Path

import pytest

from traceroof.chips import (
    ChipSpec,
    detect_chip,
    get_chip,
    list_chips,
    load_chip_file,
    references,
)
from traceroof.dtypes import PEAK_DTYPES as DTYPES
from traceroof.dtypes import canonical_dtype
from traceroof.errors import UnknownChipError
from traceroof.trace import DeviceInfo

REAL = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "real"


def fixture(rel: str) -> Path:
    """A real fixture; a missing one is a failure, not a skip."""
    p = REAL / rel
    assert p.is_file(), f"fixture missing: {p} (CI keeps ../shared beside the checkout)"
    return p


# --------------------------------------------------------------------------- the table


def test_table_loads_and_has_the_required_chips():
    keys = {c.key for c in list_chips()}
    required = {
        "a100_sxm_40gb", "a100_sxm_80gb", "a100_pcie_40gb", "a100_pcie_80gb",
        "h100_sxm", "h100_pcie", "h100_nvl", "h200_sxm", "b200", "l4", "l40s",
        "mi250x", "mi300x", "mi325x", "tpu_v4", "tpu_v5e", "tpu_v5p", "tpu_v6e",
        "v100_sxm2_16gb", "v100_sxm2_32gb", "v100_pcie_16gb", "v100_pcie_32gb",
    }
    assert required <= keys
    assert len(keys) == len(list_chips())


@pytest.mark.parametrize("chip", list_chips(), ids=lambda c: c.key)
def test_every_number_has_a_source(chip: ChipSpec):
    assert chip.missing_sources() == []
    refs = references()
    for f in ("hbm_bytes", "hbm_bytes_per_s", "intra_node_bytes_per_s", "inter_node_bytes_per_s", "launch_overhead_ns"):
        text = chip.source(f)
        assert text and text.strip(), f"{chip.key}.{f}"
        assert "?]" not in chip.source(f, expand=True)
    for d in chip.dtypes:
        assert chip.source(f"peak_flops_per_s.{d}")
    for text in chip.sources.values():
        for ref in re.findall(r"\[([A-Za-z0-9_.-]+)\]", text):
            assert ref in refs, f"{chip.key}: unknown reference [{ref}]"


@pytest.mark.parametrize("chip", list_chips(), ids=lambda c: c.key)
def test_numbers_are_plausible(chip: ChipSpec):
    assert set(chip.peak_flops_per_s) <= set(DTYPES)
    assert chip.peak("bf16") or chip.peak("fp16"), "every chip has a 16-bit tensor peak"
    assert 1e9 < chip.hbm_bytes < 1e12
    assert 1e11 <= chip.hbm_bytes_per_s <= 2e13
    assert 0 <= chip.launch_overhead_ns <= 10_000
    half = chip.peak("bf16") or chip.peak("fp16")
    # ridge points of real chips sit between ~30 and ~600 FLOP/byte
    assert 30 < half / chip.hbm_bytes_per_s < 600
    if chip.peak("fp8") is not None:
        # 2x bf16 on every part; L40S's datasheet pairs 362.05 bf16 with 733 fp8 (2.025x)
        assert half <= chip.peak("fp8") <= 2.03 * half
    if chip.peak("bf16") and chip.peak("fp16"):
        assert chip.peak("bf16") == chip.peak("fp16")
    if chip.peak("tf32") is not None:
        assert chip.peak("tf32") <= half
    if chip.peak("fp32") is not None:
        assert chip.peak("fp32") < half
    if chip.intra_node_bytes_per_s and chip.inter_node_bytes_per_s:
        assert chip.inter_node_bytes_per_s < chip.intra_node_bytes_per_s
    assert chip.name and chip.vendor in {"nvidia", "amd", "google"}


def test_docs_list_every_chip():
    doc = (Path(__file__).resolve().parents[1] / "docs" / "chips.md").read_text()
    for c in list_chips():
        assert f"`{c.key}`" in doc, c.key
        assert f"{c.ridge_point('bf16' if c.peak('bf16') else 'fp16'):.0f}" in doc


def test_peaks_are_dense_not_sparse():
    """BC-29: 1,979 TFLOP/s is the H100's 2:4-sparse bf16 figure; the table holds 989.4."""
    h100 = get_chip("h100")
    assert h100.peak("bf16") < 1.0e15
    assert h100.peak("bf16") == pytest.approx(989.4e12)
    assert h100.peak("fp8") == pytest.approx(1978.9e12)
    assert h100.peak("tf32") == pytest.approx(494.7e12)
    assert get_chip("h200").peak("bf16") == pytest.approx(989.4e12)
    assert get_chip("h100_pcie").peak("bf16") == pytest.approx(756e12)
    assert get_chip("h100_nvl").peak("bf16") == pytest.approx(835.5e12)  # per GPU, not the pair
    assert get_chip("a100").peak("bf16") == pytest.approx(312e12)
    assert get_chip("b200").peak("bf16") == pytest.approx(2.25e15)
    assert get_chip("mi300x").peak("bf16") == pytest.approx(1307.4e12)
    assert get_chip("mi250x").peak("bf16") == pytest.approx(191.5e12)  # per GCD
    assert get_chip("l4").peak("bf16") == pytest.approx(121e12)
    assert get_chip("tpu_v6e").peak("bf16") == pytest.approx(918e12)
    assert get_chip("tpu7x").peak("bf16") == pytest.approx(2307e12 / 2)  # per TensorCore device


def test_ridge_points():
    assert get_chip("h100").ridge_point() == pytest.approx(989.4e12 / 3.35e12)
    assert get_chip("h100").ridge_point("bf16") == pytest.approx(295.3, abs=0.1)
    assert get_chip("a100_sxm_80gb").ridge_point() == pytest.approx(153.0, abs=0.1)
    assert get_chip("a100_sxm_40gb").ridge_point() == pytest.approx(200.6, abs=0.1)
    assert get_chip("h100_pcie").ridge_point() == pytest.approx(378.0, abs=0.1)
    assert get_chip("mi300x").ridge_point() == pytest.approx(246.7, abs=0.1)
    assert get_chip("tpu_v6e").ridge_point() == pytest.approx(560.4, abs=0.1)
    assert get_chip("h100").ridge_point("fp8") == pytest.approx(2 * 295.3, abs=0.2)


def test_v100_has_fp16_tensor_but_no_bf16_or_tf32():
    for key in ("v100_sxm2_16gb", "v100_sxm2_32gb"):
        v = get_chip(key)
        assert v.peak("fp16") == pytest.approx(125e12)
        assert v.peak("fp32") == pytest.approx(15.7e12)
        assert v.peak("fp64") == pytest.approx(7.8e12)
        assert v.peak("bf16") is None and v.peak("tf32") is None and v.peak("fp8") is None
        assert v.hbm_bytes_per_s == pytest.approx(900e9)
        assert v.dtypes == ("fp64", "fp32", "fp16")
        with pytest.raises(ValueError, match="no bf16 peak"):
            v.ridge_point()
        assert v.ridge_point("fp16") == pytest.approx(125e12 / 900e9)
    assert get_chip("v100_pcie_32gb").peak("fp16") == pytest.approx(112e12)


def test_peak_accepts_dtype_spellings():
    h = get_chip("h100")
    assert h.peak("torch.bfloat16") == h.peak("c10::BFloat16") == h.peak("bf16")
    assert h.peak("half") == h.peak("float16") == h.peak("fp16")
    assert h.peak("float") == h.peak("float32") == 66.9e12
    assert h.peak("float8_e4m3fn") == h.peak("f8e5m2") == h.peak("fp8")
    assert h.peak("signed char") == h.peak("int8")
    assert h.peak("fp4") is None  # Hopper has no fp4: missing = unsupported
    assert canonical_dtype("double") == "fp64"
    assert canonical_dtype("complex64") is None
    with pytest.raises(ValueError, match="unknown dtype"):
        h.peak("bogus")


def test_peak_label_states_the_dense_peak_and_its_source():
    label = get_chip("h100").peak_label("bf16")
    assert label.startswith("peak=989.4 TFLOP/s bf16 dense")
    assert "nv-h100-ds" in label
    assert "no bf16 peak" in get_chip("v100").peak_label("bf16")


def test_chip_spec_is_immutable_and_hashable():
    h = get_chip("h100")
    with pytest.raises(Exception):
        h.hbm_bytes_per_s = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        h.peak_flops_per_s["bf16"] = 1.0  # type: ignore[index]
    assert {h: 1}[get_chip("h100-sxm")] == 1
    assert h.to_dict()["peak_flops_per_s"]["bf16"] == 989.4e12


# --------------------------------------------------------------------------- get_chip


@pytest.mark.parametrize(
    "query, key",
    [
        ("h100", "h100_sxm"),
        ("H100", "h100_sxm"),
        ("h100-sxm", "h100_sxm"),
        ("H100 SXM", "h100_sxm"),
        ("h100_sxm", "h100_sxm"),
        ("NVIDIA H100 80GB HBM3", "h100_sxm"),
        ("h100-pcie", "h100_pcie"),
        ("h100 pcie 80gb", "h100_pcie"),
        ("h100-nvl", "h100_nvl"),
        ("h200", "h200_sxm"),
        ("h20", "h20"),
        ("b200", "b200"),
        ("GB200", "gb200"),
        ("a100", "a100_sxm_80gb"),
        ("a100-40gb", "a100_sxm_40gb"),
        ("A100 PCIe 80GB", "a100_pcie_80gb"),
        ("v100", "v100_sxm2_32gb"),
        ("v100-sxm2-16gb", "v100_sxm2_16gb"),
        ("l4", "l4"),
        ("L40S", "l40s"),
        ("mi300x", "mi300x"),
        ("MI300X", "mi300x"),
        ("AMD Instinct MI300X", "mi300x"),
        ("mi325x", "mi325x"),
        ("mi250x", "mi250x"),
        ("tpu-v5e", "tpu_v5e"),
        ("v5e", "tpu_v5e"),
        ("TPU v5 lite", "tpu_v5e"),
        ("v5p", "tpu_v5p"),
        ("tpu_v4", "tpu_v4"),
        ("v6e", "tpu_v6e"),
        ("TPU v6 Lite", "tpu_v6e"),
        ("tpu-v6e", "tpu_v6e"),
        ("tpu7x", "tpu7x"),
        ("TPU v7x", "tpu7x"),
    ],
)
def test_get_chip_resolves_names_and_aliases(query: str, key: str):
    assert get_chip(query).key == key


def test_get_chip_returns_the_table_object():
    assert get_chip("h100") is next(c for c in list_chips() if c.key == "h100_sxm")
    assert get_chip(get_chip("h100")) is get_chip("h100")


def test_get_chip_unknown_lists_close_matches_and_known_chips():
    with pytest.raises(UnknownChipError) as ei:
        get_chip("mi350x")
    msg = str(ei.value)
    assert "unknown chip 'mi350x'" in msg
    assert "mi355x" in msg and "Known chips:" in msg and "h100_sxm" in msg
    assert "mi355x" in ei.value.candidates
    assert ei.value.exit_code == 5
    with pytest.raises(UnknownChipError, match="Known chips"):
        get_chip("h300")


def test_get_chip_ambiguous_family_string():
    with pytest.raises(UnknownChipError, match="ambiguous") as ei:
        get_chip("AMD Instinct MI250X/MI250")
    assert set(ei.value.candidates) == {"mi250x", "mi250"}


# --------------------------------------------------------------------------- user TOML

USER_CHIP = """
[chips.my_accel]
name = "My Accelerator"
vendor = "other"
aliases = ["myacc"]
hbm_bytes = 64e9
hbm_bytes_per_s = 2.0e12
intra_node_bytes_per_s = 100e9
match = { compute_capability = [9, 9], num_sms = 10 }
[chips.my_accel.peak_flops_per_s]
bf16 = 500e12
fp32 = 50e12
[chips.my_accel.sources]
peak_flops_per_s = "my measurement"
"""


def test_user_toml_path_loads_one_chip(tmp_path: Path):
    p = tmp_path / "mine.toml"
    p.write_text(USER_CHIP)
    for arg in (p, str(p)):
        c = get_chip(arg)
        assert c.key == "my_accel" and c.name == "My Accelerator"
        assert c.peak("bf16") == 500e12 and c.ridge_point() == pytest.approx(250.0)
        assert c.inter_node_bytes_per_s is None
        assert c.launch_overhead_ns == 2000.0
        assert c.source("peak_flops_per_s") == "my measurement"
        assert str(p) in c.source("hbm_bytes_per_s")  # unsourced numbers are attributed to the file
        assert c.missing_sources() == []
        assert c.origin == str(p)


def test_user_toml_top_level_form(tmp_path: Path):
    p = tmp_path / "flat_chip.toml"
    p.write_text(
        'name = "Flat"\nvendor = "nvidia"\nhbm_bytes = 8e10\nhbm_bytes_per_s = 3e12\n'
        "[peak_flops_per_s]\nbf16 = 1e15\n"
    )
    c = load_chip_file(p)
    assert c.key == "flat_chip" and c.peak("bf16") == 1e15


@pytest.mark.parametrize(
    "body, match",
    [
        ('[chips.a]\nname="A"\nvendor="x"\nhbm_bytes=1e9\n[chips.a.peak_flops_per_s]\nbf16=1e12\n', "hbm_bytes_per_s"),
        ('[chips.a]\nname="A"\nvendor="x"\nhbm_bytes=1e9\nhbm_bytes_per_s=1e12\n[chips.a.peak_flops_per_s]\nbfloat=1e12\n', "unknown dtype"),
        ('[chips.a]\nname="A"\nvendor="x"\nhbm_bytes=1e9\nhbm_bytes_per_s=-1\n[chips.a.peak_flops_per_s]\nbf16=1e12\n', "positive"),
        ('[chips.a]\nname="A"\nvendor="x"\nhbm_bytes=1e9\nhbm_bytes_per_s=1e12\nhbm_bw=3\n[chips.a.peak_flops_per_s]\nbf16=1e12\n', "unknown keys"),
        ('[chips.a]\nname="A"\n[chips.b]\nname="B"\n', "exactly one"),
        ("not = [valid", "not valid TOML"),
    ],
)
def test_user_toml_errors_are_clear(tmp_path: Path, body: str, match: str):
    p = tmp_path / "bad.toml"
    p.write_text(body)
    with pytest.raises(UnknownChipError, match=match):
        get_chip(str(p))


def test_missing_chip_file(tmp_path: Path):
    with pytest.raises(UnknownChipError, match="not found"):
        get_chip(str(tmp_path / "nope.toml"))


# --------------------------------------------------------------------------- detect_chip


def dev(name: str = "", **kw) -> DeviceInfo:
    return DeviceInfo(name=name, **kw)


@pytest.mark.parametrize(
    "device, key",
    [
        (dev("NVIDIA H100 80GB HBM3", compute_major=9, compute_minor=0, num_sms=132, memory_bytes=85018279936), "h100_sxm"),
        (dev("NVIDIA H100 80GB HBM3"), "h100_sxm"),
        (dev("NVIDIA H100 PCIe", num_sms=114), "h100_pcie"),
        (dev("NVIDIA H100 NVL", num_sms=132), "h100_nvl"),
        (dev("NVIDIA B200", compute_major=10, compute_minor=0, num_sms=148, memory_bytes=191503138816), "b200"),
        (dev("NVIDIA GB200"), "gb200"),
        (dev("NVIDIA H200"), "h200_sxm"),
        (dev("NVIDIA H200 NVL"), "h200_nvl"),
        (dev("NVIDIA H20", num_sms=78), "h20"),
        (dev("NVIDIA L4"), "l4"),
        (dev("NVIDIA L40S"), "l40s"),
        (dev("AMD Instinct MI300X", compute_major=9, compute_minor=4, num_sms=304, memory_bytes=206141652992, extra={"warpSize": 64}), "mi300x"),
        (dev("AMD Instinct MI300X VF"), "mi300x"),
        (dev("AMD Instinct MI325X"), "mi325x"),
        (dev("AMD Instinct MI250X/MI250", num_sms=110), "mi250x"),
        (dev("AMD Instinct MI250X/MI250", num_sms=104), "mi250"),
        (dev("gfx942", memory_bytes=206141652992), "mi300x"),
        (dev("gfx942", memory_bytes=256 * 2**30), "mi325x"),
        (dev("NVIDIA A100-PG509-200", compute_major=8, compute_minor=0, num_sms=108, memory_bytes=42297524224), "a100_sxm_40gb"),
        (dev("NVIDIA A100-SXM4-80GB"), "a100_sxm_80gb"),
        (dev("NVIDIA A100 80GB PCIe"), "a100_pcie_80gb"),
        (dev("Tesla V100-SXM2-32GB", compute_major=7, compute_minor=0, num_sms=80, memory_bytes=34079637504), "v100_sxm2_32gb"),
        (dev("Tesla V100-SXM2-16GB", num_sms=80, memory_bytes=16945512448), "v100_sxm2_16gb"),
        (dev("Tesla V100-DGXS-32GB"), "v100_sxm2_32gb"),
        (dev("Tesla V100-PCIE-16GB"), "v100_pcie_16gb"),
        (dev("TPU v6 Lite"), "tpu_v6e"),
        (dev("TPU v6 lite"), "tpu_v6e"),
        (dev("TPU v5 lite"), "tpu_v5e"),
        (dev("TPU v5"), "tpu_v5p"),
        (dev("TPU v5p"), "tpu_v5p"),
        (dev("TPU v4"), "tpu_v4"),
        (dev("TPU7x"), "tpu7x"),
        (dev("TPU v7x"), "tpu7x"),
        (dev("/device:TPU:0", extra={"device_type_string": "TPU v6 Lite"}), "tpu_v6e"),
        (dev("", extra={"gpu_device_name": "NVIDIA H100 80GB HBM3"}), "h100_sxm"),
    ],
)
def test_detect_by_name(device: DeviceInfo, key: str):
    chip, reason = detect_chip([device])
    assert chip.key == key
    assert key in reason and "->" in reason


def test_detect_most_specific_name_first():
    """'H20' is inside 'H200', 'B200' inside 'GB200', 'L4' inside 'L40S'."""
    assert detect_chip([dev("NVIDIA H20")])[0].key == "h20"
    assert detect_chip([dev("NVIDIA H200")])[0].key == "h200_sxm"
    assert detect_chip([dev("NVIDIA GB200")])[0].key == "gb200"
    assert detect_chip([dev("NVIDIA B200")])[0].key == "b200"
    assert detect_chip([dev("NVIDIA L40S")])[0].key == "l40s"
    assert detect_chip([dev("NVIDIA L4")])[0].key == "l4"
    with pytest.raises(UnknownChipError):  # v4i is not a v4
        detect_chip([dev("TPU v4 lite")])


def test_detect_h100_variant_by_sm_count():
    """BC-31 (b): the name can be just 'NVIDIA H100'; 114 SMs = PCIe, 132 = SXM."""
    chip, reason = detect_chip([dev("NVIDIA H100", compute_major=9, compute_minor=0, num_sms=114)])
    assert chip.key == "h100_pcie" and chip.peak("bf16") == pytest.approx(756e12)
    assert "114 SMs" in reason and "h100_pcie" in reason
    chip, reason = detect_chip([dev("NVIDIA H100", num_sms=132, memory_bytes=85018279936)])
    assert chip.key == "h100_sxm"
    with pytest.raises(UnknownChipError, match="ambiguous") as ei:
        detect_chip([dev("NVIDIA H100")])
    assert set(ei.value.candidates) == {"h100_sxm", "h100_pcie"}
    # a 96 GB H100 SXM variant is not in the table: refused, not guessed
    with pytest.raises(UnknownChipError, match="contradict"):
        detect_chip([dev("NVIDIA H100", num_sms=132, memory_bytes=96 * 2**30)])


def test_detect_reason_names_the_evidence():
    _, reason = detect_chip([dev("NVIDIA H100 80GB HBM3", compute_major=9, compute_minor=0, num_sms=132, memory_bytes=85018279936)] * 8)
    assert "'NVIDIA H100 80GB HBM3'" in reason and "132 SMs" in reason
    assert "NVIDIA H100 SXM5 80GB" in reason and "8 devices" in reason


@pytest.mark.parametrize(
    "device, expect_in_candidates",
    [
        (dev(""), None),
        (dev("", compute_major=9, compute_minor=4, num_sms=304, memory_bytes=206141652992), "mi300x"),
        (dev("AMD Radeon Graphics", compute_major=9, compute_minor=0, num_sms=104, memory_bytes=68702699520, extra={"warpSize": 64}), "mi250"),
        (dev("ARTEMIS"), None),
        (dev("AMD Instinct MI350X", compute_major=9, compute_minor=5, num_sms=256, memory_bytes=309220868096), "mi355x"),
        (dev("Quadro GP100", num_sms=56), None),
        (dev("/device:GPU:0"), None),
    ],
)
def test_detect_refuses_unknown_or_generic(device: DeviceInfo, expect_in_candidates: str | None):
    """BC-31 (a), (c): never fall back to a default chip."""
    with pytest.raises(UnknownChipError) as ei:
        detect_chip([device])
    msg = str(ei.value)
    assert "--chip" in msg
    assert ei.value.candidates, "the error lists candidates"
    if expect_in_candidates:
        assert expect_in_candidates in ei.value.candidates
        assert expect_in_candidates in msg


def test_detect_refuses_mig_or_partitioned_devices():
    with pytest.raises(UnknownChipError, match="MIG") as ei:
        detect_chip([dev("NVIDIA H100 80GB HBM3", num_sms=66)])
    assert ei.value.candidates == ["h100_sxm"]
    with pytest.raises(UnknownChipError, match="38"):
        detect_chip([dev("AMD Instinct MI300X", num_sms=38)])  # CPX partition


def test_detect_no_devices():
    with pytest.raises(UnknownChipError, match="no devices"):
        detect_chip([])


def test_detect_mixed_devices_is_ambiguous():
    devices = [dev("NVIDIA H100 80GB HBM3", index=0), dev("NVIDIA A100-SXM4-80GB", index=1)]
    with pytest.raises(UnknownChipError, match="ambiguous") as ei:
        detect_chip(devices)
    assert set(ei.value.candidates) == {"h100_sxm", "a100_sxm_80gb"}


def test_detect_one_bad_device_fails_the_whole_trace():
    with pytest.raises(UnknownChipError, match="device 1"):
        detect_chip([dev("NVIDIA H100 80GB HBM3", index=0), dev("NVIDIA H100 80GB HBM3", index=1, num_sms=66)])


def test_detect_ignores_devices_that_describe_nothing():
    chip, reason = detect_chip([dev("AMD Instinct MI355X", compute_major=9, compute_minor=5, num_sms=256)] + [dev("")] * 7)
    assert chip.key == "mi355x" and "7 without name or properties ignored" in reason


def test_property_match_is_opt_in_and_guarded():
    mi300 = dev("", compute_major=9, compute_minor=4, num_sms=304, memory_bytes=206141652992, extra={"device_vendor": "AMD"})
    with pytest.raises(UnknownChipError):
        detect_chip([mi300])
    chip, reason = detect_chip([mi300], allow_property_match=True)
    assert chip.key == "mi300x" and "property match" in reason
    # MI210 shares cc/CUs/memory with an MI250 GCD: never named from properties alone
    radeon = dev("AMD Radeon Graphics", compute_major=9, compute_minor=0, num_sms=104, memory_bytes=68702699520)
    with pytest.raises(UnknownChipError):
        detect_chip([radeon], allow_property_match=True)
    # V100 SXM2 vs PCIe differ only by clock: needs the XPlane clock_rate (kHz)
    v100 = dict(compute_major=7, compute_minor=0, num_sms=80, memory_bytes=16945512448)
    assert detect_chip([dev("", **v100, extra={"clock_rate": 1530000})], allow_property_match=True)[0].key == "v100_sxm2_16gb"
    assert detect_chip([dev("", **v100, extra={"clock_rate": 1380000})], allow_property_match=True)[0].key == "v100_pcie_16gb"
    with pytest.raises(UnknownChipError) as ei:
        detect_chip([dev("", **v100)], allow_property_match=True)
    assert {"v100_sxm2_16gb", "v100_pcie_16gb"} <= set(ei.value.candidates)
    # MI350X shares cc/CUs/memory with MI355X: only the 2.4 GHz clock identifies an MI355X
    mi35 = dict(compute_major=9, compute_minor=5, num_sms=256, memory_bytes=309220868096)
    assert detect_chip([dev("", **mi35, extra={"clock_rate": 2400000})], allow_property_match=True)[0].key == "mi355x"
    for extra in ({"clock_rate": 2200000}, {}):
        with pytest.raises(UnknownChipError):
            detect_chip([dev("", **mi35, extra=extra)], allow_property_match=True)


def test_stated_peak_disagreement_is_noted_not_fatal():
    chip, reason = detect_chip([dev("TPU v7x", peak_flops_per_s=1028.75e12)])
    assert chip.key == "tpu7x" and "trace states 1028.8 TFLOP/s" in reason


# --------------------------------------------------------------------------- real traces


def kineto_devices(rel: str) -> list[DeviceInfo]:
    """deviceProperties of a real Kineto trace, mapped the way the Kineto parser maps them."""
    with gzip.open(fixture(rel), "rt") as f:
        data = json.load(f)
    out = []
    for p in data.get("deviceProperties") or []:
        out.append(
            DeviceInfo(
                name=str(p.get("name", "") or ""),
                index=p.get("id"),
                compute_major=p.get("computeMajor"),
                compute_minor=p.get("computeMinor"),
                num_sms=p.get("numSms"),
                memory_bytes=p.get("totalGlobalMem"),
                extra={k: v for k, v in p.items() if isinstance(v, (int, float, str))},
            )
        )
    return out


@pytest.mark.parametrize(
    "rel, key, evidence",
    [
        ("TraceLens/tests/traces/h100/Falconsai_nsfw_image_detection__1016002.json.gz", "h100_sxm", "NVIDIA H100 80GB HBM3"),
        ("TraceLens/tests/traces/h100/gaunernst_bert-small-uncased__1016001.json.gz", "h100_sxm", "132 SMs"),
        ("TraceLens/tests/traces/b200/eager_trace.json.gz", "b200", "148 SMs"),
        ("TraceLens/tests/traces/mi300/ddp_resnet18_no_pool/train_resnet18.json.gz", "mi300x", "304 CUs"),
        ("TraceLens/tests/traces/inference/sglang_decode/sglang_Qwen3-8B_decode.json.gz", "mi300x", "AMD Instinct MI300X"),
        ("HolisticTraceAnalysis/tests/data/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz", "a100_sxm_40gb", "NVIDIA A100-PG509-200"),
        ("HolisticTraceAnalysis/tests/data/cupti_profiler/benchmark_result_924719_1679055439_trace.json.gz", "a100_sxm_40gb", "108 SMs"),
        ("HolisticTraceAnalysis/tests/data/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz", "v100_sxm2_32gb", "Tesla V100-SXM2-32GB"),
        ("HolisticTraceAnalysis/tests/data/trace_diff/test/test.json.gz", "v100_sxm2_16gb", "Tesla V100-SXM2-16GB"),
    ],
)
def test_detect_on_real_kineto_traces(rel: str, key: str, evidence: str):
    devices = kineto_devices(rel)
    assert devices
    chip, reason = detect_chip(devices)
    assert chip.key == key
    assert evidence in reason


@pytest.mark.parametrize(
    "rel, match, candidate",
    [
        # every device is named "" (cc 9.4, 304 CUs, 192 GiB): refused, MI300X suggested
        ("TraceLens/tests/traces/inference/vllm_decode_full/graph_execution.json.gz", "no name", "mi300x"),
        # MI250 named "AMD Radeon Graphics" (104 CUs, 64 GiB)
        ("HolisticTraceAnalysis/tests/data/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz", "generic", "mi250"),
        # MTIA, not a GPU in the table
        ("HolisticTraceAnalysis/tests/data/mtia_inference_trace/mtia_inference_rank_0.json.gz", "ARTEMIS", None),
        # Pascal Quadro, not in the table
        ("HolisticTraceAnalysis/tests/data/with_gpu_user_annotation/step_based_trace_2543932.json.gz", "Quadro GP100", None),
        # CPU-only trace: deviceProperties is an empty list
        ("HolisticTraceAnalysis/tests/data/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz", "no devices", None),
    ],
)
def test_real_traces_without_a_known_chip_are_refused(rel: str, match: str, candidate: str | None):
    with pytest.raises(UnknownChipError, match=match) as ei:
        detect_chip(kineto_devices(rel))
    assert "--chip" in str(ei.value)
    if candidate:
        assert candidate in ei.value.candidates


def test_real_unnamed_mi300x_trace_with_property_match():
    rel = "TraceLens/tests/traces/inference/vllm_decode_full/graph_execution.json.gz"
    chip, reason = detect_chip(kineto_devices(rel), allow_property_match=True)
    assert chip.key == "mi300x" and "property match" in reason


# XPlane: a minimal protobuf walk over XSpace.planes[].stats, enough to read device planes.


def _pb_fields(b: bytes):
    i = 0
    while i < len(b):
        key, i = _varint(b, i)
        f, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _varint(b, i)
        elif wt == 1:
            v, i = b[i:i + 8], i + 8
        elif wt == 5:
            v, i = b[i:i + 4], i + 4
        elif wt == 2:
            n, i = _varint(b, i)
            v, i = b[i:i + n], i + n
        else:
            raise ValueError(f"wire type {wt}")
        yield f, wt, v


def _varint(b: bytes, i: int) -> tuple[int, int]:
    r = s = 0
    while True:
        c = b[i]
        i += 1
        r |= (c & 0x7F) << s
        s += 7
        if c < 0x80:
            return r, i


def xplane_devices(rel: str) -> list[DeviceInfo]:
    """'/device:*' planes of a real XSpace as DeviceInfo (name = the plane name, stats in extra)."""
    out = []
    for f, _, plane in _pb_fields(fixture(rel).read_bytes()):
        if f != 1:
            continue
        name, meta, stats = "", {}, {}
        raw_stats = []
        for pf, _, pv in _pb_fields(plane):
            if pf == 2:
                name = pv.decode()
            elif pf == 5:  # map<int64, XStatMetadata>
                k = sname = None
                for mf, _, mv in _pb_fields(pv):
                    if mf == 1:
                        k = mv
                    elif mf == 2:
                        sname = next((sv.decode() for sf, _, sv in _pb_fields(mv) if sf == 2), None)
                meta[k] = sname
            elif pf == 6:
                raw_stats.append(pv)
        if not name.startswith("/device:"):
            continue
        for s in raw_stats:
            mid = val = None
            for sf, _, sv in _pb_fields(s):
                if sf == 1:
                    mid = sv
                elif sf == 2:
                    val = struct.unpack("<d", sv)[0]
                elif sf in (3, 4):
                    val = sv
                elif sf == 5:
                    val = sv.decode()
            stats[meta.get(mid)] = val
        out.append(
            DeviceInfo(
                name=name,
                compute_major=stats.get("compute_cap_major"),
                compute_minor=stats.get("compute_cap_minor"),
                num_sms=stats.get("core_count"),
                memory_bytes=stats.get("memory_size"),
                peak_flops_per_s=(stats["peak_teraflops_per_second"] * 1e12) if "peak_teraflops_per_second" in stats else None,
                peak_hbm_bytes_per_s=(stats["peak_hbm_bw_gigabytes_per_second"] * 1e9) if "peak_hbm_bw_gigabytes_per_second" in stats else None,
                extra={k: v for k, v in stats.items() if isinstance(k, str) and isinstance(v, (int, float, str))},
            )
        )
    return out


def test_detect_on_real_tpu_xplane():
    devices = xplane_devices("xprof/xprof/convert/test_xplanes/tpu_inference_2.xplane.pb")
    assert len(devices) == 4 and devices[0].extra["device_type_string"] == "TPU v6 Lite"
    chip, reason = detect_chip(devices)
    assert chip.key == "tpu_v6e"
    assert "TPU v6 Lite" in reason and "note" not in reason  # trace-stated 918 TF / 1638 GB/s agree
    assert devices[0].peak_flops_per_s == pytest.approx(chip.peak("bf16"))
    assert devices[0].peak_hbm_bytes_per_s == pytest.approx(chip.hbm_bytes_per_s, rel=1e-3)


def test_detect_on_real_gpu_xplanes():
    """GPU planes carry no device name: refused by default, identified by opt-in property match."""
    mi300 = xplane_devices("TraceLens/tests/traces/mi300/jax08_gemm/tw003.xplane.pb")
    assert len(mi300) == 8
    with pytest.raises(UnknownChipError) as ei:
        detect_chip(mi300)
    assert "mi300x" in ei.value.candidates
    assert detect_chip(mi300, allow_property_match=True)[0].key == "mi300x"
    mi355 = xplane_devices("TraceLens/tests/test_data_jax_te_fused_attn_categorization/934987a2fc2f.xplane.pb")
    chip, reason = detect_chip(mi355, allow_property_match=True)  # 2.4 GHz clock stated on GPU:0
    assert chip.key == "mi355x" and "ignored" in reason
    v100 = xplane_devices("profiler/demo/plugins/profile/GPU-multi-worker/34.83.195.179_6003.xplane.pb")
    assert detect_chip(v100, allow_property_match=True)[0].key == "v100_sxm2_16gb"


def test_pg509_board_is_the_40gb_part_and_its_fast_transfers_fit_in_l2():
    """'NVIDIA A100-PG509-200' is the A100 SXM4 40GB (same PCI device id, 39.4-39.6 GiB): every
    memset or device-to-device copy in the HTA traces that runs faster than the 40GB part's
    1,555 GB/s touches at most 40 MB (the A100 L2), so it measures the cache, not HBM; the
    transfers larger than the L2 stay under 1,555 GB/s. Rates from the raw events: bytes moved
    (a memset writes its size, a DtoD copy reads and writes it) / duration."""
    import gzip as _gzip
    import json as _json
    from decimal import Decimal

    l2_bytes = 40e6  # A100 L2: 40 MB ([chips-ref] on_chip.l2_bytes)
    hbm = get_chip("a100_sxm_40gb").hbm_bytes_per_s
    fast_footprints, big_rates = [], []
    for rel in ("nccl_parser_config/nccl_data.json.gz", "trace_diff/control/control.json.gz"):
        p = REAL / "HolisticTraceAnalysis/tests/data" / rel
        ev = _json.loads(_gzip.decompress(p.read_bytes()), parse_float=Decimal)["traceEvents"]
        for e in ev:
            dtod = e.get("cat") == "gpu_memcpy" and "DtoD" in e.get("name", "")
            if not (dtod or e.get("cat") == "gpu_memset") or not e["dur"] or not e["args"].get("bytes"):
                continue
            moved = e["args"]["bytes"] * (2 if dtod else 1)
            rate = float(moved / (e["dur"] * Decimal("1e-6")))
            if rate > hbm:
                fast_footprints.append(moved)
            if moved > l2_bytes:
                big_rates.append(rate)
    assert fast_footprints and max(fast_footprints) <= l2_bytes  # 25.8 MB at ~1.9-2.0 TB/s
    assert big_rates and max(big_rates) < hbm  # 290 MB DtoD copies: 1.33 TB/s = 86 % of 1,555
    chip, why = detect_chip([DeviceInfo(name="NVIDIA A100-PG509-200", compute_major=8, compute_minor=0,
                                        num_sms=108, memory_bytes=42297524224)])
    assert chip.key == "a100_sxm_40gb" and "(exact)" in why


# --------------------------------------------------------------------------- the parsed table


def test_the_parsed_table_is_in_sync_with_chips_toml():
    """``chips.parsed.json`` is what tomllib makes of ``chips.toml`` today (regenerate with
    ``write_parsed_table()`` after editing the TOML), equal value for value and type for type."""
    import tomllib

    from traceroof import chip_table as ct

    pkg = Path(ct.__file__).parent
    raw = (pkg / "chips.toml").read_bytes()
    shipped = (pkg / ct.PARSED_TABLE).read_text(encoding="utf-8")
    assert shipped == ct.parsed_table_text(raw), "run write_parsed_table()"
    data = json.loads(shipped)["data"]
    want = tomllib.loads(raw.decode("utf-8"))
    assert data == want
    # == says 80e9 == 80000000000: the types must match too (a float stays a float)
    def types(v):
        return {k: types(x) for k, x in v.items()} if isinstance(v, dict) else (
            [types(x) for x in v] if isinstance(v, list) else type(v).__name__)
    assert types(data) == types(want)
    assert ct._table_data() == want


def test_an_edited_chips_toml_is_parsed_not_read_from_the_stale_parsed_table(tmp_path, monkeypatch):
    """A ``chips.toml`` whose bytes differ from the ones the parsed table records is parsed
    from the TOML: the edit is seen."""
    from traceroof import chip_table as ct

    pkg = Path(ct.__file__).parent
    (tmp_path / ct.PARSED_TABLE).write_bytes((pkg / ct.PARSED_TABLE).read_bytes())
    text = (pkg / "chips.toml").read_text(encoding="utf-8")
    edited = text + "\n[edited_marker]\nx = 1\n"
    (tmp_path / "chips.toml").write_text(edited, encoding="utf-8")
    monkeypatch.setattr(ct.resources, "files", lambda _pkg: tmp_path)
    data = ct._table_data()
    assert data["edited_marker"] == {"x": 1}
    assert data["chips"].keys() == json.loads((pkg / ct.PARSED_TABLE).read_text())["data"]["chips"].keys()
