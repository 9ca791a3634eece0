"""Data movement: copies and casts, fills and random fills, gathers (embedding,
index_select, gather), scatters, concatenation, ``arange``, and a few vLLM cache/quant ops.

These do (almost) no arithmetic: FLOPs are 0 for copies, casts, fills and gathers (a
real 0, not "unknown"), the adds of a scatter-add or an embedding backward, and the few
operations of a random fill or a quantization. Bytes are the compulsory traffic, each side
at its own dtype width (a cast from fp32 to bf16 reads 4 and writes 2 bytes per element);
a gather reads only the rows it gathers, not the whole table; a fill only writes.
"""

from __future__ import annotations

import math
import re

from .args import OpArgs, Tensor, total_bytes
from .registry import OpCost, register_cost


def _cost(flops: float, reads: list, writes: list, dtype: str | None, note: str = "",
          kind: str = "elementwise") -> OpCost:
    return OpCost(float(flops), total_bytes(reads), total_bytes(writes), kind, dtype, note)


def _cast_note(src: Tensor, dst: Tensor) -> str:
    return f"cast {src.dtype} -> {dst.dtype}" if src.dtype != dst.dtype else ""


@register_cost("aten::copy_", "aten::_copy_from", "aten::_copy_from_and_resize", kind="elementwise")
def copy_(a: OpArgs) -> OpCost | None:
    """``copy_(self [*], src [broadcastable to self], non_blocking)``; ``_copy_from(self, dst)``.

    0 FLOPs; reads ``src`` at its dtype, writes ``self`` at its dtype (a cast when they
    differ). Cross-device copies run on the copy engines; the bytes are the same.
    """
    if a.op == "aten::copy_":
        dst, src = a.tensor(0), a.tensor(1)
    else:
        src, dst = a.tensor(0), a.tensor(1)
    if dst is None or src is None:
        return None
    return _cost(0, [src], [dst], dst.dtype, _cast_note(src, dst))


def _to_dtype(a: OpArgs) -> str | None:
    """Target dtype of ``aten::to``: ``to.other`` (a tensor at 1), ``to.dtype(self, dtype, ...)``
    (5 args), ``to.device(self, device, dtype, ...)`` (6) or ``to.dtype_layout`` (8)."""
    other = a.tensor(1)
    if other is not None:
        return other.dtype
    pos = {5: 1, 6: 2, 8: 1}.get(len(a))
    return a.scalar_type(pos) if pos is not None else None


@register_cost("aten::_to_copy", "aten::to", "aten::clone", "aten::contiguous", kind="elementwise")
def to_copy(a: OpArgs) -> OpCost | None:
    """``_to_copy(self, *, dtype?, layout?, device?, pin_memory?, non_blocking, memory_format?)``,
    ``to(...)``, ``clone(self, memory_format?)``, ``contiguous(self, memory_format)``.

    A copy of ``self`` into a new tensor of the target dtype (``dtype`` is recorded as a
    ScalarType code, ``_to_copy`` position 1): 0 FLOPs, reads ``self``, writes the copy.
    """
    x = a.tensor(0)
    if x is None:
        return None
    dtype = x.dtype
    if a.op == "aten::_to_copy":
        dtype = a.scalar_type(1) or dtype
    elif a.op == "aten::to":
        dtype = _to_dtype(a) or dtype
    out = Tensor(x.shape, dtype)
    return _cost(0, [x], [out], dtype, _cast_note(x, out))


@register_cost("aten::fill_", "aten::zero_", kind="elementwise")
def fill_(a: OpArgs) -> OpCost | None:
    """``fill_(self, value)``, ``zero_(self)``: writes ``self`` only; 0 FLOPs, 0 bytes read
    (a 0-dim ``value`` tensor is read once)."""
    x = a.tensor(0)
    if x is None:
        return None
    value = a.tensor(1) if a.op == "aten::fill_" else None
    return _cost(0, [value], [x], x.dtype)


@register_cost("aten::normal_", "aten::uniform_", "aten::bernoulli_", "aten::exponential_",
               "aten::random_", "aten::log_normal_", "aten::geometric_", "aten::cauchy_",
               kind="elementwise")
def random_fill(a: OpArgs) -> OpCost | None:
    """``normal_(self, mean, std, generator)`` and the other in-place random fills.

    Write-only. FLOPs per element for the float transform of the random bits (the
    Philox integer work is not counted): normal 6 (Box-Muller: log, sqrt, cos, 3
    arithmetic), log_normal 7, uniform 2, exponential 2, cauchy 3, geometric 3,
    bernoulli 1, random 0. ``bernoulli_.Tensor`` also reads its probability tensor.
    """
    x = a.tensor(0)
    if x is None:
        return None
    per = {"normal_": 6, "log_normal_": 7, "uniform_": 2, "exponential_": 2, "cauchy_": 3,
           "geometric_": 3, "bernoulli_": 1, "random_": 0}[a.op.split("::")[-1]]
    p = a.tensor(1) if a.op.endswith("bernoulli_") else None
    return _cost(x.numel * per, [p], [x], x.dtype, "random fill: write-only")


@register_cost("aten::embedding", kind="elementwise")
def embedding(a: OpArgs) -> OpCost | None:
    """``embedding(weight [v, d], indices [*], padding_idx, scale_grad_by_freq, sparse)
    -> [*, d]``: 0 FLOPs; reads the indices and the ``numel(indices)`` rows gathered
    (not the whole table); writes the output."""
    w, idx = a.tensor(0), a.tensor(1)
    if w is None or idx is None or w.ndim != 2:
        return None
    out = Tensor((*idx.shape, w.shape[1]), w.dtype)
    return _cost(0, [idx, out], [out], w.dtype, "gather: reads the looked-up rows only")


@register_cost("aten::index_select", kind="elementwise")
def index_select(a: OpArgs) -> OpCost | None:
    """``index_select(self [*], dim, index [n]) -> self with dim replaced by n``: 0 FLOPs;
    reads the index and the selected slices, writes the output."""
    x, idx = a.tensor(0), a.tensor(2)
    if x is None or idx is None:
        return None
    dim = a.integer(1)
    note = "gather: reads the selected slices only"
    if dim is None:
        dim, note = 0, note + "; dim not recorded: 0 assumed"
    shape = list(x.shape) or [1]
    shape[dim % len(shape)] = idx.numel
    out = a.tensor(3) or Tensor(tuple(shape), x.dtype)
    return _cost(0, [idx, Tensor(out.shape, x.dtype)], [out], x.dtype, note)


@register_cost("aten::gather", kind="elementwise")
def gather(a: OpArgs) -> OpCost | None:
    """``gather(self, dim, index [*], sparse_grad) -> [index]``: 0 FLOPs; reads the index and
    ``numel(index)`` gathered values; writes the output (index-shaped, self's dtype)."""
    x, idx = a.tensor(0), a.tensor(2)
    if x is None or idx is None:
        return None
    out = a.tensor(4) or Tensor(idx.shape, x.dtype)
    return _cost(0, [idx, Tensor(idx.shape, x.dtype)], [out], x.dtype,
                 "gather: reads the gathered values only")


@register_cost("aten::scatter", "aten::scatter_", "aten::scatter_add", "aten::scatter_add_",
               "aten::scatter_reduce", "aten::scatter_reduce_", "aten::index_add",
               "aten::index_add_", "aten::index_copy", "aten::index_copy_", kind="elementwise")
def scatter(a: OpArgs) -> OpCost | None:
    """``scatter_add_(self, dim, index, src)``, ``index_add_(self, dim, index, source, alpha)``
    and friends. In place: reads index and src, read-modify-writes the touched elements of
    ``self``; out of place, also copies ``self``. FLOPs: one add per src element for the
    ``*_add``/``*_reduce`` ops, 0 for plain scatter/copy."""
    x, idx, src = a.tensor(0), a.tensor(2), a.tensor(3)
    if x is None or idx is None:
        return None
    touched = src if src is not None else idx
    touched = Tensor(touched.shape, x.dtype)
    accumulate = "add" in a.op or "reduce" in a.op
    flops = touched.numel if accumulate else 0
    inplace = a.op.endswith("_")
    reads = [idx, src, touched if accumulate else None] + ([] if inplace else [x])
    writes = [touched] if inplace else [x]
    return _cost(flops, reads, writes, x.dtype)


@register_cost("aten::embedding_dense_backward", "aten::embedding_backward", kind="elementwise")
def embedding_backward(a: OpArgs) -> OpCost | None:
    """``embedding_dense_backward(grad_output [*, d], indices [*], num_weights, padding_idx,
    scale_grad_by_freq) -> grad_weight [num_weights, d]``.

    Zero-fills grad_weight and scatter-adds each gradient row: ``numel(grad_output)`` adds.
    Reads grad_output and indices; writes all of grad_weight (when ``num_weights`` is not
    recorded, only the touched rows: a lower bound).
    """
    g, idx = a.tensor(0), a.tensor(1)
    if g is None or idx is None or not g.ndim:
        return None
    n = a.integer(2)
    note = ""
    if n is None:
        out = Tensor(g.shape, g.dtype)
        note = "num_weights not recorded: touched rows only"
    else:
        out = Tensor((n, g.shape[-1]), g.dtype)
    return _cost(g.numel, [g, idx], [out], g.dtype, note)


@register_cost("aten::cat", "aten::concat", "aten::concatenate", "aten::stack",
               "aten::hstack", "aten::vstack", kind="elementwise")
def cat(a: OpArgs) -> OpCost | None:
    """``cat(tensors: Tensor[], dim) -> [..., Σ sizes along dim, ...]``: 0 FLOPs; reads each
    input, writes the same number of elements. Kineto does not record ``Tensor[]`` element
    dtypes: bytes are unknown unless ``tensorlist_dtype`` is given."""
    ts = a.tensorlist(0)
    if not ts:
        return None
    out = a.tensor(2)
    n = sum(t.numel for t in ts)
    dtype = ts[0].dtype if out is None else out.dtype
    written = [out] if out is not None else [Tensor((n,), dtype)]
    note = "" if dtype is not None else "Tensor[] dtypes not recorded: bytes unknown"
    return _cost(0, list(ts), written, dtype, note)


#: ``aten::arange`` overloads by argument count: (number of leading numbers, position of the
#: ``dtype`` ScalarType or of the ``out`` tensor).
_ARANGE = {5: (1, 1), 6: (2, 2), 7: (3, 3), 2: (1, 1), 4: (3, 3)}


@register_cost("aten::arange", kind="elementwise")
def arange(a: OpArgs) -> OpCost | None:
    """``arange(end, *, dtype?, ...)``, ``arange.start(start, end, ...)``,
    ``arange.start_step(start, end, step, ...)`` or their ``out=`` forms: writes
    ``ceil((end − start) / step)`` elements, 1 FLOP each (``start + i·step``); reads nothing."""
    layout = _ARANGE.get(len(a))
    if layout is None:
        return None
    n_nums, pos = layout
    nums = [a.value(i) for i in range(n_nums)]
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in nums):
        return None
    start, end, step = (0, nums[0], 1) if n_nums == 1 else (nums[0], nums[1], nums[2] if n_nums == 3 else 1)
    if not step:
        return None
    n = max(0, math.ceil((end - start) / step))
    out = a.tensor(pos)
    default = "int64" if all(isinstance(v, int) for v in nums) else "fp32"
    dtype = out.dtype if out is not None else (a.scalar_type(pos) or default)
    return _cost(n, [], [Tensor((n,), dtype)], dtype)


@register_cost("_C::static_scaled_fp8_quant", "_C::dynamic_scaled_fp8_quant", kind="elementwise")
def vllm_fp8_quant(a: OpArgs) -> OpCost | None:
    """vLLM ``_C::static_scaled_fp8_quant(Tensor! result [*] fp8, Tensor input [*], Tensor scale)``.

    3 FLOPs per element (scale, clamp twice); reads input and scale, writes the fp8 result
    (the dynamic variant also reduces the absmax: one more read of the input).
    """
    out, x, scale = a.tensor(0), a.tensor(1), a.tensor(2)
    if out is None or x is None:
        return None
    reads = [x, scale] + ([x] if "dynamic" in a.op else [])
    return _cost(3 * x.numel, reads, [out], x.dtype)


@register_cost("_C::rotary_embedding", kind="elementwise")
def vllm_rotary_embedding(a: OpArgs) -> OpCost | None:
    """vLLM ``_C::rotary_embedding(positions [t], query [t, h_q·d], key? [t, h_k·d],
    head_size d, cos_sin_cache [max_pos, rot_dim], is_neox)``, in place on query and key.

    Each rotated pair costs 4 multiplies and 2 adds: 3 FLOPs per rotated element,
    ``3·t·(h_q + h_k)·rot_dim``. Reads positions, q, k and the ``t`` cache rows used; writes
    q and k.
    """
    pos, q, k, cache = a.tensor(0), a.tensor(1), a.tensor(2), a.tensor(4)
    d = a.integer(3)
    if pos is None or q is None or cache is None or not d or cache.ndim != 2:
        return None
    rot = cache.shape[1]
    heads = q.numel // (pos.numel * d) + (k.numel // (pos.numel * d) if k is not None else 0)
    flops = 3 * pos.numel * heads * rot
    rows = Tensor((pos.numel, rot), cache.dtype)
    return _cost(flops, [pos, q, k, rows], [q, k], q.dtype)


@register_cost("_C_cache_ops::reshape_and_cache_flash", "_C_cache_ops::reshape_and_cache",
               kind="elementwise")
def vllm_reshape_and_cache(a: OpArgs) -> OpCost | None:
    """vLLM ``reshape_and_cache_flash(key [t, h, d], value [t, h, d], key_cache, value_cache,
    slot_mapping [t], kv_cache_dtype, k_scale, v_scale)``: writes the ``t`` new tokens'
    keys and values into the paged cache at the cache dtype (fp8 caches quantize: 1 FLOP per
    element); reads key, value, slot_mapping."""
    k, v, kc, vc, slots = (a.tensor(i) for i in range(5))
    if k is None or v is None or kc is None or vc is None:
        return None
    writes = [Tensor(k.shape, kc.dtype), Tensor(v.shape, vc.dtype)]
    flops = (k.numel + v.numel) if kc.dtype != k.dtype else 0
    return _cost(flops, [k, v, slots], writes, k.dtype)


# --------------------------------------------------------------------------- copy engines

#: How a copy-engine transfer (a ``memcpy`` device op) is routed, from its Kineto/ROCm name
#: (``Memcpy HtoD (Pinned -> Device)``, ``Memcpy DtoH (Device -> Pageable)``, ``Memcpy DtoD
#: (Device -> Device)``, ``Memcpy PtoP (Device -> Device)``; CUPTI/XLA ``MemcpyH2D``, ``D2D``,
#: ``P2P``): (route, regex), first match wins.
#: ``host``: one side is host memory, bounded by the host link (pinned and pageable alike:
#: the name keeps them apart in the ranking, and ``roofline.copy_link_bytes_per_s`` says why
#: the staging of a pageable copy is gap, not roof);
#: ``peer``: another device's memory, bounded by the scale-up link; ``device``: both sides in
#: this device's memory, bounded by its HBM, which it reads and writes.
COPY_ROUTES: tuple[tuple[str, str], ...] = (
    ("peer", r"(?i)PtoP|P2P|peer"),
    ("host", r"(?i)HtoD|DtoH|HtoH|H2D|D2H|H2H|host|pageable|pinned"),
    ("device", r"(?i)DtoD|D2D|device\s*->\s*device"),
)

def copy_route(name: str | None) -> str | None:
    """``host``, ``peer`` or ``device`` for a copy named ``name`` (:data:`COPY_ROUTES`),
    ``None`` when the name does not say (a bare ``Memcpy``)."""
    for route, pattern in COPY_ROUTES:
        if name and re.search(pattern, name):
            return route
    return None


def copy_hbm_bytes(name: str | None, size_bytes: float) -> float:
    """Bytes a copy of ``size_bytes`` moves through this device's memory: a device-to-device
    copy reads the source and writes the destination in the same HBM, ``2 × size``; a host or
    peer copy writes (or reads) it once, ``size``; a copy whose route is unknown counts once.

    Source: the copy reads every source byte and writes every destination byte (the
    STREAM "copy" kernel convention, McCalpin: 2 words of traffic per element copied)."""
    return 2.0 * size_bytes if copy_route(name) == "device" else float(size_bytes)
