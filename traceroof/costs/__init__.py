"""FLOPs and HBM bytes per framework op, from its recorded shapes (DESIGN §4).

One registry (:mod:`.registry`) keyed by canonical op name is the single source of truth;
the formula modules register into it on import::

    from traceroof.costs import cost_of
    c = cost_of("aten::addmm", [[512], [141, 512], [512, 512], [], []],
                ["c10::BFloat16"] * 3 + ["Scalar", "Scalar"], ["", "", "", "1", "1"])
    c.flops   # 73_924_608.0 = 2·141·512·512

See ``docs/costs.md`` for every formula, its shape convention and its source.
"""

from __future__ import annotations

from ..dtypes import itemsize
from . import (
    attention,
    comms,
    conv,
    elementwise,
    fbgemm,
    matmul,
    memory,
    moe,
    norm,
    optimizer,
    reduction,
    serving,
    triton,
)
from .args import OpArgs, Tensor, dtype_of
from .comms import (
    COMM_ANNOTATION_RE,
    collective_size,
    message_bytes,
    registered_collectives,
)
from .kinds import is_data_movement_kernel, kind_of_kernel, kind_of_op
from .registry import (
    OpCost,
    cost_of,
    formula_for,
    register_cost,
    register_uncosted,
    registered_ops,
    registered_uncosted,
    uncosted_reason,
)

__all__ = [
    "COMM_ANNOTATION_RE",
    "OpArgs",
    "OpCost",
    "Tensor",
    "collective_size",
    "cost_of",
    "dtype_of",
    "formula_for",
    "is_data_movement_kernel",
    "itemsize",
    "kind_of_kernel",
    "kind_of_op",
    "message_bytes",
    "register_cost",
    "register_uncosted",
    "registered_collectives",
    "registered_ops",
    "registered_uncosted",
    "uncosted_reason",
]

# the formula modules are imported for their registrations
del attention, comms, conv, elementwise, fbgemm, matmul, memory, moe, norm, optimizer, reduction, serving, triton
