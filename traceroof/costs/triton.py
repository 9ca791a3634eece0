"""torch.compile (Inductor) Triton kernels: ``triton_poi_*`` (pointwise), ``triton_red_*``
(reduction) and ``triton_per_*`` (persistent reduction), BC-26.

The kernel's launch is recorded as a ``cpu_op`` named like the kernel, whose ``Input Dims``
/ ``Input type`` describe the launcher's arguments. Inductor passes every buffer the kernel
touches, outputs included (``in_out_ptr*``, ``in_ptr*``, ``out_ptr*``), followed by the
integer arguments as Scalars (``ks*`` sizes, then ``xnumel``, then ``r0_numel`` for a
reduction): Inductor's ``triton_heuristics`` launcher signature.

Bytes are a compulsory-traffic *lower bound*: every buffer read or written once at its
dtype width (fusion keeps intermediates in registers, so nothing else need touch HBM).
When the record holds the size Scalars, the buffers already include the outputs; the last
buffer is taken as the written one (Inductor puts ``out_ptr*`` last). When it holds only
tensors (no sizes: a hand-made or shape-only record), a pointwise kernel is taken to write
one output of the inputs' broadcast shape.

FLOPs: ``iterations × Σ c(op)`` over the aten ops Inductor names in the kernel
(``triton_poi_fused_add_mul_0`` fuses ``add`` and ``mul``), ``c`` the per-element FLOP count
of that op's own formula (:mod:`.elementwise`, :mod:`.reduction`: add 1, rsqrt 1, silu 4,
mean 1, ...; views, copies, casts and indexing 0). ``iterations`` is the kernel's iteration
domain from the launch record: ``xnumel`` (the last Scalar) for a pointwise kernel,
``xnumel · r0_numel`` (the last two) for a reduction. The real traces confirm the positions:
``grid[0] = ceil(xnumel / XBLOCK)`` with the launcher's ``XBLOCK`` kernel kwarg
(``tests/test_costs_triton.py``). Every named op is counted over the whole domain: an estimate
(an op applied once per row after a reduction, as the ``rsqrt`` of an RMS norm, is
over-counted; an op applied twice is counted once; Inductor names at most
``kernel_name_max_ops`` ops). A name with an op not in the vocabulary, a kernel without
ops in its name (``triton_poi_fused_0``) or a record without the size Scalars (and, for a
reduction, any record without them) leaves FLOPs unknown (``None``): the kernel is costed by
its bytes alone.
"""

from __future__ import annotations

import math
import re

from .args import OpArgs, Tensor, broadcast, promote, total_bytes
from .registry import OpCost, formula_for, register_cost

NOTE = "Inductor kernel: bytes are a compulsory-traffic lower bound"
NOTE_FLOPS = "; FLOPs = iterations x the per-element FLOPs of the aten ops its name fuses (an estimate)"
NOTE_NO_FLOPS = "; FLOPs not known (costed by bytes: memory-bound)"

#: Ops Inductor names that do no arithmetic: views, copies, casts, indexing, fills, RNG
#: plumbing (their cost is bytes, already counted from the buffers).
ZERO_FLOP_OPS = frozenset(
    "_unsafe_view view reshape clone _to_copy copy copy_ to contiguous constant_pad_nd cat "
    "slice select permute expand unsqueeze squeeze transpose t unbind split split_with_sizes "
    "stack index index_select index_put gather scatter embedding embedding_dense_backward full "
    "full_like zeros zeros_like ones ones_like fill fill_ empty new_zeros new_ones arange iota "
    "lift_fresh detach alias flip roll repeat as_strided slice_scatter select_scatter "
    "diagonal_scatter scalar_tensor _unsafe_index _unsafe_index_put convert_element_type "
    "masked_select bernoulli rand randn native_dropout_mask".split()
)

#: Per-element FLOPs of the ops whose formula is no single-coefficient spec (the counts of
#: those formulas: :mod:`.elementwise` ``add``, :mod:`.reduction` ``var_mean``/``softmax``,
#: :mod:`.norm` layer norm 6 + weight + bias, RMS norm 3 + weight, dropout 2).
OP_FLOPS = {
    "add": 1.0, "sub": 1.0, "rsub": 1.0, "max": 1.0, "min": 1.0, "var_mean": 4.0, "std_mean": 4.0,
    "_softmax": 5.0, "softmax": 5.0, "_log_softmax": 5.0, "log_softmax": 5.0, "_safe_softmax": 5.0,
    "native_layer_norm": 8.0, "layer_norm": 8.0, "_fused_rms_norm": 4.0, "rms_norm": 4.0,
    "native_dropout": 2.0,
}

_NAME = re.compile(r"^triton_(?:poi|red|per)_fused_(?P<ops>.*?)_\d+$")


def op_flops_per_element(op: str) -> float | None:
    """FLOPs per element of the aten op ``op`` (no ``aten::``) as named in an Inductor kernel
    name: 0 for :data:`ZERO_FLOP_OPS`, :data:`OP_FLOPS`, else the ``flops`` coefficient of
    the op's registered pointwise or reduction formula; ``None`` when unknown."""
    if op in ZERO_FLOP_OPS:
        return 0.0
    if op in OP_FLOPS:
        return OP_FLOPS[op]
    fn = formula_for(f"aten::{op}")
    spec = getattr(fn, "spec", None) if fn is not None else None
    flops = getattr(spec, "flops", None)
    return float(flops) if flops is not None else None


def fused_ops(kernel_name: str) -> list[str] | None:
    """The aten ops an Inductor kernel name fuses, in order: ``triton_poi_fused__unsafe_view_add_3``
    → ``["_unsafe_view", "add"]`` (op names contain ``_``: each position takes the longest
    known op name). ``None`` when the name is no ``triton_{poi,red,per}_fused_<ops>_<n>``, is
    empty of ops, or holds a word that is no known op."""
    m = _NAME.match(kernel_name)
    if not m or not m.group("ops"):
        return None
    rest, out, i = m.group("ops"), [], 0
    words = rest.split("_")
    # candidate op names are runs of consecutive words; a leading "" word is an op's own "_"
    while i < len(words):
        best = None
        for j in range(len(words), i, -1):
            cand = "_".join(words[i:j])
            # no trailing "_": Inductor names functional ops (``add``, never ``add_``)
            if cand and not cand.endswith("_") and op_flops_per_element(cand) is not None:
                best = (cand, j)
                break
        if best is None:
            return None
        out.append(best[0])
        i = best[1]
    return out or None


def fused_flops_per_element(kernel_name: str) -> float | None:
    """Σ per-element FLOPs of the ops the kernel name fuses (:func:`fused_ops`), or ``None``."""
    ops = fused_ops(kernel_name)
    if ops is None:
        return None
    return sum(op_flops_per_element(o) or 0.0 for o in ops)


def _scalars(a: OpArgs) -> list[int | None]:
    """The integer value of each Scalar argument, in order (``None`` where not recorded)."""
    return [a.integer(i) for i in range(len(a)) if a.type(i) == "Scalar"]


def iterations(a: OpArgs, kind: str) -> int | None:
    """The kernel's iteration domain from its launch record: ``xnumel`` (last Scalar) for a
    pointwise kernel, ``xnumel · r0_numel`` (last two) for a reduction; ``None`` when not
    recorded or not a positive integer."""
    sc = _scalars(a)
    need = 1 if kind == "elementwise" else 2
    if len(sc) < need or any(v is None or v <= 0 for v in sc[-need:]):
        return None
    return math.prod(v for v in sc[-need:] if v is not None)


def _triton(a: OpArgs, kind: str) -> OpCost | None:
    buffers = [t for _, t in a.tensors()]
    if not buffers:
        return None
    launcher = any(a.type(i) == "Scalar" for i in range(len(a)))
    dtype = max(buffers, key=lambda t: t.numel).dtype
    n: int | None = None
    if launcher:
        reads, writes = buffers[:-1], buffers[-1:]
        if len(buffers) == 1:
            reads = []
        n = iterations(a, kind)
    else:
        reads = buffers
        writes = []
        if kind == "elementwise":
            out = Tensor(broadcast(*(t.shape for t in buffers)), promote([t.dtype for t in buffers]))
            writes = [out]
            n = out.numel
    per = fused_flops_per_element(a.op)
    flops = float(n * per) if n is not None and per is not None else None
    note = NOTE + (NOTE_FLOPS if flops is not None else NOTE_NO_FLOPS)
    if not writes:
        note += "; output not recorded"
    return OpCost(flops, total_bytes(reads), total_bytes(writes), kind, dtype, note)


@register_cost("triton_poi_*", kind="elementwise")
def triton_pointwise(a: OpArgs) -> OpCost | None:
    """Inductor pointwise kernel ``triton_poi_fused_<ops>_<n>``: buffers ``[*]`` of any shapes;
    bytes = Σ buffers (plus the broadcast output when the record lists inputs only);
    FLOPs = xnumel · Σ c(op) over the named ops (module docstring), else ``None``."""
    return _triton(a, "elementwise")


@register_cost("triton_red_*", "triton_per_*", kind="reduction")
def triton_reduction(a: OpArgs) -> OpCost | None:
    """Inductor (persistent) reduction kernel ``triton_red_*`` / ``triton_per_*``:
    bytes = Σ buffers (the output is one of them in a launcher record); FLOPs = xnumel ·
    r0_numel · Σ c(op) over the named ops, else ``None``."""
    return _triton(a, "reduction")
