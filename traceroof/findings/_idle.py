"""Device-idle gaps, their cause, and which detector owns each one.

The device of a rank is idle wherever no device op of any stream runs: the gaps between the
intervals of the union of all its ops (BC-33: never per-stream sums). Each gap is attributed
to exactly one cause, so the idle-type detectors (``launch_bound``, ``device_idle``,
``host_device_copies``) never claim the same nanosecond twice:

============  ===========================================================================
label         the gap before device op *n* (the first op after the gap) ...
============  ===========================================================================
``graph``     touches a CUDA/HIP graph replay (op *n* or the op before it is a graph
              kernel, or the gap lies inside a graph's span) or a graph-capture window
              (:mod:`traceroof.graph_capture`): not attributable from CPU-side timing
              (BC-13), not host-bound; nobody claims it
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

from .. import graph_capture
from ..frames import done, small, smalls
from . import FindingContext
from ._common import device_order, name_tests

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

#: dtypes of the ``label`` and ``owner`` columns: Enums (integers underneath, cheap to build and
#: compare) whose categories are in lexical order, so they sort like the strings
LABEL = pl.Enum(["graph", "host", "launch", "none", "sync", "unknown", "wait"])
OWNER = pl.Enum(sorted([OWNER_IDLE, OWNER_LAUNCH, OWNER_SYNC]))


#: the name tests the timeline needs (:func:`~traceroof.findings._common.name_tests`)
_NAME_TESTS = {"launch": LAUNCH_RE, "sync": SYNC_RE, "memcpy": "(?i)memcpy"}


def _host_calls(host: pl.DataFrame) -> pl.DataFrame:
    """The host runtime calls and sync events (categories ``runtime`` and ``sync``), narrow:
    ``host_row`` (UInt32: the row in ``host``), ``rank``, ``thread``, ``name``, ``start_ns``,
    ``dur_ns``, ``correlation`` and ``runtime`` (true for a runtime call, false for a sync
    event). The category is tested once per row as two string equalities (cheaper than an
    ``is_in``), and the narrow columns are filtered, never the whole host table."""
    cat = host["cat"]
    runtime = cat == "runtime"
    return done(small(host).select(
        pl.int_range(pl.len(), dtype=pl.UInt32).alias("host_row"),
        "rank", "thread", "name", "start_ns", "dur_ns", "correlation", runtime.alias("runtime"),
    ).filter(runtime | (cat == "sync")))


def _host_launches(calls: pl.DataFrame, launch: pl.Series) -> pl.DataFrame:
    """Launch calls with the spacing to the previous launch call on the same host thread.

    ``calls``: :func:`_host_calls`; ``launch``: per row, whether its name matches
    :data:`LAUNCH_RE`. Returns the runtime calls that carry a correlation id and a launch
    name, in ``(rank, thread, start_ns)`` order: ``rank``, ``correlation``, ``launch_row`` (the
    call's row in the host table) and ``spacing_ns`` (start minus the previous launch's start
    on the thread, ns; null on a thread's first).
    """
    rt = small(calls).select("rank", "thread", "start_ns", "correlation", "host_row").filter(
        launch & calls["runtime"] & calls["correlation"].is_not_null()
    )
    rt = rt.sort("rank", "thread", "start_ns")
    same_thread = pl.col("rank").eq_missing(pl.col("rank").shift(1)) & pl.col("thread").eq_missing(
        pl.col("thread").shift(1)
    )
    spacing = pl.when(same_thread).then(pl.col("start_ns") - pl.col("start_ns").shift(1))
    return done(rt.select("rank", "correlation", pl.col("host_row").alias("launch_row"), spacing.alias("spacing_ns")))


def _attach_launches(tl: pl.DataFrame, launches: pl.DataFrame) -> pl.DataFrame:
    """``tl`` with the ``launch_row`` and ``spacing_ns`` of the launch call that has its
    ``(rank, correlation)``; when several do, the first in ``launches``' order (as
    ``unique(keep="first")`` then a left join would give)."""
    cols = ["launch_row", "spacing_ns"]
    if launches.height == 0:
        return tl.with_columns(pl.lit(None, launches.schema[c]).alias(c) for c in cols)
    bounds = [
        df.select(
            pl.col("rank").min().alias("r0"), pl.col("rank").max().alias("r1"),
            pl.col("correlation").min().alias("c0"), pl.col("correlation").max().alias("c1"),
        ).row(0)
        for df in (tl, launches)
    ]
    fits = all(
        r0 is None or (c0 is not None and c0 >= 0 and c1 < 2**32 and -(2**29) <= r0 and r1 < 2**29)
        for r0, r1, c0, c1 in bounds
    )
    if not fits:  # ids outside the packed key's range: a hash join
        first = launches.unique(["rank", "correlation"], keep="first", maintain_order=True)
        return tl.join(first, on=["rank", "correlation"], how="left", maintain_order="left")
    # One Int64 key per (rank, correlation) and a merge (as-of join on sorted keys) instead of a
    # hash join. The stable sort keeps the launches of one key in ``launches``' order, so the
    # first of each run of equal keys is the first launch call of that key.
    key = (pl.col("rank").cast(pl.Int64) * 2**32 + pl.col("correlation")).alias("_k")
    lk = _sorted_by(launches.select(key, *cols).filter(pl.col("_k").is_not_null()), "_k")
    lk = lk.filter(pl.col("_k").ne_missing(pl.col("_k").shift(1))).with_columns(pl.col("_k").alias("_hit"))
    exact = pl.col("_hit") == pl.col("_k")  # null for ops without a correlation id
    want = tl.select(key)
    if want["_k"].null_count() == 0 and want["_k"].is_sorted():
        # the ops are in key order already (one launch thread per rank, ids in time order): the
        # as-of join keeps that order, so nothing is sorted or put back
        j = want.join_asof(lk, on="_k", strategy="backward", check_sortedness=False)
        return pl.concat([tl, j.select(pl.when(exact).then(pl.col(c)).alias(c) for c in cols)], how="horizontal")
    want = want.with_row_index("_i").sort("_k", maintain_order=True)
    j = want.join_asof(lk, on="_k", strategy="backward", check_sortedness=False)
    j = j.select("_i", *(pl.when(exact).then(pl.col(c)).alias(c) for c in cols)).sort("_i")
    return pl.concat([tl, j.drop("_i")], how="horizontal")


def _sorted_by(df: pl.DataFrame, col: str) -> pl.DataFrame:
    """``df`` stably sorted by the null-free column ``col``; no sort when it already is (one
    pass to check: launches and ops often come in key order)."""
    return df if df[col].is_sorted() else df.sort(col, maintain_order=True)


def host_syncs(host: pl.DataFrame) -> pl.DataFrame:
    """Host synchronizations: ``rank, name, sync_start_ns, sync_end_ns`` (sorted by end).

    A synchronizing runtime call (:data:`SYNC_RE`), a runtime copy call that ran at least
    :data:`SYNC_COPY_MIN_NS`, or an event of category ``sync``.
    """
    calls = _host_calls(host)
    tests = name_tests(calls["name"], _NAME_TESTS)
    return _syncs(calls, tests["sync"], tests["memcpy"])


def _syncs(calls: pl.DataFrame, sync: pl.Series, memcpy: pl.Series) -> pl.DataFrame:
    """:func:`host_syncs` from :func:`_host_calls` and, per row, whether the name matches
    :data:`SYNC_RE` (``sync``) and contains ``memcpy`` (``memcpy``)."""
    runtime = calls["runtime"]
    sel = calls.filter((runtime & sync) | (runtime & memcpy & (calls["dur_ns"] >= SYNC_COPY_MIN_NS)) | ~runtime)
    return sel.select(
        "rank", "name", pl.col("start_ns").alias("sync_start_ns"),
        (pl.col("start_ns") + pl.col("dur_ns")).alias("sync_end_ns"),
    ).sort("sync_end_ns")


def _in_graph_span(gaps: pl.DataFrame, tl: pl.DataFrame) -> pl.Series:
    """Per gap (rows of ``gaps``, in order): whether it starts inside the span of a graph launch
    (first to last kernel of one correlation id) on its rank/device."""
    g = ["rank", "device"]
    spans = (
        tl.filter("graph")
        .group_by(*g, "correlation", maintain_order=True)
        .agg(pl.col("start_ns").min().alias("gs"), pl.col("end_ns").max().alias("ge"))
        .sort("gs", maintain_order=True)
    )
    j = gaps.select("_gi", *g, "gap_start_ns").sort("gap_start_ns", maintain_order=True).join_asof(
        spans.select(*g, "gs", "ge"), left_on="gap_start_ns", right_on="gs", by=g, strategy="backward",
        check_sortedness=False,
    )
    inside = pl.col("ge").is_not_null() & (pl.col("gap_start_ns") < pl.col("ge"))
    return j.select("_gi", inside.alias("in_graph")).sort("_gi")["in_graph"]


def _in_graph(ops: pl.DataFrame, caps: pl.DataFrame) -> pl.Series:
    """``in_graph`` of every timeline row (:func:`_in_graph_span`, on the rows with a gap only;
    false elsewhere), or its gap overlaps a graph-capture window of its rank (``caps``,
    :func:`traceroof.graph_capture.windows`: launches there have no device op by design, so
    the device is not idle for the host). Only called when some op is a graph kernel or the
    host captured a graph."""
    at = ops.select(pl.arg_where(pl.col("gap_ns") > 0)).to_series()
    gaps = ops.select("rank", "device", "gap_start_ns")[at].with_row_index("_gi")
    inside = _in_graph_span(gaps, ops) if gaps.height else pl.Series("in_graph", [], pl.Boolean)
    out = _scatter(ops.height, at, inside.alias("in_graph"), False)
    if caps.height:
        # a gap overlaps a window when the window starts before the op after the gap and ends
        # after the gap starts: the latest window starting before the op (by rank), with the
        # running max of the window ends (windows of several threads may overlap)
        m = (caps.select(pl.col("rank").cast(ops.schema["rank"]), pl.col("start_ns").alias("_cs"),
                         pl.col("end_ns").alias("_ce"))
             .sort("rank", "_cs").with_columns(pl.col("_ce").cum_max().over("rank")).sort("_cs"))
        j = (ops.select("rank", "start_ns", "gap_start_ns", "gap_ns").with_row_index("_i").sort("start_ns")
             .join_asof(m, left_on="start_ns", right_on="_cs", by="rank", strategy="backward",
                        allow_exact_matches=False, check_sortedness=False))
        hit = ((pl.col("gap_ns") > 0) & (pl.col("gap_start_ns") < pl.col("_ce"))).fill_null(False)
        out = out | j.sort("_i").select(hit.alias("in_graph"))["in_graph"]
    return out


def _sync_names(ops: pl.DataFrame, syncs: pl.DataFrame) -> pl.Series:
    """Per timeline row: the host sync whose return lies in the gap before it (within
    :data:`SYNC_TOL_NS`) and that began before the device ran dry, else null (also when there
    is no gap). The last sync returning by the gap's end is tried first, then the first
    returning after its start."""
    good = (
        pl.col("sync_end_ns").is_not_null()
        & (pl.col("sync_end_ns") >= pl.col("gap_start_ns") - SYNC_TOL_NS)
        & (pl.col("sync_end_ns") <= pl.col("start_ns") + SYNC_TOL_NS)
        & (pl.col("sync_start_ns") <= pl.col("gap_start_ns") + SYNC_TOL_NS)
    )
    out = pl.repeat(None, ops.height, dtype=pl.String, eager=True).alias("sync_name")
    # Only a gap whose window [gap_start − tol, start + tol] holds the return of a sync of its
    # rank can pass ``good``; the joins below run on those few. A row's as-of match does not
    # depend on the other rows, so the result is the same as over every gap.
    at = _near_syncs(ops, syncs)
    if at.len() == 0:
        return out
    base = ops.select("rank", "gap_start_ns", "start_ns")[at].with_columns(at.alias("_gi"))

    def nearest(t: pl.Expr, strategy: str) -> pl.Series:
        b, sy = smalls(base, syncs)
        j = b.with_columns(t.alias("_t")).sort("_t", maintain_order=True).join_asof(
            sy, left_on="_t", right_on="sync_end_ns", by="rank", strategy=strategy, check_sortedness=False,
        )  # (one lazy plan on small tables, :mod:`traceroof.frames`)
        return done(j.select("_gi", pl.when(good).then(pl.col("name")).alias("sync_name")).sort("_gi"))["sync_name"]

    back = nearest(pl.col("start_ns") + SYNC_TOL_NS, "backward")
    fwd = nearest(pl.col("gap_start_ns") - SYNC_TOL_NS, "forward")
    return out.scatter(at, pl.select(pl.coalesce(back, fwd)).to_series())


def _near_syncs(ops: pl.DataFrame, syncs: pl.DataFrame) -> pl.Series:
    """The timeline rows (UInt32 indices, increasing) with a gap whose window
    ``[gap_start_ns − SYNC_TOL_NS, start_ns + SYNC_TOL_NS]`` holds the end of a sync of the
    same rank.

    Within one (rank, device) the rows are in start order and ``gap_start_ns`` (the cover of
    the earlier ops) never decreases, so the rows whose window holds a time ``t`` are one
    contiguous run: from the first with ``start ≥ t − tol`` to the last with ``gap_start ≤ t +
    tol``. Lifting each (rank, device) ``g`` by ``g × span`` (as
    :func:`~traceroof.findings._common.group_cum_max` does; queries clamped into the span)
    makes both columns sorted over the whole table, so two binary searches per (sync, device)
    find each run: the work grows with the syncs, not with the rows.
    """
    ok = syncs.select("rank", "sync_end_ns").drop_nulls()
    if ok.height == 0 or ops.height == 0:
        return pl.Series([], dtype=pl.UInt32)
    lo, hi = ops.select(
        pl.min_horizontal(pl.col("start_ns").min(), pl.col("gap_start_ns").min()).alias("lo"),
        pl.max_horizontal(pl.col("start_ns").max(), pl.col("gap_start_ns").max()).alias("hi"),
    ).row(0)
    firsts = ops["new_group"].arg_true()
    if ops["start_ns"].null_count() or (hi - lo + 1) * (firsts.len() + 1) >= 2**62:
        # lifting is not possible: test every row against every sync end (of any rank)
        ends = syncs["sync_end_ns"].drop_nulls()
        gap_start = ops["gap_start_ns"].fill_null(ops["start_ns"]).fill_null(0)
        lo_i = ends.search_sorted(gap_start - SYNC_TOL_NS, side="left")
        hi_i = ends.search_sorted(ops["start_ns"].fill_null(0) + SYNC_TOL_NS, side="right")
        return ((hi_i > lo_i) & (ops["gap_ns"] > 0)).arg_true()
    span = hi - lo + 1
    # (one group needs no lift)
    lift = (pl.col("new_group").cast(pl.Int64).cum_sum() - 1) * span - lo if firsts.len() > 1 else pl.lit(-lo)
    lifted = done(
        small(ops).select(pl.col("start_ns"), pl.col("gap_start_ns").fill_null(lo), lift.alias("_lift"))
        .select((pl.col("start_ns") + pl.col("_lift")).alias("s"), (pl.col("gap_start_ns") + pl.col("_lift")).alias("g")))
    groups = ops.select("rank").gather(firsts).with_row_index("_g")
    groups, ok_ = smalls(groups, ok)  # (one lazy plan on small tables, :mod:`traceroof.frames`)
    q = done(groups.with_columns(pl.col("_g").cast(pl.Int64)).join(ok_, on="rank").select(
        (pl.col("_g") * span + (pl.col("sync_end_ns") - SYNC_TOL_NS - lo).clip(0, span)).alias("a"),
        (pl.col("_g") * span + (pl.col("sync_end_ns") + SYNC_TOL_NS - lo).clip(-1, span - 1)).alias("b"),
    ))
    runs = pl.DataFrame([
        lifted["s"].search_sorted(q["a"], side="left").alias("a"),
        lifted["g"].search_sorted(q["b"], side="right").alias("b"),
    ]).filter(pl.col("b") > pl.col("a"))
    rows = runs.select(pl.int_ranges("a", "b", dtype=pl.UInt32).explode().unique().sort()).to_series()
    return rows.filter(ops["gap_ns"].gather(rows) > 0)


def _scatter(n: int, at: pl.Series, values: pl.Series, fill: object) -> pl.Series:
    """A Series of length ``n`` holding ``fill``, with ``values`` put at the rows ``at``."""
    if at.len() == n:  # every row (``at`` is increasing)
        return values
    out = pl.repeat(fill, n, dtype=values.dtype, eager=True).alias(values.name)
    return out.scatter(at, values) if at.len() else out


def _label(graphs: bool) -> pl.Expr:
    """The ``label`` of the gap before each op (module docstring), from the timeline columns.
    ``graphs``: some op is a graph kernel (else the ``graph`` test is left out, and the
    timeline needs no ``in_graph`` column)."""
    launch_end = pl.col("launch_start_ns") + pl.col("launch_dur_ns")
    label = pl.when(pl.col("gap_ns") <= 0).then(pl.lit("none", LABEL))
    if graphs:
        label = label.when(pl.col("graph") | pl.col("prev_graph") | pl.col("in_graph")).then(pl.lit("graph", LABEL))
    return (
        label.when(pl.col("sync_name").is_not_null())
        .then(pl.lit("sync", LABEL))
        .when(pl.col("launch_start_ns").is_null())
        .then(pl.lit("unknown", LABEL))
        .when((launch_end <= pl.col("gap_start_ns")) | (pl.col("start_ns") - launch_end > QUEUE_WAIT_NS))
        .then(pl.lit("wait", LABEL))
        .when(pl.col("spacing_ns").is_not_null() & (pl.col("spacing_ns") <= LAUNCH_SPACING_MAX_NS))
        .then(pl.lit("launch", LABEL))
        .otherwise(pl.lit("host", LABEL))
        .alias("label")
    )


def _owner() -> pl.Expr:
    """The detector that claims the gap before each op (module docstring), or null."""
    inner_launch = (pl.col("label") == "launch") & ~pl.col("_brk") & pl.col("qualifies")
    return (
        pl.when(pl.col("label") == "sync")
        .then(pl.lit(OWNER_SYNC, OWNER))
        .when(inner_launch)
        .then(pl.lit(OWNER_LAUNCH, OWNER))
        .when(pl.col("label").is_in(["launch", "host", "unknown"]) & (pl.col("gap_ns") >= IDLE_MIN_GAP_NS))
        .then(pl.lit(OWNER_IDLE, OWNER))
        .otherwise(pl.lit(None, OWNER))
        .alias("owner")
    )


def _device_ops(ctx: FindingContext) -> pl.DataFrame:
    """:func:`~traceroof.findings._common.device_order` with the op columns the timeline reads
    (gathered by ``op_row``; ``dur_ns`` is ``end_ns − start_ns``, exactly) and ``prev_graph``
    (the op the device finished last before this one, the holder of the running max end, is a
    graph kernel)."""
    d = device_order(ctx)
    extra = ctx.ops.select("step", "graph", "launch_start_ns", "launch_dur_ns", "correlation")
    if not d["op_row"].is_sorted():  # sorted: the op table is in device order already (no gather)
        extra = extra.select(pl.all().gather(d["op_row"]))
    ops = pl.concat([d, extra], how="horizontal")
    ops = ops.with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("dur_ns"), pl.col("graph").fill_null(False))
    if not ops["graph"].any():
        return ops.with_columns(pl.lit(False).alias("prev_graph")).drop("cover_ns")
    # a device's first op always holds the running max, so the forward fill never crosses devices
    holder = pl.when(pl.col("end_ns") >= pl.col("cover_ns")).then(pl.col("graph")).forward_fill()
    prev_graph = pl.when(~pl.col("new_group")).then(holder.shift(1)).fill_null(False)
    return ops.with_columns(prev_graph.alias("prev_graph")).drop("cover_ns")


def timeline(ctx: FindingContext) -> pl.DataFrame:
    """The device ops of every (rank, device), in start order, each with the idle gap before it.

    A narrow table (no name strings): ``op_row`` (the op's row in ``ctx.ops``, for its name
    and op: :func:`with_names`), ``rank``, ``device``, ``start_ns``, ``end_ns``, ``dur_ns``,
    ``step``, ``graph``, ``launch_start_ns``, ``launch_dur_ns``, ``correlation``, ``gap_ns``
    (idle before the op, > 0 only where the union of all earlier ops ends before it starts),
    ``gap_start_ns``, ``prev_graph``, ``launch_row`` (the row in ``ctx.host`` of the op's launch
    call, for its thread: :func:`with_launch_thread`), ``spacing_ns`` (host launch spacing),
    ``sync_name``, ``label`` (an Enum, see the module docstring; ``none`` when there is no
    gap), ``graph_step``, ``stretch`` (id, unique in the table), ``qualifies`` (the stretch is
    launch-bound) and ``owner`` (an Enum: the detector that claims the gap, or null). Times in
    ns. Computed once per context, with :func:`stretches` (``ctx.shared``).
    """
    shared = ctx.shared

    def compute() -> pl.DataFrame:
        tl, shared.stretches = _timeline_and_stretches(ctx)  # the stretches first: set with it
        return tl

    return shared.once("timeline", compute)


def _timeline_and_stretches(ctx: FindingContext) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``(timeline, stretches)`` of a context, computed (:func:`timeline`)."""
    ops = _device_ops(ctx)
    caps = ctx.captures if ctx.captures is not None else graph_capture.windows(ctx.host)
    graphs = bool(ops["graph"].any()) or caps.height > 0
    calls = _host_calls(ctx.host)
    tests = name_tests(calls["name"], _NAME_TESTS)
    ops = _attach_launches(ops, _host_launches(calls, tests["launch"]))
    causes = [_sync_names(ops, _syncs(calls, tests["sync"], tests["memcpy"]))]
    if graphs:
        causes.append(_in_graph(ops, caps))
    # (one lazy plan on a small table, :mod:`traceroof.frames`)
    lops = small(ops).with_columns(*causes).with_columns(_label(graphs))
    if graphs:
        lops = lops.drop("in_graph")

    # stretches: runs of ops separated only by no gap or by launch gaps, within one step
    graph_step = pl.col("graph").any().over("rank", "step") if graphs else pl.lit(False)
    step_change = pl.col("step").ne_missing(pl.col("step").shift(1))
    brk = pl.col("new_group") | ~pl.col("label").is_in(["none", "launch"]) | step_change | pl.col("graph")
    # every device's first op breaks, so one running count numbers the stretches of all devices
    lops = lops.with_columns(graph_step.alias("graph_step"), brk.alias("_brk"), brk.cum_sum().alias("stretch"))
    ops = done(lops.drop("new_group"))
    st = stretches_of(ops)
    qualifies = pl.col("stretch").is_in(st.filter("qualifies")["stretch"].implode())
    ops = done(small(ops).with_columns(qualifies.alias("qualifies")).with_columns(_owner()).drop("_brk"))
    return ops, st


def stretches_of(ops: pl.DataFrame) -> pl.DataFrame:
    """Aggregate the ``stretch`` ids of a timeline: size, span, busy share, launch gaps.

    ``ops``: timeline rows with ``_brk`` (the op starts a stretch) and ``stretch`` (the running
    count of ``_brk``, so each stretch is one contiguous run of rows; the first row breaks).
    ``qualifies`` (launch-bound) when the stretch has at least :data:`STRETCH_MIN_OPS` ops, keeps
    the device busy at most :data:`STRETCH_MAX_BUSY` of its span, its median kernel is shorter
    than its median host launch spacing, it has a launch gap, and its step replays no graph.
    Only stretches of :data:`STRETCH_MIN_OPS` ops or more are aggregated (the others cannot qualify).
    """
    g = ["rank", "device"]
    inner = ~pl.col("_brk")
    schema_extra = {"qualifies": pl.Boolean}
    empty = pl.DataFrame(schema={"rank": pl.Int32, "device": pl.Int32, "stretch": pl.UInt32, **schema_extra})
    if ops.height == 0:
        return empty
    # stretch k (1-based) is the run of rows from the k-th break to the next: its size is the
    # distance between consecutive break rows, looked up per row (no window over the ids)
    first = ops["_brk"].arg_true()
    size = first.extend_constant(ops.height, 1).diff(null_behavior="drop")
    big = ops.filter(size.gather(ops["stretch"] - 1) >= STRETCH_MIN_OPS)
    if big.height == 0:
        return empty
    st = small(big).group_by(*g, "stretch").agg(
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
    return done(st.with_columns(q.alias("qualifies")).sort(*g, "start_ns", maintain_order=True))


def stretches(ctx: FindingContext) -> pl.DataFrame:
    """The stretch table of :func:`timeline` (computed with it)."""
    timeline(ctx)
    assert ctx.shared.stretches is not None  # filled with the timeline
    return ctx.shared.stretches


def with_names(ctx: FindingContext, rows: pl.DataFrame) -> pl.DataFrame:
    """``rows`` (timeline rows) with the ``name`` and ``op`` of their ops, looked up in
    ``ctx.ops`` by ``op_row``: for the few rows a finding describes (the timeline carries no
    strings)."""
    return rows.with_columns(ctx.ops.select("name", "op").select(pl.all().gather(rows["op_row"])))


def with_launch_thread(ctx: FindingContext, rows: pl.DataFrame) -> pl.DataFrame:
    """``rows`` (timeline rows) with ``launch_thread``: the host thread of their launch call,
    looked up in ``ctx.host`` by ``launch_row`` (null without a launch)."""
    return rows.with_columns(ctx.host["thread"].gather(rows["launch_row"]).alias("launch_thread"))


def claimed(ctx: FindingContext, owner: str) -> pl.DataFrame:
    """The timeline rows whose preceding gap ``owner`` claims."""
    return timeline(ctx).filter(pl.col("owner") == owner)
