"""The issue-14 chip audit: each added or fixed entry is detected from the device description
a trace carries (Kineto ``deviceProperties``: name, compute capability, SMs, totalGlobalMem)
without a TOML, and each carries a source for its host link and scale-up domain."""

from __future__ import annotations

import pytest

from traceroof.chips import detect_chip, get_chip, list_chips, references
from traceroof.errors import UnknownChipError
from traceroof.trace import DeviceInfo

GIB = 2**30


def dev(name: str, cc: tuple[int, int] | None = None, sms: int | None = None, mem_bytes: int | None = None) -> DeviceInfo:
    return DeviceInfo(name=name, compute_major=cc[0] if cc else None, compute_minor=cc[1] if cc else None,
                      num_sms=sms, memory_bytes=mem_bytes)


@pytest.mark.parametrize(
    "device, key",
    [
        # 'NVIDIA A100-PG509-200' reports 42,297,524,224 B = 39.4 GiB: the 40 GB SXM part
        (dev("NVIDIA A100-PG509-200", (8, 0), 108, 42297524224), "a100_sxm_40gb"),
        # a GB200 device reports 152 SMs (was refused: the table said 148)
        (dev("NVIDIA GB200", (10, 0), 152, 199_000_000_000), "gb200"),
        (dev("NVIDIA H800", (9, 0), 132, 85_000_000_000), "h800"),
        (dev("NVIDIA A800-SXM4-80GB", (8, 0), 108, 85_100_000_000), "a800_sxm_80gb"),
        # 97,280 MiB visible (OpenCL 'NVIDIA GH200 480GB') = 95.0 GiB
        (dev("NVIDIA GH200 480GB", (9, 0), 132, 97280 * 2**20), "gh200_480gb"),
        (dev("NVIDIA GH200 120GB", (9, 0), 132, 97280 * 2**20), "gh200_120gb"),
        (dev("NVIDIA GH200 144G HBM3e", (9, 0), 132, 150_000_000_000), "gh200_144gb"),
        (dev("NVIDIA A10G", (8, 6), 80, 23_677_436_928), "a10g"),
        (dev("Tesla T4", (7, 5), 40, 15_843_721_216), "t4"),
        (dev("AMD Instinct MI210", (9, 0), 104, 68_702_699_520), "mi210"),
        (dev("NVIDIA L40", (8, 9), 142, 48_305_799_168), "l40"),
        (dev("NVIDIA L40S", (8, 9), 142, 48_305_799_168), "l40s"),
        (dev("NVIDIA RTX 6000 Ada Generation", (8, 9), 142, 51_527_024_640), "rtx_6000_ada"),
        (dev("NVIDIA RTX PRO 6000 Blackwell Server Edition", (12, 0), 188, 102_000_000_000), "rtx_pro_6000_blackwell"),
        (dev("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", (12, 0), 188, 102_000_000_000), "rtx_pro_6000_blackwell"),
        (dev("NVIDIA L20", (8, 9), 92, 48_305_799_168), "l20"),
        (dev("NVIDIA L4", (8, 9), 58, 23_580_639_232), "l4"),
    ],
)
def test_detect_new_and_fixed_chips(device: DeviceInfo, key: str):
    chip, why = detect_chip([device])
    assert chip.key == key, why


@pytest.mark.parametrize(
    "device",
    [
        dev("NVIDIA GB200", (10, 0), 148),  # a B200-sized part named GB200: contradicts the table
        dev("NVIDIA A800-SXM4-40GB", (8, 0), 108, 42_505_273_344),  # the 40 GB A800 is not in the table
        dev("NVIDIA T4 32GB", (7, 5), 40, 34_000_000_000),
        dev("NVIDIA H800 PCIe", (9, 0), 114, 85_000_000_000),
    ],
)
def test_look_alikes_are_refused(device: DeviceInfo):
    with pytest.raises(UnknownChipError):
        detect_chip([device])


def test_same_die_parts_are_not_guessed_from_properties():
    """L40, L40S and RTX 6000 Ada are all AD102 with 142 SMs and 48 GB; MI210 and an MI250 GCD
    are both gfx90a with 104 CUs and 64 GiB: an unnamed device must not be mapped to one."""
    for props in (dev("", (8, 9), 142, 48_305_799_168), dev("", (9, 0), 104, 64 * GIB)):
        with pytest.raises(UnknownChipError):
            detect_chip([props], allow_property_match=True)


AUDITED = ["h800", "a800_sxm_80gb", "gh200_480gb", "gh200_120gb", "gh200_144gb", "a10g", "t4", "mi210",
           "l40", "rtx_6000_ada", "rtx_pro_6000_blackwell", "l20", "gb200", "a100_sxm_40gb"]


@pytest.mark.parametrize("key", AUDITED)
def test_audited_entries_cite_a_reference_for_every_number(key: str):
    chip = get_chip(key)
    assert chip.missing_sources() == []
    refs = references()
    for field in ("peak_flops_per_s", "hbm_bytes_per_s", "host_link_bytes_per_s", "scale_up_domain", "match"):
        text = chip.source(field) or ""
        cited = [r for r in refs if f"[{r}]" in text]
        assert cited or text.startswith(("assumption", "absent", "as ")), (key, field, text)


def test_every_chip_has_a_host_link_and_scale_up_domain_or_says_why_not():
    for chip in list_chips():
        assert chip.scale_up_domain is not None and chip.scale_up_domain >= 1, chip.key
        if chip.host_link_bytes_per_s is None:
            assert chip.source("host_link_bytes_per_s").startswith("absent"), chip.key
        else:
            # PCIe Gen3/4/5/6 x16 one way, MI250X's 36 GB/s Infinity Fabric, or NVLink-C2C 450e9
            assert chip.host_link_bytes_per_s in (16e9, 32e9, 36e9, 64e9, 128e9, 450e9), chip.key


def test_fp64_peaks_of_the_ada_parts_are_one_64th_of_fp32():
    """The Ada white paper: 2 FP64 units per SM beside 128 FP32 lanes, FP64 = FP32 / 64."""
    for key in ("l4", "l40s", "rtx_4090", "l40", "rtx_6000_ada", "l20"):
        c = get_chip(key)
        assert c.peak("fp64") == pytest.approx(c.peak("fp32") / 64, rel=0.01), key
    assert get_chip("h20").peak("fp64") == 1e12


def test_nvl72_and_grace_parts_use_nvlink_c2c_for_the_host():
    for key in ("gb200", "gb300"):
        c = get_chip(key)
        assert c.scale_up_domain == 72 and c.host_link_bytes_per_s == 450e9
    assert get_chip("gh200").host_link_bytes_per_s == 450e9
    assert get_chip("h100_sxm").scale_up_domain == 8 and get_chip("h100_sxm").host_link_bytes_per_s == 64e9
