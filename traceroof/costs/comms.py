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
from collections.abc import Callable
from typing import Any

from ..errors import DuplicateFormulaError
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


# --------------------------------------------------------------------------- by Input Dims
# Collective framework ops that are not ``record_param_comms`` (so the trace carries no
# ``In msg nelems``) but record their buffer as an ordinary tensor argument: torch symmetric
# memory (``symm_mem::*``), vLLM's custom-op wrappers of its process-group collectives
# (``vllm::all_reduce`` ...) and DeepEP's expert-parallel all-to-all. Their message size is
# read from that argument's ``Input Dims`` × dtype, the convention of ``comm_bytes``: the full
# buffer per device (the input of an all-reduce or reduce-scatter, the output of an
# all-gather, DESIGN §6; the roofline applies the ring factor of the op's collective type).

#: ``(bytes, group_size)`` of a collective from its recorded arguments; ``group_size`` is
#: ``None`` when the op records no participant count (a process-group name is a string,
#: whose value Kineto does not record).
Sizer = Callable[[OpArgs], "tuple[float, int | None] | None"]

_SIZERS: dict[str, Sizer] = {}


def register_collective(*op_names: str) -> Callable[[Sizer], Sizer]:
    """Register the message-size function of collective ops ``op_names`` (exact names; an
    overload ``name.out`` resolves to ``name``).

    Raises:
        DuplicateFormulaError: a name already has a size function.
    """
    def decorate(fn: Sizer) -> Sizer:
        for n in op_names:
            if n in _SIZERS:
                raise DuplicateFormulaError(f"a collective size function for {n!r} is already registered")
        for n in op_names:
            _SIZERS[n] = fn
        return fn

    return decorate


def registered_collectives() -> list[str]:
    """Every op name with a collective size function, sorted."""
    return sorted(_SIZERS)


def _sizer(op: str) -> Sizer | None:
    fn = _SIZERS.get(op)
    if fn is None and "." in op.rpartition("::")[2]:
        fn = _SIZERS.get(op.rsplit(".", 1)[0])
    return fn


def collective_size(op: str, input_dims: Any, input_types: Any,
                    concrete_inputs: Any = None) -> tuple[float, int | None] | None:
    """``(message bytes, group size or None)`` of collective op ``op`` from its recorded
    ``Input Dims`` / ``Input type`` / ``Concrete Inputs`` (lists or their JSON text).

    ``symm_mem::multimem_all_reduce_`` ``[[2557440], [], []]`` ``["c10::BFloat16", "", ""]`` →
    ``(5114880.0, None)`` (2,557,440 bf16 elements × 2 bytes; the group is a name).

    Returns:
        ``None`` when ``op`` has no size function or its tensor is not recorded with a dtype
        (unknown, never 0). Never raises on odd input.
    """
    fn = _sizer((op or "").strip())
    if fn is None or input_dims is None:
        return None
    try:
        return fn(OpArgs(op, input_dims, input_types, concrete_inputs))
    except Exception:  # a size function must never take the analysis down
        return None


def _tensor_bytes(a: OpArgs, i: int) -> float | None:
    t = a.tensor(i)
    return None if t is None else t.nbytes


def _positive(n: int | None) -> int | None:
    return n if n is not None and n >= 1 else None


@register_collective(
    "symm_mem::multimem_all_reduce_", "symm_mem::multimem_one_shot_all_reduce",
    "symm_mem::multimem_one_shot_all_reduce_out", "symm_mem::one_shot_all_reduce",
    "symm_mem::one_shot_all_reduce_out", "symm_mem::two_shot_all_reduce_",
    "symm_mem::two_shot_all_reduce_out", "symm_mem::reduce_scatter_out",
    "vllm::all_reduce", "vllm::outplace_all_reduce", "vllm::inplace_all_reduce",
)
def input_buffer(a: OpArgs) -> tuple[float, int | None] | None:
    """All-reduce / reduce-scatter whose buffer is the first argument: ``input [*]`` (torch
    ``symm_mem`` schemas ``multimem_all_reduce_(Tensor(a!) input, str reduce_op, str
    group_name)``, ``reduce_scatter_out(Tensor input, str group_name, bool split_last_dim,
    Tensor(a!) out)``; vLLM ``all_reduce(Tensor tensor, str group_name)``). Bytes =
    ``numel(input) × itemsize``; the group is a name, so its size is not recorded (``None``)."""
    b = _tensor_bytes(a, 0)
    return None if b is None else (b, None)


@register_collective("symm_mem::multimem_all_gather_out")
def gathered_buffer(a: OpArgs) -> tuple[float, int | None] | None:
    """``multimem_all_gather_out(Tensor input [n_local, *], str group_name, Tensor(a!) out
    [n·n_local, *])``: an all-gather's message is its full output (``out``, the last tensor);
    the group size is ``numel(out) / numel(input)`` when that is a whole number."""
    tensors = a.tensors()
    if len(tensors) < 2:
        return None
    x, out = tensors[0][1], tensors[-1][1]
    if out.nbytes is None:
        return None
    n = out.numel // x.numel if x.numel and out.numel % x.numel == 0 else None
    return out.nbytes, _positive(n)


@register_collective("vllm::all_gather", "vllm::reduce_scatter")
def vllm_group_collective(a: OpArgs) -> tuple[float, int | None] | None:
    """vLLM ``all_gather(Tensor tensor [*], int dim, int world_size, str group_name)`` and
    ``reduce_scatter(Tensor tensor [*], int dim, int world_size, str group_name)``
    (``vllm/distributed/parallel_state.py``): the group size is the recorded ``world_size``
    scalar (position 2). Bytes: an all-gather's full output, ``world_size × numel(tensor) ×
    itemsize``; a reduce-scatter's input, ``numel(tensor) × itemsize``. Without the recorded
    ``world_size`` an all-gather's output is unknown (``None``)."""
    b = _tensor_bytes(a, 0)
    n = _positive(a.integer(2))
    if b is None:
        return None
    if a.op.startswith("vllm::all_gather"):
        return None if n is None else (b * n, n)
    return b, n


#: DeepEP (deepseek-ai/DeepEP ``deep_ep/buffer.py``) expert-parallel ops when a framework
#: records them as ops: ``x`` (the tokens' hidden states, ``[num_tokens, hidden]``) first.
DEEPEP_OPS = ("deep_ep::dispatch", "deep_ep::combine", "deep_ep::low_latency_dispatch",
              "deep_ep::low_latency_combine")


@register_collective(*DEEPEP_OPS)
def deepep_tokens(a: OpArgs) -> tuple[float, int | None] | None:
    """DeepEP ``dispatch(x [t, hidden], ...)`` / ``combine(x [t', hidden], ...)``: an
    all-to-all whose message is the tokens ``x`` (the first tensor) at its dtype, each token
    counted once (a lower bound: a token routed to experts on k ranks is sent k times, and
    the routing is not in the shapes). The group is the Buffer's, not recorded (``None``)."""
    tensors = a.tensors()
    if not tensors:
        return None
    b = tensors[0][1].nbytes
    return None if b is None else (b, None)
