"""Chip database: dense peaks, memory and interconnect bandwidth of the chips traceroof knows.

The numbers live in ``chips.toml`` beside this module; every number there has a source
(``ChipSpec.sources``; ``[id]`` tags point into the file's ``[refs]`` table, see
:func:`references`). ``docs/chips.md`` is the readable table with the disagreements found.

Units everywhere: FLOP/s (int8: OP/s) for peaks, bytes for capacity, B/s (decimal) for
bandwidths, ns for the launch floor. Peaks are **dense** (never the 2:4-sparsity figure) and
per *framework device* (one CUDA/HIP/JAX device: an MI250X GCD, a TPU7x TensorCore).

Public API::

    get_chip("h100")                 # key, name or alias, case/separator-insensitive, or a TOML path
    detect_chip(trace.meta.devices)  # -> (ChipSpec, "device name 'NVIDIA H100 80GB HBM3' ... -> ...")
    list_chips()
    chip.peak("bf16"), chip.ridge_point("bf16"), chip.source("hbm_bytes_per_s")

Unknown or ambiguous chips raise :class:`~traceroof.errors.UnknownChipError` listing the
candidates; nothing ever falls back to a default chip.
"""

from __future__ import annotations

from .chip_detect import detect_chip
from .chip_table import (
    ChipMatch,
    ChipSpec,
    get_chip,
    list_chips,
    load_chip_file,
    references,
)
from .dtypes import canonical_dtype

__all__ = [
    "ChipMatch",
    "ChipSpec",
    "canonical_dtype",
    "detect_chip",
    "get_chip",
    "list_chips",
    "load_chip_file",
    "references",
]
