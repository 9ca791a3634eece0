"""The recorded shapes of the framework ops an op table links, by integer keys: a part of
:func:`traceroof.costing.compute_costs` (and the lender lookup of
:func:`traceroof.graph_sources.build_source`).

Only integer columns are filtered and sorted; the text columns are gathered once for the rows
picked. A host table holds several times more ``cpu_op`` rows than an op table links (711 k
for 175 k on the 1 GB replicated trace): :func:`innermost_of` looks at the linked ids only.
"""

from __future__ import annotations

import polars as pl

from .host import innermost_cpu_ops


def columns(df: pl.DataFrame, names: list[str]) -> pl.DataFrame:
    """``df.select(names)`` (plain column names) without the query engine: the columns as
    they are, no copy, however each is cut into chunks (the engine copies every column of a
    table whose columns are cut differently to align them first: ~0.012 s of CPU per select
    on the 1 GB trace's op table)."""
    return pl.DataFrame([df.get_column(c) for c in names])


#: the key columns :func:`rank_id_key` packs into one integer
RANK_ID = ["rank", "external_id"]


def rank_id_key(frames: list[pl.DataFrame], name: str = "_k") -> pl.Expr | None:
    """An Int64 per row standing for its ``(rank, external_id)``, equal on two rows exactly
    when both columns are (over all of ``frames``): ``(external_id - lo + 1) * 2**b + rank``
    (``lo`` the smallest id of ``frames``, ``b`` the bits of their largest rank), null where
    either is null, so that a join on it matches the rows a join on the two columns
    matches (one integer key hashed: half the CPU of two on the 1 GB trace). None when a
    rank is negative or the values would not fit in 62 bits (then join on the columns)."""
    ranks = [f.get_column("rank") for f in frames if f.height]
    ids = [f.get_column("external_id") for f in frames if f.height]
    r_lo = [r.min() for r in ranks if r.null_count() < r.len()]
    i_lo = [i.min() for i in ids if i.null_count() < i.len()]
    if not r_lo or not i_lo:
        return None
    rmin, rmax = min(r_lo), max(r.max() for r in ranks if r.null_count() < r.len())  # type: ignore[type-var]
    lo, hi = min(i_lo), max(i.max() for i in ids if i.null_count() < i.len())  # type: ignore[type-var]
    bits = int(rmax).bit_length()  # type: ignore[arg-type]
    if int(rmin) < 0 or (int(hi) - int(lo) + 2) << bits >= 1 << 62:  # type: ignore[arg-type]
        return None
    return ((pl.col("external_id").cast(pl.Int64) - int(lo) + 1) * (1 << bits)  # type: ignore[arg-type]
            + pl.col("rank").cast(pl.Int64)).alias(name)


def join_columns(ops: pl.DataFrame, right: pl.DataFrame, on: list[str], *, nulls_equal: bool = False) -> pl.DataFrame:
    """``ops.join(right, on=on, how="left", nulls_equal=nulls_equal, maintain_order="left")``
    built from the key columns alone: only ``on`` is joined, and ``right``'s other columns
    are added to ``ops`` as they come (a left join of the whole op table gathered every one
    of its columns again: ~60 MB a join on the 1 GB replicated trace's 290 k ops, issue 19).
    Where a key matches several rows of ``right`` (the result would have more rows than
    ``ops``), the plain join is made, so the result is the same either way."""
    # the key columns taken as they are (a select through the query engine copied every
    # column of a table whose columns are cut differently, to align them, each time)
    packed = rank_id_key([ops, right]) if on == RANK_ID and not nulls_equal else None
    if packed is not None:  # one integer key instead of two (rank_id_key: the same matches)
        add = (columns(ops, on).select(packed)
               .join(right.select(packed, pl.exclude(on)), on="_k", how="left", maintain_order="left"))
        if add.height == ops.height:
            return ops.hstack([c.rechunk() for c in add.drop("_k").get_columns()])
        return ops.join(right, on=on, how="left", nulls_equal=nulls_equal, maintain_order="left")
    add = columns(ops, on).join(right, on=on, how="left", nulls_equal=nulls_equal, maintain_order="left")
    if add.height != ops.height:
        return ops.join(right, on=on, how="left", nulls_equal=nulls_equal, maintain_order="left")
    # each added column as one chunk: a table whose columns are cut alike is queried
    # without a copy to align them
    return ops.hstack([c.rechunk() for c in add.drop(on).get_columns()])


def innermost_of(host: pl.DataFrame, external_ids: pl.Series | None) -> pl.Series:
    """:func:`traceroof.host.innermost_cpu_ops` by ``(rank, external_id)`` (UInt32 row indices
    into ``host``, ascending), for the keys whose External id is in ``external_ids`` only
    (None: every key). Only those ``cpu_op`` rows are sorted (a filter on one integer
    column), by key, start and row: a key's innermost is its last row (the one that started
    last, of several at one ns the last in table order), read where the key changes. It
    depends only on that key's rows, so each key kept gets the row it gets without the
    filter.

    Args:
        host: a host table (``rank``, ``external_id``, ``cat``, ``start_ns`` are read).
        external_ids: the External ids wanted (nulls and repeats ignored), or None.
    """
    if external_ids is None:
        return innermost_cpu_ops(host, ["rank", "external_id"])
    # the last row of each key once sorted by (key, start, row): no hash of the keys
    key = ["rank", "external_id"]
    last = pl.lit(False)
    for c in key:
        last = last | pl.col(c).ne_missing(pl.col(c).shift(-1))
    return (host.lazy().select(*key, "cat", "start_ns").with_row_index("_h")
            .filter(pl.col("cat") == "cpu_op", pl.col("external_id").is_in(external_ids.drop_nulls().unique().implode()))
            .select("_h", "start_ns", *key).sort([*key, "start_ns", "_h"])
            .filter(last | (pl.int_range(pl.len()) == pl.len() - 1))
            .select("_h").sort("_h").collect())["_h"]


def shapes_by_external_id(host: pl.DataFrame, of: pl.DataFrame | None = None) -> pl.DataFrame:
    """The recorded shapes of each framework op: one row per ``(rank, external_id)``.

    Columns ``rank, external_id, input_dims, input_types, concrete_inputs`` (raw JSON text,
    HOST_SCHEMA), from the ``cpu_op`` event with that External id; when several share one
    (nested ops in old traces), the one that started last (the innermost). Sorting only the
    integer keys and gathering the text columns once keeps this fast on millions of host
    events. ``of``: the ``(rank, external_id)`` wanted (those an op table links; None: every
    one): only the ``cpu_op`` rows whose External id is among them are looked at
    (:func:`innermost_of`; a key of another rank with the same id may come along).
    """
    rows = innermost_of(host, None if of is None else of["external_id"])
    return columns(host, ["rank", "external_id", "input_dims", "input_types", "concrete_inputs"])[rows]


def _split_shapes(host: pl.DataFrame, of: pl.DataFrame | None, split: int | None) -> pl.DataFrame:
    """:func:`shapes_by_external_id` of ``host``, looked up in its first ``split`` rows (a
    trace's host table) and in the rest (the lent ops' rows, under External ids of their
    own) apart, when no External id is in both: then a key's rows are all in one part, and
    the two results, one after the other, are the rows (ascending) the whole gives. Looked
    up apart, the trace's table is read as it is, not through a concatenation of the two
    (on the 1 GB trace the lookup over the concatenation took 0.10 s of CPU, apart 0.06 s)."""
    if split is None or split in (0, host.height):
        return shapes_by_external_id(host, of)
    head, tail = host.slice(0, split), host.slice(split)
    ids = [p["external_id"].drop_nulls() for p in (head, tail)]
    lo = [(int(i.min()), int(i.max())) if i.len() else None for i in ids]  # type: ignore[arg-type]
    if lo[0] is not None and lo[1] is not None and not (lo[1][1] < lo[0][0] or lo[0][1] < lo[1][0]):
        return shapes_by_external_id(host, of)  # the id ranges meet: looked up as one table
    return pl.concat([shapes_by_external_id(head, of), shapes_by_external_id(tail, of)])


def _codes(col: pl.Series) -> pl.Expr:
    """``col`` (String) as integer codes: 1.. per distinct value, null 0 (Int64)."""
    values = col.drop_nulls().unique()
    if values.len() == 0:  # every row null (polars' replace_strict panics on an empty mapping): 0 per row
        return pl.col(col.name).is_not_null().cast(pl.Int64)
    return (pl.col(col.name).replace_strict(values, pl.int_range(1, values.len() + 1, eager=True, dtype=pl.Int64),
                                            return_dtype=pl.Int64).fill_null(0))


def shape_keys(host: pl.DataFrame, of: pl.DataFrame | None = None, *,
               split: int | None = None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """:func:`shapes_by_external_id` (of ``of``'s keys) with the text replaced by an integer
    key: ``(rank, external_id, _skey)`` and the key table ``(_skey, input_dims, input_types,
    concrete_inputs)`` (one row per distinct shape), so the op table is joined on integers
    and the recorded text is looked at once per distinct shape. ``split``: ``host`` is a
    trace's host table (its first ``split`` rows) with the lent ops' rows after it, looked
    up apart where that gives the same rows (:func:`_split_shapes`)."""
    sh = _split_shapes(host, of, split)
    sk = ["input_dims", "input_types", "concrete_inputs"]
    bits = max(sh.height, 1).bit_length()
    if 3 * bits > 63:  # too many rows to pack three codes into one integer: hash the text
        keys = sh.select(sk).unique(maintain_order=True).with_row_index("_skey")
        ids = sh.join(keys, on=sk, how="left", nulls_equal=True, maintain_order="left").select(
            "rank", "external_id", "_skey")
        return ids, keys
    # each text column coded by its distinct values (1.., null 0: a null equals a null, as in
    # the text), the three codes packed into one integer: equal packed keys ⇔ equal text
    # triples, and no row of text is encoded for a multi-column hash (+78 MB peak on the 1 GB
    # trace)
    packed = sh.select(sum(_codes(sh[c]) * (1 << bits * (2 - i)) for i, c in enumerate(sk)).alias("_p"))["_p"]
    first = packed.to_frame().with_row_index("_i").unique("_p", keep="first", maintain_order=True)
    keys = sh.select(sk)[first["_i"]].with_row_index("_skey")
    code = packed.replace_strict(first["_p"], pl.int_range(first.height, eager=True, dtype=pl.UInt32),
                                 return_dtype=pl.UInt32)
    return sh.select("rank", "external_id", code.alias("_skey")), keys


__all__ = ["RANK_ID", "columns", "rank_id_key", "innermost_of", "join_columns", "shape_keys", "shapes_by_external_id"]
