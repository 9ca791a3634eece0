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
from typing import TYPE_CHECKING, Any

from . import kineto_vocab as V

if TYPE_CHECKING:  # numpy is imported by the first scan: a file msgspec decodes never loads it
    import numpy as np

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

    ``Scanner(helper=True)``: scans pieces of the same file for another scanner (the owner,
    in another thread). Its results are in its own codes until the owner takes them,
    in file order, with :meth:`absorb`: the helper's strings enter the owner's dictionary
    (in C), the results are recoded to the owner's codes, the helper's dictionary is
    emptied. The owner's dictionary is then the one it would have built scanning those
    pieces itself, code for code (a string enters it at the first piece that holds it, in
    the order the scanner met it there).

    Raises:
        RuntimeError: the extension is not built (check :data:`AVAILABLE` first).
    """

    def __init__(self, helper: bool = False) -> None:
        if _kineto_scan is None:
            raise RuntimeError("the native Kineto scanner is not built (python setup.py build_ext --inplace)")
        self.helper = helper
        self._c = _kineto_scan.Scanner(SPELLINGS, not helper)
        #: the dictionary: code → string (``strings[0]`` is None), grown by :meth:`columns`
        #: (:meth:`adopt`, :meth:`absorb`); a helper's stays empty
        self.strings: list[str | None] = [None]

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
        """Forget a :meth:`scan_raw` result of this scanner that will not be converted: the
        strings it added leave the C dictionary (with those of any later scan of this
        scanner, which must be discarded too)."""
        if d is not None:
            self._c.truncate(d["n_before"])

    def adopt(self, d: dict[str, Any]) -> None:
        """Add the strings a result of this (owner) scanner brought to :attr:`strings` now
        (before an :meth:`absorb` that follows it in the file); :meth:`columns` later."""
        self.strings.extend(d["strings"])
        d["strings"] = []

    def absorb(self, helper: Scanner, results: list[dict[str, Any]]) -> None:
        """Take ``helper``'s ``results`` (all its scans since the last absorb, in file
        order, each following everything this scanner's dictionary holds): their strings
        join this dictionary, their codes become this scanner's (in C, in place); then
        :meth:`columns` converts them. The helper's dictionary starts afresh.

        Raises:
            MemoryError: an allocation failed.
        """
        table, added = self._c.absorb(helper._c)
        self.strings.extend(added)
        for d in results:
            self._c.remap(d, table)
            d["strings"] = []

    def columns(self, d: dict[str, Any] | None) -> Columns | None:
        """:meth:`scan_raw`'s result as :class:`Columns`, the strings it added appended to
        :attr:`strings`: call it on the results in the order of the pieces in the file (a
        helper's after :meth:`absorb`, on the owner).

        Raises:
            RuntimeError: called on a helper (its codes are not a dictionary's).
        """
        if d is None:
            return None
        if self.helper:
            raise RuntimeError("a helper scanner's results are converted by its owner (absorb)")
        self.strings.extend(d["strings"])
        import numpy as np

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
            dur_state=np.frombuffer(d["dur_state"], u8), slots=slots, scanner=self,
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
