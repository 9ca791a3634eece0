"""Pair each FBGEMM table-batched-embedding (TBE) lookup with its backward node, so both can
be costed from shapes (:mod:`traceroof.costs.fbgemm`).

Neither half records enough alone: the forward ``fbgemm::split_embedding_codegen_lookup_*``
records ``indices``, ``offsets`` and the tables but not the scalar ``total_D`` (PyTorch 1.x
has no ``Concrete Inputs``); the backward node ``torch::autograd::CppNode<SplitLookupFunction_*_Op>``
records only ``grad_output [B, total_D]``. The autograd link between them (the forward's
sequence number) is not recorded on the forward lookup either, so they are paired by order:
per rank and optimizer, each backward node takes the latest earlier forward not yet taken
whose ``B`` (``offsets`` = ``B·T+1``) equals ``grad_output``'s rows (autograd runs the
backward of independent lookups in the reverse order of their forwards). Two forwards it
could confuse have the same ``B`` and optimizer; a wrong pair moves the cost between them.

The pair is written into the shape text the costing reads (not into the trace): the forward
gets ``total_D`` as its ``Concrete Inputs`` entry, the backward node its forward's arguments
after its own (``[grad_output, *forward]``).
"""

from __future__ import annotations

import re

import msgspec
import polars as pl

from .costs.args import OpArgs
from .costs.fbgemm import FORWARD_RE, tbe_lookup_shape

#: a TBE backward node; group 1 is the optimizer (``Dense`` for the dense lookup)
BACKWARD_RE = r"^torch::autograd::CppNode<SplitLookupFunction_(\w+)_Op>$"

_TOTAL_D = {True: 7, False: 3}  # total_D's position: split_ / dense_ schema
_enc = msgspec.json.Encoder()


def _family(name: str) -> str | None:
    """The optimizer a TBE op belongs to (``rowwise_adagrad``, ``Dense``), ``None`` if none."""
    m = re.match(BACKWARD_RE, name)
    if m:
        return m.group(1)
    if re.match(FORWARD_RE, name):
        if name.startswith("fbgemm::dense_"):
            return "Dense"
        return name.removeprefix("fbgemm::split_embedding_codegen_lookup_").removesuffix("_function")
    return None


def pair_tbe(host: pl.DataFrame) -> tuple[pl.DataFrame, int]:
    """``host`` with each paired TBE forward and backward node's shape text completed (module
    docstring), and the number of pairs. Rows of other ops are returned as they are.

    Args:
        host: a host table (HOST_SCHEMA).

    Returns:
        ``(host, pairs)``.
    """
    # the cheap tests first: the regexes run on the few fbgemm / autograd-node rows only
    # (one lazy query over the columns read: an eager filter copied every column of every cpu_op)
    tbe = (host.lazy().with_row_index("_h")
           .select("_h", "rank", "cat", "name", "start_ns", "input_dims", "input_types", "concrete_inputs")
           .filter(pl.col("cat") == "cpu_op", pl.col("input_dims").is_not_null())
           .filter(pl.col("name").str.starts_with("fbgemm::")
                   | pl.col("name").str.starts_with("torch::autograd::CppNode<Split"))
           .filter(pl.col("name").str.contains(FORWARD_RE) | pl.col("name").str.contains(BACKWARD_RE))
           .collect())
    if tbe.height == 0:
        return host, 0
    open_fwd: dict[tuple, list] = {}
    new: dict[int, tuple[str, str, str]] = {}
    rows = tbe.sort("rank", "start_ns", "_h").select("_h", "rank", "name", "input_dims", "input_types",
                                                    "concrete_inputs").iter_rows()
    for h, rank, name, dims, types, conc in rows:
        fam = _family(name)
        a = OpArgs(name, dims, types, conc)
        if not name.startswith("torch::"):
            s = tbe_lookup_shape(a, name.startswith("fbgemm::split_"))
            if s is not None:
                open_fwd.setdefault((rank, fam), []).append((h, a, s))
            continue
        g = a.shape(0)
        stack = open_fwd.get((rank, fam), [])
        hit = next((i for i in range(len(stack) - 1, -1, -1)
                    if g is not None and len(g) == 2 and stack[i][2]["B"] == g[0]
                    and stack[i][2]["total_D"] in (None, g[1])), None)
        if hit is None:
            continue
        fh, fa, fs = stack.pop(hit)
        split = fa.op.startswith("fbgemm::split_")
        conc_f = [str(c) if c is not None else "" for c in fa.concrete] + [""] * (len(fa) - len(fa.concrete))
        conc_f[_TOTAL_D[split]] = str(g[1])
        new[fh] = (_enc.encode(fa.dims).decode(), _enc.encode(fa.types).decode(), _enc.encode(conc_f).decode())
        new[h] = (_enc.encode([list(g), *fa.dims]).decode(), _enc.encode([a.type(0), *fa.types]).decode(),
                  _enc.encode(["", *conc_f]).decode())
    if not new:
        return host, 0
    idx = pl.Series(list(new), dtype=pl.UInt32)
    cols = {c: host[c].scatter(idx, [v[i] for v in new.values()])
            for i, c in enumerate(("input_dims", "input_types", "concrete_inputs"))}
    return host.with_columns(**cols), len(new) // 2
