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


def _phase(s: str | None) -> int:
    return _NONE if s is None else _PHASES.get(s, _OTHER)


def _distinct(codes: np.ndarray) -> list[int]:
    """The distinct values of an integer array, ascending: ``np.unique(codes).tolist()``, a
    few times faster on the few new codes of a piece (a set, no sort of the array)."""
    return sorted(set(codes.tolist()))


class _Lut:
    """``f(string)`` per dictionary code, computed once per code the first time it is seen
    (int8 values >= 0; -1 marks a code not yet computed)."""

    def __init__(self, f: Any) -> None:
        self.f = f
        self.values = np.full(0, -1, np.int8)

    def get(self, codes: np.ndarray, S: list[Any]) -> np.ndarray:
        if len(self.values) < len(S):  # the dictionary grew: room for twice as many codes
            grown = np.full(max(2 * len(self.values), len(S), 1024), -1, np.int8)
            grown[: len(self.values)] = self.values
            self.values = grown
        out = self.values[codes]
        if (out < 0).any():
            for k in _distinct(codes[out < 0]):
                self.values[k] = self.f(S[k])
            out = self.values[codes]
        return out


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
        """The per-code lookups of one dictionary: phase class; device kind and host
        category (1 + their code in ``cat_names``, 0 for none); 1 python_function / 2
        profiler range; 1 memory sample / 2 recording-window edge."""
        self.ph_class = _Lut(_phase)
        self._cat_dense = np.full(0, -1, np.int32)  # category code -> its dense number
        self._dense_cats: list[Any] = []  # dense number -> the category
        self.dev_kind = _Lut(lambda s: 1 + self._cat(V.DEVICE_CATEGORIES.get(s)))
        self.host_kind = _Lut(lambda s: 1 + self._cat(V.HOST_CATEGORIES.get(s)))
        self.cat_flag = _Lut(lambda s: (s == "python_function") + 2 * (s in V.PROFILER_RANGE_CATEGORIES))
        self.name_flag = _Lut(_instant_kind)

    def _cat(self, name: str | None) -> int:
        if name is None:
            return -1
        code = self._cat_code.get(name)
        if code is None:
            code = self._cat_code[name] = len(self.cat_names)
            self.cat_names.append(name)
        return code

    def add(self, c: Columns) -> None:
        """Sort one piece (see ``kineto._Builder._sort``)."""
        if self.scanner is not None and c.scanner is not self.scanner:
            self.flush()  # another file's dictionary (an in-memory fallback): its own frames
            self._luts()
        self.scanner = c.scanner
        S = c.scanner.dictionary()
        b = self.b
        phc = self.ph_class.get(c.ph, S)
        is_x, is_m = phc == _X, phc == _M
        empty = (phc == _NONE) | (~is_m & (c.ts_state == 0))
        kept = ~empty
        b.empty_events += int(empty.sum())
        self._count_categories(c.cat[kept], S)
        dev_kind = self.dev_kind.get(c.cat, S)
        host_kind = self.host_kind.get(c.cat, S)
        xk = is_x & kept
        dev_rows = xk & (dev_kind > 0)
        host_rows = xk & (dev_kind == 0) & (host_kind > 0)
        cat_flag = self.cat_flag.get(c.cat, S)
        b.python_events += int((xk & (cat_flag == 1)).sum())
        b.profiler_ranges += int((xk & (cat_flag == 2)).sum())
        nk = kept & ~is_x
        b.flows += int((nk & (phc == _FLOW)).sum())
        b.counter_samples += int((nk & (phc == _COUNTER)).sum())
        other = nk & (phc == _OTHER)
        if other.any():
            for k in _distinct(c.ph[other]):
                ph = str(S[k])
                b.unknown_phases[ph] = b.unknown_phases.get(ph, 0) + int((other & (c.ph == k)).sum())
        if (nk & is_m).any():
            self._meta_names(c, np.flatnonzero(nk & is_m), S)
        instant = nk & (phc == _INSTANT)
        window = np.zeros(c.n, bool)
        if instant.any():
            name_flag = self.name_flag.get(c.name, S)
            b.mem_samples += int((instant & (name_flag == 1)).sum())
            window = instant & (name_flag == 2)
        d = np.flatnonzero(dev_rows)
        self.dev.add(c, d, dev_kind[d] - 1)
        h = np.flatnonzero(host_rows | window)
        self.host.add(c, h, np.where(window[h], self._cat(WINDOW_CAT), host_kind[h] - 1))

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
