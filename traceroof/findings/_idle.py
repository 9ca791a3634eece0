"""Device-idle gaps, their cause, and which detector owns each one.

The device of a rank is idle wherever no device op of any stream runs: the gaps between the
intervals of the union of all its ops (BC-33: never per-stream sums). Each gap is attributed
to exactly one cause, so the idle-type detectors (``launch_bound``, ``device_idle``,
``host_device_copies``) never claim the same nanosecond twice:

============  ===========================================================================
label         the gap before device op *n* (the first op after the gap) ...
============  ===========================================================================
``graph``     touches a CUDA/HIP graph replay (op *n* or the op before it is a graph
              kernel, or the gap lies inside a graph's span): not attributable from CPU-side
              timing (BC-13); nobody claims it
``sync``      contains the return of a host synchronization that began before the device
              ran dry (``cudaDeviceSynchronize``, ``cudaStreamSynchronize``, a synchronous
              ``cudaMemcpy`` ...): owned by ``host_device_copies``
``unknown``   op *n* has no host launch in the trace: cause unknown, owned by
              ``device_idle`` when large
``wait``      op *n* was submitted before the device went idle, or started more than
              :data:`QUEUE_WAIT_NS` after its launch call returned: it waited on another
              stream, an event or device work the trace did not record; not host-bound,
              nobody claims it
``launch``    the host submitted op *n* only after the device went idle, and its launch
              followed the previous launch on the same host thread within
              :data:`LAUNCH_SPACING_MAX_NS`: the host is busy launching
``host``      the host submitted op *n* after the device went idle, after a longer pause:
              the host was doing something else (host-bound)
============  ===========================================================================

``launch`` gaps inside a launch-bound *stretch* (see :func:`stretches`) are owned by
``launch_bound``; every other ``launch``, ``host`` or ``unknown`` gap of at least
:data:`IDLE_MIN_GAP_NS` is owned by ``device_idle``.
"""

from __future__ import annotations

import polars as pl

from . import FindingContext

#: Longest host-side spacing between two consecutive launch calls on one thread for the
#: host to count as "busy launching" (eager PyTorch spends ~5-50 µs of framework overhead per op).
LAUNCH_SPACING_MAX_NS = 100_000
#: A launch-bound stretch has at least this many device ops ...
STRETCH_MIN_OPS = 16
#: ... and keeps the device busy at most this share of its span.
STRETCH_MAX_BUSY = 0.75
#: Gaps shorter than this are launch latency, not idle worth claiming (device_idle).
IDLE_MIN_GAP_NS = 10_000
#: A kernel that starts later than this after its launch call returned, on an idle device,
#: was waiting for something other than the host (an event, another stream, unrecorded work).
QUEUE_WAIT_NS = 20_000
#: Clock tolerance when matching a host sync's return to a device gap.
SYNC_TOL_NS = 2_000
#: Host runtime calls that block the calling thread until the device (or a stream) drains.
SYNC_RE = (
    r"(?i)^(cuda|hip)(Device|Stream|Event|Ctx|Thread)Synchronize|^cu(Ctx|Stream|Event)Synchronize"
    r"|^(cuda|hip)Memcpy(2D|3D)?$|^hipMemcpyWithStream$|^cuMemcpy(DtoH|HtoD)(_v2)?$"
)
#: A copy call that ran at least this long on the host blocked it (pageable memory).
SYNC_COPY_MIN_NS = 20_000
#: Host runtime calls that submit device work (their spacing is the launch interval).
LAUNCH_RE = r"(?i)launch|memcpy|memset"

#: owner labels
OWNER_LAUNCH = "launch_bound"
OWNER_IDLE = "device_idle"
OWNER_SYNC = "host_device_copies"


def _host_launches(host: pl.DataFrame) -> pl.DataFrame:
    """Launch calls with the spacing to the previous launch call on the same host thread."""
    rt = host.filter(
        pl.col("cat") == "runtime", pl.col("correlation").is_not_null(), pl.col("name").str.contains(LAUNCH_RE)
    ).sort("rank", "thread", "start_ns")
    rt = rt.with_columns(
        (pl.col("start_ns") - pl.col("start_ns").shift(1).over("rank", "thread")).alias("spacing_ns")
    )
    return rt.unique(["rank", "correlation"], keep="first").select(
        "rank", "correlation", pl.col("thread").alias("launch_thread"), "spacing_ns"
    )


def host_syncs(host: pl.DataFrame) -> pl.DataFrame:
    """Host synchronizations: ``rank, name, sync_start_ns, sync_end_ns`` (sorted by end)."""
    is_rt = pl.col("cat") == "runtime"
    sel = host.filter(
        (is_rt & pl.col("name").str.contains(SYNC_RE))
        | (is_rt & pl.col("name").str.contains("(?i)memcpy") & (pl.col("dur_ns") >= SYNC_COPY_MIN_NS))
        | (pl.col("cat") == "sync")
    )
    return sel.select(
        "rank", "name", pl.col("start_ns").alias("sync_start_ns"),
        (pl.col("start_ns") + pl.col("dur_ns")).alias("sync_end_ns"),
    ).sort("sync_end_ns")


def timeline(ctx: FindingContext) -> pl.DataFrame:
    """The device ops of every (rank, device), in start order, each with the idle gap before it.

    Columns added to the op table: ``end_ns``, ``gap_ns`` (idle before the op, > 0 only where
    the union of all earlier ops ends before it starts), ``gap_start_ns``, ``label`` (see
    the module docstring; ``none`` when there is no gap), ``spacing_ns`` (host launch spacing),
    ``stretch`` (id within the rank/device), ``owner`` (the detector that claims the gap, or
    null) and ``sync_name``.
    """
    if "timeline" in ctx.cache:
        return ctx.cache["timeline"]
    g = ["rank", "device"]
    ops = ctx.ops.select(
        "rank", "device", "stream", "name", "op", "kind", "start_ns", "dur_ns", "step", "graph",
        "launch_start_ns", "launch_dur_ns", "correlation",
    ).with_columns(pl.col("graph").fill_null(False), (pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns"))
    ops = ops.sort(*g, "start_ns", "end_ns").with_row_index("_row")
    ops = ops.with_columns(pl.col("end_ns").cum_max().over(g).alias("_cm"))
    ops = ops.with_columns(
        pl.col("_cm").shift(1).over(g).alias("gap_start_ns"),
        # graph flag of the op holding the running max end (the op the device finished last)
        pl.when(pl.col("end_ns") >= pl.col("_cm")).then(pl.col("graph")).alias("_holder"),
    )
    ops = ops.with_columns(pl.col("_holder").forward_fill().over(g).alias("_holder"))
    ops = ops.with_columns(
        (pl.col("start_ns") - pl.col("gap_start_ns")).clip(lower_bound=0).fill_null(0).alias("gap_ns"),
        pl.col("_holder").shift(1).over(g).fill_null(False).alias("prev_graph"),
    ).drop("_cm", "_holder")

    # host launch spacing
    ops = ops.join(_host_launches(ctx.host), on=["rank", "correlation"], how="left")

    # graph spans: a gap inside one is not attributable
    spans = (
        ops.filter("graph")
        .group_by(*g, "correlation")
        .agg(pl.col("start_ns").min().alias("gs"), pl.col("end_ns").max().alias("ge"))
        .sort("gs")
    )
    gaps = ops.filter(pl.col("gap_ns") > 0).with_row_index("_gi")
    if spans.height and gaps.height:
        j = gaps.select("_gi", *g, "gap_start_ns").sort("gap_start_ns").join_asof(
            spans.select(*g, "gs", "ge"), left_on="gap_start_ns", right_on="gs", by=g, strategy="backward",
            check_sortedness=False,
        )
        in_span = j.select("_gi", (pl.col("ge").is_not_null() & (pl.col("gap_start_ns") < pl.col("ge"))).alias("in_graph"))
        gaps = gaps.join(in_span, on="_gi", how="left")
    else:
        gaps = gaps.with_columns(pl.lit(False).alias("in_graph"))

    # host syncs whose return lies in the gap and that began before the device ran dry
    syncs = host_syncs(ctx.host)
    if syncs.height and gaps.height:
        base = gaps.select("_gi", "rank", "gap_start_ns", "start_ns")
        back = base.with_columns((pl.col("start_ns") + SYNC_TOL_NS).alias("_t")).sort("_t").join_asof(
            syncs, left_on="_t", right_on="sync_end_ns", by="rank", strategy="backward",
            check_sortedness=False,
        )
        fwd = base.with_columns((pl.col("gap_start_ns") - SYNC_TOL_NS).alias("_t")).sort("_t").join_asof(
            syncs, left_on="_t", right_on="sync_end_ns", by="rank", strategy="forward",
            check_sortedness=False,
        )

        def ok(df: pl.DataFrame) -> pl.DataFrame:
            good = (
                pl.col("sync_end_ns").is_not_null()
                & (pl.col("sync_end_ns") >= pl.col("gap_start_ns") - SYNC_TOL_NS)
                & (pl.col("sync_end_ns") <= pl.col("start_ns") + SYNC_TOL_NS)
                & (pl.col("sync_start_ns") <= pl.col("gap_start_ns") + SYNC_TOL_NS)
            )
            return df.select("_gi", pl.when(good).then(pl.col("name")).alias("sync_name"))

        sy = ok(back).join(ok(fwd), on="_gi", how="full", coalesce=True, suffix="_f").select(
            "_gi", pl.coalesce("sync_name", "sync_name_f").alias("sync_name")
        )
        gaps = gaps.join(sy, on="_gi", how="left")
    else:
        gaps = gaps.with_columns(pl.lit(None, dtype=pl.String).alias("sync_name"))

    launch_end = pl.col("launch_start_ns") + pl.col("launch_dur_ns")
    label = (
        pl.when(pl.col("graph") | pl.col("prev_graph") | pl.col("in_graph").fill_null(False))
        .then(pl.lit("graph"))
        .when(pl.col("sync_name").is_not_null())
        .then(pl.lit("sync"))
        .when(pl.col("launch_start_ns").is_null())
        .then(pl.lit("unknown"))
        .when((launch_end <= pl.col("gap_start_ns")) | (pl.col("start_ns") - launch_end > QUEUE_WAIT_NS))
        .then(pl.lit("wait"))
        .when(pl.col("spacing_ns").is_not_null() & (pl.col("spacing_ns") <= LAUNCH_SPACING_MAX_NS))
        .then(pl.lit("launch"))
        .otherwise(pl.lit("host"))
    )
    gaps = gaps.with_columns(label.alias("label"))
    ops = ops.join(gaps.select("_row", "label", "sync_name"), on="_row", how="left").with_columns(
        pl.col("label").fill_null("none")
    )
    ops = ops.sort("_row")

    # stretches: runs of ops separated only by no gap or by launch gaps, within one step
    graph_steps = ops.filter("graph").select("rank", "step").unique().with_columns(pl.lit(True).alias("graph_step"))
    ops = ops.join(graph_steps, on=["rank", "step"], how="left", nulls_equal=True).with_columns(
        pl.col("graph_step").fill_null(False)
    ).sort("_row")
    first = pl.int_range(pl.len()).over(g) == 0
    step_change = pl.col("step").ne_missing(pl.col("step").shift(1).over(g))
    brk = first | ~pl.col("label").is_in(["none", "launch"]) | step_change | pl.col("graph")
    ops = ops.with_columns(brk.cast(pl.Int64).cum_sum().over(g).alias("stretch"), brk.alias("_brk"))
    st = stretches_of(ops)
    ops = ops.join(st.select(*g, "stretch", "qualifies"), on=[*g, "stretch"], how="left").sort("_row")
    ops = ops.with_columns(pl.col("qualifies").fill_null(False))

    inner_launch = (pl.col("label") == "launch") & ~pl.col("_brk") & pl.col("qualifies")
    owner = (
        pl.when(pl.col("label") == "sync")
        .then(pl.lit(OWNER_SYNC))
        .when(inner_launch)
        .then(pl.lit(OWNER_LAUNCH))
        .when(pl.col("label").is_in(["launch", "host", "unknown"]) & (pl.col("gap_ns") >= IDLE_MIN_GAP_NS))
        .then(pl.lit(OWNER_IDLE))
        .otherwise(pl.lit(None, dtype=pl.String))
    )
    ops = ops.with_columns(owner.alias("owner")).drop("_brk")
    ctx.cache["timeline"] = ops
    ctx.cache["stretches"] = st
    return ops


def stretches_of(ops: pl.DataFrame) -> pl.DataFrame:
    """Aggregate the ``stretch`` ids of a timeline: size, span, busy share, launch gaps.

    ``qualifies`` (launch-bound) when the stretch has at least :data:`STRETCH_MIN_OPS` ops, keeps
    the device busy at most :data:`STRETCH_MAX_BUSY` of its span, its median kernel is shorter
    than its median host launch spacing, it has a launch gap, and its step replays no graph.
    Only stretches of :data:`STRETCH_MIN_OPS` ops or more are aggregated (the others cannot qualify).
    """
    g = ["rank", "device"]
    inner = ~pl.col("_brk")
    big = ops.filter(pl.len().over(*g, "stretch") >= STRETCH_MIN_OPS)
    schema_extra = {"qualifies": pl.Boolean}
    if big.height == 0:
        return pl.DataFrame(schema={"rank": pl.Int32, "device": pl.Int32, "stretch": pl.Int64, **schema_extra})
    st = big.group_by(*g, "stretch").agg(
        pl.len().alias("ops"),
        pl.col("step").first(),
        pl.col("start_ns").min().alias("start_ns"),
        pl.col("end_ns").max().alias("end_ns"),
        pl.col("gap_ns").filter(inner).sum().alias("inner_gap_ns"),
        pl.col("gap_ns").filter(inner & (pl.col("label") == "launch")).sum().alias("launch_gap_ns"),
        (inner & (pl.col("label") == "launch")).sum().alias("launch_gaps"),
        pl.col("dur_ns").median().alias("median_dur_ns"),
        pl.col("spacing_ns").median().alias("median_spacing_ns"),
        pl.col("launch_dur_ns").median().alias("median_launch_call_ns"),
        pl.col("graph_step").any().alias("graph_step"),
    )
    st = st.with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("span_ns"))
    st = st.with_columns((pl.col("span_ns") - pl.col("inner_gap_ns")).alias("busy_ns"))
    st = st.with_columns(
        pl.when(pl.col("span_ns") > 0).then(pl.col("busy_ns") / pl.col("span_ns")).otherwise(1.0).alias("busy_fraction")
    )
    q = (
        (pl.col("ops") >= STRETCH_MIN_OPS)
        & (pl.col("busy_fraction") <= STRETCH_MAX_BUSY)
        & (pl.col("median_dur_ns") < pl.col("median_spacing_ns")).fill_null(False)
        & (pl.col("launch_gaps") > 0)
        & ~pl.col("graph_step")
    )
    return st.with_columns(q.alias("qualifies")).sort(*g, "start_ns")


def stretches(ctx: FindingContext) -> pl.DataFrame:
    """The stretch table of :func:`timeline` (computed with it)."""
    timeline(ctx)
    return ctx.cache["stretches"]


def claimed(ctx: FindingContext, owner: str) -> pl.DataFrame:
    """The timeline rows whose preceding gap ``owner`` claims."""
    return timeline(ctx).filter(pl.col("owner") == owner)
