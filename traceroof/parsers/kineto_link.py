"""Turn the raw Kineto columns of one file into the op and host tables, with their links.

Links (all scoped to one file and rank, so two ranks' correlation ids never meet, BC-06;
a file holding several ranks is built one rank at a time, :mod:`.kineto_ranks`):
kernel ``correlation`` → runtime/driver call (launch start and duration, its
``External id``) → the framework op (and, with ``record_shapes=True``, its input shapes):
the innermost ``cpu_op`` with that ``External id``, or in PyTorch 1.x traces (``External
id == correlation``) the innermost ``cpu_op`` enclosing the launch on its thread; a link
inconsistent with that rule is refused and counted (rule 8, :mod:`.kineto_enclose`). A ``*GraphLaunch`` call whose correlation
is shared by several kernels marks them ``graph`` (BC-13).
"""

from __future__ import annotations

import polars as pl

from ..costs.memory import copy_hbm_bytes
from ..host import in_start_order, innermost_cpu_ops
from ..schema import HOST_SCHEMA, OP_SCHEMA, conform, empty
from ..step_markers import WINDOW_CAT, device_and_host_windows
from ..trace import TraceMeta
from . import kineto_vocab as V
from .kineto_enclose import consistent_links, enclosing_cpu_ops, is_nesting_era

_COLLECTIVE_RE = r"(?i)(nccl|rccl|all_?reduce|all_?gather|reduce_?scatter|alltoall|all_to_all|sendrecv)"
_NCCL_RE = r"(?i)(nccl|rccl)"
#: the collective a NCCL/RCCL kernel name spells (``ncclKernel_SendRecv_RING_…``, ``ncclDevKernel_AllGather_…``)
_NCCL_KERNEL_OP_RE = r"^[nr]ccl(?:Dev)?Kernel_([A-Za-z]+)"


def build_tables(
    dev: pl.DataFrame | None, host: pl.DataFrame | None, meta: TraceMeta, *, rank: int
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Build (ops, host) for one file. See the module docstring for the links made."""
    if dev is None:
        dev = pl.DataFrame()
    if host is None:
        host = pl.DataFrame()

    dev = _drop_invalid_durations(dev, meta, "device") if dev.height else dev
    host = _drop_invalid_durations(host, meta, "host") if host.height else host

    # the recording-window instants do not move the origin (they may open before any event)
    # (a min over one column: filtering the host frame first copied every column of it)
    starts = [dev["ts_ns"].min() if dev.height else None,
              host.select(pl.col("ts_ns").filter(pl.col("cat") != WINDOW_CAT).min()).item() if host.height else None]
    starts = [s for s in starts if s is not None]
    origin = int(min(starts)) if starts else 0
    meta.origin_ns = origin

    # the unsorted host frame is handed over (and freed column by column as it is sorted)
    box = [host]
    host = None  # type: ignore[assignment]
    host_tbl = _host_table(box, origin, rank) if box[0].height else empty(HOST_SCHEMA)
    box.clear()
    if not dev.height:
        return empty(OP_SCHEMA), host_tbl

    ops = _device_columns(dev, rank, origin)
    # the raw device frame is not held past here: its columns that the op table does not keep
    # (pid, tid, the raw arguments) are freed by the select below, the others by the sort
    del dev
    ops = _link_launches(ops, host_tbl)
    ops = _link_framework_ops(ops, host_tbl, meta)
    ops = _classify(ops)
    # handed over in a box and the name released: the unsorted columns are freed one by one
    # as their sorted copies are made (the name held the whole unsorted table until the
    # gather returned: a second copy of the op table at the read's peak)
    box = [conform(ops, OP_SCHEMA).select(list(OP_SCHEMA))]
    del ops
    order = box[0].select(pl.arg_sort_by(["device", "stream", "start_ns"]))[:, 0]
    ops = _gather_by_column(box, order)
    del order
    ops = assign_steps(ops, host_tbl, meta)

    _warn_links(ops, host_tbl, meta)
    return ops, host_tbl


def _device_columns(dev: pl.DataFrame, rank: int, origin: int) -> pl.DataFrame:
    """The raw device events with their rank, device, stream and ``start_ns`` (relative to ``origin``)."""
    return dev.with_columns(
        pl.lit(rank, dtype=pl.Int32).alias("rank"),
        pl.coalesce(pl.col("device_arg").cast(pl.Int32, strict=False),  # past Int32: not a device
                    pl.col("pid").cast(pl.Int32, strict=False))
        .fill_null(0)
        .alias("device"),
        pl.coalesce(
            pl.col("stream_arg"),
            pl.col("tid").str.extract(r"(\d+)").cast(pl.Int64, strict=False),
        ).alias("stream"),
        (pl.col("ts_ns") - origin).alias("start_ns"),
    )


def _link_launches(ops: pl.DataFrame, host_tbl: pl.DataFrame) -> pl.DataFrame:
    """Launch link (correlation → runtime call: launch start/duration, its ``External id``)
    and graph replays (one ``*GraphLaunch`` correlation, several kernels: ``graph``, BC-13)."""
    # --- launch link: correlation -> runtime call (the first runtime row of each correlation)
    # The op's row of the launch is found on integer columns alone (a join of one column);
    # each launch column is then gathered with it, so the op table is never copied by a join
    # (a join of the whole table copied every op column; 1 GB trace: -0.15 GB of peak RSS)
    # (the first row of each correlation as a ``unique``: the rows and order of a
    # ``group_by(maintain_order=True).agg(first)``, at half its memory and a third of its CPU
    # on the 1 GB trace's 327 k runtime rows: 52 -> 23 MB, 0.067 -> 0.021 s)
    first = host_tbl.lazy().select(pl.int_range(pl.len(), dtype=pl.UInt32).alias("_h"), "cat", "correlation").filter(
        pl.col("cat") == "runtime", pl.col("correlation").is_not_null()
    ).select("_h", "correlation").unique("correlation", keep="first", maintain_order=True).collect()
    at = _lookup_unique(first, "correlation", ops["correlation"], "_h")
    # (a null name is no graph launch: the test's null is filled, not the text; filling the
    # text column with "" copied every name)
    graph_launch = host_tbl["name"].gather(at).str.contains("|".join(V.GRAPH_LAUNCH_SUBSTRINGS)).fill_null(False)
    ops = ops.with_columns(
        host_tbl["start_ns"].gather(at).alias("launch_start_ns"),
        host_tbl["dur_ns"].gather(at).alias("launch_dur_ns"),
        pl.when(at.is_not_null()).then(graph_launch).alias("_graph_launch"),
        pl.coalesce(host_tbl["external_id"].gather(at), pl.col("external_id")).alias("external_id"),
        host_tbl["pid"].gather(at).alias("launch_pid"),
        host_tbl["thread"].gather(at).alias("launch_thread"),
    )

    # --- graph replay: one *GraphLaunch correlation, several kernels (BC-13)
    per_corr = pl.len().over("correlation")
    is_graph_launch = pl.col("_graph_launch").fill_null(False)
    ops = ops.with_columns(
        (is_graph_launch & pl.col("correlation").is_not_null() & (per_corr > 1)).alias("graph")
    )
    return ops


def _lookup_unique(table: pl.DataFrame, key: str, values: pl.Series, column: str) -> pl.Series:
    """``table[column]`` at the row whose ``key`` equals each of ``values`` (``key`` unique in
    ``table``; null where no row has it, or the value is null): a left join of ``values``
    with ``table`` on ``key``, by a binary search of the sorted keys instead of a hash table
    (the launch link's 290 k correlations against 327 k runtime rows on the 1 GB trace:
    28 -> 14 MB of extra peak, 0.032 -> 0.020 s of CPU)."""
    if table.height == 0:
        return pl.Series(column, [None] * len(values), dtype=table.schema[column])
    by_key = table.select(key, column).sort(key)
    keys = by_key[key]
    pos = keys.search_sorted(values, side="left").clip(0, table.height - 1)
    hit = keys.gather(pos) == values
    return pl.select(pl.when(hit).then(by_key[column].gather(pos))).to_series().alias(column)


def _link_framework_ops(ops: pl.DataFrame, host_tbl: pl.DataFrame, meta: TraceMeta) -> pl.DataFrame:
    """The framework op of each kernel, with its collective arguments (``op_*`` columns).

    Id era: ``External id`` → innermost ``cpu_op`` with that id (the last to start). Nesting
    era (PyTorch 1.x: every launch's ``External id`` is its correlation): the innermost
    ``cpu_op`` enclosing the launch on its thread, whose ``External id`` the kernel takes.
    Either way the link must pass rule 8 (:func:`~.kineto_enclose.consistent_links`); one
    that does not is dropped (no op, no ``External id``) and counted."""
    # (only the columns it reads: its filter would copy every column of the host table)
    nesting = is_nesting_era(host_tbl.select("cat", "correlation", "external_id"))
    if nesting:
        ops = ops.with_columns(enclosing_cpu_ops(host_tbl, ops).alias("_op_row"))
        meta.stats["links_by_nesting"] = 1
    else:
        ops = ops.with_columns(_op_rows_by_id(host_tbl, ops))
    ok = consistent_links(host_tbl, ops)
    _count_dropped(ops, ok, meta)
    refused = ok.eq(False).fill_null(False)
    ops = ops.with_columns(pl.when(ok.fill_null(False)).then(pl.col("_op_row")).alias("_op_row"), refused.alias("_refused"))
    # a null row gathers nulls: an op without a link takes none of these (gathering row 0 for
    # it and masking the seven columns afterwards made each column twice)
    op_row = ops["_op_row"]
    cpu_ops = host_tbl.select(
        pl.col("external_id", "name", "coll_name", "coll_in_nelems", "coll_out_nelems", "coll_group_size",
               "coll_dtype").gather(op_row)
    ) if host_tbl.height else None
    del op_row
    linked = pl.col("_op_row").is_not_null()
    cols = {"_op_ext": "external_id", "op": "name", "op_coll_name": "coll_name", "op_in": "coll_in_nelems",
            "op_out": "coll_out_nelems", "op_gs": "coll_group_size", "op_cdt": "coll_dtype"}
    if cpu_ops is None:
        ops = ops.with_columns([pl.lit(None, dtype=pl.Int64 if k in ("_op_ext", "op_in", "op_out", "op_gs")
                                       else pl.String).alias(k) for k in cols])
    else:
        ops = ops.with_columns([cpu_ops[v].alias(k) for k, v in cols.items()])
    ops = ops.with_columns(
        pl.col("op_gs").cast(pl.Int64),
        # a kernel whose link was refused keeps no id that would fetch another op's shapes
        pl.when(linked).then(pl.col("_op_ext")).when(pl.col("_refused")).then(None)
        .otherwise(pl.col("external_id")).alias("external_id"),
    )
    return ops.drop("_op_ext", "_op_row", "_refused")


def _op_rows_by_id(host_tbl: pl.DataFrame, ops: pl.DataFrame) -> pl.Series:
    """``_op_row`` (UInt32, one per op row, null: none): the host row of the innermost
    ``cpu_op`` with the op's ``External id`` (:func:`~traceroof.host.innermost_cpu_ops`).

    A host table in start order (:func:`~traceroof.host.in_start_order`, as
    :func:`_host_table` leaves it) has its winner of an id at that id's largest row, so only
    the ids the ops carry are grouped (1 GB trace: 175 k of 711 k cpu_ops; 93 -> 33 MB of
    peak, 0.14 -> 0.05 s of CPU); any other table takes the sort of ``innermost_cpu_ops``."""
    if in_start_order(host_tbl):
        ids = ops["external_id"].drop_nulls().unique()
        by_id = (host_tbl.lazy().select(pl.int_range(pl.len(), dtype=pl.UInt32).alias("_h"), "cat", "external_id")
                 .filter(pl.col("cat") == "cpu_op", pl.col("external_id").is_in(ids.implode()))
                 .group_by("external_id").agg(pl.col("_h").max().alias("_op_row")).collect())
    else:
        # winners are picked on integer columns only; text columns are gathered for them alone
        winners = innermost_cpu_ops(host_tbl, ["external_id"])
        by_id = host_tbl.select("external_id")[winners].with_columns(winners.alias("_op_row"))
    # one winner per id: the row is found by a join of the key column alone (no copy of ops)
    return ops.select("external_id").join(by_id, on="external_id", how="left", maintain_order="left")["_op_row"]


def _count_dropped(ops: pl.DataFrame, ok: pl.Series, meta: TraceMeta) -> None:
    """Rule 8: count and warn about links refused because the op does not enclose the launch
    on the launch's thread (or no launch was recorded to check against)."""
    bad = ok.eq(False).fill_null(False)
    n = int(bad.sum())
    if not n:
        return
    no_launch = int((bad & ops["launch_start_ns"].is_null()).sum())
    share = ops.filter(bad)["dur_ns"].sum() / max(ops["dur_ns"].sum(), 1)
    meta.stats["links_dropped_rule8"] = n
    meta.stats["links_dropped_rule8_no_launch"] = no_launch
    meta.warn(
        f"{n} kernel-to-framework-op links ({share:.1%} of device time) were refused: the op "
        "does not enclose the kernel's launch on the launching thread"
        + (f" ({no_launch} with no launch recorded to check against)" if no_launch else "")
        + "; those kernels have no framework op (accounting rule 8)"
    )


def _classify(ops: pl.DataFrame) -> pl.DataFrame:
    """``kind`` from the category, collectives' framework op, message bytes and group size,
    and the byte counts copies and fills carry in the trace (``cost_source`` ``trace``)."""
    # --- kind from the category; kernels are refined later by the cost stage
    ops = ops.with_columns(
        pl.when(pl.col("cat") == "memcpy")
        .then(pl.lit("memcpy"))
        .when(pl.col("cat") == "memset")
        .then(pl.lit("memset"))
        # a null name matches no collective ("" does not match _NCCL_RE): the test's null is
        # filled, not the text column (fill_null("") copied every kernel name, +65 MB on 1 GB)
        .when(pl.col("name").str.contains(_NCCL_RE).fill_null(False) | pl.col("coll_name").is_not_null())
        .then(pl.lit("collective"))
        .otherwise(pl.lit("other"))
        .alias("kind")
    )

    # --- collectives: the framework op is the c10d collective, not record_param_comms; a
    # record_param_comms without "Collective name" (PyTorch 1.x) takes the kernel's own word
    # for it (ncclKernel_AllReduce_… -> nccl:AllReduce), as the kernel name said before linking
    bare_comms = pl.when(pl.col("op") == "record_param_comms").then(
        pl.concat_str(pl.lit("nccl:"), pl.col("name").str.extract(_NCCL_KERNEL_OP_RE)))
    ops = ops.with_columns(
        pl.when(pl.col("kind") == "collective")
        .then(
            pl.coalesce(
                pl.concat_str(pl.lit("nccl:"), pl.coalesce("coll_name", "op_coll_name")), bare_comms, pl.col("op")
            )
        )
        .otherwise(pl.col("op"))
        .alias("op")
    )

    # --- collectives: message bytes per device and group size
    in_n = pl.coalesce("coll_in_nelems", "op_in")
    out_n = pl.coalesce("coll_out_nelems", "op_out")
    cdt = pl.coalesce("coll_dtype", "op_cdt")
    itemsize = cdt.replace_strict(V.COLL_DTYPE_BYTES, default=None, return_dtype=pl.Int64)
    ops = ops.with_columns(
        pl.when(pl.col("kind") == "collective")
        .then(pl.max_horizontal(in_n, out_n) * itemsize)
        .cast(pl.Float64)
        .alias("comm_bytes"),
        pl.when(pl.col("kind") == "collective")
        .then(pl.coalesce("coll_group_size", "op_gs"))
        .cast(pl.Int32)
        .alias("group_size"),
    )

    # --- copies and fills carry their byte count in the trace; a device-to-device copy reads
    # and writes it (costs.memory.copy_hbm_bytes), once per distinct name
    is_copy = pl.col("kind").is_in(["memcpy", "memset"])
    names = ops.filter(pl.col("kind") == "memcpy")["name"].drop_nulls().unique().to_list()
    factor = pl.col("name").replace_strict({n: copy_hbm_bytes(n, 1.0) for n in names}, default=1.0,
                                          return_dtype=pl.Float64)
    per_byte = pl.when(pl.col("kind") == "memcpy").then(factor).otherwise(pl.lit(1.0))
    ops = ops.with_columns(
        pl.when(is_copy & pl.col("nbytes").is_not_null())
        .then(pl.col("nbytes").cast(pl.Float64) * per_byte)
        .alias("bytes"),
        pl.when(is_copy & pl.col("nbytes").is_not_null()).then(pl.lit(0.0)).alias("flops"),
        pl.when(is_copy & pl.col("nbytes").is_not_null())
        .then(pl.lit("trace"))
        .otherwise(pl.lit("unknown"))
        .alias("cost_source"),
        pl.col("dur_ns").alias("dur_ns"),
    )
    return ops


def _warn_links(ops: pl.DataFrame, host_tbl: pl.DataFrame, meta: TraceMeta) -> None:
    """Warnings (and stats) for kernels without a launch, graph replays, and host-side
    collectives without device kernels."""
    # counts and sums over the columns they read (a filter of the op table copied every
    # column of the rows it kept: nearly the whole table for the kernel count)
    n_kernels = ops.select(((pl.col("kind") != "memcpy") & (pl.col("kind") != "memset")).sum()).item()
    if n_kernels:
        no_launch = pl.col("launch_start_ns").is_null()
        n_unlinked, unlinked_ns = ops.select(no_launch.sum(), pl.col("dur_ns").filter(no_launch).sum()).row(0)
        if n_unlinked:
            share = unlinked_ns / max(ops["dur_ns"].sum(), 1)
            meta.stats["unlinked_device_ops"] = n_unlinked
            meta.warn(
                f"{n_unlinked} device ops ({share:.1%} of device time) have no host launch in "
                "the trace window (no matching correlation); they have no framework op or shapes"
            )
    n_graph = int(ops["graph"].sum())
    if n_graph:
        meta.stats["graph_kernels"] = n_graph
        share = ops.select(pl.col("dur_ns").filter("graph").sum()).item() / max(ops["dur_ns"].sum(), 1)
        meta.warn(
            f"{n_graph} kernels ({share:.1%} of device time) were replayed from CUDA/HIP graphs: "
            "their per-op attribution and shapes are unavailable"
        )
    # a count of the names (a filter of the table would copy every host column); null names never match
    cpu_colls = int(host_tbl["name"].str.contains(r"^(nccl|rccl|gloo):").sum())
    if cpu_colls and not ops.select((pl.col("kind") == "collective").any()).item():
        meta.warn(
            f"{cpu_colls} host-side collective annotations (nccl:/gloo:) but no device collective "
            "kernels: communication time cannot be measured on the device"
        )


def _drop_invalid_durations(df: pl.DataFrame, meta: TraceMeta, what: str) -> pl.DataFrame:
    bad = df.filter(pl.col("dur_ns") < 0)
    if bad.height:
        meta.stats[f"negative_duration_{what}_events"] = bad.height
        meta.warn(
            f"{bad.height} {what} events with a negative duration in the input were excluded "
            f"(first: {bad['name'][0]!r})"
        )
        df = df.filter(~(pl.col("dur_ns") < 0))
    missing = df.filter(pl.col("ts_ns").is_null())
    if missing.height:
        meta.stats[f"untimed_{what}_events"] = missing.height
        meta.warn(f"{missing.height} {what} events without a readable 'ts' were skipped")
        df = df.filter(pl.col("ts_ns").is_not_null())
    return df.with_columns(pl.col("dur_ns").fill_null(0))


def _host_table(box: list[pl.DataFrame], origin: int, rank: int) -> pl.DataFrame:
    """The host table of one file, sorted by start: ``box`` holds the unsorted frame and is
    emptied, so each unsorted column is freed as soon as its sorted copy exists (peak: the
    table plus one column, not two tables)."""
    h = box.pop().with_columns(
        pl.lit(rank, dtype=pl.Int32).alias("rank"),
        (pl.col("ts_ns") - origin).alias("start_ns"),
    )
    h = conform(h, HOST_SCHEMA).select(list(HOST_SCHEMA))
    # == h.sort("start_ns") (the same permutation, the same column flags)
    order = h["start_ns"].arg_sort()
    box.append(h)
    del h
    return _gather_by_column(box, order).with_columns(pl.col("start_ns").set_sorted())


#: a frame up to this many bytes (``DataFrame.estimated_size``) is gathered in one operation,
#: holding a second copy of it at most this big; a larger one a column at a time
GATHER_AT_ONCE_BYTES = 16 << 20


def _gather_by_column(box: list[pl.DataFrame], order: pl.Series) -> pl.DataFrame:
    """The frame ``box`` holds (which is emptied) with its rows in ``order`` (row indices), a
    column at a time: each column is gathered, then dropped from the source, so the peak is
    the frame plus one column (sorting the whole frame at once, or a join, holds a second
    copy of every column). A frame of at most :data:`GATHER_AT_ONCE_BYTES` is gathered in one
    operation (the same rows; its second copy is that small). ``order`` is an integer sort
    key computed once (``arg_sort`` / ``arg_sort_by``): the same permutation
    ``DataFrame.sort`` takes."""
    h = box.pop()
    if h.estimated_size() <= GATHER_AT_ONCE_BYTES:
        # one polars operation instead of two per column (~0.1 ms each: on bert, 2 instead
        # of 74 of the read's 182)
        return h.select(pl.all().gather(order))
    cols = []
    for c in list(h.columns):
        cols.append(h.select(pl.col(c).gather(order)))
        h = h.drop(c)
    return pl.concat(cols, how="horizontal") if cols else h


def assign_steps(ops: pl.DataFrame, host: pl.DataFrame, meta: TraceMeta) -> pl.DataFrame:
    """Fill ``ops.step`` from the step markers' windows
    (:func:`~traceroof.step_markers.device_and_host_windows`).

    A kernel belongs to the step during which the host launched it (its launch call lies in
    the CPU-side ``ProfilerStep#N``); kernels without a launch use the device-side
    ``ProfilerStep#N`` (``gpu_user_annotation``) window, else the CPU window, by device start.
    """
    gpu_steps, cpu_steps = device_and_host_windows(host)  # one scan of the host names
    if cpu_steps.height == 0:
        return ops
    ops = ops.with_row_index("_row")

    def _lookup(times: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
        s = steps.select(pl.col("start_ns").alias("_t"), "step", "end_ns")
        j = times.sort("_t").join_asof(s, on="_t", strategy="backward")
        return j.with_columns(pl.when(pl.col("_t") < pl.col("end_ns")).then(pl.col("step")).alias("step")).select(
            "_row", "step"
        )

    t_launch = ops.filter(pl.col("launch_start_ns").is_not_null()).select("_row", pl.col("launch_start_ns").alias("_t"))
    t_dev = ops.filter(pl.col("launch_start_ns").is_null()).select("_row", pl.col("start_ns").alias("_t"))
    parts = []
    if t_launch.height:
        parts.append(_lookup(t_launch, cpu_steps))
    if t_dev.height:
        parts.append(_lookup(t_dev, gpu_steps if gpu_steps.height else cpu_steps))
    found = pl.concat(parts) if parts else pl.DataFrame(schema={"_row": pl.UInt32, "step": pl.Int32})
    # every row is in ``found`` once (with a launch or without): its steps, put in row order by
    # their integer key, replace the column (no join, no sort of the whole table)
    step = found.sort("_row")["step"] if found.height == ops.height else (
        ops.select("_row").join(found, on="_row", how="left", maintain_order="left")["step"])
    return ops.drop("_row").with_columns(step.cast(OP_SCHEMA["step"]).alias("step")).select(list(OP_SCHEMA))
