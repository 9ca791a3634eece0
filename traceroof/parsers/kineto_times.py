"""Exact conversion of Kineto's microsecond numbers (raw JSON text) to int64 nanoseconds (BC-10)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import polars as pl


def raw_us_to_ns(raws: list[Any]) -> pl.Series:
    """Exact conversion of JSON microsecond numbers (raw text) to int64 nanoseconds.

    ``1708722576381804.130`` → ``1708722576381804130``: the integer and fraction parts are
    combined as integers, never through float64, so 19-digit absolute timestamps keep their
    ns (BC-10). Quoted numbers (``"12.5"``) are accepted. Digits beyond the third decimal are
    rounded half-up. Entries that are ``None``/``null``/not numbers become null.

    Args:
        raws: ``msgspec.Raw`` (or bytes/None) per event, in µs.

    Returns:
        An ``Int64`` series, ns.
    """
    try:
        # the common case: all Raw/bytes (an empty one reads as null: "" is no number)
        joined = b"\n".join(raws)
    except TypeError:
        joined = b"\n".join(r if r is not None and len(r) else b"null" for r in raws)
    if _plain_numbers(joined):
        # Fast path: only ``[-]digits[.d[d[d]]]`` (or null): polars' exact decimal parser
        s = pl.Series("t", [joined.decode("ascii")], dtype=pl.String).str.split("\n").explode()
        if len(s) == len(raws):
            t = pl.col("t")
            missing = (t == "null") | (t == "")
            dec = (t.str.to_decimal(scale=3) * 1000).cast(pl.Int64, strict=False)
            out = s.to_frame("t").select(
                pl.when(missing).then(None).otherwise(dec).alias("ns"),
                (dec.is_null() & ~missing).any().alias("odd"),
            )
            if not out["odd"][0]:
                return out["ns"]
    try:
        text = joined.decode("utf-8")
    except UnicodeDecodeError:
        text = joined.decode("utf-8", "replace")
    s = pl.Series("t", [text], dtype=pl.String).str.split("\n").explode()
    if len(s) != len(raws):  # a raw newline inside a value (not valid JSON): one by one
        s = pl.Series(
            "t", [(bytes(r) if r is not None and len(r) else b"null").decode("utf-8", "replace") for r in raws],
            dtype=pl.String,
        )
    return _us_text_to_ns(s)


_DIGITS_AS_D = bytes.maketrans(b"0123456789", b"dddddddddd")


def _plain_numbers(joined: bytes) -> bool:
    """True when ``joined`` (values separated by newlines) holds only ``null`` and numbers
    of the form ``[-]digits[.ddd]`` (no exponent, quotes, spaces, sign ``+``, leading dot,
    4th decimal or 19th integer digit): the forms where polars' decimal parser and
    :func:`_us_text_to_ns` agree."""
    shape = joined.replace(b"null", b"").translate(_DIGITS_AS_D)  # every digit reads "d"
    return not (
        shape.translate(None, b"d.-\n")  # any other character
        or shape[:1] == b"."
        or b"\n." in shape
        or b"-." in shape
        or b".dddd" in shape
        or b"d" * 19 in shape  # beyond int64 ns anyway (and beyond polars' decimal width)
    )


def _us_text_to_ns(s: pl.Series) -> pl.Series:
    """µs number text (one per row) → int64 ns; see :func:`raw_us_to_ns`."""
    # integer and fraction parts as integers, half-up on the 4th decimal
    t = pl.col("t").str.strip_chars(' "')
    parts = t.str.split_exact(".", 1)
    ip = parts.struct.field("field_0")
    fp = parts.struct.field("field_1").fill_null("")
    neg = ip.str.starts_with("-")
    ip_abs = ip.str.strip_chars_start("-+")
    frac3 = fp.str.slice(0, 3).str.pad_end(3, "0")
    round_up = fp.str.slice(3, 1).fill_null("").is_in(["5", "6", "7", "8", "9"])
    ns = ip_abs.cast(pl.Int64, strict=False) * 1000 + frac3.cast(pl.Int64, strict=False)
    ns = ns + round_up.cast(pl.Int64)
    ns = pl.when(neg).then(-ns).otherwise(ns)
    ns = pl.when(t == "null").then(None).otherwise(ns)
    out = s.to_frame("t").select(ns.alias("ns"), t.str.contains("[eE]").alias("has_exp"))
    ns_s = out["ns"]
    has_exp = out["has_exp"]
    if has_exp.any():
        fixed = [
            _exp_to_ns(v) if e else None
            for v, e in zip(s.str.strip_chars(' "').to_list(), has_exp.to_list())
        ]
        ns_s = pl.select(
            pl.when(has_exp).then(pl.Series(fixed, dtype=pl.Int64)).otherwise(ns_s)
        ).to_series()
    return ns_s.alias("ns").cast(pl.Int64)


def _exp_to_ns(v: str) -> int | None:
    try:
        ns = int((Decimal(v) * 1000).to_integral_value())
    except (ArithmeticError, ValueError):  # InvalidOperation; OverflowError ("1e400", "-Infinity");
        # decimal.Overflow, an ArithmeticError but no OverflowError ("1E9197675": past Decimal's exponent)
        return None
    return ns if -(1 << 63) <= ns < 1 << 63 else None  # past int64 ns (±292 years): unknown
