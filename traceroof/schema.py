"""The op-table and host-table schemas: column names, dtypes and units, declared once.

Every parser produces tables with exactly these columns (DESIGN §2); every later stage
reads them by these names. Times are int64 nanoseconds relative to the trace origin
(``TraceMeta.origin_ns``); every name carries its unit.
"""

from __future__ import annotations

import polars as pl

from .errors import SchemaError

#: Op kinds. ``collective`` covers NCCL/RCCL/XLA collectives; ``memcpy``/``memset`` the copy engines.
KINDS: tuple[str, ...] = (
    "matmul",
    "attention",
    "conv",
    "elementwise",
    "reduction",
    "norm",
    "collective",
    "memcpy",
    "memset",
    "other",
)
KIND = pl.Enum(list(KINDS))

#: The dtype of the host table's text columns but ``name``: dictionary-coded (4 bytes a row,
#: one copy of each distinct text; a String row is a 16-byte view whatever its text), session
#: 8, issue 19 item 2. ``==`` / ``is_in`` with a literal work as on String; ``.str`` methods
#: need ``.cast(pl.String)``; a join needs both sides Categorical.
CAT = pl.Categorical()

#: Roofline verdicts (DESIGN §6).
BOUNDS: tuple[str, ...] = ("compute", "memory", "comm", "latency", "unknown")

#: One row per device op (kernel, memcpy, memset, or XLA op on a device).
OP_SCHEMA = pl.Schema(
    {
        "rank": pl.Int32,  # global rank of the process (0 when the trace has none)
        "device": pl.Int32,  # device ordinal on its host
        "stream": pl.Int64,  # CUDA/HIP stream id, or XPlane line id
        "name": pl.String,  # kernel / HLO instruction name as in the trace
        "op": pl.String,  # framework op that launched it (aten::mm, HLO opcode), null if unknown
        "kind": KIND,
        "start_ns": pl.Int64,  # device start, ns relative to TraceMeta.origin_ns
        "dur_ns": pl.Int64,  # device duration, ns
        "step": pl.Int32,  # step index, null outside any step
        "dtype": pl.String,  # compute dtype: fp32, tf32, bf16, fp16, fp8, int8, ...
        "flops": pl.Float64,  # floating-point operations performed; null = unknown (never 0)
        "bytes": pl.Float64,  # bytes moved to/from HBM; null = unknown
        "comm_bytes": pl.Float64,  # collectives: message bytes per device
        "group_size": pl.Int32,  # collectives: participants
        "cost_source": pl.String,  # trace | shapes | name | unknown
        "launch_start_ns": pl.Int64,  # host launch call start (cudaLaunchKernel, ...), when linked
        "launch_dur_ns": pl.Int64,  # host launch call duration, ns
        "correlation": pl.Int64,  # id linking device op <-> launch
        "external_id": pl.Int64,  # id linking launch <-> framework op (Kineto "External id")
        "graph": pl.Boolean,  # launched by a CUDA/HIP graph replay (one launch, many kernels)
    }
)

#: Columns the roofline stage adds to the op table (DESIGN §6).
ROOFLINE_SCHEMA = pl.Schema(
    {
        "intensity": pl.Float64,  # arithmetic intensity, FLOP/byte
        "peak_flops_per_s": pl.Float64,  # the peak used for this op's dtype/kind, FLOP/s
        "compute_ns": pl.Float64,  # flops / peak
        "memory_ns": pl.Float64,  # bytes / HBM bandwidth
        "comm_ns": pl.Float64,  # ring factor * comm_bytes / link bandwidth
        "expected_ns": pl.Float64,  # max of the above (roofline time)
        "bound": pl.String,  # compute | memory | comm | latency | unknown
        "gap_ns": pl.Float64,  # dur_ns - expected_ns: time lost against the roofline
        "efficiency": pl.Float64,  # expected_ns / dur_ns
    }
)

#: Host-side events that matter for analysis: framework ops, runtime/driver calls,
#: annotations, ProfilerStep markers.
HOST_SCHEMA = pl.Schema(
    {
        "rank": pl.Int32,
        "pid": CAT,
        "thread": CAT,  # tid as written in the trace (ints and strings both occur)
        "name": pl.String,
        "cat": CAT,  # normalised category: cpu_op, runtime, annotation, gpu_annotation, python, sync
        "start_ns": pl.Int64,
        "dur_ns": pl.Int64,
        "correlation": pl.Int64,
        "external_id": pl.Int64,
        "input_dims": CAT,  # raw JSON text of Kineto "Input Dims" (record_shapes=True)
        "input_types": CAT,  # raw JSON text of "Input type"
        "concrete_inputs": CAT,  # raw JSON text of "Concrete Inputs"
        "coll_name": CAT,  # record_param_comms "Collective name"
        "coll_in_nelems": pl.Int64,  # "In msg nelems"
        "coll_out_nelems": pl.Int64,  # "Out msg nelems"
        "coll_group_size": pl.Int32,  # "Group size"
        "coll_dtype": CAT,  # "dtype"
    }
)


def empty(schema: pl.Schema) -> pl.DataFrame:
    """An empty DataFrame with ``schema``."""
    return pl.DataFrame(schema=schema)


def conform(df: pl.DataFrame, schema: pl.Schema) -> pl.DataFrame:
    """Add missing columns of ``schema`` as nulls, cast, and order columns as declared.

    Extra columns are kept after the declared ones (the roofline adds its own). A declared
    column that is null in every row becomes a broadcast null (polars keeps one value for the
    whole column, not 8 bytes a row: 30 MB of the 1 GB Kineto trace's host table, whose five
    collective columns are empty; session 8).
    """
    cols = []
    for name, dtype in schema.items():
        if name in df.columns and df.height and df[name].null_count() == df.height:
            cols.append(pl.lit(None, dtype=dtype).alias(name))
        elif name in df.columns:
            cols.append(pl.col(name).cast(dtype))
        else:
            cols.append(pl.lit(None, dtype=dtype).alias(name))
    extra = [c for c in df.columns if c not in schema]
    # with_columns, not select: a select of nothing but literals (every declared column null,
    # no extra column) would make a table of one row
    return df.with_columns(cols).select([*schema, *extra])


def validate(df: pl.DataFrame, schema: pl.Schema, *, what: str = "table") -> pl.DataFrame:
    """Check that ``df`` has every column of ``schema`` with its dtype, and sane times.

    Returns ``df`` unchanged.

    Raises:
        SchemaError: naming the missing columns, the columns of the wrong dtype, or a
            negative ``dur_ns`` (durations are >= 0 by construction; a negative one is a
            parser bug, not a property of the input).
    """
    missing = [c for c in schema if c not in df.columns]
    if missing:
        raise SchemaError(f"{what}: missing columns {missing}; expected {list(schema)}")
    wrong = [
        f"{c} is {df.schema[c]}, expected {dtype}"
        for c, dtype in schema.items()
        if df.schema[c] != dtype
    ]
    if wrong:
        raise SchemaError(f"{what}: wrong dtypes: " + "; ".join(wrong))
    if "dur_ns" in df.columns and df.height and (df["dur_ns"] < 0).any():
        raise SchemaError(f"{what}: negative dur_ns in {int((df['dur_ns'] < 0).sum())} rows")
    return df
