"""Native-scanned pieces (:class:`~.kineto_native.Columns`) → the device and host frames.

The same rows, columns, dtypes and counts as the msgspec path (``kineto._Builder._sort``
then :mod:`.kineto_columns`), computed on the integer codes: each event's phase and
category are looked up once per distinct code, the rows are picked with numpy masks, and
the frames are built once per run of native pieces (:meth:`NativeRows.flush`) with one
``dictionary.gather(codes)`` per String column, so a row of a String column is a 16-byte
view into the file's dictionary, never a copy of its text; the host frame's recorded-shape
text (``input_dims``, ``input_types``, ``concrete_inputs``) is gathered from the dictionary
as Categorical, 4 bytes a row (HOST_SCHEMA's dtype for them).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from ..schema import CAT
from ..step_markers import WINDOW_CAT, WINDOW_END, WINDOW_START
from . import kineto_vocab as V
from .kineto_columns import as_int
from .kineto_native import SLOT, Columns, Scanner

# phase classes (``kineto._Builder._sort``'s branches)
_NONE, _X, _M, _FLOW, _INSTANT, _COUNTER, _OTHER = range(7)
_PHASES = {"X": _X, "M": _M, "s": _FLOW, "f": _FLOW, "t": _FLOW, "i": _INSTANT, "I": _INSTANT, "C": _COUNTER}


#: an event's class number: phase class x _PH_STEP + 16 when it has no ``ts`` + the category
#: bits (``NativeRows._cat_bits``: 1 device, 2 host, 4 python_function, 8 profiler range)
_PH_STEP = 32
_N_CLASSES = 7 * _PH_STEP
#: a lookup's value for a code not computed yet: a class number made with it is negative
_UNSEEN = -1024
#: ``ts_state`` (0 absent, 1 null, 2 a number) -> its part of the class number
_TS_ABSENT = np.array([16] + [0] * 255, np.int16)


def _class_tables() -> tuple[np.ndarray, ...]:
    """Per class number: the counts it adds to (rows of ``_COUNTS``, int64 ``[8, classes]``)
    and the rows it is (bool ``[classes]``), ``kineto._Builder._sort``'s branches."""
    cls = np.arange(_N_CLASSES)
    ph, no_ts, bits = cls // _PH_STEP, (cls >> 4) & 1 == 1, cls & 15
    kept = (ph != _NONE) & ((ph == _M) | ~no_ts)
    xk = kept & (ph == _X)
    nk = kept & (ph != _X)
    flag = bits >> 2
    counts = np.array([
        ~kept, xk & (flag == 1), xk & (flag == 2), nk & (ph == _FLOW), nk & (ph == _COUNTER),
        nk & (ph == _OTHER), nk & (ph == _M), nk & (ph == _INSTANT),
    ], np.int64)
    dev = xk & (bits & 1 == 1)
    host = xk & (bits & 2 == 2)
    return counts, kept, nk & (ph == _OTHER), nk & (ph == _INSTANT), dev, host


_COUNTS, _KEPT, _OTHER_ROWS, _INSTANT_ROWS, _DEV_ROWS, _HOST_ROWS = _class_tables()


def _phase(s: str | None) -> int:
    return _NONE if s is None else _PHASES.get(s, _OTHER)


def _distinct(codes: np.ndarray) -> list[int]:
    """The distinct values of an integer array, ascending: ``np.unique(codes).tolist()``, a
    few times faster on the few new codes of a piece (a set, no sort of the array)."""
    return sorted(set(codes.tolist()))


class _Lut:
    """``f(string)`` per dictionary code, computed once per code the first time it is seen
    (values >= 0 of ``dtype``; ``unseen`` marks a code not yet computed)."""

    def __init__(self, f: Any, dtype: Any = np.int8, unseen: int = -1) -> None:
        self.f = f
        self.unseen = unseen
        self.values = np.full(0, unseen, dtype)

    def get(self, codes: np.ndarray, S: list[Any]) -> np.ndarray:
        self.grow(len(S))
        out = self.values[codes]
        if (out < 0).any():
            self.fill(codes[out < 0], S)
            out = self.values[codes]
        return out

    def grow(self, n: int) -> None:
        """Room for ``n`` codes (the dictionary grew: room for twice as many)."""
        if len(self.values) < n:
            grown = np.full(max(2 * len(self.values), n, 1024), self.unseen, self.values.dtype)
            grown[: len(self.values)] = self.values
            self.values = grown

    def fill(self, codes: np.ndarray, S: list[Any]) -> None:
        """Compute the codes not computed yet among ``codes``."""
        for k in _distinct(codes[self.values[codes] < 0]):
            self.values[k] = self.f(S[k])


class _Frame:
    """The rows of one frame (device or host) gathered from native pieces, as numpy parts."""

    def __init__(self, tid: str, columns: tuple[V.ArgColumn, ...]) -> None:
        self.tid = tid
        self.columns = columns
        self.parts: list[dict[str, np.ndarray]] = []  # one per piece (small arrays)
        self.merged: list[dict[str, np.ndarray]] = []  # every _MERGE_PARTS of them, merged

    def add(self, c: Columns, rows: np.ndarray, cats: np.ndarray) -> None:
        if not len(rows):
            return
        part = {
            "name": c.name[rows], "cat": cats, "pid": c.pid[rows], "tid": c.tid[rows],
            "ts": c.ts_ns[rows], "ts_state": c.ts_state[rows], "dur": c.dur_ns[rows],
            "dur_state": c.dur_state[rows],
        }
        for col in self.columns:
            kinds, vals = c.slots[SLOT[col.arg]]
            part[col.column] = vals[rows]
            if kinds is not None:
                part[col.column + "/kind"] = kinds[rows]
        self.parts.append(part)
        if len(self.parts) >= _MERGE_PARTS:
            self.merged.append(_merge(self.parts))
            self.parts = []

    def flush(self, strings: pl.Series, cat_names: pl.Series, dictionary: list[Any],
              coded: Any = None) -> pl.DataFrame | None:
        """The frame of the rows added so far (None when there are none); the parts are
        freed column by column as the Series are made, so they are never held twice.
        ``coded(codes)``: a TEXT column as Categorical (:func:`_coded`), 4 bytes a row."""
        if not (self.parts or self.merged):
            return None
        parts, self.parts, self.merged = self.merged + self.parts, [], []

        def take(key: str) -> np.ndarray:
            arr = np.concatenate([p.pop(key) for p in parts])
            _trim_heap()  # the parts just freed: back to the system before polars allocates
            return arr

        out = {
            "name": strings.gather(take("name")),
            "cat": cat_names.gather(take("cat").astype(np.int32)),
            "pid": strings.gather(take("pid")),
            self.tid: strings.gather(take("tid")),
        }
        ts = take("ts")
        out["ts_ns"] = _nullable(ts, take("ts_state") == 2, pl.Int64)
        dur = take("dur")
        out["dur_ns"] = _nullable(dur, take("dur_state") == 2, pl.Int64)
        del ts, dur
        for col in self.columns:
            vals = take(col.column)
            if col.dtype == V.TEXT:
                out[col.column] = strings.gather(vals) if coded is None else coded(vals)
            elif col.dtype == V.STRING:
                out[col.column] = _string_arg(vals, take(col.column + "/kind"), strings)
            else:
                out[col.column] = _int_arg(vals, take(col.column + "/kind"), dictionary, col.dtype)
        return pl.DataFrame({k: s.alias(k) for k, s in out.items()})


#: a piece's arrays are small (heap memory, which polars' allocator cannot reuse once freed):
#: every this many pieces they are merged into arrays big enough to be their own mappings,
#: which go back to the system when the frame is made
_MERGE_PARTS = 64


def _merge(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The parts as one, column by column (each small array freed as it is merged)."""
    return {k: np.concatenate([p.pop(k) for p in parts]) for k in list(parts[0])}


def _coded(strings: pl.Series, codes: np.ndarray) -> pl.Series:
    """``strings.gather(codes)`` as Categorical (:data:`traceroof.schema.CAT`): only the
    distinct strings the codes use are made categories (the whole dictionary would be a second
    copy of every text of the file in polars' category map: +45 MB on the 1 GB trace), then
    each row is a 4-byte code gathered through a per-code lookup (no sort, one pass)."""
    used = np.zeros(len(strings), bool)
    used[codes] = True
    at = np.cumsum(used, dtype=np.int64) - 1  # code -> its position among the used ones
    return strings.gather(np.flatnonzero(used)).cast(CAT).gather(at[codes])


def _nullable(vals: np.ndarray, valid: np.ndarray, dtype: Any) -> pl.Series:
    """``vals`` as a Series, null where not ``valid``."""
    s = pl.Series(vals, dtype=pl.Int64)
    if not valid.all():  # one when/then: ~5x faster than a scatter of the null positions
        s = pl.select(pl.when(pl.Series(valid)).then(s)).to_series()
    return s if dtype == pl.Int64 else s.cast(dtype)


def _int_arg(vals: np.ndarray, kinds: np.ndarray, dictionary: list[Any], dtype: str) -> pl.Series:
    """An INT64/INT32 argument column: ints as they are, a string through
    :func:`~.kineto_columns.as_int` (as :func:`~.kineto_columns.ints` does), none → null."""
    vals = vals.copy()
    valid = kinds == 2
    strs = kinds == 3
    if strs.any():
        conv = {k: as_int(dictionary[k]) for k in _distinct(vals[strs])}
        for k, v in conv.items():
            at = strs & (vals == k)
            if v is not None:
                vals[at] = v
                valid |= at
    s = _nullable(vals, valid, pl.Int64)
    # beyond Int32: unknown (null), as kineto_columns.ints
    return s.cast(pl.Int32, strict=False) if dtype == V.INT32 else s


def _string_arg(vals: np.ndarray, kinds: np.ndarray, strings: pl.Series) -> pl.Series:
    """A STRING argument column: an int as its decimal text, a string as it is, none → null
    (:func:`~.kineto_columns.strs`)."""
    as_text = _nullable(vals, kinds == 2, pl.Int64).cast(pl.String)
    if not (kinds == 3).any():
        return as_text
    from_dict = strings.gather(np.where(kinds == 3, vals, 0))
    return from_dict.zip_with(pl.Series(kinds == 3), as_text)


class NativeRows:
    """Sorts native pieces into device and host rows for one ``kineto._Builder``, updating
    its counters exactly as ``_Builder._sort`` does; :meth:`flush` makes the frames."""

    def __init__(self, builder: Any) -> None:
        self.b = builder
        self.scanner: Scanner | None = None
        self.dev = _Frame("tid", V.DEVICE_ARG_COLUMNS)
        self.host = _Frame("thread", V.HOST_ARG_COLUMNS)
        self.cat_names: list[str] = []
        self._cat_code: dict[str, int] = {}
        self._luts()

    def _luts(self) -> None:
        """The per-code lookups of one dictionary (:data:`_UNSEEN` until computed): the
        phase's class (times :data:`_PH_STEP`, a part of the event's class number); the
        category's bits (:func:`_cat_bits`) and its code in ``cat_names`` (the device
        kind's, else the host category's, else -1); 1 memory sample / 2 recording-window
        edge (by name)."""
        self.ph_class = _Lut(lambda s: _PH_STEP * _phase(s), np.int16, _UNSEEN)
        self.cat_bits = _Lut(None, np.int16, _UNSEEN)  # filled by _classes
        self.cat_code = np.full(0, -1, np.int32)
        self._cat_dense = np.full(0, -1, np.int32)  # category code -> its dense number
        self._dense_cats: list[Any] = []  # dense number -> the category
        self.name_flag = _Lut(_instant_kind)

    def _cat_bits(self, s: Any) -> tuple[int, int]:
        """A category's bits (1 a device kind, 2 a host category and not a device kind, 4
        ``python_function``, 8 a profiler-range category: ``kineto._Builder._sort``'s tests)
        and its code in ``cat_names`` (-1 for neither)."""
        dev = V.DEVICE_CATEGORIES.get(s)
        host = None if dev is not None else V.HOST_CATEGORIES.get(s)
        flag = (s == "python_function") + 2 * (s in V.PROFILER_RANGE_CATEGORIES)
        bits = (dev is not None) + 2 * (host is not None) + 4 * flag
        return bits, self._cat(dev if dev is not None else host)

    def _cat(self, name: str | None) -> int:
        if name is None:
            return -1
        code = self._cat_code.get(name)
        if code is None:
            code = self._cat_code[name] = len(self.cat_names)
            self.cat_names.append(name)
        return code

    def _classes(self, c: Columns, S: list[Any]) -> np.ndarray:
        """Each event's class number (:data:`_CLASSES`): phase class x 32 + 16 when it has
        no ``ts`` + its category's bits; int16 ``[events]``."""
        ph, cat = self.ph_class, self.cat_bits
        ph.grow(len(S))
        cat.grow(len(S))
        cls = ph.values[c.ph] + cat.values[c.cat] + _TS_ABSENT[c.ts_state]
        if cls.min() < 0:  # codes not seen before (each lookup's unseen is < -2 x 223)
            ph.fill(c.ph, S)
            if len(self.cat_code) < len(cat.values):
                grown = np.full(len(cat.values), -1, np.int32)
                grown[: len(self.cat_code)] = self.cat_code
                self.cat_code = grown
            for k in _distinct(c.cat[cat.values[c.cat] < 0]):
                cat.values[k], self.cat_code[k] = self._cat_bits(S[k])
            cls = ph.values[c.ph] + cat.values[c.cat] + _TS_ABSENT[c.ts_state]
        return cls

    def add(self, c: Columns) -> None:
        """Sort one piece (see ``kineto._Builder._sort``): each event's class number
        (:meth:`_classes`) gives its counts (one ``bincount`` times :data:`_COUNTS`) and
        rows (per-class masks), the same as the branches of ``_sort``."""
        if self.scanner is not None and c.scanner is not self.scanner:
            self.flush()  # another file's dictionary (an in-memory fallback): its own frames
            self._luts()
        self.scanner = c.scanner
        S = c.scanner.dictionary()
        b = self.b
        cls = self._classes(c, S)
        n = _COUNTS @ np.bincount(cls, minlength=_N_CLASSES)
        empty, python, ranges, flows, counters, other, meta, instants = n.tolist()
        b.empty_events += empty
        b.python_events += python
        b.profiler_ranges += ranges
        b.flows += flows
        b.counter_samples += counters
        self._count_categories(c.cat[_KEPT[cls]], S)
        if other:
            at = _OTHER_ROWS[cls]
            for k in _distinct(c.ph[at]):
                ph = str(S[k])
                b.unknown_phases[ph] = b.unknown_phases.get(ph, 0) + int((at & (c.ph == k)).sum())
        if meta:
            self._meta_names(c, np.flatnonzero((cls >> 5) == _M), S)
        d = np.flatnonzero(_DEV_ROWS[cls])
        self.dev.add(c, d, self.cat_code[c.cat[d]])
        host = _HOST_ROWS[cls]
        if instants:
            instant = _INSTANT_ROWS[cls]
            name_flag = self.name_flag.get(c.name, S)
            b.mem_samples += int((instant & (name_flag == 1)).sum())
            window = instant & (name_flag == 2)
            h = np.flatnonzero(host | window)
            cats = np.where(window[h], self._cat(WINDOW_CAT), self.cat_code[c.cat[h]])
        else:
            h = np.flatnonzero(host)
            cats = self.cat_code[c.cat[h]]
        self.host.add(c, h, cats)

    def _count_categories(self, cats: np.ndarray, S: list[Any]) -> None:
        """``counts[cat] += 1`` per kept event, categories in first-seen order: each category
        code gets a dense number the first time it is counted (in the order of its first
        event), and a piece is counted with one ``bincount`` of those numbers (a sort of the
        piece, ``np.unique``, cost ~3x more)."""
        if not len(cats):
            return
        if len(self._cat_dense) < len(S):
            grown = np.full(max(2 * len(self._cat_dense), len(S), 1024), -1, np.int32)
            grown[: len(self._cat_dense)] = self._cat_dense
            self._cat_dense = grown
        dense = self._cat_dense[cats]
        if (dense < 0).any():  # categories not counted before: numbered in first-seen order
            for code in dict.fromkeys(cats[dense < 0].tolist()):
                self._cat_dense[code] = len(self._dense_cats)
                self._dense_cats.append(S[code])
            dense = self._cat_dense[cats]
        n = np.bincount(dense, minlength=len(self._dense_cats))
        counts = self.b.counts
        for j in np.flatnonzero(n):
            cat = self._dense_cats[j]
            counts[cat] = counts.get(cat, 0) + int(n[j])

    def _meta_names(self, c: Columns, rows: np.ndarray, S: list[Any]) -> None:
        """The process/thread names of ``M`` events (the last one of a key wins)."""
        names = c.slots[SLOT["info::name"]][1]
        for i in rows:
            label = names[i]
            kind = S[int(c.name[i])]
            if not label or kind not in ("process_name", "thread_name"):
                continue
            pid = str(S[int(c.pid[i])])
            key = pid if kind == "process_name" else f"{pid}/{S[int(c.tid[i])]}"
            self.b.meta_names[(kind, key)] = S[int(label)]

    def flush(self) -> None:
        """Append the frames of the pieces added so far to the builder's frame lists."""
        if self.scanner is None:
            return
        dictionary = self.scanner.dictionary()
        strings = pl.Series(dictionary, dtype=pl.String)
        cat_names = pl.Series(self.cat_names, dtype=pl.String)
        dev = self.dev.flush(strings, cat_names, dictionary)
        host = self.host.flush(strings, cat_names, dictionary, lambda codes: _coded(strings, codes))
        if dev is not None:
            self.b.dev_frames.append(dev)
        if host is not None:
            self.b.host_frames.append(host)
        _trim_heap()


def _trim_heap() -> None:
    """Give the C heap's free pages back to the system (glibc ``malloc_trim``; nothing
    elsewhere). The numpy parts just freed live in that heap, which polars' own allocator
    cannot reuse: without this they would stay resident through the linking (~0.15 GB on a
    1 GB trace)."""
    global _MALLOC_TRIM
    if _MALLOC_TRIM is None:
        _MALLOC_TRIM = False
        try:
            import ctypes

            _MALLOC_TRIM = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):  # not glibc
            pass
    if _MALLOC_TRIM:
        _MALLOC_TRIM(0)


_MALLOC_TRIM: Any = None


def _instant_kind(name: Any) -> int:
    """1 for a memory sample, 2 for a recording-window edge, 0 otherwise."""
    if name == "[memory]":
        return 1
    if isinstance(name, str) and (name.startswith(WINDOW_START) or name == WINDOW_END):
        return 2
    return 0
