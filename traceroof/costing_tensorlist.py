"""Bytes of ``Tensor[]`` ops (``aten::cat``, ``_foreach_*``) from the element dtype their
kernel's name reveals: a part of :func:`traceroof.costing.compute_costs` (the costing's helper
columns in, the same table with ``_b`` filled where it can be)."""

from __future__ import annotations

import re
from collections.abc import Callable

import polars as pl

from . import costs
from .dtypes import KERNEL_TEMPLATE_DTYPES, WIDTH_DTYPE

_OPAQUE = re.compile(r"OpaqueType<(\d+)u?>")


def element_dtype_of_kernel(name: str) -> str | None:
    """The element dtype a kernel's template arguments reveal, for ``Tensor[]`` ops.

    Kineto records only ``"TensorList"`` for list arguments (``aten::cat``, ``_foreach_*``), so
    their bytes are unknown from shapes alone; the launched kernel's name often says the
    element type (``CatArrayBatchedCopy<OpaqueType<2u>, …>`` = 2-byte elements). Only the width
    matters for bytes; a bare width maps to a representative dtype of that width.
    """
    m = _OPAQUE.search(name)
    if m:
        return WIDTH_DTYPE.get(int(m.group(1)))
    for needle, dt in KERNEL_TEMPLATE_DTYPES:
        if needle in name:
            return dt
    return None


def tensorlist_bytes(ops: pl.DataFrame, keys: pl.DataFrame, parse: Callable[[str | None], object]) -> pl.DataFrame:
    """Second pass for ``Tensor[]`` ops: bytes from the element dtype of the kernel name.
    Only the rows that need it are read (a lazy query of four columns) and written (one
    scatter into ``_b``): a join of the whole op table on the kernel name cost more than
    the rest of the pass. ``parse``: the JSON parse of the recorded argument text."""
    miss = pl.col("_f").is_not_null() & pl.col("_b").is_null()
    need = ops.lazy().with_row_index("_i").filter(miss, pl.col("_tl")).select("_i", "name", "op", "_skey").collect()
    if need.height == 0:
        return ops
    # the kernel-name parse runs once per distinct name
    names = need["name"].unique().to_list()
    ldt_of = pl.DataFrame({"name": names, "_ldt": [element_dtype_of_kernel(n or "") for n in names]},
                          schema={"name": pl.String, "_ldt": pl.String})
    need = need.join(ldt_of, on="name", how="left", nulls_equal=True, maintain_order="left")
    rows = []
    todo = need.filter(pl.col("_ldt").is_not_null()).select("op", "_skey", "_ldt").unique().join(
        keys, on="_skey", how="left")
    for op, skey, ldt, dims, types, conc in todo.select(
        "op", "_skey", "_ldt", "input_dims", "input_types", "concrete_inputs"
    ).iter_rows():
        c = costs.cost_of(op, parse(dims), parse(types), parse(conc), tensorlist_dtype=ldt)
        if c is not None and c.bytes is not None:
            rows.append((op, skey, ldt, float(c.bytes)))
    if not rows:
        return ops
    fix = pl.DataFrame(rows, schema={"op": pl.String, "_skey": pl.UInt32, "_ldt": pl.String, "_b2": pl.Float64},
                       orient="row")
    # (op, _skey, _ldt) is unique in fix: one value per row of need (null where none)
    got = need.join(fix, on=["op", "_skey", "_ldt"], how="left", nulls_equal=True,
                    maintain_order="left").filter(pl.col("_b2").is_not_null())
    return ops.with_columns(ops["_b"].scatter(got["_i"], got["_b2"]))


__all__ = ["element_dtype_of_kernel", "tensorlist_bytes"]
