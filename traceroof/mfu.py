"""MFU and HFU: FLOPs per step ÷ (step time × peak), with the guard against >100 %.

MFU counts *model* FLOPs (:func:`traceroof.model.model_flops_per_step`, the PaLM-paper
definition: Chowdhery et al. 2022, App. B); HFU counts the FLOPs the hardware executed, from
the op table (recomputation included). A value above 1.0 is never returned as a result: it is
an :class:`Inconsistency` naming the suspicious inputs (the peak taken, the FLOP formula, the
clock) — BC-29, BC-31.
"""

from __future__ import annotations

import logging
import math
import operator
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from . import units
from .errors import UsageError

log = logging.getLogger(__name__)

def _canon(dtype: str) -> str:
    """Canonical dtype key (``bfloat16`` → ``bf16``) via the chip database's mapping."""
    from .dtypes import canonical_dtype

    return canonical_dtype(str(dtype)) or str(dtype).strip().lower()


__all__ = ["Peak", "peak_from_chip", "Utilization", "Inconsistency", "achieved_flops_per_s", "mfu", "hfu"]


@dataclass(frozen=True)
class Peak:
    """A peak FLOP/s figure and where it came from (BC-29: dense, its dtype, its source)."""

    flops_per_s: float
    dtype: str | None = None
    source: str | None = None
    chip: str | None = None
    dense: bool = True

    def describe(self) -> str:
        """``peak=989 TFLOP/s bf16 dense (NVIDIA H100 SXM5 80GB; source)``."""
        kind = "dense" if self.dense else "2:4 sparse"
        source = self.source.split(";")[0].strip() if self.source else None
        where = "; ".join(x for x in (self.chip, source) if x)
        dt = f" {self.dtype}" if self.dtype else ""
        return f"peak={units.tflops(self.flops_per_s)} TFLOP/s{dt} {kind}" + (
            f" ({where})" if where else "")


def peak_from_chip(chip: Any, dtype: str = "bf16") -> Peak | None:
    """The dense peak of ``chip`` (a ChipSpec) for ``dtype``, labelled; None when it has none."""
    d = _canon(dtype)
    try:
        value = chip.peak(d)
    except ValueError:  # a dtype the chip database does not know at all
        value = None
    if value is None:
        return None
    src: Any = None
    if callable(getattr(chip, "source", None)):  # traceroof.chips.ChipSpec.source(field)
        src = chip.source(f"peak_flops_per_s.{d}")
    if src is None:
        src = getattr(chip, "sources", None)
        if isinstance(src, Mapping):
            src = src.get(f"peak_flops_per_s.{d}") or src.get("peak_flops_per_s")
        elif isinstance(src, (list, tuple)):
            src = src[0] if src else None
    return Peak(float(value), d, str(src) if src else None, getattr(chip, "name", None))


@dataclass(frozen=True)
class Utilization:
    """An MFU or HFU figure with every input it was computed from.

    ``value`` is a fraction (0.485 = 48.5 %), or None when no peak is known (BC-31: MFU unknown,
    never a fallback peak). ``achieved_flops_per_s`` is per device.
    """

    kind: Literal["MFU", "HFU"]
    value: float | None
    flops_per_step: float
    step_time_ns: float
    n_devices: int
    peak: Peak | None
    achieved_flops_per_s: float
    flops_formula: str | None = None
    note: str | None = None

    @property
    def percent(self) -> float | None:
        return None if self.value is None else 100.0 * self.value

    def describe(self) -> str:
        """``MFU 48.5 % (480 TFLOP/s per device; peak=989 TFLOP/s bf16 dense (...))``."""
        ach = f"{units.tflops(self.achieved_flops_per_s)} TFLOP/s per device"
        if self.value is None or self.peak is None:
            return f"{self.kind} unknown ({ach}; {self.note or 'no peak for this chip'})"
        return f"{self.kind} {100 * self.value:.1f} % ({ach}; {self.peak.describe()})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "value": self.value, "flops_per_step": self.flops_per_step,
            "step_time_ns": self.step_time_ns, "n_devices": self.n_devices,
            "achieved_flops_per_s": self.achieved_flops_per_s,
            "peak_flops_per_s": self.peak.flops_per_s if self.peak else None,
            "peak_dtype": self.peak.dtype if self.peak else None,
            "peak_source": self.peak.source if self.peak else None,
            "peak_chip": self.peak.chip if self.peak else None,
            "peak_dense": self.peak.dense if self.peak else None,
            "flops_formula": self.flops_formula, "note": self.note,
        }


@dataclass(frozen=True)
class Inconsistency:
    """A number that cannot be true (utilization above 100 %, an op above its roof).

    Reported instead of the number, never as a result (BC-29, BC-31). ``suspects`` names the
    inputs to check, most likely first; ``inputs`` holds their values.
    """

    what: str
    value: float
    limit: float
    message: str
    suspects: tuple[str, ...]
    inputs: Mapping[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        return f"INCONSISTENT {self.what}: {self.message} Check: " + "; ".join(self.suspects)

    def to_dict(self) -> dict[str, Any]:
        return {"what": self.what, "value": self.value, "limit": self.limit,
                "message": self.message, "suspects": list(self.suspects),
                "inputs": dict(self.inputs)}


def achieved_flops_per_s(flops: Any, step_time_ns: Any, n_devices: Any) -> Any:
    """FLOP/s per device: ``flops / n_devices / (step_time_ns · 1e-9)``.

    The one formula behind MFU, HFU and their per-step columns: the arguments may be numbers
    or polars expressions (``pl.col("flops")``, ``pl.col("wall_ns")``), in ns and FLOPs.
    """
    return flops / n_devices / (step_time_ns * 1e-9)


def _utilization(kind: Literal["MFU", "HFU"], flops: float, step_time_ns: float,
                 peak: float | Peak | None, n_devices: int, peak_dtype: str | None,
                 peak_source: str | None, flops_formula: str | None
                 ) -> Utilization | Inconsistency:
    if flops is None or not math.isfinite(flops) or flops < 0:
        raise UsageError(f"{kind}: FLOPs per step must be a non-negative number, got {flops!r}")
    if not step_time_ns or not math.isfinite(step_time_ns) or step_time_ns <= 0:
        raise UsageError(f"{kind}: step time must be positive (ns), got {step_time_ns!r}")
    try:
        n_devices = operator.index(n_devices)
    except TypeError:
        raise UsageError(f"{kind}: n_devices must be an integer, got {n_devices!r}") from None
    if n_devices < 1:
        raise UsageError(f"{kind}: n_devices must be positive, got {n_devices!r}")
    if peak is not None and not isinstance(peak, Peak):
        if not math.isfinite(peak) or peak <= 0:
            raise UsageError(f"{kind}: peak FLOP/s must be positive, got {peak!r}")
        peak = Peak(float(peak), _canon(peak_dtype) if peak_dtype else None, peak_source)
    achieved = achieved_flops_per_s(flops, step_time_ns, n_devices)
    if peak is None:
        return Utilization(kind, None, flops, step_time_ns, n_devices, None, achieved,
                           flops_formula, "no peak known for this chip and dtype; pass --peak")
    value = achieved / peak.flops_per_s
    if value > 1.0:
        which = "model FLOP formula" if kind == "MFU" else "per-op FLOP formulas (op table)"
        suspects = (
            f"peak taken: {peak.describe()} — the right chip, dtype and device count "
            f"(n_devices={n_devices})?",
            f"FLOP formula: {which}" + (f" = {flops_formula}" if flops_formula else "")
            + " — causal attention counted as full, tokens or layers double-counted?",
            f"clock: step time {step_time_ns / 1e6:.3f} ms — a cut-off step, wrong time unit, "
            "or a step boundary that misses part of the work?",
        )
        return Inconsistency(
            what=kind, value=value, limit=1.0,
            message=(f"{kind} would be {100 * value:.1f} % ({units.tflops(achieved)} TFLOP/s per "
                     f"device against {peak.describe()}); above 100 % is impossible, so an "
                     "input is wrong."),
            suspects=suspects,
            inputs={"flops_per_step": flops, "step_time_ns": step_time_ns,
                    "n_devices": n_devices, "peak_flops_per_s": peak.flops_per_s,
                    "peak_dtype": peak.dtype, "peak_source": peak.source,
                    "peak_dense": peak.dense, "flops_formula": flops_formula},
        )
    return Utilization(kind, value, flops, step_time_ns, n_devices, peak, achieved,
                       flops_formula)


def mfu(model_flops_per_step: float, step_time_ns: float, peak_flops_per_s: float | Peak | None,
        n_devices: int = 1, *, peak_dtype: str | None = None, peak_source: str | None = None,
        flops_formula: str | None = None) -> Utilization | Inconsistency:
    """Model FLOPs utilization (PaLM, Chowdhery et al. 2022, App. B).

    MFU = model FLOPs per step / step time / (n_devices · peak), where model FLOPs are the
    architecture's (6N·tokens + attention for training, :func:`model_flops_per_step`), not what
    the hardware ran (no recomputation, no padding).

    Args:
        model_flops_per_step: FLOPs of one step over all ``n_devices``.
        step_time_ns: wall time of the step, ns.
        peak_flops_per_s: dense peak of one device (a float or a labelled :class:`Peak`), or
            None when unknown (result: value None, never a fallback peak; BC-31).
        peak_dtype, peak_source: labels for a float peak.
        flops_formula: how the FLOPs were obtained, shown in outputs and in an inconsistency.

    Returns:
        :class:`Utilization`, or :class:`Inconsistency` when the value exceeds 1.0.

    Raises:
        UsageError: non-positive time, peak or device count; negative FLOPs.
    """
    return _utilization("MFU", model_flops_per_step, step_time_ns, peak_flops_per_s, n_devices,
                        peak_dtype, peak_source, flops_formula)


def hfu(hardware_flops: float, step_time_ns: float, peak: float | Peak | None,
        n_devices: int = 1, *, peak_dtype: str | None = None, peak_source: str | None = None,
        flops_formula: str | None = "sum of op-table FLOPs") -> Utilization | Inconsistency:
    """Hardware FLOPs utilization: FLOPs the device ops performed / time / peak.

    The FLOPs are the op table's (DESIGN §4): recomputation, padding, and attention as each
    kernel ran it are all included, ops without a cost model are not. Same contract as :func:`mfu`.
    """
    return _utilization("HFU", hardware_flops, step_time_ns, peak, n_devices, peak_dtype,
                        peak_source, flops_formula)
