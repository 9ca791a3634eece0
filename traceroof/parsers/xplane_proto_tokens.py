"""The vectorised protobuf tokeniser: a chunk of all-varint fields → (tag, value) pairs, with
numpy, reusing per-thread scratch arrays (:func:`tokenise`)."""

from __future__ import annotations

import threading

import numpy as np

_LOCAL = threading.local()

#: Bytes decoded per vectorised chunk: small enough to keep temporaries in cache-friendly,
#: reused allocations (peak memory stays a small multiple of the chunk, not of the file).
CHUNK_BYTES = 1 << 18


def pos_buffer(n: int) -> np.ndarray:
    """A per-thread int32 byte -> pair-index map of at least ``n`` entries, all -1 (callers
    reset what they set): allocated once, not per chunk."""
    buf = getattr(_LOCAL, "pos", None)
    if buf is None or len(buf) < n:
        buf = np.full(max(n, CHUNK_BYTES + 1), -1, np.int32)
        _LOCAL.pos = buf
    return buf


_VARINT_MASK = np.array([(1 << (8 * (k + 1))) - 1 for k in range(8)], np.uint64)
_U = np.uint64
_SWAR = ((_U(0x7F007F007F007F00), _U(0x007F007F007F007F), _U(1)),
         (_U(0x3FFF00003FFF0000), _U(0x00003FFF00003FFF), _U(2)),
         (_U(0x0FFFFFFF00000000), _U(0x000000000FFFFFFF), _U(4)))


def _multi_byte(a: np.ndarray, v: np.ndarray, val_start: np.ndarray, extra: np.ndarray,
                multi: np.ndarray) -> None:
    """Decode the varints of ``v[multi]`` that are longer than one byte, in place. Up to 8
    bytes: an unaligned 8-byte little-endian read and a branch-free compaction of the 7-bit
    groups (SWAR); longer ones (and those too near the end of ``a``), a byte at a time."""
    starts = val_start[multi]
    ext = extra[multi]
    n_ok = int(np.searchsorted(starts, len(a) - 8, "right"))  # 8 bytes readable from there
    long = np.flatnonzero(ext[:n_ok] >= 8)
    slow = multi[n_ok:]
    if len(long):
        slow = np.concatenate([multi[long], slow])
        keep = np.ones(n_ok, np.bool_)
        keep[long] = False
        multi, starts, ext = multi[:n_ok][keep], starts[:n_ok][keep], ext[:n_ok][keep]
    else:
        multi, starts, ext = multi[:n_ok], starts[:n_ok], ext[:n_ok]
    if len(slow):
        v[slow] &= _U(0x7F)
        k = 1
        while len(slow):
            v[slow] |= (a[val_start[slow] + k] & 0x7F).astype(np.uint64) << _U(7 * k)
            k += 1
            slow = slow[extra[slow] >= k]
    if not len(multi):
        return
    win = np.ndarray(shape=(len(a) - 7,), dtype="<u8", buffer=a, strides=(1,))
    x = win[starts]  # (np.take would first copy all of ``win``)
    x &= _VARINT_MASK[ext]
    x &= _U(0x7F7F7F7F7F7F7F7F)
    t = np.empty_like(x)
    for hi, lo, shift in _SWAR:  # 8 x 7 bits -> 4 x 14 -> 2 x 28 -> 56 bits, in place
        np.bitwise_and(x, hi, out=t)
        t >>= shift
        x &= lo
        x |= t
    v[multi] = x


class _Workspace:
    """Per-thread scratch arrays for :func:`tokenise`, reused from chunk to chunk: fresh
    megabyte-sized temporaries per chunk cost more in page faults (the allocator hands the
    memory back to the OS between chunks) than the arithmetic on them."""

    def __init__(self, n: int) -> None:
        self.n = n
        m = n // 2 + 1
        self.mask = np.empty(n, np.bool_)
        self.tag_pos = np.empty(m, np.int64)
        self.val_start = np.empty(m, np.int64)
        self.extra = np.empty(m, np.int64)
        self.v = np.empty(m, np.uint64)
        self.u8 = np.empty(m, np.uint8)
        self.tag8 = np.empty(m, np.uint8)
        self.cmp = np.empty(m, np.bool_)


def _workspace(n: int) -> _Workspace:
    w = getattr(_LOCAL, "work", None)
    if w is None or w.n < n:
        w = _LOCAL.work = _Workspace(max(n, CHUNK_BYTES))
    return w


def tokenise(a: np.ndarray):
    """Split a chunk into (tag, varint value) pairs: ``tag8`` (uint8; 255 for a tag longer
    than one byte, which no field we handle has), ``val`` (uint64), ``tag_pos`` and
    ``val_end`` (byte offsets of the tag and of the value's last byte), or None when the chunk
    holds no complete pair. The arrays are views of this thread's scratch space: valid until
    the next call (callers copy what they keep)."""
    n = len(a)
    w = _workspace(n)
    ends = np.flatnonzero(np.less(a, 0x80, out=w.mask[:n]))
    npairs = len(ends) // 2
    if npairs == 0:
        return None
    tag_end = ends[0 : 2 * npairs : 2]
    val_end = ends[1 : 2 * npairs : 2]
    tag_pos = w.tag_pos[:npairs]
    tag_pos[0] = 0
    np.add(val_end[:-1], 1, out=tag_pos[1:])
    tag8 = np.take(a, tag_pos, out=w.tag8[:npairs])
    cmp = np.not_equal(tag_pos, tag_end, out=w.cmp[:npairs])
    if cmp.any():
        tag8[np.flatnonzero(cmp)] = 255
    val_start = np.add(tag_end, 1, out=w.val_start[:npairs])
    v = w.v[:npairs]
    v[...] = np.take(a, val_start, out=w.u8[:npairs])
    extra = np.subtract(val_end, val_start, out=w.extra[:npairs])  # extra bytes (0: one)
    multi = np.flatnonzero(extra)
    if len(multi):
        _multi_byte(a, v, val_start, extra, multi)
    return tag8, v, tag_pos, val_end
