"""The shares of a framework op's cost its kernels get: a part of
:func:`traceroof.costing.compute_costs` (``_fill_from_formulas``).

An op's bytes are spread over its kernels by duration, its FLOPs over the kernels that do its
arithmetic (:func:`split_shares`); the per-op sums they divide by are windows on a large op
table and one ``group_by`` joined back on a small one (:func:`op_shares`; session 11).
"""

from __future__ import annotations

import polars as pl

from . import frames


def split_shares(grp: list[str], is_kern: pl.Expr, is_mover: pl.Expr,
                 sums: tuple[pl.Expr, pl.Expr, pl.Expr, pl.Expr] | None = None) -> tuple[pl.Expr, pl.Expr]:
    """The shares of its framework op's bytes and FLOPs each kernel gets (fractions; the
    shares of one op's kernels sum to 1), grouped by ``grp`` (``rank, external_id``).

    Bytes: every kernel of the op (copies and fills are not its kernels, ``is_kern``) by its
    duration. FLOPs: only the kernels that do the op's arithmetic, by their duration; a
    data-movement kernel (``is_mover``: a layout transpose, memset, fill, copy or cast of a
    cuDNN/MIOpen convolution or a GEMM, :func:`traceroof.costs.is_data_movement_kernel`)
    gets 0 FLOPs. An op whose kernels are all movers (a copy op) spreads its FLOPs over all
    of them, by duration. An equal split where the durations sum to 0.

    ``sums``: the four per-group figures the shares divide by (:func:`_group_sums`: kernels,
    their ns, arithmetic kernels, their ns; Int64), as columns already on each row; None:
    computed here as windows over ``grp``.
    """
    n_k, kdur_sum, n_d, ddur_sum = sums if sums is not None else (s.over(grp) for s in _group_sums(is_kern, is_mover))
    byte_share = pl.when(n_k == 1).then(pl.lit(1.0)).otherwise(
        (pl.col("dur_ns") / kdur_sum).fill_nan(1.0 / n_k))
    doer = is_kern & ~is_mover
    flop_share = (
        pl.when(n_d == 0).then(byte_share)
        .when(~doer).then(pl.lit(0.0))
        .when(n_d == 1).then(pl.lit(1.0))
        .otherwise((pl.col("dur_ns") / ddur_sum).fill_nan(1.0 / n_d))
    )
    return byte_share, flop_share


def _group_sums(is_kern: pl.Expr, is_mover: pl.Expr) -> tuple[pl.Expr, pl.Expr, pl.Expr, pl.Expr]:
    """The aggregations :func:`split_shares` divides by, per framework op: its kernels
    (``is_kern``), their device time (ns), its arithmetic kernels (not ``is_mover``), their
    device time (ns); Int64 each."""
    doer = is_kern & ~is_mover
    return (is_kern.cast(pl.Int64).sum(), pl.when(is_kern).then(pl.col("dur_ns")).otherwise(0).sum(),
            doer.cast(pl.Int64).sum(), pl.when(doer).then(pl.col("dur_ns")).otherwise(0).sum())


#: the per-op sums of :func:`_group_sums` as op-table columns (small tables, :func:`op_shares`)
SUM_COLUMNS = ("_gnk", "_gkd", "_gnd", "_gdd")


def op_shares(ops: pl.DataFrame, grp: list[str], is_kern: pl.Expr, is_mover: pl.Expr,
            ) -> tuple[pl.DataFrame, pl.Expr, pl.Expr, pl.Expr]:
    """``ops`` (with :data:`SUM_COLUMNS` added on a small table), the byte and FLOP shares
    (:func:`split_shares`) and the kernel count of each row's op. On a table of at most
    :data:`traceroof.frames.SMALL_ROWS` rows the per-op sums are one ``group_by`` joined back
    (nulls grouped as the windows group them): four windows in one query took ~10 ms of CPU
    on polars' in-memory engine on 15,632 ops, and 30–180 ms of wall on a loaded machine,
    the group sums joined back in the same plan ~2 ms. A larger table keeps the windows, as session 9
    measured them on the 1 GB trace. The same integers either way, so the same shares."""
    if ops.height > frames.SMALL_ROWS:
        byte_share, flop_share = split_shares(grp, is_kern, is_mover)
        return ops, byte_share, flop_share, is_kern.cast(pl.Int64).sum().over(grp)
    # one query: the sums and their join in one plan (a join of the collected sums by
    # join_columns was three queries, 0.9 against 0.6 ms of CPU on bert's 61 ops)
    lf = ops.lazy()
    sums = lf.group_by(grp).agg(e.alias(n) for e, n in zip(_group_sums(is_kern, is_mover), SUM_COLUMNS))
    ops = lf.join(sums, on=grp, how="left", nulls_equal=True, maintain_order="left").collect()
    cols = tuple(pl.col(c) for c in SUM_COLUMNS)
    byte_share, flop_share = split_shares(grp, is_kern, is_mover, cols)  # type: ignore[arg-type]
    return ops, byte_share, flop_share, cols[0]


__all__ = ["SUM_COLUMNS", "op_shares", "split_shares"]
