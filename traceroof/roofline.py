"""The roofline engine: expected time, bound, gap and efficiency of every op (DESIGN §6).

For an op with F FLOPs and B bytes on a chip with peak P(dtype) and HBM bandwidth W::

    compute_ns  = F / P · 1e9
    memory_ns   = B / W · 1e9
    comm_ns     = factor · comm_bytes / link_bandwidth · 1e9      (collectives)
    expected_ns = max(compute_ns, memory_ns, comm_ns)
    gap_ns      = dur_ns − expected_ns
    efficiency  = expected_ns / dur_ns

Source: Williams, Waterman & Patterson, "Roofline: an insightful visual performance model
for multicore architectures", CACM 52(4), 2009. Collective ring factors: the NCCL
performance notes (nccl-tests ``doc/PERFORMANCE.md``: algorithm bandwidth vs bus bandwidth):
AllReduce 2(n−1)/n, AllGather and ReduceScatter (n−1)/n of the full buffer, AllToAll
(n−1)/n, point-to-point 1.
"""

from __future__ import annotations

import polars as pl

from .chips import ChipSpec
from .costs.memory import copy_route
from .frames import done, small

#: op kinds that run on tensor cores / matrix units (use the tensor peak of their dtype).
MATRIX_KINDS = ("matmul", "attention", "conv")

#: An op whose roofline time is under this multiple of the chip's kernel floor and whose
#: measured time is within this multiple of it is ``latency`` bound.
LATENCY_FACTOR = 2.0

#: Above-roof bound: an efficiency beyond it is an inconsistency, not a result (BC-29/31;
#: accounting rule 4: no efficiency above 100 % is shown, so the bound is the roof itself).
ABOVE_ROOF_TOLERANCE = 1.0

#: An fp32 matrix op whose achieved FLOP/s exceeds the fp32 peak by this factor ran on TF32
#: tensor cores (the factor leaves room for timing noise; a guess, so it needs a margin).
TF32_EVIDENCE_FACTOR = 1.05

#: XLA async-pair instruction names (``copy-start.4``, ``all-gather-done``).
ASYNC_PAIR_RE = r"-(start|done)(\.\d+)?$"

#: Devices per scale-up domain assumed for a chip whose ``scale_up_domain`` is unknown (a user
#: chip file without it): the 8-GPU HGX/DGX board.
GPUS_PER_NODE = 8


def scale_up_domain(chip: ChipSpec) -> int:
    """Devices one scale-up link joins on ``chip`` (``chips.toml`` ``scale_up_domain``: 8 on
    HGX, 72 on NVL72, the ICI slice on TPU), else :data:`GPUS_PER_NODE`."""
    return int(chip.scale_up_domain or GPUS_PER_NODE)


def collective_link_bytes_per_s(chip: ChipSpec, group_size: int | None) -> float | None:
    """Link bandwidth (B/s, one direction per device) a collective over ``group_size`` devices
    is costed at: the scale-up link (``intra_node_bytes_per_s``) when the group fits in
    :func:`scale_up_domain`, else the scale-out network (``inter_node_bytes_per_s``, or the
    scale-up link where the network is platform-dependent). ``None`` when neither is known."""
    intra = chip.intra_node_bytes_per_s
    if group_size is not None and group_size > scale_up_domain(chip):
        return chip.inter_node_bytes_per_s or intra
    return intra


def copy_link_bytes_per_s(chip: ChipSpec, route: str | None) -> float | None:
    """Bandwidth (B/s) a copy-engine transfer is bounded by: ``host`` copies (pinned or
    pageable) the host link (PCIe x16 or NVLink-C2C, one direction), ``peer`` copies the
    scale-up link, ``device`` copies and copies of unknown route the HBM (their ``bytes``
    count both the read and the write). ``None`` when the chip does not give that link.

    A pageable copy is staged by the driver through a pinned buffer (a host ``memcpy`` into
    it, then DMA; NVIDIA, "How to Optimize Data Transfers in CUDA C/C++", 2012, and the CUDA
    C++ Best Practices Guide, "Pinned Memory"). Its bound is still the host link: the staging
    is the part pinning the buffer wins back, so it is gap, not roof."""
    if route == "host":
        return chip.host_link_bytes_per_s
    if route == "peer":
        return chip.intra_node_bytes_per_s
    return float(chip.hbm_bytes_per_s)


#: (substring of the lower-cased name without ``_``/``-``, collective type), first match wins.
_COLLECTIVE_PATTERNS: tuple[tuple[str, str], ...] = (
    ("allreduce", "all_reduce"),
    ("reducescatter", "reduce_scatter"),
    ("allgather", "all_gather"),
    ("alltoall", "all_to_all"),
    ("deepep::", "all_to_all"),  # DeepEP dispatch / combine / notify: expert-parallel all-to-all
    ("sendrecv", "send_recv"),
    ("broadcast", "broadcast"),
    ("collectivepermute", "collective_permute"),
    ("send", "send_recv"),
    ("recv", "send_recv"),
    ("reduce", "reduce"),
)


def collective_type_expr() -> pl.Expr:
    """Canonical collective type (``all_reduce``, ``reduce_scatter``, ``all_gather``,
    ``all_to_all``, ``send_recv``, ``broadcast``, ``collective_permute``, ``reduce``, else
    ``collective``) from ``coalesce(op, name)``, lower-cased without ``_`` and ``-``."""
    s = (
        pl.coalesce(pl.col("op"), pl.col("name"))
        .fill_null("")
        .str.to_lowercase()
        .str.replace_all(r"[_\-]", "")
    )
    expr = pl.when(pl.lit(False)).then(pl.lit(None, dtype=pl.String))
    for key, label in _COLLECTIVE_PATTERNS:
        expr = expr.when(s.str.contains(key, literal=True)).then(pl.lit(label))
    return expr.otherwise(pl.lit("collective"))


def ring_factor_expr(ctype: pl.Expr, n: pl.Expr) -> pl.Expr:
    """Bus-bandwidth factor of a collective of type ``ctype`` over ``n`` participants
    (nccl-tests PERFORMANCE.md): all-reduce 2(n−1)/n; all-gather, reduce-scatter, all-to-all
    (n−1)/n; anything else 1 (the message crosses one link); 0 for n = 1; null when ``n`` is
    null or < 1."""
    nf = n.cast(pl.Float64)
    return (
        pl.when(n.is_null() | (n < 1))
        .then(pl.lit(None, dtype=pl.Float64))
        .when(n == 1)
        .then(pl.lit(0.0))
        .when(ctype == "all_reduce")
        .then(2.0 * (nf - 1) / nf)
        .when(ctype.is_in(["all_gather", "reduce_scatter", "all_to_all"]))
        .then((nf - 1) / nf)
        .otherwise(pl.lit(1.0))
    )


def _peak_table(chip: ChipSpec) -> dict[str, float]:
    return {k: float(v) for k, v in chip.peak_flops_per_s.items() if v}


def _names_matching(ops: pl.DataFrame, rows: pl.Expr, pattern: str) -> pl.Expr:
    """Per op: is it one of ``rows`` and does its ``name`` match the regex ``pattern`` (False
    for a null name).

    The pattern runs once per distinct name of those rows (kernel names are long and repeat
    thousands of times); ops are then flagged by membership in the matching names."""
    names = ops["name"].filter(ops.select(rows.fill_null(False)).to_series()).drop_nulls().unique()
    hits = names.filter(names.str.contains(pattern)).to_list()
    return (rows & pl.col("name").is_in(hits)).fill_null(False) if hits else pl.lit(False)


def _collective_types(ops: pl.DataFrame) -> pl.Series:
    """``collective``: :func:`collective_type_expr` of each collective op, null for the
    others. Evaluated on the collective rows only (the string work is per row) and
    scattered back into place."""
    rows = (ops["kind"] == "collective").arg_true()
    out = pl.repeat(None, ops.height, dtype=pl.String, eager=True).alias("collective")
    if rows.len():
        labels = ops.select("op", "name")[rows].select(collective_type_expr()).to_series()
        out = out.scatter(rows, labels)
    return out


def add_roofline(ops: pl.DataFrame, chip: ChipSpec) -> pl.DataFrame:
    """Add the ROOFLINE_SCHEMA columns to an op table.

    Args:
        ops: an op table (OP_SCHEMA) with ``flops``/``bytes`` filled where known.
        chip: the chip the ops ran on.

    Returns:
        ``ops`` with ``peak_flops_per_s``, ``peak_dtype``, ``intensity``, ``compute_ns``,
        ``memory_ns``, ``comm_ns``, ``expected_ns``, ``bound``, ``gap_ns``, ``efficiency``.
        Unknown costs stay null (never 0); their bound is ``unknown``. An op costed by
        bytes alone (FLOPs null: a Triton kernel whose FLOPs are not known) has
        ``compute_ns`` null and ``expected_ns = memory_ns`` (bound ``memory``, or
        ``latency`` under the kernel floor): a memory-bound kernel needs only its bytes.

    Matmul-class ops (matmul, attention, conv) use the tensor peak of their dtype; fp32
    ones use the fp32 (non-tensor) peak unless the kernel name says TF32 or their achieved
    rate exceeds the fp32 peak, in which case TF32 is assumed (``peak_dtype`` = ``tf32``).
    Other ops use the fp32 vector peak (they are memory-bound in practice).
    """
    peaks = _peak_table(chip)
    # one lazy plan on a small op table, eager steps on a large one (:mod:`traceroof.frames`);
    # what needs the table itself (the names to match, the collective labels) is read first
    out = _with_peaks(small(ops), ops, peaks)
    out = _with_terms(out, ops, chip)
    # XLA async pairs (copy-start/copy-done, all-gather-start/-done): the transfer runs between
    # the two halves, overlapped with other ops. The "-start" half only issues it and the
    # "-done" half waits for what is not yet finished, so their durations are exposed transfer
    # time, not bandwidth use: their expected time is 0 (fully overlapped) and all of their
    # duration is gap. The roofline terms are kept for reference.
    # one anchored regex over every name, kept in a column for the two uses below: cheaper
    # than hashing each name to find the distinct ones (measured); any op can be an async half
    out = out.with_columns(pl.col("name").str.contains(ASYNC_PAIR_RE).fill_null(False).alias("_async"))
    is_async = pl.col("_async")
    terms = [pl.col("compute_ns"), pl.col("memory_ns"), pl.col("comm_ns")]
    known = pl.any_horizontal([t.is_not_null() for t in terms])
    expected = pl.when(is_async).then(pl.lit(0.0)).when(known).then(pl.max_horizontal(terms))
    out = out.with_columns(expected.alias("expected_ns"))
    out = out.with_columns(
        _bound(is_async, float(chip.launch_overhead_ns)).alias("bound"),
        (pl.col("dur_ns") - pl.col("expected_ns")).alias("gap_ns"),
        pl.when(pl.col("dur_ns") > 0).then(pl.col("expected_ns") / pl.col("dur_ns")).alias("efficiency"),
    )
    return done(out.drop("_async"))


def _with_peaks(out: pl.DataFrame | pl.LazyFrame, ops: pl.DataFrame,
                peaks: dict[str, float]) -> pl.DataFrame | pl.LazyFrame:
    """``out`` (a chain begun on the op table ``ops``) with ``peak_dtype`` and
    ``peak_flops_per_s`` (FLOP/s): matrix ops the tensor peak of their dtype (TF32 for fp32
    ones the name or the achieved rate says are TF32), other ops the fp32 vector peak; a dtype
    the chip has no peak for falls back to fp16, then fp32 (only for ops with FLOPs)."""
    fp32 = peaks.get("fp32")
    tf32 = peaks.get("tf32")
    is_matrix = pl.col("kind").is_in(list(MATRIX_KINDS))  # Enum or String: compares labels
    dtype = pl.col("dtype").fill_null("fp32")
    fp32_matrix = is_matrix & (dtype == "fp32")
    # the name only matters for fp32 matrix ops, so only their names are matched
    name_tf32 = _names_matching(ops, fp32_matrix, r"(?i)tf32|xf32") if tf32 is not None else pl.lit(False)
    achieved = pl.col("flops") / pl.col("dur_ns") * 1e9
    use_tf32 = (
        fp32_matrix
        & pl.lit(tf32 is not None)
        & (name_tf32 | (achieved > (fp32 or float("inf")) * TF32_EVIDENCE_FACTOR))
    )
    peak_dtype = (
        pl.when(use_tf32)
        .then(pl.lit("tf32"))
        .when(is_matrix)
        .then(dtype)
        .otherwise(pl.lit("fp32") if fp32 else dtype)
    )
    out = out.with_columns(peak_dtype.alias("peak_dtype"))
    out = out.with_columns(
        pl.col("peak_dtype").replace_strict(peaks, default=None, return_dtype=pl.Float64).alias("peak_flops_per_s")
    )
    # dtypes the chip has no peak for (fp8 on A100, bf16 on V100): fall back to fp16 then fp32;
    # never fp64, whose rate is far below both (an fp64 matmul on a chip without an fp64 peak
    # keeps an unknown compute term rather than the fp16 tensor peak)
    wider = pl.col("peak_dtype").fill_null("") == "fp64"
    for fb in ("fp16", "fp32"):
        if fb in peaks:
            out = out.with_columns(
                pl.when(pl.col("peak_flops_per_s").is_null() & pl.col("flops").is_not_null() & ~wider)
                .then(pl.lit(peaks[fb]))
                .otherwise(pl.col("peak_flops_per_s"))
                .alias("peak_flops_per_s"),
                pl.when(pl.col("peak_flops_per_s").is_null() & pl.col("flops").is_not_null() & ~wider)
                .then(pl.lit(fb))
                .otherwise(pl.col("peak_dtype"))
                .alias("peak_dtype"),
            )
    return out


def _with_terms(out: pl.DataFrame | pl.LazyFrame, ops: pl.DataFrame, chip: ChipSpec) -> pl.DataFrame | pl.LazyFrame:
    """``out`` (a chain begun on ``ops``) with ``collective`` and the roofline terms ``compute_ns = F/P·1e9``,
    ``memory_ns = B/W·1e9``, ``comm_ns = factor·comm_bytes/link·1e9`` (collectives; the
    scale-up link for groups within the chip's :func:`scale_up_domain`, else scale-out) and
    ``intensity = F/B`` (FLOP/byte, null when B is 0). A copy's ``W`` is its link
    (:func:`copy_link_bytes_per_s`): a host copy with no known host link has no roofline terms."""
    coll = pl.col("kind") == "collective"
    out = out.with_columns(_collective_types(ops))
    factor = ring_factor_expr(pl.col("collective"), pl.col("group_size"))
    intra = chip.intra_node_bytes_per_s
    inter = chip.inter_node_bytes_per_s or intra
    link = (
        pl.when(pl.col("group_size") <= scale_up_domain(chip)).then(pl.lit(intra)).otherwise(pl.lit(inter))
    ).cast(pl.Float64)
    hbm = float(chip.hbm_bytes_per_s)
    on_link, bw = _copy_bandwidth(ops, chip)
    return out.with_columns(
        pl.when(~on_link | bw.is_not_null())
        .then(pl.col("flops") / pl.col("peak_flops_per_s") * 1e9)
        .alias("compute_ns"),
        # HBM-bound ops divide by the scalar (the same float operation as ever); copies on a
        # link by their link's bandwidth
        pl.when(on_link).then(pl.col("bytes") / bw * 1e9).otherwise(pl.col("bytes") / hbm * 1e9).alias("memory_ns"),
        pl.when(coll).then(factor * pl.col("comm_bytes") / link * 1e9).alias("comm_ns"),
        pl.when(pl.col("bytes") > 0).then(pl.col("flops") / pl.col("bytes")).alias("intensity"),
    )


def _copy_bandwidth(ops: pl.DataFrame, chip: ChipSpec) -> tuple[pl.Expr, pl.Expr]:
    """``(on_link, bandwidth)``: whether an op is a ``memcpy`` bounded by a link other than HBM
    (:func:`copy_link_bytes_per_s`, decided once per distinct name), and that link's bandwidth
    (B/s; null where the chip does not give it)."""
    hbm = float(chip.hbm_bytes_per_s)
    names = ops.filter(pl.col("kind") == "memcpy")["name"].drop_nulls().unique().to_list()
    links = {n: copy_link_bytes_per_s(chip, copy_route(n)) for n in names}
    links = {n: v for n, v in links.items() if v != hbm}
    if not links:
        return pl.lit(False), pl.lit(None, dtype=pl.Float64)
    on_link = ((pl.col("kind") == "memcpy") & pl.col("name").is_in(list(links))).fill_null(False)
    known = {n: v for n, v in links.items() if v is not None}
    bw = (pl.col("name").replace_strict(known, default=None, return_dtype=pl.Float64) if known
          else pl.lit(None, dtype=pl.Float64))
    return on_link, bw


def _bound(is_async: pl.Expr, floor_ns: float) -> pl.Expr:
    """What limits each op: ``unknown`` (no expected time), async halves ``comm``/``memory``,
    ``latency`` (roof under the kernel floor ``floor_ns`` and measured within
    :data:`LATENCY_FACTOR` of it; never a collective), ``comm`` when the link term is the
    largest, else ``compute`` or ``memory`` by the larger term (compute on a tie)."""
    coll = pl.col("kind") == "collective"
    return (
        pl.when(pl.col("expected_ns").is_null())
        .then(pl.lit("unknown"))
        .when(is_async)
        .then(pl.when(coll).then(pl.lit("comm")).otherwise(pl.lit("memory")))
        .when(
            (pl.col("expected_ns") < floor_ns)
            & (pl.col("dur_ns") <= LATENCY_FACTOR * floor_ns)
            & ~coll
        )
        .then(pl.lit("latency"))
        .when(pl.col("comm_ns").is_not_null() & (pl.col("comm_ns") >= pl.col("expected_ns")))
        .then(pl.lit("comm"))
        .when(pl.col("compute_ns").fill_null(-1.0) >= pl.col("memory_ns").fill_null(-1.0))
        .then(pl.lit("compute"))
        .otherwise(pl.lit("memory"))
    )


def above_roof(ops: pl.DataFrame, tolerance: float = ABOVE_ROOF_TOLERANCE) -> pl.DataFrame:
    """Ops measured faster than their roofline allows (efficiency > ``tolerance``).

    Each is an inconsistency: the FLOP/byte formula, the dtype/peak chosen, or the chip is
    wrong (BC-29, BC-31); never a result to print as >100 %.
    """
    return ops.filter(pl.col("efficiency") > tolerance)


def group_label_expr(by: str = "op") -> pl.Expr:
    """The label of an op's ranking row: the one rule every grouping of ops by label uses
    (the ranking :func:`rank_ops`, the dashboard's op groups, the above-roof inconsistencies
    and the accounting check of rule 4).

    Args:
        by: ``op``: the framework op, falling back to the kernel name; copies and memsets
            (kind ``memcpy``/``memset``) keep their own name, so that one ``aten::copy_``
            does not merge device-to-host and device-to-device copies. ``kernel``: the
            kernel (HLO instruction) name.

    Returns:
        A String expression over the columns ``name``, ``op`` and ``kind`` (Enum or String).

    Raises:
        ValueError: ``by`` is neither ``op`` nor ``kernel``.
    """
    if by == "kernel":
        return pl.col("name")
    if by != "op":
        raise ValueError(f"group_by must be 'op' or 'kernel', got {by!r}")
    copy = pl.col("kind").is_in(["memcpy", "memset"]).fill_null(False)  # Enum or String
    # == when(copy).then(name).otherwise(coalesce(op, name)), with one string zip, not two
    return pl.coalesce(pl.when(~copy).then(pl.col("op")), pl.col("name"))


def rank_ops(ops: pl.DataFrame, by: str = "op") -> pl.DataFrame:
    """Sum the time lost per op (or per kernel name) and sort by it, largest first (DESIGN §6).

    Accounting rule 7 (docs/accounting.md): a row's ``measured_ns``, ``expected_ns``,
    ``gap_ns`` and ``efficiency`` cover the same ops, its **costed** ones (those with an
    expected time), so ``gap_ns = measured_ns − expected_ns`` and ``efficiency =
    expected_ns / measured_ns`` hold on every row; ``total_ns`` is the time of all its ops and
    ``costed = measured_ns / total_ns`` the share of it that is costed.

    Args:
        ops: an op table with roofline columns (``dur_ns``, ``expected_ns``, ``gap_ns`` in ns).
        by: ``op`` (framework op, falling back to the kernel name) or ``kernel``
            (:func:`group_label_expr`).

    Returns:
        One row per group: ``label, kind, count, total_ns`` (ns, every op), ``costed_count``,
        ``measured_ns, expected_ns, gap_ns`` (ns, costed ops only), ``costed`` (fraction of
        ``total_ns``), ``efficiency, bound, intensity`` (FLOP/byte), ``flops, bytes, dtype`` (``flops``/``bytes``
        the sum of the known ones, null when no op of the group has one: ops costed by bytes
        alone have null FLOPs).
        A group with no costed op has null ``measured_ns``, ``expected_ns``, ``gap_ns`` and
        ``efficiency`` (unknown, not 0), ``costed`` 0, and sorts last; ties sort by
        ``total_ns``, then label.

    Raises:
        ValueError: ``by`` is neither ``op`` nor ``kernel``.
    """
    df = ops.with_columns(group_label_expr(by).alias("label"))
    costed = pl.col("expected_ns").is_not_null()
    g = df.group_by("label").agg(
        # the modes of the kind codes (Enum), as labels, lowest on a tie: the few modes are
        # cast to strings, not every row
        pl.col("kind").mode().cast(pl.String).sort().first().alias("kind"),
        pl.len().alias("count"),
        pl.col("dur_ns").sum().alias("total_ns"),
        costed.sum().alias("costed_count"),
        pl.col("dur_ns").filter(costed).sum().alias("measured_ns"),
        pl.col("expected_ns").sum().alias("expected_ns"),
        pl.col("gap_ns").sum().alias("gap_ns"),
        pl.col("bound").filter(pl.col("bound") != "unknown").mode().sort().first().alias("bound"),
        pl.col("flops").sum().alias("flops"),
        pl.col("bytes").sum().alias("bytes"),
        pl.col("flops").count().alias("_n_flops"),
        pl.col("bytes").count().alias("_n_bytes"),
        pl.col("dtype").drop_nulls().mode().sort().first().alias("dtype"),
    )
    # a group without one known FLOP (bytes) count has unknown FLOPs (bytes): null, not a sum of 0
    g = g.with_columns(pl.when(pl.col("_n_flops") > 0).then(pl.col("flops")).alias("flops"),
                       pl.when(pl.col("_n_bytes") > 0).then(pl.col("bytes")).alias("bytes"))
    some = pl.col("costed_count") > 0
    g = g.with_columns(
        pl.when(some).then(pl.col("measured_ns")).alias("measured_ns"),
        pl.when(some).then(pl.col("expected_ns")).alias("expected_ns"),
        pl.when(some).then(pl.col("gap_ns")).alias("gap_ns"),
        pl.when(some & (pl.col("measured_ns") > 0)).then(pl.col("expected_ns") / pl.col("measured_ns")).alias("efficiency"),
        pl.when(pl.col("total_ns") > 0).then(pl.col("measured_ns").fill_null(0) / pl.col("total_ns")).alias("costed"),
        pl.when(pl.col("bytes") > 0).then(pl.col("flops") / pl.col("bytes")).alias("intensity"),
        pl.col("bound").fill_null("unknown"),
    )
    g = g.select("label", "kind", "count", "total_ns", "costed_count", "measured_ns", "expected_ns", "gap_ns",
                 "costed", "efficiency", "bound", "intensity", "flops", "bytes", "dtype")
    # label last: ties never leave the order to chance (reports are reproducible)
    return g.sort(["gap_ns", "total_ns", "label"], descending=[True, True, False], nulls_last=True)
