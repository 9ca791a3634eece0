"""The estimate's floor for a measured step (``traceroof analyze --model``): the time no
implementation of the model can beat on the devices the trace ran on, set beside the measured
step and the sum of the step's ops' roofline times, so that model floor ≤ measured shows.

* training (``--mode train``): model FLOPs per step / (devices × dense peak), the MFU
  numerator over its denominator (PaLM, Chowdhery et al. 2022, App. B); the communication a
  layout implies is not included (the trace does not say the layout: ``estimate --tp ...``
  computes it);
* inference (``--mode infer``): max(model FLOPs / (devices × peak), weight bytes read by the
  step / (devices × HBM bandwidth)) (the decode floor of docs/estimate.md; KV-cache reads
  not included, so it stays a floor).

A floor above the measured step means the model FLOPs (or bytes) count work the trace did not
run: the wrong ``--tokens-per-step``, ``--mode`` or ``--devices``, or a trace of part of a step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .estimate import weights_read_bytes
from .model import ModelConfig, param_counts

__all__ = ["ModelFloor", "model_floor"]


@dataclass(frozen=True)
class ModelFloor:
    """The floor of one step in seconds (``_s``; None when the peak or bandwidth is unknown),
    its compute and memory parts, the measured step (s) and the per-device mean of the step's
    ops' ``expected_ns`` summed (s; None when the report has no op table or no costed op)."""

    mode: str
    compute_floor_s: float | None
    memory_floor_s: float | None
    measured_step_s: float | None
    ops_expected_s: float | None
    n_devices: int

    @property
    def floor_s(self) -> float | None:
        parts = [x for x in (self.compute_floor_s, self.memory_floor_s) if x is not None]
        return max(parts) if parts else None

    @property
    def above_measured(self) -> bool | None:
        if self.floor_s is None or self.measured_step_s is None:
            return None
        return self.floor_s > self.measured_step_s

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "floor_s": self.floor_s, "compute_floor_s": self.compute_floor_s,
                "memory_floor_s": self.memory_floor_s, "measured_step_s": self.measured_step_s,
                "ops_expected_s": self.ops_expected_s, "n_devices": self.n_devices,
                "above_measured": self.above_measured}


def model_floor(cfg: ModelConfig | None, *, mode: str, model_flops_per_step: float,
                tokens_per_step: float | None, n_devices: int, peak_flops_per_s: float | None,
                hbm_bytes_per_s: float | None, measured_step_ns: float | None,
                ops_expected_ns_per_step: float | None = None,
                bytes_per_param: float = 2.0) -> ModelFloor:
    """The :class:`ModelFloor` of a step (module docstring). ``cfg`` None (FLOPs given
    directly) leaves the inference memory floor unknown."""
    compute = None if not peak_flops_per_s else model_flops_per_step / (n_devices * peak_flops_per_s)
    memory = None
    if mode == "infer" and cfg is not None and tokens_per_step and hbm_bytes_per_s:
        read = weights_read_bytes(cfg, param_counts(cfg), tokens_per_step, bytes_per_param)
        memory = read / (n_devices * hbm_bytes_per_s)
    return ModelFloor(
        mode=mode, compute_floor_s=compute, memory_floor_s=memory,
        measured_step_s=None if measured_step_ns is None else measured_step_ns / 1e9,
        ops_expected_s=None if ops_expected_ns_per_step is None else ops_expected_ns_per_step / 1e9,
        n_devices=n_devices)
