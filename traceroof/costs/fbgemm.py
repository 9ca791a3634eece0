"""FBGEMM GPU (``fbgemm_gpu``, torchrec/DLRM) sparse ops: table-batched embedding (TBE)
lookups forward and backward, and the small index/permute ops around them.

Shape convention (the op schemas of FBGEMM's codegen, ``embedding_backward_split_host_template.cpp``
and ``embedding_backward_dense_host.cpp``, 2022-2023; the positions below match the traces
recorded with them):

* ``split_embedding_codegen_lookup_{optimizer}_function(placeholder_autograd_tensor,
  dev_weights, uvm_weights, lxu_cache_weights, weights_placements, weights_offsets,
  D_offsets [T+1], total_D, max_D, hash_size_cumsum, total_hash_size_bits, indices [L],
  offsets [B·T+1], pooling_mode, indice_weights [L]?, …)``: positions 1, 6, 7, 11, 12, 14;
* ``dense_embedding_codegen_lookup_function(dev_weights, weights_offsets, D_offsets [T+1],
  total_D, max_D, hash_size_cumsum, total_hash_size_bits, indices [L], offsets [B·T+1],
  pooling_mode, indice_weights [L]?, …)``: positions 0, 2, 3, 7, 8, 10.

``T`` tables, ``B`` bags per table, ``L`` looked-up rows in all, ``total_D`` the sum of the
tables' embedding dims; the pooled output is ``[B, total_D]``. ``total_D`` is a scalar
argument: PyTorch 1.x traces do not record it (no ``Concrete Inputs``), so
:mod:`traceroof.costing_tbe` fills it in from the paired backward node's ``grad_output``
``[B, total_D]`` (and gives the backward node its forward's arguments).

The per-table dims are not recorded, so a looked-up row is ``D̄ = total_D / T`` wide: exact
when the tables share one dim (DLRM's common embedding dim), the mean otherwise.

The lookups and their backward are kind ``other``, not ``elementwise``: a gather-reduce and
a sort-and-scatter that no elementwise fusion (torch.compile, XLA) can fuse, so the
unfused-elementwise detector must not chain their kernels.
"""

from __future__ import annotations

import re

from .args import OpArgs, Tensor, total_bytes
from .registry import OpCost, register_cost

#: (weights, D_offsets, total_D, indices, offsets, indice_weights) argument positions
_SPLIT = (1, 6, 7, 11, 12, 14)
_DENSE = (0, 2, 3, 7, 8, 10)


#: the forward lookups these positions describe (the ``_pt2`` ops of 2024 have another schema)
FORWARD_RE = r"^fbgemm::(split_embedding_codegen_lookup_\w+?|dense_embedding_codegen_lookup)_function$"


def tbe_lookup_shape(a: OpArgs, split: bool, base: int = 0) -> dict | None:
    """The lookup's sizes from the arguments of a TBE forward (the ``split_`` schema, or the
    ``dense_`` one) starting at position ``base`` of ``a`` (0 for the forward itself; 1 in a
    paired backward node): ``T``, ``B``, ``L``, ``total_D`` (``None`` when not recorded),
    the tensors ``indices``, ``offsets``, ``weights`` (the table: ``dev_weights``, or
    ``uvm_weights`` when ``dev_weights`` is ``[0]``), ``indice_weights`` (``None`` when
    unweighted). ``None`` when the shapes do not fit the schema (``offsets`` not ``B·T+1``)."""
    pw, pd, ptd, pi, po, piw = (p + base for p in (_SPLIT if split else _DENSE))
    d_off, idx, off = a.tensor(pd), a.tensor(pi), a.tensor(po)
    w = a.tensor(pw)
    if split and w is not None and w.numel == 0:
        w = a.tensor(pw + 1)
    if d_off is None or idx is None or off is None or w is None or d_off.ndim != 1 or idx.ndim != 1:
        return None
    t = d_off.numel - 1
    bt = off.numel - 1
    if t < 1 or bt < 0 or bt % t:
        return None
    iw = a.tensor(piw)
    return {"T": t, "B": bt // t, "L": idx.numel, "total_D": a.integer(ptd), "indices": idx, "offsets": off,
            "weights": w, "indice_weights": iw if iw is not None and iw.numel == idx.numel else None}


@register_cost("fbgemm::split_embedding_codegen_lookup_*", "fbgemm::dense_embedding_codegen_lookup_function",
               kind="other")
def tbe_forward(a: OpArgs) -> OpCost | None:
    """Pooled TBE forward (sum pooling): each of the ``L`` looked-up rows (``D̄`` wide) is
    read once and added into its bag's output; weighted lookups multiply it by its
    per-sample weight first (FBGEMM ``embedding_forward_split_template.cu``: one row read,
    one FMA per element, one ``[B, total_D]`` output write).

    FLOPs: ``L·D̄`` (unweighted) or ``2·L·D̄`` (weighted). Bytes read: the rows
    ``L·D̄·itemsize(weights)``, ``indices``, ``offsets`` and ``indice_weights``; written: the
    output ``B·total_D`` at the weights' dtype (the ``output_dtype`` scalar is not recorded).
    ``None`` without ``total_D`` (unpaired in a PyTorch 1.x trace).
    """
    if not re.match(FORWARD_RE, a.op):
        return None
    s = tbe_lookup_shape(a, a.op.startswith("fbgemm::split_"))
    if s is None or not s["total_D"]:
        return None
    d_mean = s["total_D"] / s["T"]
    w = s["weights"]
    rows = Tensor((s["L"], 1), w.dtype)
    row_bytes = None if rows.nbytes is None else rows.nbytes * d_mean
    reads = total_bytes([s["indices"], s["offsets"], s["indice_weights"]])
    if row_bytes is None or reads is None:
        return None
    out = Tensor((s["B"], s["total_D"]), w.dtype).nbytes
    flops = (2.0 if s["indice_weights"] is not None else 1.0) * s["L"] * d_mean
    note = f"T={s['T']} tables, B={s['B']}, L={s['L']} rows of mean D={d_mean:g}"
    return OpCost(flops, reads + row_bytes, out, "other", w.dtype, note)


@register_cost("torch::autograd::CppNode<SplitLookupFunction_*", kind="other")
def tbe_backward(a: OpArgs) -> OpCost | None:
    """Backward of a pooled TBE lookup (``SplitLookupFunction_{optimizer}_Op``, run with the
    fused optimizer update), from its arguments as :mod:`traceroof.costing_tbe` pairs them:
    ``[grad_output [B, total_D], *the forward lookup's arguments]`` (the ``Dense`` node's
    forward has the ``dense_`` schema, the others the ``split_`` one).

    A lower bound, the traffic every run of FBGEMM's exact backward
    (``embedding_backward_split_template.cu``) does: read ``grad_output`` once, read
    ``indices``, ``offsets`` and ``indice_weights``, write the linearized ``int64`` indices
    (``linearize_index_kernel``); FLOPs ``L·D̄`` to accumulate each looked-up row's gradient
    (``2·L·D̄`` weighted). Not counted: the sort passes (implementation-defined) and the
    optimizer's row updates, whose number (the distinct rows looked up) the trace does not
    record. ``None`` unpaired (``grad_output`` alone).
    """
    g = a.tensor(0)
    if g is None or g.ndim != 2 or len(a) == 1:
        return None
    s = tbe_lookup_shape(a, "SplitLookupFunction_Dense_Op" not in a.op, base=1)
    if s is None or s["B"] != g.shape[0]:
        return None
    d_mean = g.shape[1] / s["T"]
    reads = total_bytes([g, s["indices"], s["offsets"], s["indice_weights"]])
    if reads is None:
        return None
    written = float(s["L"] * 8)
    flops = (2.0 if s["indice_weights"] is not None else 1.0) * s["L"] * d_mean
    note = f"lower bound: T={s['T']}, B={s['B']}, L={s['L']}, mean D={d_mean:g}; row updates not counted"
    return OpCost(flops, reads, written, "other", g.dtype, note)


@register_cost("fbgemm::bounds_check_indices", kind="elementwise")
def bounds_check_indices(a: OpArgs) -> OpCost | None:
    """``bounds_check_indices(rows_per_table [T], indices [L], offsets [B·T+1],
    bounds_check_mode, warning [1], weights [L]?)``: reads every argument tensor once,
    writes nothing in a valid batch (bad indices are fixed in place); 0 FLOPs (comparisons)."""
    ts = [t for _, t in a.tensors()]
    if len(ts) < 3:
        return None
    return OpCost(0.0, total_bytes(ts), 0.0, "elementwise", a.dtype(1))


@register_cost("fbgemm::asynchronous_complete_cumsum", "fb::asynchronous_complete_cumsum", kind="reduction")
def complete_cumsum(a: OpArgs) -> OpCost | None:
    """``asynchronous_complete_cumsum(t [N])`` → ``[N+1]`` (a leading 0, then the inclusive
    scan): ``N`` adds; reads ``N``, writes ``N+1`` elements of ``t``'s dtype."""
    t = a.tensor(0)
    if t is None or t.ndim != 1:
        return None
    return OpCost(float(t.numel), t.nbytes, Tensor((t.numel + 1,), t.dtype).nbytes, "reduction", t.dtype)


@register_cost("fbgemm::permute_pooled_embs_auto_grad", "fbgemm::permute_pooled_embs",
               "fbgemm::recat_embedding_grad_output_mixed_D_batch",
               "torch::autograd::CppNode<fbgemm_gpu::PermutePooledEmbsFunction*", kind="elementwise")
def permute_pooled(a: OpArgs) -> OpCost | None:
    """A permutation of pooled embeddings' columns: ``permute_pooled_embs(pooled_embs
    [B, total_D], offset_dim_list, permute_list, inv_offset_dim_list, inv_permute_list)``,
    ``recat_embedding_grad_output_mixed_D_batch(grad_output [B, total_D],
    dim_sum_per_rank, cumsum_dim_sum_per_rank)`` and the permutation's backward node
    (``grad [B, total_D]``): 0 FLOPs; reads every argument tensor, writes one tensor the
    size of the first."""
    ts = [t for _, t in a.tensors()]
    if not ts or ts[0].ndim != 2:
        return None
    return OpCost(0.0, total_bytes(ts), ts[0].nbytes, "elementwise", ts[0].dtype)


@register_cost("fbgemm::permute_2D_sparse_data", "fbgemm::permute_sparse_features", kind="elementwise")
def permute_sparse(a: OpArgs) -> OpCost | None:
    """``permute_2D_sparse_data(permute [T'], lengths [T, B], indices [L], weights [L]?, …)``
    (``permute_sparse_features`` the same): the rows ``permute`` names of ``lengths``, and
    each row's indices and weights, gathered into ``[T', B]`` lengths and their indices.
    0 FLOPs.

    A permutation (``T' == T``) reads every argument tensor and writes ``lengths``,
    ``indices`` (and ``weights``) once. A selection or repetition (``T' != T``) moves a
    number of indices the trace does not record: counted is a lower bound, reading
    ``permute`` and ``lengths`` and writing the ``[T', B]`` lengths (the note says so).
    """
    perm, lengths, idx = a.tensor(0), a.tensor(1), a.tensor(2)
    if perm is None or lengths is None or idx is None or lengths.ndim != 2 or perm.ndim != 1:
        return None
    if perm.numel != lengths.shape[0]:
        out = Tensor((perm.numel, lengths.shape[1]), lengths.dtype)
        note = f"lower bound: {perm.numel} of {lengths.shape[0]} rows selected, indices moved not recorded"
        return OpCost(0.0, total_bytes([perm, lengths]), out.nbytes, "elementwise", idx.dtype, note)
    w = a.tensor(3)
    w = w if w is not None and w.numel == idx.numel else None
    return OpCost(0.0, total_bytes([perm, lengths, idx, w]), total_bytes([lengths, idx, w]), "elementwise",
                  idx.dtype)
