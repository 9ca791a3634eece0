"""Message bytes of a collective from the shapes its host-side annotation recorded.

PyTorch 1.x traces carry no ``In msg nelems``/``Out msg nelems`` on ``record_param_comms``
(those came in PyTorch 2.1); what they carry is an ``nccl:<collective>`` annotation
(``nccl:all_reduce``, ``nccl:all_to_all``, ``gloo:…``) nested in it, whose ``Input Dims`` and
``Input type`` are the buffer the collective sends (``record_function`` in
``torch/distributed/distributed_c10d.py`` / ``ProcessGroupNCCL``, recorded with
``record_shapes=True``). The message size is that buffer: the convention of the op table's
``comm_bytes`` (message bytes per device, the full buffer; the roofline applies the ring
factor, DESIGN §6).
"""

from __future__ import annotations

import re

from .args import OpArgs

#: the host annotations that name a collective and record its buffer: ``nccl:all_reduce``,
#: ``rccl:…``, ``gloo:…`` (``torch.distributed`` profiling names)
COMM_ANNOTATION_RE = r"^(nccl|rccl|gloo):"

_COMM_ANNOTATION = re.compile(COMM_ANNOTATION_RE)


def is_comm_annotation(name: str | None) -> bool:
    """Whether ``name`` is a collective's host annotation (``nccl:all_to_all``)."""
    return bool(name) and _COMM_ANNOTATION.match(name) is not None


def message_bytes(input_dims: list | str | None, input_types: list | str | None) -> float | None:
    """Bytes of the buffer a collective annotation recorded: Σ numel × itemsize over its
    tensor arguments (``nccl:all_to_all`` ``[[8, 1024, 8816]]`` ``["float"]`` → 8·1024·8816·4 =
    288,882,688 bytes).

    Args:
        input_dims: the annotation's ``Input Dims`` (list, or its JSON text).
        input_types: its ``Input type``.

    Returns:
        The bytes, or ``None`` when no tensor argument is recorded, a tensor's dtype is
        unknown, or an argument is a ``Tensor[]`` (Kineto does not record its elements).
        Never 0 for unknown; an empty buffer (a recorded ``[0]``) is 0 bytes.
    """
    if input_dims is None or input_types is None:
        return None
    a = OpArgs("comm", input_dims, input_types)
    if any(a.type(i) == "TensorList" for i in range(len(a))):
        return None
    tensors = a.tensors()
    if not tensors:
        return None
    sizes = [t.nbytes for _, t in tensors]
    if any(s is None for s in sizes):
        return None
    return float(sum(sizes))
