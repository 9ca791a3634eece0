"""Moved: HLO costs live in :mod:`traceroof.costs.hlo` (jaxlib cost model, attaching costs),
:mod:`traceroof.costs.hlo_text` (HLO text), :func:`traceroof.costs.kinds.kind_of_hlo`
(opcode -> kind) and :mod:`traceroof.parsers.hlo_modules` (the programs of an XPlane).

This module only re-exports the names the XPlane reader and its tests import, until they
import the new homes (integration of issue 12); nothing is defined here.
"""

from __future__ import annotations

from ..costs.hlo import HloCostUnavailable, HloOpCost, ModuleInfo, attach_hlo_costs, available
from ..costs.hlo_text import (
    TRIVIAL_OPCODES, InstrInfo, collective_size, parse_hlo_expression, shape_bytes, xla_dtype,
)
from ..costs.kinds import kind_of_hlo as op_kind
from .hlo_modules import Modules, module_info

__all__ = [
    "TRIVIAL_OPCODES", "HloCostUnavailable", "HloOpCost", "InstrInfo", "ModuleInfo", "Modules",
    "attach_hlo_costs", "available", "collective_size", "module_info", "op_kind",
    "parse_hlo_expression", "shape_bytes", "xla_dtype",
]
