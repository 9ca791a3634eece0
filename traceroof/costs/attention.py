"""Scaled dot-product attention: SDPA and the flash / efficient / cuDNN / CPU kernels it
dispatches to, forward and backward, with causal masks, sliding windows, MQA/GQA and
variable-length batches.

Shape convention: ``q [b, h_q, s_q, d]``, ``k [b, h_kv, s_k, d]``, ``v [b, h_kv, s_k, d_v]``
(the ``_flash_attention_*`` / ``_efficient_attention_*`` ops take ``[b, s, h, d]``; their
variable-length form ``[total_tokens, h, d]`` with ``cum_seq`` offsets). MQA/GQA: ``h_kv``
divides ``h_q``; every query head does its own products, so FLOPs scale with ``h_q``.

FLOPs over the ``P`` unmasked (query, key) pairs of each batch element and head
(torch ``flop_counter.sdpa_flop_count`` / ``sdpa_backward_flop_count`` when ``P = s_q·s_k``)::

    forward  = 2·b·h_q·P·d   # [b, h, s_q, d] @ [b, h, d, s_k] -> scores
             + 2·b·h_q·P·d_v # [b, h, s_q, s_k] @ [b, h, s_k, d_v] -> out
    backward = 2·b·h_q·P·(3·d + 2·d_v)   # recompute scores, dV, dP, dQ, dK: 2.5x forward

Causal masks keep only the pairs a kernel computes (BC-25; the FlashAttention benchmarks
divide by 2, Dao-AILab/flash-attention#594). ``P`` is the exact count of unmasked pairs:
``s(s+1)/2`` for ``s_q = s_k = s``. When ``s_q != s_k`` alignment matters (xformers#1033):

* top-left (torch SDPA ``is_causal``, efficient ``custom_mask_type=1``): query ``i`` sees
  keys ``0..i``;
* bottom-right (FlashAttention ≥ 2.1 ``is_causal``, efficient ``custom_mask_type=2``):
  query ``i`` sees keys ``0..i + s_k - s_q``; a one-token decode step sees every key.

Sliding windows (flash ``window_size_left/right``, efficient ``window_size``) narrow each
row to the window. An arbitrary ``attn_mask``/``attn_bias`` is read but does not reduce FLOPs
(kernels compute every pair and add the bias). Dropout and the softmax exponentials are not
counted. Bytes: q, k, v (+ mask) read and the output (+ fp32 logsumexp ``[b, h, s_q]``)
written; backward reads grad_out, q, k, v, out, logsumexp and writes dq, dk, dv.
"""

from __future__ import annotations

from dataclasses import dataclass

from .args import OpArgs, Tensor, total_bytes
from .registry import OpCost, register_cost


def _sum_clamp(start: int, n: int, lo: int, hi: int) -> int:
    """``Σ_{i=0}^{n-1} clamp(start + i, lo, hi)`` in closed form (``lo <= hi``)."""
    if n <= 0:
        return 0
    end = start + n - 1
    below = max(0, min(end, lo - 1) - start + 1)  # terms < lo
    above = max(0, end - max(start, hi + 1) + 1)  # terms > hi
    a, b = max(start, lo), min(end, hi)  # terms inside [lo, hi]
    middle = (a + b) * (b - a + 1) // 2 if b >= a else 0
    return below * lo + above * hi + middle


def attention_pairs(
    s_q: int,
    s_k: int,
    *,
    causal: bool = False,
    bottom_right: bool = False,
    window_left: int | None = None,
    window_right: int | None = None,
) -> int:
    """Number of (query, key) pairs a kernel computes for one batch element and head.

    Query row ``i`` sees keys ``j`` with ``i + o - window_left <= j <= i + o + window_right``
    and ``0 <= j < s_k``, where ``o = s_k - s_q`` for bottom-right alignment and 0 for
    top-left. ``causal`` sets ``window_right = 0``; ``None`` or a negative window is
    unbounded (FlashAttention's ``-1``).

    >>> attention_pairs(4, 4, causal=True)
    10
    >>> attention_pairs(1, 4096, causal=True, bottom_right=True)
    4096
    """
    if s_q <= 0 or s_k <= 0:
        return 0
    wl = None if window_left is None or window_left < 0 else window_left
    wr = None if window_right is None or window_right < 0 else window_right
    if causal:
        wr = 0 if wr is None else min(wr, 0)
    if wl is None and wr is None:
        return s_q * s_k
    o = s_k - s_q if bottom_right else 0
    # row i covers [max(0, i + o - wl), min(s_k, i + o + wr + 1)); each end is clamped to [0, s_k]
    hi = s_q * s_k if wr is None else _sum_clamp(o + wr + 1, s_q, 0, s_k)
    lo = 0 if wl is None else _sum_clamp(o - wl, s_q, 0, s_k)
    return max(0, hi - lo)


def attention_flops(b: int, h_q: int, pairs: int, d_qk: int, d_v: int, backward: bool = False) -> int:
    """``2·b·h_q·P·(d_qk + d_v)`` forward, ``2·b·h_q·P·(3·d_qk + 2·d_v)`` backward."""
    per_pair = 3 * d_qk + 2 * d_v if backward else d_qk + d_v
    return 2 * b * h_q * pairs * per_pair


@dataclass(frozen=True)
class AttnLayout:
    """Schema positions of an attention op's arguments (``None``: not in this schema)."""

    q: int
    k: int
    v: int
    bshd: bool = False  # [b, s, h, d] (flash/efficient native ops) instead of [b, h, s, d]
    backward: bool = False
    bottom_right: bool = False  # causal alignment of this kernel's is_causal flag
    grad_out: int | None = None
    out: int | None = None
    lse: int | None = None  # backward: the logsumexp input
    mask: int | None = None  # attn_mask / attn_bias
    is_causal: int | None = None
    mask_type: int | None = None  # efficient attention custom_mask_type
    cum_q: int | None = None
    cum_k: int | None = None
    window_left: int | None = None
    window_right: int | None = None
    window: int | None = None  # efficient attention window_size (left, with causal)
    lse_out: bool | int = False  # forward writes a logsumexp: always, or a bool arg position
    enable_gqa: int | None = None


@dataclass(frozen=True)
class _Dims:
    b: int
    h_q: int
    h_kv: int
    d_qk: int
    d_v: int
    seqs: tuple[tuple[int, int], ...]  # (s_q, s_k) per batch element, or one shared entry
    varlen: bool


def _varlen_seqs(a: OpArgs, lay: AttnLayout, b: int, t_q: int, t_k: int) -> tuple[tuple[int, int], ...]:
    """The ``(s_q, s_k)`` of each of the ``b`` sequences of a varlen batch, where what the
    trace records decides them: one sequence (``t_q``, ``t_k``), or every sequence at the
    recorded maximum (``t_q = b·max_q`` and ``t_k = b·max_k``; every aten varlen schema has
    ``max_q, max_k`` right after ``cum_seq_k``). Otherwise ``()``: the lengths are the values
    of the ``cum_seq`` offsets, which Kineto does not record, and the FLOPs are unknown."""
    if b == 1:
        return ((t_q, t_k),)
    base = lay.cum_k if lay.cum_k is not None else lay.cum_q
    max_q, max_k = a.integer(base + 1), a.integer(base + 2)
    if max_q and max_k and t_q == b * max_q and t_k == b * max_k:
        return ((max_q, max_k),) * b
    return ()


def _dims(a: OpArgs, lay: AttnLayout, q: Tensor, k: Tensor, v: Tensor) -> _Dims | None:
    cum = a.tensor(lay.cum_q) if lay.cum_q is not None else None
    if cum is not None and q.ndim == 4 and q.shape[0] == 1 and k.shape[:1] == v.shape[:1] == (1,):
        # efficient-attention varlen packs the batch as [1, total_tokens, h, d]
        q, k, v = (Tensor(t.shape[1:], t.dtype) for t in (q, k, v))
    if q.ndim == 4 and k.ndim == 4 and v.ndim == 4:
        if lay.bshd:
            (b, s_q, h_q, d), (b2, s_k, h_kv, d2), (b3, s_v, h_v, d_v) = q.shape, k.shape, v.shape
        else:
            (b, h_q, s_q, d), (b2, h_kv, s_k, d2), (b3, h_v, s_v, d_v) = q.shape, k.shape, v.shape
        if not (b == b2 == b3 and d == d2 and s_k == s_v and h_kv == h_v):
            return None
        if h_kv <= 0 or h_q % h_kv:
            return None
        return _Dims(b, h_q, h_kv, d, d_v, ((s_q, s_k),), False)
    if q.ndim == 3 and k.ndim == 3 and v.ndim == 3 and lay.cum_q is not None:
        # variable length: [total_tokens, h, d] with cum_seq offsets [b + 1]
        cq, ck = a.tensor(lay.cum_q), a.tensor(lay.cum_k) if lay.cum_k is not None else None
        if cq is None or cq.ndim != 1 or cq.shape[0] < 2:
            return None
        b = cq.shape[0] - 1
        (t_q, h_q, d), (t_k, h_kv, d2), (_, _, d_v) = q.shape, k.shape, v.shape
        if d != d2 or h_kv <= 0 or h_q % h_kv or (ck is not None and ck.shape != cq.shape):
            return None
        return _Dims(1, h_q, h_kv, d, d_v, _varlen_seqs(a, lay, b, t_q, t_k), True)
    return None


def _mask(a: OpArgs, lay: AttnLayout) -> tuple[bool, bool, str]:
    """(causal, bottom_right, description) from the recorded flags."""
    if lay.mask_type is not None:
        mt = a.integer(lay.mask_type, 0)
        if mt == 1:
            return True, False, "causal (top-left)"
        if mt == 2:
            return True, True, "causal (bottom-right)"
        return False, False, ""
    if lay.is_causal is not None and a.flag(lay.is_causal, False):
        align = "bottom-right" if lay.bottom_right else "top-left"
        return True, lay.bottom_right, f"causal ({align})"
    return False, False, ""


def _attention(a: OpArgs, lay: AttnLayout) -> OpCost | None:
    q, k, v = a.tensor(lay.q), a.tensor(lay.k), a.tensor(lay.v)
    if q is None or k is None or v is None:
        return None
    dims = _dims(a, lay, q, k, v)
    if dims is None:
        return None
    causal, bottom_right, desc = _mask(a, lay)
    wl = a.integer(lay.window_left) if lay.window_left is not None else None
    wr = a.integer(lay.window_right) if lay.window_right is not None else None
    if lay.window is not None:
        w = a.integer(lay.window)
        if w is not None and w > 0:
            wl = w
    pairs = sum(
        attention_pairs(s_q, s_k, causal=causal, bottom_right=bottom_right,
                        window_left=wl, window_right=wr)
        for s_q, s_k in dims.seqs
    )
    full = sum(s_q * s_k for s_q, s_k in dims.seqs)
    flops = attention_flops(dims.b, dims.h_q, pairs, dims.d_qk, dims.d_v, lay.backward) if dims.seqs else None

    notes = []
    windowed = (wl is not None and wl >= 0) or (wr is not None and wr >= 0)
    if dims.seqs and (pairs != full or causal):
        parts = [desc] if desc else []
        if windowed:
            parts.append(f"window left={wl} right={wr}")
        notes.append(f"{', '.join(parts)}: {pairs} of {full} (q, k) pairs")
    if dims.h_kv != dims.h_q:
        notes.append(f"GQA: {dims.h_q} query heads over {dims.h_kv} kv heads")
    if dims.varlen and not dims.seqs:
        notes.append("varlen: per-sequence lengths not recorded, FLOPs unknown (costed by bytes)")
    elif dims.varlen and len(dims.seqs) > 1:
        notes.append("varlen: every sequence at the recorded maximum length")
    if lay.backward:
        notes.append("backward = 2.5x forward matmuls (scores recomputed)")

    mask = a.tensor(lay.mask) if lay.mask is not None else None
    if lay.backward:
        g = a.tensor(lay.grad_out) if lay.grad_out is not None else None
        out = a.tensor(lay.out) if lay.out is not None else None
        lse = a.tensor(lay.lse) if lay.lse is not None else None
        reads = total_bytes([g, q, k, v, out, lse, mask])
        writes = total_bytes([q, k, v])  # dq, dk, dv have the shapes and dtypes of q, k, v
    else:
        tokens = q.shape[:-1]  # [b, h, s_q] or [b, s_q, h] or [t, h]
        out = Tensor((*tokens, dims.d_v), q.dtype if q.dtype != "fp8" else v.dtype)
        lse_out = lay.lse_out if isinstance(lay.lse_out, bool) else bool(a.flag(lay.lse_out, False))
        lse = Tensor(tokens, "fp32") if lse_out else None
        reads = total_bytes([q, k, v, mask])
        writes = total_bytes([out, lse])
    return OpCost(None if flops is None else float(flops), reads, writes, "attention", q.dtype, "; ".join(notes))


def _register(lay: AttnLayout, *names: str) -> None:
    def formula(a: OpArgs) -> OpCost | None:
        return _attention(a, lay)

    layout = "[b, s, h, d]" if lay.bshd else "[b, h, s, d]"
    formula.__doc__ = (
        f"{'Backward' if lay.backward else 'Forward'} attention ({', '.join(names)}): "
        f"q/k/v {layout} at positions {lay.q}/{lay.k}/{lay.v}; causal alignment "
        f"{'bottom-right' if lay.bottom_right else 'top-left'}. FLOPs as in the module docstring."
    )
    formula.__qualname__ = formula.__name__ = names[0].split("::")[-1].lstrip("_")
    formula.layout = lay  # type: ignore[attr-defined]  # checked against torch's schemas in tests
    register_cost(*names, kind="attention")(formula)


# torch.nn.functional.scaled_dot_product_attention: is_causal is top-left (torch docs)
_register(AttnLayout(q=0, k=1, v=2, mask=3, is_causal=5, enable_gqa=7),
          "aten::scaled_dot_product_attention")
# FlashAttention kernels: is_causal is bottom-right (flash-attn >= 2.1)
_register(AttnLayout(q=0, k=1, v=2, is_causal=4, bottom_right=True, lse_out=True),
          "aten::_scaled_dot_product_flash_attention")
_register(AttnLayout(q=1, k=2, v=3, grad_out=0, out=4, lse=5, cum_q=6, cum_k=7, is_causal=11,
                     bottom_right=True, backward=True),
          "aten::_scaled_dot_product_flash_attention_backward")
_register(AttnLayout(q=0, k=1, v=2, bshd=True, cum_q=3, cum_k=4, is_causal=8, bottom_right=True,
                     window_left=11, window_right=12, lse_out=True),
          "aten::_flash_attention_forward")
_register(AttnLayout(q=1, k=2, v=3, bshd=True, grad_out=0, out=4, lse=5, cum_q=6, cum_k=7,
                     is_causal=11, bottom_right=True, window_left=15, window_right=16,
                     backward=True),
          "aten::_flash_attention_backward")
# memory-efficient (xformers/CUTLASS) kernels
_register(AttnLayout(q=0, k=1, v=2, mask=3, is_causal=6, lse_out=4),
          "aten::_scaled_dot_product_efficient_attention")
_register(AttnLayout(q=1, k=2, v=3, grad_out=0, mask=4, out=5, lse=6, is_causal=11, backward=True),
          "aten::_scaled_dot_product_efficient_attention_backward")
_register(AttnLayout(q=0, k=1, v=2, bshd=True, mask=3, cum_q=4, cum_k=5, mask_type=9, lse_out=10,
                     window=13),
          "aten::_efficient_attention_forward")
_register(AttnLayout(q=1, k=2, v=3, bshd=True, grad_out=0, mask=4, out=5, cum_q=6, cum_k=7,
                     lse=10, mask_type=14, window=18, backward=True),
          "aten::_efficient_attention_backward")
# cuDNN
_register(AttnLayout(q=0, k=1, v=2, mask=3, is_causal=6, lse_out=4),
          "aten::_scaled_dot_product_cudnn_attention")
_register(AttnLayout(q=1, k=2, v=3, grad_out=0, out=4, lse=5, mask=8, cum_q=9, cum_k=10,
                     is_causal=14, backward=True),
          "aten::_scaled_dot_product_cudnn_attention_backward", "aten::_cudnn_attention_backward")
_register(AttnLayout(q=0, k=1, v=2, mask=3, cum_q=4, cum_k=5, lse_out=8, is_causal=10),
          "aten::_cudnn_attention_forward")
# CPU flash kernel (BC-24: missing from torch's FLOP registry) and the XPU/PrivateUse1 hook
_register(AttnLayout(q=0, k=1, v=2, is_causal=4, mask=5, lse_out=True),
          "aten::_scaled_dot_product_flash_attention_for_cpu")
_register(AttnLayout(q=1, k=2, v=3, grad_out=0, out=4, lse=5, is_causal=7, mask=8, backward=True),
          "aten::_scaled_dot_product_flash_attention_for_cpu_backward")
_register(AttnLayout(q=0, k=1, v=2, mask=3, is_causal=5, lse_out=True),
          "aten::_scaled_dot_product_fused_attention_overrideable")
_register(AttnLayout(q=1, k=2, v=3, grad_out=0, mask=4, out=6, lse=7, cum_q=8, cum_k=9,
                     is_causal=13, backward=True),
          "aten::_scaled_dot_product_fused_attention_overrideable_backward")
