"""torch.compile (Inductor) Triton kernels: ``triton_poi_*`` (pointwise), ``triton_red_*``
(reduction) and ``triton_per_*`` (persistent reduction), BC-26.

The kernel's launch is recorded as a ``cpu_op`` named like the kernel, whose ``Input Dims``
/ ``Input type`` describe the launcher's arguments. Inductor passes every buffer the kernel
touches, outputs included (``in_out_ptr*``, ``in_ptr*``, ``out_ptr*``), followed by the
integer sizes (``xnumel``, ``r0_numel``) as Scalars.

Bytes are a compulsory-traffic *lower bound*: every buffer read or written once at its
dtype width (fusion keeps intermediates in registers, so nothing else need touch HBM).
When the record holds the size Scalars, the buffers already include the outputs; the last
buffer is taken as the written one (Inductor puts ``out_ptr*`` last). When it holds only
tensors (no sizes: a hand-made or shape-only record), a pointwise kernel is taken to write
one output of the inputs' broadcast shape. FLOPs are not modeled (``None``): a fused kernel's
arithmetic is not in the trace, and these kernels are memory-bound by construction.
"""

from __future__ import annotations

from .args import OpArgs, Tensor, broadcast, promote, total_bytes
from .registry import OpCost, register_cost

NOTE = "Inductor kernel: bytes are a compulsory-traffic lower bound; FLOPs not modeled (memory-bound)"


def _triton(a: OpArgs, kind: str) -> OpCost | None:
    buffers = [t for _, t in a.tensors()]
    if not buffers:
        return None
    launcher = any(a.type(i) == "Scalar" for i in range(len(a)))
    dtype = max(buffers, key=lambda t: t.numel).dtype
    if launcher:
        reads, writes = buffers[:-1], buffers[-1:]
        if len(buffers) == 1:
            reads = []
    else:
        reads = buffers
        writes = []
        if kind == "elementwise":
            writes = [Tensor(broadcast(*(t.shape for t in buffers)), promote([t.dtype for t in buffers]))]
    note = NOTE if writes else NOTE + "; output not recorded"
    return OpCost(None, total_bytes(reads), total_bytes(writes), kind, dtype, note)


@register_cost("triton_poi_*", kind="elementwise")
def triton_pointwise(a: OpArgs) -> OpCost | None:
    """Inductor pointwise kernel ``triton_poi_fused_<ops>_<n>``: buffers ``[*]`` of any shapes;
    bytes = Σ buffers (plus the broadcast output when the record lists inputs only)."""
    return _triton(a, "elementwise")


@register_cost("triton_red_*", "triton_per_*", kind="reduction")
def triton_reduction(a: OpArgs) -> OpCost | None:
    """Inductor (persistent) reduction kernel ``triton_red_*`` / ``triton_per_*``:
    bytes = Σ buffers (the output is one of them in a launcher record)."""
    return _triton(a, "reduction")
