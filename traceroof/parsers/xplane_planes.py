"""XPlane reading, the base layer: a scanned plane with its stats resolved, per-event stat
columns, event times, and the container of what one file contributes (:class:`Parts`).

Used by :mod:`.xplane_ops`, :mod:`.xplane_host`, :mod:`.xplane_convert` and
:mod:`.xplane_assemble`; the format's entry point is :mod:`.xplane`.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from ..trace import DeviceInfo
from . import xplane_proto as xp
from .xplane_proto import (
    STAT_BYTES,
    STAT_DOUBLE,
    STAT_INT64,
    STAT_REF,
    STAT_STR,
    STAT_UINT64,
    text,
)

if TYPE_CHECKING:
    from .xplane_convert import LineFeed


#: the name given to an event whose event-metadata id the plane does not declare (a cut file
#: loses a plane's metadata, written after its lines): unknown, never the empty name
LOST_NAME = "<event metadata {}: not in the file>"
#: what every :data:`LOST_NAME` starts and ends with (around the id)
LOST_HEAD, LOST_TAIL = LOST_NAME.split("{}")


def is_lost_name(name: str) -> bool:
    """Whether ``name`` is a :data:`LOST_NAME` (an event whose metadata is not in the file)."""
    return name.startswith(LOST_HEAD) and name.endswith(LOST_TAIL)


def nulls(name: str, n: int, dtype) -> pl.Series:
    """An all-null series of length ``n`` (without building a Python list)."""
    return pl.Series(name, [], dtype=dtype).extend_constant(None, n)


def aligned(frame: pl.DataFrame, series: pl.Series) -> pl.Series:
    """``series`` (one value per row of ``frame``) split into chunks at the same row
    boundaries as ``frame``'s columns. A frame whose columns are chunked alike is operated on
    as is; one column chunked differently makes polars copy (rechunk) the whole frame on every
    later operation."""
    lengths = [len(c) for c in frame.get_column(frame.columns[0]).get_chunks()]
    if len(lengths) <= 1:
        return series.rechunk() if series.n_chunks() > 1 else series
    series = series.rechunk()
    pieces, at = [], 0
    for n in lengths:
        pieces.append(series.slice(at, n))
        at += n
    return pl.concat(pieces, rechunk=False)


def factorize(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(ids, return_inverse=True)`` for integer ids: a lookup table when the ids
    are small non-negative numbers (metadata ids, refs: no sort), else numpy's."""
    if len(ids):
        lo, hi = int(ids.min()), int(ids.max())
        if lo >= 0 and hi < max(1 << 16, 4 * len(ids)):
            seen = np.zeros(hi + 1, np.bool_)
            seen[ids] = True
            uniq = np.flatnonzero(seen)
            lut = np.zeros(hi + 1, np.int64)
            lut[uniq] = np.arange(len(uniq))
            return uniq.astype(ids.dtype, copy=False), lut[ids]
    uniq, inv = np.unique(ids, return_inverse=True)
    return uniq, inv.reshape(-1)


def masked(values: np.ndarray, present: np.ndarray, dtype) -> pl.Series:
    """A polars series of ``values`` with nulls where ``present`` is False."""
    if dtype == pl.UInt64:
        values = values.astype(np.int64).view(np.uint64)
    series = pl.Series(values, dtype=dtype)
    if present.all():
        return series
    return pl.select(pl.when(pl.Series(present)).then(series)).to_series()


def _stat_value(stat, names: dict[int, str]) -> Any:
    which = stat.WhichOneof("value")
    if which is None:
        return None
    if which == "ref_value":
        return names.get(stat.ref_value)
    if which == "str_value":
        return text(stat.str_value)
    return getattr(stat, which)


class Plane:
    """A scanned plane with its stat names resolved and per-metadata stats cached."""

    def __init__(self, scan: xp.PlaneScan) -> None:
        self.scan = scan
        meta = scan.meta
        self.name = text(meta.name)
        self.stat_names = {k: text(v.name) for k, v in meta.stat_metadata.items()}
        self.stat_ids: dict[str, list[int]] = {}
        for k, v in self.stat_names.items():
            self.stat_ids.setdefault(v, []).append(k)
        self.stats = {self.stat_names.get(s.metadata_id, str(s.metadata_id)):
                      _stat_value(s, self.stat_names) for s in meta.stats}
        self._md: dict[int, dict[str, Any]] = {}
        self.md_rows: dict[int, tuple] = {}  # _md_frame rows, by metadata id
        self._matches: dict[str, dict[int, bool]] = {}  # name_matches: pattern → metadata id → hit
        self.prefetch_ids: list[int] = []
        self.lost_ids: set[int] = set()  # event-metadata ids used by events, not declared
        self.feed: LineFeed | None = None

    def md(self, mid: int) -> dict[str, Any]:
        """Event metadata ``mid`` as a dict: ``_name``, ``_display_name`` and its stats; an id
        the plane does not declare gets ``_name`` :data:`LOST_NAME` (and joins ``lost_ids``)."""
        got = self._md.get(mid)
        if got is None:
            m = self.scan.meta.event_metadata.get(mid)
            if m is not None:
                got = {self.stat_names.get(s.metadata_id, str(s.metadata_id)):
                       _stat_value(s, self.stat_names) for s in m.stats}
                got["_name"] = text(m.name)
                got["_display_name"] = text(m.display_name)
            else:
                got = {"_name": LOST_NAME.format(mid)}
                self.lost_ids.add(mid)
            self._md[mid] = got
        return got

    def sids(self, name: str) -> list[int]:
        """The stat-metadata ids named ``name`` (a plane may declare a name more than once)."""
        return self.stat_ids.get(name, [])

    def numeric(self, cols: xp.EventColumns, name: str) -> tuple[np.ndarray, np.ndarray]:
        """Per-event numeric stat ``name``: (values, present mask). int64 values (uint64
        reinterpreted), or float64 when any entry is a double."""
        n = len(cols)
        ints = np.zeros(n, np.int64)
        floats = None
        present = np.zeros(n, np.bool_)
        for sid in self.sids(name):
            ev, kind, val, _rows = cols.stat(sid)
            m = (kind == STAT_INT64) | (kind == STAT_UINT64)
            if m.all():
                ints[ev] = val.view(np.int64)
                present[ev] = True
                continue
            ints[ev[m]] = val[m].view(np.int64)
            present[ev[m]] = True
            d = kind == STAT_DOUBLE
            if d.any():
                if floats is None:
                    floats = np.full(n, np.nan)
                floats[ev[d]] = val[d].view(np.float64)
                present[ev[d]] = True
        if floats is not None:
            return np.where(np.isnan(floats), ints.astype(np.float64), floats), present
        return ints, present

    def strings(self, cols: xp.EventColumns, name: str) -> pl.Series:
        """Per-event string stat ``name`` (refs resolved through stat metadata) as a polars
        String series, null where absent. Built dictionary-style: one Python string per
        distinct value, then a vectorised gather."""
        n = len(cols)
        codes = np.full(n, -1, np.int64)
        cats: list[str | None] = []
        for sid in self.sids(name):
            ev, kind, val, rows = cols.stat(sid)
            ref = kind == STAT_REF
            if ref.any():
                uniq, inv = factorize(val[ref])
                codes[ev[ref]] = len(cats) + inv
                cats.extend(self.stat_names.get(int(u)) for u in uniq)
            for j in np.flatnonzero(~ref).tolist():
                k = int(kind[j])
                if k in (STAT_STR, STAT_BYTES):
                    v = cols.stat_objects.get(int(rows[j]))
                    v = text(v) if isinstance(v, (str, bytes)) else None
                elif k in (STAT_INT64, STAT_UINT64):
                    v = str(int(val[j]))
                else:
                    v = None
                codes[ev[j]] = len(cats)
                cats.append(v)
        if not cats:
            return nulls(name, n, pl.String)
        cats.append(None)
        codes[codes < 0] = len(cats) - 1
        return pl.Series(name, cats, dtype=pl.String).gather(codes)

    def name_matches(self, cols: xp.EventColumns, pattern: re.Pattern[str]) -> np.ndarray:
        """Per event, whether its event-metadata name (as :meth:`names`) matches ``pattern``
        (``pattern.search``): the pattern runs once per distinct metadata id of the plane
        (cached), never once per event or per line as a polars string query would."""
        cache = self._matches.setdefault(pattern.pattern, {})
        uniq, inv = factorize(cols.metadata_id)
        hit = np.zeros(len(uniq), np.bool_)
        for j, m in enumerate(uniq.tolist()):
            got = cache.get(m)
            if got is None:
                got = cache[m] = pattern.search(self.md(m).get("_name", "")) is not None
            hit[j] = got
        return hit[inv]

    def names(self, cols: xp.EventColumns) -> pl.Series:
        """Per-event event-metadata name (``XEventMetadata.name``) as a String series."""
        uniq, inv = factorize(cols.metadata_id)
        cats = [self.md(int(m)).get("_name", "") for m in uniq]
        return pl.Series("name", cats, dtype=pl.String).gather(inv)


def times(line: xp.LineScan, cols: xp.EventColumns, plane: Plane | None = None,
           device_clock: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(start_ns, dur_ns) on the file's clock, in integer arithmetic on the raw fields:
    ``start = timestamp_ns + offset_ps // 1000`` and ``dur = (offset_ps + duration_ps) // 1000
    - offset_ps // 1000`` -- the ns interval is the floor-image of the ps interval, so events
    that touch in ps still touch in ns and durations are not biased low. With
    ``device_clock`` the ``device_offset_ps``/``device_duration_ps`` stats replace the event's
    span where both are present (TPU ``XLA Ops``: the device's own timing)."""
    off = cols.offset_ps
    end = off + cols.duration_ps
    if device_clock and plane is not None:
        d_off, has_off = plane.numeric(cols, "device_offset_ps")
        d_dur, has_dur = plane.numeric(cols, "device_duration_ps")
        both = has_off & has_dur
        if both.any():
            off = np.where(both, d_off.astype(np.int64), off)
            end = np.where(both, d_off.astype(np.int64) + d_dur.astype(np.int64), end)
    first = off // 1000
    return line.timestamp_ns + first, end // 1000 - first


class Parts:
    """What one file contributes: op/host frames on the file's clock, and metadata."""

    def __init__(self) -> None:
        self.ops: list[pl.DataFrame] = []
        self.host: list[pl.DataFrame] = []
        self.devices: list[DeviceInfo] = []
        self.versions: dict[str, str] = {}
        self.warnings: list[str] = []
        self.stats: Counter = Counter()
        self.profile_start_ns: int | None = None
        self.hostname = ""
