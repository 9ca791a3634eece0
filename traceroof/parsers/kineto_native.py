"""The native Kineto column scanner: a C extension that reads an event array straight into columns.

Entry point (also the fuzz harness's): :func:`scan` ``(data: bytes) -> Columns | None``:
``data`` is one JSON array of Kineto events (``[{...}, ...]``, the pieces the decoders of
:mod:`.kineto_decode` / :mod:`.kineto_stream` cut); the result is its columns, or None
("not handled") for anything the scanner does not fully validate and understand (invalid
JSON or UTF-8, an escaped key, nesting deeper than 64, a float or a bool where an id is
expected, a quoted ``ts``, an integer beyond 18 digits, an exponent beyond ±300, a time
beyond int64 ns). A None piece is decoded by msgspec exactly as without this module
(:func:`decode_piece`), so the tables are the same either way; it never raises on any
input (bounded loops and indexes, in ``_kineto_scan.c``).

Strings once: every string (``ph``, ``cat``, ``name``, ``pid``/``tid`` text, string args,
the raw JSON text of ``Input Dims`` / ``Input type`` / ``Concrete Inputs``) is interned in
C, one dictionary per :class:`Scanner` (one per file), and the columns hold int32 codes
(0 = null). The frames are built by :mod:`.kineto_native_frames` with one
``dictionary.gather(codes)`` per String column: polars' String is a view type, so a row
costs 16 bytes, not a copy of its kernel name.

Which path runs: :data:`AVAILABLE` (the extension was built) and :func:`active` (available
and not switched off with ``TRACEROOF_DECODER=python``); ``--debug`` logs it per file.
``TRACEROOF_REQUIRE_NATIVE=1`` (set by CI) makes the equality tests fail when the extension
was not built.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import kineto_vocab as V

logger = logging.getLogger(__name__)

try:  # built by setup.py (optional: an install without a C compiler runs the msgspec path)
    from . import _kineto_scan
except ImportError:  # pragma: no cover - depends on the build
    _kineto_scan = None  # type: ignore[assignment]

#: the C extension was built and imports
AVAILABLE: bool = _kineto_scan is not None

#: ``TRACEROOF_DECODER=python`` forces the msgspec path (tests, comparisons)
ENV_DECODER = "TRACEROOF_DECODER"

_KIND = {V.NUMBER: 0, V.JSON_TEXT: 1, V.ANY: 2}

#: ``(raw key, slot, kind)`` per spelling of :data:`.kineto_vocab.ARGS`, slot = the index
#: of its :class:`~.kineto_vocab.Arg` (spellings in precedence order)
SPELLINGS: tuple[tuple[bytes, int, int], ...] = tuple(
    (sp.raw.encode(), slot, _KIND[arg.value])
    for slot, arg in enumerate(V.ARGS)
    for sp in arg.spellings
)

#: ``Arg.key`` → its slot in :attr:`Columns.slots`
SLOT: dict[str, int] = {arg.key: i for i, arg in enumerate(V.ARGS)}


def active() -> bool:
    """True when the native scanner is used: built, and ``TRACEROOF_DECODER`` is not
    ``python``."""
    return AVAILABLE and os.environ.get(ENV_DECODER, "").strip().lower() != "python"


@dataclass
class Columns:
    """One scanned piece: ``n`` events, one entry per event in each array.

    ``ph``, ``cat``, ``name``, ``pid``, ``tid``: int32 codes into ``scanner``'s dictionary
    (0 = absent or null; an integer pid/tid is the code of its decimal text).
    ``ts_ns``, ``dur_ns``: int64 ns (exact, :func:`~.kineto_times.raw_us_to_ns`'s rules);
    ``ts_state``, ``dur_state``: uint8, 0 absent, 1 ``null``, 2 a number.
    ``slots[i]`` for :data:`.kineto_vocab.ARGS` ``[i]`` (first spelling present):
    NUMBER: ``(kinds uint8 (0 none, 2 int, 3 string), values int64 (the int, or the
    string's code))``; JSON_TEXT and ANY: ``(None, int32 codes)`` (JSON_TEXT: the raw text
    without pretty-printing, 0 for null/absent; ANY: a string value, 0 otherwise).
    """

    n: int
    ph: np.ndarray
    cat: np.ndarray
    name: np.ndarray
    pid: np.ndarray
    tid: np.ndarray
    ts_ns: np.ndarray
    dur_ns: np.ndarray
    ts_state: np.ndarray
    dur_state: np.ndarray
    slots: list[tuple[np.ndarray | None, np.ndarray]]
    scanner: Scanner

    def __len__(self) -> int:
        return self.n


class Scanner:
    """One file's scanner: one string dictionary shared by all the pieces it scans.

    ``Scanner(into=owner)``: a helper that scans other pieces of the same file (in another
    thread): its :class:`Columns` use ``owner``'s dictionary (``scanner`` is ``owner``),
    each of its codes remapped to the owner's code of the same string. Once it has a
    helper, the owner remaps its own codes too (its C dictionary no longer holds every
    string). Converted in file order (:meth:`columns`), the merged dictionary is the one a
    single scanner would have built, code for code: a string enters it at the first piece
    that holds it, in the order the scanner met it there.

    Raises:
        RuntimeError: the extension is not built (check :data:`AVAILABLE` first).
    """

    def __init__(self, into: Scanner | None = None) -> None:
        if _kineto_scan is None:
            raise RuntimeError("the native Kineto scanner is not built (python setup.py build_ext --inplace)")
        self._c = _kineto_scan.Scanner(SPELLINGS)
        #: whose dictionary the columns use
        self.owner: Scanner = into if into is not None else self
        #: the dictionary: code → string (``strings[0]`` is None), grown by :meth:`columns`
        #: (a helper's is its owner's)
        self.strings: list[str | None] = self.owner.strings if into is not None else [None]
        #: string → code in :attr:`strings`, kept once a helper exists (None before)
        self._index: dict[str | None, int] | None = None
        #: this scanner's C code → the owner's code (None: the same, no helper)
        self._remap: np.ndarray | None = None
        self._remap_n = 0
        if into is not None:
            into._start_remap()
            self._start_remap()

    def _start_remap(self) -> None:
        if self._remap is not None:
            return
        own = self.owner
        if own._index is None:
            own._index = {t: i for i, t in enumerate(own.strings) if i}
        n = len(self.strings) if own is self else 1  # the owner's C codes so far are its own
        self._remap = np.arange(max(n, 1024), dtype=np.int32)
        self._remap_n = n

    def _map_new(self, new: list[str]) -> None:
        """Give the strings a scan added (its C codes ``_remap_n ...``) their owner codes."""
        own = self.owner
        index, strings = own._index, own.strings
        assert index is not None and self._remap is not None
        if self._remap_n + len(new) > len(self._remap):
            grown = np.zeros(2 * (self._remap_n + len(new)), np.int32)
            grown[: self._remap_n] = self._remap[: self._remap_n]
            self._remap = grown
        out = self._remap
        for j, t in enumerate(new, self._remap_n):
            code = index.get(t)
            if code is None:
                code = index[t] = len(strings)
                strings.append(t)
            out[j] = code
        self._remap_n += len(new)

    def scan(self, data: Any, bare: bool = False) -> Columns | None:
        """The columns of ``data`` (a JSON event array; bytes or any buffer; ``bare``: its
        items without the brackets, at least one), None when not handled (the dictionary is
        then as before the call). Same as ``columns(scan_raw(data, bare))``."""
        return self.columns(self.scan_raw(data, bare))

    def scan_raw(self, data: Any, bare: bool = False) -> dict[str, Any] | None:
        """The C scan alone (the GIL released while it runs), safe in a worker thread: the
        extension's dict (None when not handled), for :meth:`columns` or :meth:`discard`.
        ``data`` must not be changed until it returns.

        Raises:
            RuntimeError: this Scanner is already scanning (one scan at a time).
            MemoryError: an allocation failed.
        """
        return self._c.scan(data, bare)

    def discard(self, d: dict[str, Any] | None) -> None:
        """Forget a :meth:`scan_raw` result that will not be converted: the strings it added
        leave this scanner's C dictionary (with those of any later scan of this scanner,
        which must be discarded too)."""
        if d is not None:
            self._c.truncate(d["n_strings"] - len(d["strings"]))

    def columns(self, d: dict[str, Any] | None) -> Columns | None:
        """:meth:`scan_raw`'s result as :class:`Columns`, the strings it added appended to
        :attr:`strings`: call it on the results in the order of the pieces in the file."""
        if d is None:
            return None
        if self._remap is None:
            self.strings.extend(d["strings"])
        else:
            self._map_new(d["strings"])
            self._c.remap(d, self._remap[: self._remap_n])  # in C, in place: d is this call's
        i32, i64, u8 = np.int32, np.int64, np.uint8
        slots = [
            (None if k is None else np.frombuffer(k, u8), np.frombuffer(v, i32 if k is None else i64))
            for k, v in d["slots"]
        ]
        return Columns(
            n=d["n"], ph=np.frombuffer(d["ph"], i32), cat=np.frombuffer(d["cat"], i32),
            name=np.frombuffer(d["name"], i32), pid=np.frombuffer(d["pid"], i32),
            tid=np.frombuffer(d["tid"], i32), ts_ns=np.frombuffer(d["ts"], i64),
            dur_ns=np.frombuffer(d["dur"], i64), ts_state=np.frombuffer(d["ts_state"], u8),
            dur_state=np.frombuffer(d["dur_state"], u8), slots=slots, scanner=self.owner,
        )

    def dictionary(self) -> list[str | None]:
        """Every string interned by the scans converted so far (:meth:`columns`), by code
        (``[0]`` is None)."""
        return self.strings


def scan(data: Any) -> Columns | None:
    """Scan one JSON event array with a fresh :class:`Scanner` (see the module docstring).

    Args:
        data: bytes (or any contiguous buffer) holding ``[ {event}, ... ]``.

    Returns:
        The :class:`Columns` (their dictionary: ``result.scanner.dictionary()``), or None
        when the scanner does not handle this input (the msgspec path then decodes it).

    Raises:
        RuntimeError: the extension is not built (:data:`AVAILABLE` is False).
        MemoryError: an allocation failed.
    """
    return Scanner().scan(data)


def native_scanner(native: bool, path: str) -> Scanner | None:
    """A fresh :class:`Scanner` when ``native`` is asked for and :func:`active`, else None;
    logs (debug) which decoder reads ``path``."""
    use = native and active()
    if native:
        why = "" if use else (f" ({ENV_DECODER}=python)" if AVAILABLE else " (the extension is not built)")
        logger.debug("%s: Kineto decoder: %s%s", path, "native scanner" if use else "msgspec", why)
    return Scanner() if use else None


def decode_piece(scanner: Scanner | None, piece: Any) -> Any:
    """``piece`` (a JSON event array) as native :class:`Columns` when ``scanner`` handles it,
    else as msgspec's ``list[Event]`` (raising ``msgspec.DecodeError`` as that decoder does).
    """
    if scanner is not None:
        cols = scanner.scan(piece)
        if cols is not None:
            return cols
    from .kineto_events import EVENTS_DECODER

    return EVENTS_DECODER.decode(piece)
