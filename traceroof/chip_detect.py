"""Which chip a trace ran on, from its device descriptions (:func:`detect_chip`).

Evidence, strongest first: the device name (exact, or the most specific name-token rule of
``chips.toml``'s ``match.names``), narrowed by compute capability, SM/CU count, memory and
clock (``match``); nothing ever falls back to a default chip. The table itself is in
:mod:`traceroof.chip_table`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .chip_table import (
    ChipSpec,
    chip_table,
    close_matches,
    known_chips_text,
    norm_name,
    token_candidates,
)
from .errors import UnknownChipError
from .trace import DeviceInfo

__all__ = ["detect_chip"]


_GENERIC_NAMES = {"", "amdradeongraphics", "radeongraphics", "gpu", "cuda", "device", "nvidiagraphicsdevice"}


def _is_generic(name: str) -> bool:
    n = name.strip().lower()
    return norm_name(n) in _GENERIC_NAMES or n.startswith(("/device:", "/host:"))


@dataclass(frozen=True)
class _Props:
    name: str
    cc: tuple[int, int] | None
    sms: int | None
    mem_gib: float | None
    vendor: str | None
    clock_mhz: float | None
    peak_flops: float | None
    peak_bw: float | None

    @staticmethod
    def of(d: DeviceInfo) -> _Props:
        extra = d.extra or {}
        vendor = None
        v = str(extra.get("device_vendor") or extra.get("vendor") or "").strip().lower()
        if v in ("nvidia", "amd", "google", "intel"):
            vendor = v
        elif extra.get("warpSize") == 64 or extra.get("warp_size") == 64:
            vendor = "amd"
        cc = None
        if d.compute_major is not None and d.compute_minor is not None:
            cc = (int(d.compute_major), int(d.compute_minor))
        mem = d.memory_bytes / 2**30 if d.memory_bytes else None
        clock = None
        cr = extra.get("clock_rate")  # XPlane: kHz
        if isinstance(cr, (int, float)) and not isinstance(cr, bool) and cr > 0:
            clock = cr / 1000.0
        name = (d.name or "").strip()
        for k in ("gpu_device_name", "device_type_string"):
            if _is_generic(name) and isinstance(extra.get(k), str) and extra[k].strip():
                name = extra[k].strip()
        return _Props(name, cc, d.num_sms or None, mem, vendor, clock, d.peak_flops_per_s, d.peak_hbm_bytes_per_s)

    @property
    def informative(self) -> bool:
        named = bool(self.name) and not _is_generic(self.name)
        return named or self.cc is not None or self.sms is not None or self.mem_gib is not None

    def describe(self) -> str:
        parts = []
        if self.cc is not None:
            parts.append(f"cc {self.cc[0]}.{self.cc[1]}")
        if self.sms is not None:
            parts.append(f"{self.sms} {'CUs' if self.vendor == 'amd' else 'SMs'}")
        if self.mem_gib is not None:
            parts.append(f"{self.mem_gib:.1f} GiB")
        if self.clock_mhz is not None:
            parts.append(f"{self.clock_mhz:.0f} MHz")
        return ", ".join(parts)


_MEM_TOL = 0.06


def _mismatches(c: ChipSpec, p: _Props) -> list[str]:
    m = c.match
    out = []
    if p.vendor is not None and p.vendor != c.vendor:
        out.append(f"vendor {p.vendor} vs {c.vendor}")
    if m.compute_capability is not None and p.cc is not None and m.compute_capability != p.cc:
        out.append(f"compute capability {p.cc[0]}.{p.cc[1]} vs {m.compute_capability[0]}.{m.compute_capability[1]}")
    if m.num_sms is not None and p.sms is not None and m.num_sms != p.sms:
        hint = " (MIG / partitioned device?)" if p.sms < m.num_sms else ""
        out.append(f"{p.sms} SMs/CUs vs {m.num_sms}{hint}")
    if m.mem_gib is not None and p.mem_gib is not None and abs(p.mem_gib - m.mem_gib) > _MEM_TOL * m.mem_gib:
        out.append(f"{p.mem_gib:.1f} GiB vs ~{m.mem_gib:g} GiB")
    return out


def _property_candidates(p: _Props) -> list[ChipSpec]:
    """Chips whose cc, SM count and memory all match (all three must be known on both sides)."""
    if p.cc is None or p.sms is None or p.mem_gib is None:
        return []
    out = []
    for c in chip_table().chips:
        m = c.match
        if m.compute_capability is None or m.num_sms is None or m.mem_gib is None:
            continue
        if _mismatches(c, p):
            continue
        if m.clock_mhz is not None and p.clock_mhz is not None and abs(p.clock_mhz - m.clock_mhz) > 0.03 * m.clock_mhz:
            continue
        out.append(c)
    return out


class _NoMatch(Exception):
    def __init__(self, message: str, candidates: Sequence[str]) -> None:
        super().__init__(message)
        self.message = message
        self.candidates = list(candidates)


def _ask(msg: str, candidates: Sequence[str]) -> _NoMatch:
    cands = list(dict.fromkeys(candidates))
    shown = ", ".join(cands) if cands else known_chips_text()
    label = "Candidates" if cands else "Known chips"
    return _NoMatch(
        f"{msg} Pass --chip NAME (or --chip path/to/chip.toml). {label}: {shown}.",
        cands or [c.key for c in chip_table().chips],
    )


def _identify(p: _Props, allow_property_match: bool) -> tuple[ChipSpec, str]:
    desc = p.describe()
    desc_s = f" ({desc})" if desc else ""
    label = f"device name {p.name!r}"
    if not _is_generic(p.name):
        db = chip_table()
        for c in db.chips:
            if norm_name(p.name) in {norm_name(b) for b in c.match.board_names}:
                mm = [m for m in _mismatches(c, p) if "GiB" not in m]
                if not mm:
                    return c, (
                        f"{label} (custom board of {c.key}){', ' + desc if desc else ''} -> {c.name} [{c.key}]"
                        " (reported memory not compared: see the chip's notes)"
                    )
        exact = db.by_norm.get(norm_name(p.name))
        contradiction = ""
        if exact is not None:
            mm = _mismatches(exact, p)
            if not mm:
                return exact, f"{label} (exact){', ' + desc if desc else ''} -> {exact.name} [{exact.key}]"
            contradiction = f"{label} names {exact.key} but the device reports {'; '.join(mm)}."
        cands = token_candidates(p.name)
        if cands:
            ok = [c for c in cands if not _mismatches(c, p)]
            if len(ok) == 1:
                c = ok[0]
                why = f"{label}{', ' + desc if desc else ''} -> {c.name} [{c.key}]"
                if len(cands) > 1:
                    why += f" (family rule: {', '.join(x.key for x in cands)} narrowed by the device properties)"
                return c, why
            if not ok:
                detail = "; ".join(f"{c.key}: {', '.join(_mismatches(c, p))}" for c in cands)
                raise _ask(
                    contradiction or f"{label}{desc_s} looks like {', '.join(c.key for c in cands)} "
                    f"but its properties contradict every one ({detail}).",
                    [c.key for c in cands],
                )
            raise _ask(
                f"{label}{desc_s} is ambiguous: it fits {', '.join(c.key for c in ok)} "
                "and the trace does not say which.",
                [c.key for c in ok],
            )
        if contradiction:
            raise _ask(contradiction, [exact.key] if exact else [])
        close = close_matches(p.name)
        prop = [c.key for c in _property_candidates(p)]
        raise _ask(f"{label}{desc_s} is not in the chip table.", prop + close)
    # empty / generic name
    prop = _property_candidates(p)
    what = "the device has no name" if not p.name else f"{label} is generic"
    if not desc:
        raise _ask(f"cannot identify the chip: {what} and no properties.", [])
    if allow_property_match and len(prop) == 1:
        c = prop[0]
        if c.match.identify_by_properties and (c.match.clock_mhz is None or p.clock_mhz is not None):
            return c, f"{what}; {desc} match only {c.name} [{c.key}] (property match)"
    hint = f" Its properties ({desc}) fit {', '.join(c.key for c in prop)}." if prop else f" Properties: {desc}."
    raise _ask(f"cannot identify the chip: {what}.{hint}", [c.key for c in prop])


def _check_stated_peaks(c: ChipSpec, p: _Props) -> str:
    notes = []
    if p.peak_flops:
        bf16 = c.peak("bf16") or max(c.peak_flops_per_s.values())
        if abs(p.peak_flops - bf16) > 0.1 * bf16:
            notes.append(f"trace states {p.peak_flops / 1e12:.1f} TFLOP/s peak vs table bf16 {bf16 / 1e12:.1f}")
    if p.peak_bw and abs(p.peak_bw - c.hbm_bytes_per_s) > 0.1 * c.hbm_bytes_per_s:
        notes.append(f"trace states {p.peak_bw / 1e9:.0f} GB/s vs table {c.hbm_bytes_per_s / 1e9:.0f} GB/s")
    return f"; note: {'; '.join(notes)}" if notes else ""


def detect_chip(
    devices: Iterable[DeviceInfo], *, allow_property_match: bool = False
) -> tuple[ChipSpec, str]:
    """Identify the chip a trace ran on from its device descriptions.

    Order: exact name/alias match, then the most specific name-token rule (``"H20"`` never
    matches ``"H200"``; ``"L4"`` never matches ``"L40S"``), narrowed by compute capability,
    SM/CU count and memory (``"NVIDIA H100"`` with 114 SMs -> H100 PCIe, with 132 -> SXM).
    A name whose properties contradict the table (a MIG slice, an 80 GB name with 96 GB) is
    refused. Empty or generic names (``""``, ``"AMD Radeon Graphics"``, ``"/device:GPU:0"``)
    are refused with the property-compatible candidates listed, unless
    ``allow_property_match`` is true and cc + SMs + memory fit exactly one chip that can be
    identified that way.

    Every distinct device is identified; devices that describe nothing (no name, no
    properties) are ignored when others do. Different chips in one trace are an error.

    Returns:
        ``(chip, reason)``: the reason says which evidence was used, e.g.
        ``"device name 'NVIDIA H100 80GB HBM3' (exact), cc 9.0, 132 SMs, 79.2 GiB -> NVIDIA H100 SXM5 80GB [h100_sxm]"``.

    Raises:
        UnknownChipError: no devices, unknown, generic or contradictory device, or several
            different chips; ``.candidates`` holds the keys to choose from.
    """
    devs = list(devices)
    if not devs:
        raise UnknownChipError(
            "the trace describes no devices (CPU-only trace, or deviceProperties missing); "
            f"pass --chip NAME to analyse device ops. Known chips: {known_chips_text()}.",
            [c.key for c in chip_table().chips],
        )
    groups: dict[_Props, list[DeviceInfo]] = {}
    for d in devs:
        groups.setdefault(_Props.of(d), []).append(d)
    informative = {p: ds for p, ds in groups.items() if p.informative}
    if not informative:
        raise UnknownChipError(
            f"cannot identify the chip: the trace's {len(devs)} device(s) carry no usable name or properties. "
            f"Pass --chip NAME (or --chip path/to/chip.toml). Known chips: {known_chips_text()}.",
            [c.key for c in chip_table().chips],
        )
    results: list[tuple[ChipSpec, str, _Props, list[DeviceInfo]]] = []
    for p, ds in informative.items():
        try:
            chip, why = _identify(p, allow_property_match)
        except _NoMatch as e:
            idx = [d.index for d in ds if d.index is not None]
            where = f" (device {', '.join(map(str, idx))})" if idx and len(informative) > 1 else ""
            raise UnknownChipError(e.message + where, e.candidates) from None
        results.append((chip, why, p, ds))
    chips = list(dict.fromkeys(r[0].key for r in results))
    if len(chips) > 1:
        detail = "; ".join(f"{r[2].name or '(unnamed)'} -> {r[0].key}" for r in results)
        raise UnknownChipError(
            f"ambiguous: the trace holds different chips ({detail}). "
            f"Pass --chip NAME to pick one. Candidates: {', '.join(chips)}.",
            chips,
        )
    chip, why, p, _ = results[0]
    n_info = sum(len(ds) for ds in informative.values())
    why += _check_stated_peaks(chip, p)
    if len(devs) > 1:
        why += f" ({n_info} device{'s' if n_info > 1 else ''}"
        skipped = len(devs) - n_info
        why += f", {skipped} without name or properties ignored)" if skipped else ")"
    return chip, why
