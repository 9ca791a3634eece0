"""Decoded Kineto events → the column frames of one chunk (device ops, host events).

The argument columns come from the declarative vocabulary: :data:`.kineto_vocab.DEVICE_ARG_COLUMNS`
and :data:`.kineto_vocab.HOST_ARG_COLUMNS` say which column each argument fills and how it is
converted; for an argument with several spellings (:attr:`.kineto_vocab.Arg.spellings`) the
first one present on an event is read. Columns are built field by field with C-level getters
and converted in bulk, falling back to the per-value conversions only when a column holds
something unusual (a float id, a number written as a string).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import polars as pl

from . import kineto_vocab as V
from .kineto_events import Args, Event

_NUMBER_IN = re.compile(r"(\d+)")

#: stands in for a missing ``args`` object: every field at its default (None / empty Raw)
NO_ARGS = Args()


def as_int(v: Any) -> int | None:
    """An id, size or header number as an int: ints as they are, floats truncated, numeric
    strings parsed, else the first run of digits (``"stream 7"`` → 7); None for None, bools
    and values without digits."""
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return int(v)
    try:
        return int(str(v).strip())
    except ValueError:
        m = _NUMBER_IN.search(str(v))
        return int(m.group(1)) if m else None


def _raw_text(r: Any) -> str | None:
    if r is None:
        return None
    b = bytes(r)
    if not b or b == b"null":
        return None
    return b.decode("utf-8", "replace")


# bulk conversions; each equals the per-value conversion it replaces
def ints(vals: list[Any], dtype: Any = pl.Int64) -> pl.Series:
    """``[as_int(v) for v in vals]`` as a Series; in bulk when all are ints or None. A value
    beyond ``dtype``'s range (a 2**40 group size for an Int32 column, an id beyond int64) is
    unknown: null (it crashed the read before)."""
    try:
        return pl.Series(vals, dtype=dtype)  # strict: floats, strings and overflows raise
    except Exception:  # noqa: BLE001 - any oddity: the exact per-value path decides
        bits = 32 if dtype == pl.Int32 else 64
        lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
        # a value past the column's integer range (2**64, 1e30) is no id or size: unknown
        return pl.Series([x if x is None or lo <= x <= hi else None for x in map(as_int, vals)], dtype=dtype)


def strs(vals: list[Any]) -> pl.Series:
    """``[None if v is None else str(v) for v in vals]`` as a String Series."""
    try:
        return pl.Series(vals, dtype=pl.Int64).cast(pl.String)  # all ints (or None)
    except Exception:  # noqa: BLE001
        pass
    try:
        return pl.Series(vals, dtype=pl.String)  # all strings (or None)
    except Exception:  # noqa: BLE001
        return pl.Series([None if v is None else str(v) for v in vals], dtype=pl.String)


def texts(raws: list[Any]) -> pl.Series:
    """``[_raw_text(r) for r in raws]`` (raw JSON text; empty or ``null`` → None), with
    pretty-printing (newlines and their indentation) dropped."""
    joined = b"\x00".join(raws)  # JSON text never holds a raw NUL
    try:
        text = joined.decode("utf-8")
    except UnicodeDecodeError:
        text = joined.decode("utf-8", "replace")
    s = pl.Series([text], dtype=pl.String).str.split("\x00").explode()
    if len(s) != len(raws):
        s = pl.Series([_raw_text(r) for r in raws], dtype=pl.String)
    # drop pretty-printing (a newline and its indentation; never inside a JSON string):
    # torch's exporter indents every list element, which tripled the memory of these columns
    s = s.str.replace_all(r"[\r\n]\s*", "")
    return s.set(s.is_in(["", "null"]), None)


_CONVERT: dict[str, Callable[[list[Any]], pl.Series]] = {
    V.INT64: ints,
    V.INT32: lambda vals: ints(vals, pl.Int32),
    V.STRING: strs,
}


def _getter(arg: V.Arg) -> Callable[[list[Any]], list[Any]]:
    """``getter(args) -> values``: the value of ``arg`` on each event's args, the first
    spelling present (a number: not None; raw JSON text: not empty).

    Compiled from the table as one list comprehension (``[a.f if a.f is not None else
    a.f__1 for a in args]``): the hand-written form, about 4x faster than ``operator``
    getters and a fold over the spellings, which cost ~10 % of the column building.
    """
    fields = arg.fields()
    if not all(f.isidentifier() for f in fields):
        raise ValueError(f"{arg.key}: struct fields must be identifiers: {fields}")
    present = "len(a.{})" if arg.value == V.JSON_TEXT else "a.{} is not None"
    expr = f"a.{fields[-1]}"
    for f in reversed(fields[:-1]):
        expr = f"a.{f} if {present.format(f)} else {expr}"
    return eval(f"lambda args: [{expr} for a in args]", {})  # noqa: S307 - our own table


#: ``Arg.key`` → its compiled getter (see :func:`_getter`)
_GETTERS: dict[str, Callable[[list[Any]], list[Any]]] = {a.key: _getter(a) for a in V.ARGS}


def _arg_columns(events: list[Event], columns: tuple[V.ArgColumn, ...]) -> dict[str, pl.Series]:
    """The argument columns of ``events``, in ``columns`` order. The raw-text columns are
    converted in one call (one query instead of one per column, each with its fixed cost)."""
    no_args = NO_ARGS
    args = [e.args or no_args for e in events]
    n = len(args)
    text_cols = [c for c in columns if c.dtype == V.TEXT]
    out: dict[str, pl.Series] = {}
    if text_cols:
        raws: list[Any] = []
        for c in text_cols:
            raws += _GETTERS[c.arg](args)
        joined = texts(raws)
        for i, c in enumerate(text_cols):
            out[c.column] = joined.slice(i * n, n)
    return {
        c.column: out[c.column] if c.dtype == V.TEXT else _CONVERT[c.dtype](_GETTERS[c.arg](args))
        for c in columns
    }


def _frame(
    events: list[Event], cats: list[str], ts_ns: pl.Series, dur_ns: pl.Series, tid: str,
    columns: tuple[V.ArgColumn, ...],
) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "name": pl.Series([e.name for e in events], dtype=pl.String, strict=False),
            "cat": pl.Series(cats, dtype=pl.String),
            "pid": strs([e.pid for e in events]),
            tid: strs([e.tid for e in events]),
            "ts_ns": ts_ns,
            "dur_ns": dur_ns,
            **_arg_columns(events, columns),
        }
    )


def device_frame(dev: list[Event], cats: list[str], ts_ns: pl.Series, dur_ns: pl.Series) -> pl.DataFrame:
    """The device-op frame of one chunk: ``name``, ``cat`` (``cats``: the device kind per
    event), ``pid``, ``tid`` (String), ``ts_ns``/``dur_ns`` (Int64 ns, converted by the
    caller), then :data:`.kineto_vocab.DEVICE_ARG_COLUMNS`; one row per event of ``dev``."""
    return _frame(dev, cats, ts_ns, dur_ns, "tid", V.DEVICE_ARG_COLUMNS)


def host_frame(host: list[Event], cats: list[str], ts_ns: pl.Series, dur_ns: pl.Series) -> pl.DataFrame:
    """The host frame of one chunk: ``name``, ``cat`` (``cats``: the normalised host
    category per event), ``pid``, ``thread`` (String), ``ts_ns``/``dur_ns`` (Int64 ns), then
    :data:`.kineto_vocab.HOST_ARG_COLUMNS`; one row per event of ``host``."""
    return _frame(host, cats, ts_ns, dur_ns, "thread", V.HOST_ARG_COLUMNS)
