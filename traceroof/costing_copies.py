"""Copies and fills the trace recorded without a byte count: sized from their framework op.

A part of :func:`traceroof.costing.compute_costs` (the costing's helper columns in, the same
table with ``bytes``/``flops``/``cost_source`` filled out).
"""

from __future__ import annotations

from collections.abc import Callable

import polars as pl

from .costing_shapes import join_columns
from .costs.args import dtype_of, nbytes
from .costs.memory import copy_hbm_bytes

#: framework ops whose ``Memcpy``/``Memset`` moves one of their recorded tensors: the index of
#: that tensor in ``Input Dims`` (``copy_(self, src)`` copies ``src``; the others their ``self``)
COPY_SOURCE_ARG = {"aten::copy_": 1, "aten::_copy_from": 0, "aten::_copy_from_and_resize": 0,
                   "aten::_to_copy": 0, "aten::to": 0, "aten::clone": 0, "aten::contiguous": 0,
                   "aten::fill_": 0, "aten::zero_": 0}


def copy_sizes_from_op(ops: pl.DataFrame, keys: pl.DataFrame, parse: Callable[[str | None], object]) -> pl.DataFrame:
    """Bytes of copies and fills the trace recorded without a byte count (ROCm's
    ``gpu_memcpy`` events carry none), from the tensor their framework op moves
    (:data:`COPY_SOURCE_ARG`; its recorded shape × dtype width): a ``Memcpy HtoD`` under
    ``aten::copy_([5, 128] float, [5, 128] float)`` moves 5·128·4 = 2,560 bytes (split over
    the op's copy events by duration when it issued several: the tensor is copied once). A
    device-to-device copy reads and writes them (× :func:`traceroof.costs.memory.copy_hbm_bytes`).
    FLOPs 0 (a copy does no arithmetic), ``cost_source`` ``shapes``. Rows with a byte count,
    other ops or no recorded shape are left as they are.

    ``ops`` has the costing's ``_skey`` column (the key of the op's recorded arguments in
    ``keys``: ``input_dims``, ``input_types`` as JSON text, read with ``parse``)."""
    is_copy = pl.col("kind").is_in(["memcpy", "memset"])
    need = ops.filter(is_copy, pl.col("bytes").is_null(), pl.col("op").is_in(list(COPY_SOURCE_ARG)),
                      pl.col("_skey").is_not_null())
    if need.height == 0:
        return ops
    rows = []
    todo = need.select("op", "_skey", "name").unique().join(
        keys.select("_skey", "input_dims", "input_types"), on="_skey", how="left")
    for op, skey, name, dims, types in todo.iter_rows():
        dims, types, i = parse(dims), parse(types), COPY_SOURCE_ARG[op]
        size = None
        if isinstance(dims, list) and isinstance(types, list) and i < len(dims) and i < len(types):
            shape = dims[i]
            if isinstance(shape, list) and all(isinstance(d, int) for d in shape):
                size = nbytes(shape, dtype_of(types[i]))
        if size is not None and name and name.startswith("Memcpy"):
            size = copy_hbm_bytes(name, size)
        rows.append((op, skey, name, size))
    sizes = pl.DataFrame(rows, schema={"op": pl.String, "_skey": pl.UInt32, "name": pl.String,
                                       "_cb": pl.Float64}, orient="row")
    ops = join_columns(ops, sizes, ["op", "_skey", "name"])
    fill = is_copy & pl.col("bytes").is_null() & pl.col("_cb").is_not_null()
    # one tensor, however many copy events the op issued (a chunked copy): its size is split
    # over them by duration (equally when they have none), so the op's copies sum to it once
    grp = ["rank", "external_id"]
    fdur = pl.when(fill).then(pl.col("dur_ns")).otherwise(0)
    n = fill.cast(pl.Int64).sum().over(grp)
    share = pl.when(n == 1).then(pl.lit(1.0)).otherwise(
        (pl.col("dur_ns") / fdur.sum().over(grp)).fill_nan(1.0 / n))
    return ops.with_columns(
        pl.when(fill).then(pl.col("_cb") * share).otherwise(pl.col("bytes")).alias("bytes"),
        pl.when(fill).then(pl.lit(0.0)).otherwise(pl.col("flops")).alias("flops"),
        pl.when(fill).then(pl.lit("shapes")).otherwise(pl.col("cost_source")).alias("cost_source"),
    ).drop("_cb")
