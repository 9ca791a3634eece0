"""The content of a gzip stream read piece by piece, member after member, up to a cut or a
corrupt block: the one inflater of the format sniff (:func:`.registry.head_of`), the streamed
Kineto reader (:class:`.kineto_blocks.Source`) and the in-memory readers of cut or corrupt
``.gz`` files (:func:`inflate_partial`: Kineto JSON, XPlane).

A gzip file is one or more members one after another (RFC 1952 section 2.2); bytes after the
last member that do not start another (``1f 8b``) are ignored. A stream that ends inside a
member, or a block that does not inflate, ends the content there: everything inflated before
is kept and :attr:`GzipInflater.problem` says why.

No traceroof imports: the registry imports it before any reader.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Callable

#: the first two bytes of a gzip member (RFC 1952 section 2.3.1)
GZIP_MAGIC = b"\x1f\x8b"
#: what gzip's own reader says of a stream that ends inside a member
CUT_PROBLEM = "Compressed file ended before the end-of-stream marker was reached"


class GzipInflater:
    """``read(n)``: the next up to ``n`` bytes of the content of the gzip stream whose bytes
    are ``first`` then what ``more(k)`` returns (up to ``k`` bytes each call, ``b""`` at the
    end); ``b""`` once the content ends (:attr:`done`).

    Args:
        more: reads the stream's next raw bytes.
        first: raw bytes already read (the stream's start).
        piece: raw bytes asked of ``more`` at a time (a corrupt block loses at most the
            output of one call's piece or ``n`` bytes, whichever is less).

    Attributes:
        done: the content has ended (at its end, a cut, a corrupt block or trailing bytes).
        problem: None, or why the content ended early: :data:`CUT_PROBLEM`, or
            ``corrupt gzip data (<zlib's words>)``.
    """

    def __init__(self, more: Callable[[int], bytes], first: bytes = b"", piece: int = 1 << 16) -> None:
        self._more = more
        self._pending = first
        self._piece = max(int(piece), 1)
        self._z = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self.done = False
        self.problem: str | None = None

    def read(self, n: int) -> bytes:
        """At least one and up to ``n`` bytes of content, or ``b""`` at its end."""
        while not self.done and n > 0:
            z = self._z
            if z.eof:
                # the member ended: what follows it is unused_data. CPython's zlib also leaves
                # the same bytes in unconsumed_tail when the member ended in a call after an
                # output-limited one; feeding that tail to the finished member returned b""
                # forever (a fuzz hang), so eof is tested first
                rest = bytes(z.unused_data) + bytes(self._pending)
                self._pending = b""
                while len(rest) < len(GZIP_MAGIC):
                    # the member may end one byte before a piece's end: the magic's second
                    # byte is then in the next piece (one byte alone is no verdict)
                    more = self._more(self._piece)
                    if not more:
                        break
                    rest += bytes(more)
                if rest[:2] != GZIP_MAGIC:
                    self.done = True
                    break
                self._z, self._pending = zlib.decompressobj(16 + zlib.MAX_WBITS), rest
                continue
            data = z.unconsumed_tail or self._pending or self._more(self._piece)
            self._pending = b""
            if not data:
                self.done, self.problem = True, CUT_PROBLEM
                break
            try:
                out = z.decompress(data, n)
            except zlib.error as exc:
                self.done, self.problem = True, f"corrupt gzip data ({exc})"
                break
            if out:
                return out
        return b""

    def read_full(self, n: int) -> bytes:
        """``n`` bytes of content, fewer only where it ends."""
        parts, got = [], 0
        while got < n:
            b = self.read(n - got)
            if not b:
                break
            parts.append(b)
            got += len(b)
        return b"".join(parts)


def byte_reader(data: bytes, pos: int = 0) -> Callable[[int], memoryview]:
    """``more(n)``: the next up to ``n`` bytes of ``data`` from ``pos`` on, as a memoryview of
    ``data`` (empty at its end), a piece at a time: what a reader of a stream (:class:`GzipInflater`,
    :func:`.text_head.skip_to_text`) is given for bytes already in memory, never a copy of
    the whole."""
    view = memoryview(data)

    def more(n: int) -> bytes:
        nonlocal pos
        piece = view[pos : pos + n]  # (a view: no copy of the piece either)
        pos += len(piece)
        return piece

    return more


def inflate_partial(data: bytes, piece: int = 1 << 12) -> tuple[bytes, str | None]:
    """All that inflates of the gzip stream ``data`` (member after member) before its end, a
    cut or a corrupt block, and :attr:`GzipInflater.problem` (None when it is whole). For a
    stream ``gzip.decompress`` refused: ``piece`` (4 KiB) raw bytes at a time, so a corrupt
    block loses little of what inflated before it."""
    z = GzipInflater(byte_reader(data), piece=piece)
    parts = []
    while True:
        b = z.read(1 << 20)
        if not b:
            return b"".join(parts), z.problem
        parts.append(b)


def gunzip(data: bytes) -> tuple[bytes, Exception | None]:
    """The content of the gzip stream ``data`` (:func:`gzip.decompress`) and None; of a stream
    that refuses (cut, corrupt, trailing bytes that are not a member), what
    :func:`inflate_partial` keeps of it (maybe ``b""``) and the exception the stdlib raised:
    the in-memory readers' one way to a damaged ``.gz`` (BC-35). Never raises."""
    try:
        return gzip.decompress(data), None
    except (OSError, EOFError, zlib.error) as exc:  # zlib.error: a damaged deflate block
        return inflate_partial(data)[0], exc


__all__ = ["GZIP_MAGIC", "CUT_PROBLEM", "GzipInflater", "byte_reader", "inflate_partial", "gunzip"]
