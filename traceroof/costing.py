"""Fill ``flops``/``bytes``/``kind``/``dtype``/``cost_source`` of an op table (DESIGN §4).

Precedence: numbers the trace carries (``trace``) → a formula over the framework op's
input shapes (``shapes``, :mod:`traceroof.costs`) → a kind from the kernel name alone
(``name``, no numbers) → ``unknown``. Unknown stays null, never zero.

An op with bytes but no FLOPs is costed by bytes alone (FLOPs null; the roofline's memory
term; ``Coverage.bytes_only_ns``). When one framework op launched several kernels, its bytes
are spread over them in proportion to their durations and its FLOPs over the kernels that do
its arithmetic (data-movement kernels get none: :func:`split_shares`); the coverage summary
says how many ops were split.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import polars as pl

from . import costs
from .costing_copies import copy_sizes_from_op
from .costing_shapes import (  # noqa: F401  (re-exported)
    columns,
    innermost_of,
    join_columns,
    shape_keys,
    shapes_by_external_id,
)
from .costing_shares import SUM_COLUMNS, op_shares, split_shares  # noqa: F401  (split_shares re-exported)
from .costing_tbe import pair_tbe
from .costing_tensorlist import element_dtype_of_kernel, tensorlist_bytes  # noqa: F401  (re-exported)
from .costing_why import why as _why
from .schema import KIND
from .trace import StoredCosts, Trace, TraceMeta

logger = logging.getLogger(__name__)

_json = msgspec.json.Decoder()


@dataclass
class Coverage:
    """How much device time has a cost model, by source (ns and shares).

    ``kernel_ns`` is the device time of the kernels (copies and fills excluded): the time
    ``linked_ns`` is a part of. ``uncosted_ns`` holds the device time (ns) of every op or
    kernel label without a cost model (``uncosted_why``: why, in a few words);
    ``group_size_assumed_ns`` the collectives' time whose group size was not recorded and is
    taken as the world size; ``bytes_only_ns`` the time of the costed ops (non-collective)
    with bytes but no FLOPs, costed "by bytes": a roofline time from their bytes alone
    (memory bound), their FLOPs unknown (null, so HFU leaves them out). Coverages of disjoint op tables (the ranks of a dataset) add up
    exactly (:meth:`merge`); ``uncosted_top`` is its largest five.
    """

    device_ns: int = 0
    by_source_ns: dict[str, int] = field(default_factory=dict)
    linked_ns: int = 0
    linked_costed_ns: int = 0
    split_ops: int = 0
    uncosted_ns: dict[str, int] = field(default_factory=dict)
    kernel_ns: int = 0
    uncosted_why: dict[str, str] = field(default_factory=dict)
    group_size_assumed_ns: int = 0
    bytes_only_ns: int = 0
    uncosted_kinds_ns: dict[str, dict[str, int]] = field(default_factory=dict)

    def share(self, source: str) -> float:
        """Share of device time whose costs came from ``source`` (0 when there is none)."""
        return self.by_source_ns.get(source, 0) / self.device_ns if self.device_ns else 0.0

    @property
    def costed_share(self) -> float:
        """Share of device time with a cost (from the trace or shapes): FLOPs and bytes,
        bytes alone (:attr:`bytes_only_share`), or a collective's message size."""
        return self.share("trace") + self.share("shapes")

    @property
    def bytes_only_share(self) -> float:
        """Share of device time costed by bytes alone (FLOPs unknown); part of :attr:`costed_share`."""
        return self.bytes_only_ns / self.device_ns if self.device_ns else 0.0

    @property
    def linked_costed_share(self) -> float:
        """Share of the *linked* kernel time (kernels with a framework op) that is costed."""
        return self.linked_costed_ns / self.linked_ns if self.linked_ns else 0.0

    @property
    def uncosted_top(self) -> list[tuple[str, int]]:
        """The five labels with the most uncosted device time: ``[(label, ns)]``, largest first."""
        return sorted(self.uncosted_ns.items(), key=lambda kv: (-kv[1], kv[0]))[:5]

    def families(self, examples: int = 3) -> list[dict[str, Any]]:
        """The uncosted device time by family: one dict per (kind, reason) with ``kind`` (the
        kernels' kind: ``matmul``, ``attention``, ``collective``, ...; one label's kernels of
        several kinds count in several families), ``why`` (the reason, as in
        ``uncosted_why``), ``device_time_ns`` (ns) and ``examples`` (its ``examples`` largest
        labels); largest first. The families partition :attr:`uncosted_ns`: their times add up
        to its total."""
        fam: dict[tuple[str, str], list[tuple[str, int]]] = {}
        for lbl, ns in self.uncosted_ns.items():
            by_kind = self.uncosted_kinds_ns.get(lbl) or {"other": ns}
            for kind, kns in by_kind.items():
                fam.setdefault((kind, self.uncosted_why.get(lbl, "unknown")), []).append((lbl, kns))
        out = [{"kind": k, "why": w, "device_time_ns": sum(ns for _, ns in v),
                "examples": [lbl for lbl, _ in sorted(v, key=lambda kv: (-kv[1], kv[0]))[:examples]]}
               for (k, w), v in fam.items()]
        return sorted(out, key=lambda d: (-d["device_time_ns"], d["kind"], d["why"]))

    def to_json(self) -> dict[str, Any]:
        """Every field, as a JSON-ready dict (ns as ints)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Coverage:
        """Inverse of :meth:`to_json`. Raises ``TypeError``/``ValueError`` on a malformed dict."""
        return cls(
            device_ns=int(d["device_ns"]), by_source_ns={str(k): int(v) for k, v in d["by_source_ns"].items()},
            linked_ns=int(d["linked_ns"]), linked_costed_ns=int(d["linked_costed_ns"]),
            split_ops=int(d["split_ops"]), uncosted_ns={str(k): int(v) for k, v in d["uncosted_ns"].items()},
            kernel_ns=int(d.get("kernel_ns", 0)), group_size_assumed_ns=int(d.get("group_size_assumed_ns", 0)),
            bytes_only_ns=int(d.get("bytes_only_ns", 0)),
            uncosted_why={str(k): str(v) for k, v in d.get("uncosted_why", {}).items()},
            uncosted_kinds_ns={str(k): {str(a): int(b) for a, b in v.items()}
                               for k, v in d.get("uncosted_kinds_ns", {}).items()},
        )

    @classmethod
    def merge(cls, parts: list[Coverage]) -> Coverage:
        """The coverage of the concatenation of disjoint op tables (different ranks): every
        figure is a sum (a split op is one ``(rank, external_id)`` group, never in two parts)."""
        out = cls()
        for c in parts:
            out.device_ns += c.device_ns
            out.linked_ns += c.linked_ns
            out.linked_costed_ns += c.linked_costed_ns
            out.split_ops += c.split_ops
            out.kernel_ns += c.kernel_ns
            out.group_size_assumed_ns += c.group_size_assumed_ns
            out.bytes_only_ns += c.bytes_only_ns
            for k, v in c.uncosted_why.items():
                out.uncosted_why.setdefault(k, v)
            for k, v in c.uncosted_kinds_ns.items():
                mine = out.uncosted_kinds_ns.setdefault(k, {})
                for a, b in v.items():
                    mine[a] = mine.get(a, 0) + b
            for k, v in c.by_source_ns.items():
                out.by_source_ns[k] = out.by_source_ns.get(k, 0) + v
            for k, v in c.uncosted_ns.items():
                out.uncosted_ns[k] = out.uncosted_ns.get(k, 0) + v
        return out


#: The op-table columns :func:`apply_costs` fills; the rest of the table is left as it is.
COST_COLUMNS = ("kind", "dtype", "flops", "bytes", "cost_source", "comm_bytes", "group_size")


@functools.cache
def cost_model_id() -> str:
    """An identifier of this cost model: a hash of the sources that decide an op's costs
    (this module and its ``costing_*`` parts, the graph-replay attribution
    (:mod:`traceroof.graph_replay`, :mod:`traceroof.graph_match`, :mod:`traceroof.graph_sources`),
    :mod:`traceroof.host`,
    :mod:`traceroof.dtypes`, every :mod:`traceroof.costs`
    module -- the formulas, the kind rules, the HLO cost model -- and
    :mod:`traceroof.parsers.hlo_modules`, which finds the HLO an XLA op is costed from).

    Costs stored by ``traceroof ingest`` (:class:`traceroof.trace.StoredCosts`) are used only under the same
    identifier, so a changed formula never meets costs computed by the old one.
    """
    here = Path(__file__).parent
    files = [Path(__file__), *sorted(here.glob("costing_*.py")), here / "graph_replay.py", here / "graph_match.py", here / "graph_sources.py",
             here / "unlaunched.py",
             here / "host.py", here / "dtypes.py", here / "parsers" / "hlo_modules.py",
             *sorted((here / "costs").glob("*.py"))]
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _parse(text: str | None) -> object:
    if text is None:
        return None
    try:
        return _json.decode(text)
    except msgspec.DecodeError:
        return None


def _tensorlist_bytes(ops: pl.DataFrame, keys: pl.DataFrame) -> pl.DataFrame:
    """:func:`traceroof.costing_tensorlist.tensorlist_bytes` with this module's JSON parse."""
    return tensorlist_bytes(ops, keys, _parse)


def apply_costs(trace: Trace) -> tuple[pl.DataFrame, Coverage]:
    """Return the op table with costs filled, and the coverage summary.

    When ``trace.stored_costs`` holds costs stored by ``traceroof ingest`` (for this op
    table: a trace drops them when its ``ops`` is replaced) under the current
    :func:`cost_model_id`, they are used as they are (re-analysis of a cache skips the
    costing); otherwise :func:`compute_costs` computes them.

    Args:
        trace: a parsed trace. Rows that already have ``cost_source == "trace"`` keep their
            numbers.

    Returns:
        ``(ops, coverage)``: the op table with :data:`COST_COLUMNS` filled.
    """
    got = _stored(trace.ops, trace.stored_costs)
    return got if got is not None else compute_costs(trace)


def _stored(ops: pl.DataFrame, stored: StoredCosts | None) -> tuple[pl.DataFrame, Coverage] | None:
    """``ops`` with ``stored`` costs, when they are of the current :func:`cost_model_id`; else None."""
    if stored is None or stored.model_id != cost_model_id():
        return None
    # one chunk, as compute_costs leaves it: float sums then add in the same order
    return ops.with_columns(stored.columns.select(COST_COLUMNS)).rechunk(), Coverage.from_json(stored.coverage)


def apply_costs_to(ops: pl.DataFrame, host: pl.DataFrame, meta: TraceMeta,
                   stored: StoredCosts | None = None, lent_rows: pl.DataFrame | None = None,
                   ) -> tuple[pl.DataFrame, Coverage]:
    """:func:`apply_costs` of the tables of a trace (OP_SCHEMA, HOST_SCHEMA, as a
    :class:`Trace` conforms them) without making one: the analysis costs its op table with
    the lent ops' host rows added (:func:`traceroof.analysis.cost_ops`), and a :class:`Trace`
    of them conformed and validated 1.1 M host rows again (0.1 s of CPU on the 1 GB trace)
    to give the same tables. ``stored``: costs stored for exactly ``ops``. ``lent_rows``: the
    lent ops' host rows (HOST_SCHEMA), costed as if appended to ``host`` (their shapes are
    looked up apart from the trace's rows where that gives the same rows:
    :func:`traceroof.costing_shapes.shape_keys`).

    Raises:
        ValueError: ``stored`` holds costs for another number of ops than ``ops`` (as
            :class:`Trace` raises).
    """
    if stored is not None and stored.columns.height != ops.height:
        raise ValueError(f"stored costs for {stored.columns.height} ops, the op table has {ops.height}")
    got = _stored(ops, stored)
    if got is not None:
        return got
    return _compute(ops, host if lent_rows is None else pl.concat([host, lent_rows]), meta,
                    None if lent_rows is None else host.height)


def compute_costs(trace: Trace) -> tuple[pl.DataFrame, Coverage]:
    """:func:`apply_costs` without stored costs: always computes them from the shapes."""
    return _compute(trace.ops, trace.host, trace.meta)


def _compute(ops: pl.DataFrame, trace_host: pl.DataFrame, meta: TraceMeta,
             split: int | None = None) -> tuple[pl.DataFrame, Coverage]:
    """:func:`compute_costs` of a trace's tables (``split``: the host rows before the lent
    ops' rows, :func:`apply_costs_to`)."""
    host, _ = pair_tbe(trace_host)
    # only the framework ops the op table links are looked at (a host table holds several
    # times more: 711 k cpu_ops for 175 k linked on the 1 GB trace)
    linked = columns(ops, ["rank", "external_id"]).filter(pl.col("external_id").is_not_null())
    shapes, keys = shape_keys(host, linked) if split is None else shape_keys(host, linked, split=split)
    # each join below adds its columns to the op table from a join of the keys alone
    # (:func:`~traceroof.costing_shapes.join_columns`): the table is never gathered again
    # one chunk per column from here (join_columns adds its columns as one chunk each): a
    # query over a table whose columns are cut differently copies every column to align
    # them first (~0.012 s of CPU per eager step on the 1 GB trace's 290 k ops, issue 19)
    ops = join_columns(ops.rechunk().with_row_index("_row"), shapes, ["rank", "external_id"])
    # rows the parser already costed (XPlane: numbers in the trace or from the HLO) keep them
    ops = ops.with_columns((pl.col("flops").is_not_null() & pl.col("bytes").is_not_null()).alias("_pre"))

    # copies and fills the trace costed are in ``todo`` too: they take their op's dtype (never
    # its numbers) whatever other ranks hold, so a rank costed alone matches the whole
    is_copy = pl.col("kind").is_in(["memcpy", "memset"])
    todo = ops.lazy().filter(
        ~pl.col("_pre") | is_copy,
        pl.col("op").is_not_null(),
        pl.col("kind") != "collective",
        # a replayed kernel only once traceroof.graph_replay lent it a captured op, under a
        # negative External id of its own (one per replay of that op)
        ~pl.col("graph").fill_null(False) | (pl.col("external_id") < 0).fill_null(False),
    )
    table = _formula_costs(todo.select("op", "_skey").unique().collect().join(keys, on="_skey", how="left"))
    ops = join_columns(ops, table, ["op", "_skey"], nulls_equal=True)
    ops = ops.with_columns(pl.col("_tl").fill_null(False))
    ops = _tensorlist_bytes(ops, keys)
    ops = _fill_from_formulas(ops)
    ops = copy_sizes_from_op(ops, keys, _parse)
    ops = _collective_costs(ops, trace_host, meta.world_size, keys)
    dims = keys.select("_skey", pl.col("input_dims").is_not_null().alias("_dims"))
    ops = join_columns(ops, dims, ["_skey"])
    cov = _coverage(ops)
    # every join above keeps the left order: the sort (a gather of every column) is only a guard
    ops = (ops if ops["_row"].is_sorted() else ops.sort("_row")).drop(
        ["_row", "_pre", "_skey", "_tl", "_f", "_b", "_kind", "_dtype", "_nk", "_dims", "_gs_assumed"]
    )
    return ops, cov


def _formula_costs(uniq: pl.DataFrame) -> pl.DataFrame:
    """The cost formula of each distinct (op, shapes): ``op, _skey, _f, _b, _kind, _dtype,
    _tl`` (FLOPs, bytes, kind, dtype, whether an argument is a ``Tensor[]``); null numbers
    and the name's kind where the op has no formula."""
    rows = []
    for op, skey, dims, types, conc in uniq.select(
        "op", "_skey", "input_dims", "input_types", "concrete_inputs"
    ).iter_rows():
        tl = "TensorList" in (types or "")
        c = costs.cost_of(op, _parse(dims), _parse(types), _parse(conc))
        if c is None:
            rows.append((op, skey, None, None, costs.kind_of_op(op), None, tl))
        else:
            f = None if c.flops is None else float(c.flops)
            b = None if c.bytes is None else float(c.bytes)
            rows.append((op, skey, f, b, c.kind, c.dtype, tl))
    return pl.DataFrame(
        rows,
        schema={
            "op": pl.String, "_skey": pl.UInt32, "_f": pl.Float64, "_b": pl.Float64,
            "_kind": pl.String, "_dtype": pl.String, "_tl": pl.Boolean,
        },
        orient="row",
    )


def _fill_from_formulas(ops: pl.DataFrame) -> pl.DataFrame:
    """Fill ``flops, bytes, cost_source, dtype, kind`` from the formula columns: a framework
    op's cost is spread over its kernels (:func:`split_shares`; copies/fills are not its
    kernels; ``_nk`` counts them), the parser's kind wins, then the formula's, then the kernel
    name's. A formula with bytes but no FLOPs is applied (FLOPs stay null: costed by bytes).

    One lazy query: its common subexpressions (the per-op window sums of
    :func:`split_shares`, used in several branches) are computed once; eager
    ``with_columns`` evaluated each again (0.6 s of CPU on 290 k ops, 0.16 s lazily). The
    ``kind`` Enum is compared as it is (a cast to String per comparison made 290 k strings
    each: 0.19 → 0.14 s)."""
    grp = ["rank", "external_id"]
    is_kern = ~pl.col("kind").is_in(["memcpy", "memset"])
    # the kernel-name rules run once per distinct name (a few hundred), not per row
    names = ops["name"].fill_null("").unique().to_list()
    movers = [n for n in names if costs.is_data_movement_kernel(n)]
    is_mover = pl.col("name").is_in(movers).fill_null(False) if movers else pl.lit(False)
    ops, byte_share, flop_share, n_k = op_shares(ops, grp, is_kern, is_mover)
    # a cost needs bytes (a memory-bound op's roofline time); FLOPs may be unknown (null)
    lf = ops.lazy().with_columns(
        pl.when(pl.col("_b").is_not_null() & pl.col("external_id").is_not_null() & is_kern)
        .then(n_k)
        .alias("_nk")
    )
    has_shape_cost = (
        pl.col("_b").is_not_null() & ~pl.col("_pre")
        & (pl.col("cost_source") != "trace") & is_kern
    )
    kernel_kind = (
        pl.col("name")
        .fill_null("")
        .replace_strict({n: costs.kind_of_kernel(n) for n in names}, default="other", return_dtype=pl.String)
    )
    cur_kind = pl.col("kind").cast(pl.String)
    new_kind = (
        pl.when(pl.col("kind") != "other")  # the parser's kind (copies, collectives, HLO categories)
        .then(cur_kind)
        # the formula's kind; a costed formula's "other" too (an FBGEMM lookup is no elementwise
        # op, whatever its kernels' names say)
        .when(pl.col("_kind").is_not_null() & ((pl.col("_kind") != "other") | has_shape_cost))
        .then(pl.col("_kind"))
        .otherwise(kernel_kind)
    )
    lf = lf.with_columns(
        pl.when(has_shape_cost).then(pl.col("_f") * flop_share).otherwise(pl.col("flops")).alias("flops"),
        pl.when(has_shape_cost).then(pl.col("_b") * byte_share).otherwise(pl.col("bytes")).alias("bytes"),
        pl.when(has_shape_cost)
        .then(pl.lit("shapes"))
        .when(pl.col("_pre") | (pl.col("cost_source") == "trace"))
        .then(pl.col("cost_source"))
        .otherwise(pl.lit("name"))
        .alias("cost_source"),
        pl.coalesce(pl.col("dtype"), pl.col("_dtype")).alias("dtype"),
        new_kind.cast(KIND).alias("kind"),
    )
    # 'name' means: a kind from the kernel name, but no numbers; 'unknown' when even that failed
    lf = lf.with_columns(
        pl.when((pl.col("cost_source") == "name") & (pl.col("kind") == "other"))
        .then(pl.lit("unknown"))
        .otherwise(pl.col("cost_source"))
        .alias("cost_source")
    )
    # only the columns the query makes are collected, then put in the table eagerly (replaced
    # where they are, ``_nk`` appended; the per-op sums of a small table, :func:`op_shares`,
    # dropped): the columns and order the whole query gave. Collected whole on polars'
    # default engine, every column passed through was written again (a copy of the op
    # table: ~40 MB on the 1 GB trace). One chunk each, as before.
    made = lf.select(_FORMULA_FILLED).collect().rechunk()
    return ops.drop(SUM_COLUMNS, strict=False).with_columns(made.get_columns())


#: the columns :func:`_fill_from_formulas` fills or adds, in the order its query makes them
_FORMULA_FILLED = ("_nk", "flops", "bytes", "cost_source", "dtype", "kind")


def comm_annotation_bytes(host: pl.DataFrame, keys: pl.DataFrame) -> pl.DataFrame:
    """The message bytes of the collective framework ops ``keys`` (``rank, external_id``)
    from the ``nccl:*`` annotation nested in each (:mod:`traceroof.costs.comms`): ``rank,
    external_id, _cb``.

    The op is the ``cpu_op`` a collective kernel is linked to (``record_param_comms`` or a
    ``c10d::`` op in PyTorch 1.x; of several with its External id, the innermost, as the
    shapes are read); the annotation runs inside its host interval on the same (pid,
    thread). An op holding annotations of different sizes has no size (ambiguous: null,
    never a guess).
    """
    empty = pl.DataFrame(schema={"rank": pl.Int32, "external_id": pl.Int64, "_cb": pl.Float64})
    if keys.height == 0:  # no collective to size: the host table is not looked at
        return empty
    ann = host.filter(pl.col("input_dims").is_not_null()).filter(pl.col("name").str.contains(costs.COMM_ANNOTATION_RE))
    if ann.height == 0:
        return empty
    # the formula runs once per distinct recorded buffer
    uniq = ann.select("input_dims", "input_types").unique()
    uniq = uniq.with_columns(pl.Series("_ab", [costs.message_bytes(d, t) for d, t in uniq.iter_rows()],
                                       dtype=pl.Float64))
    ann = ann.join(uniq, on=["input_dims", "input_types"], how="left", nulls_equal=True).select(
        "rank", "pid", "thread", pl.col("start_ns").alias("_as"),
        (pl.col("start_ns") + pl.col("dur_ns")).alias("_ae"), "_ab")
    # the innermost op of the wanted External ids only (:func:`innermost_of`: each key gets the
    # row it gets among all keys; the semi join below keeps the wanted (rank, id) pairs)
    ops = host.select("rank", "pid", "thread", "external_id", "start_ns", "dur_ns")[
        innermost_of(host, keys["external_id"])]
    ops = ops.join(keys.unique(), on=["rank", "external_id"], how="semi").select(
        "rank", "pid", "thread", "external_id", "start_ns", (pl.col("start_ns") + pl.col("dur_ns")).alias("_oe"))
    nested = ops.join(ann, on=["rank", "pid", "thread"]).filter(
        pl.col("_as") >= pl.col("start_ns"), pl.col("_ae") <= pl.col("_oe"))
    return nested.group_by("rank", "external_id").agg(
        pl.when(pl.col("_ab").n_unique() == 1).then(pl.col("_ab").first()).alias("_cb"))


def _collective_costs(ops: pl.DataFrame, host: pl.DataFrame, world_size: int | None,
                      keys: pl.DataFrame | None = None) -> pl.DataFrame:
    """Collectives: ``comm_bytes`` from the nested ``nccl:*`` annotation's shapes where the
    trace carried no message size (:func:`comm_annotation_bytes`), else from the op's own
    recorded buffer (:func:`_own_buffer_bytes`: ``symm_mem::*``, ``vllm::all_gather``), and the group size, when
    not recorded, taken as the world size (the default process group: PyTorch 1.x records
    none). ``cost_source`` of a collective: ``shapes`` when its size came from shapes,
    ``trace`` when the trace carried it, else as before (``name``)."""
    coll = pl.col("kind") == "collective"
    if ops.filter(coll).height == 0:
        return ops.with_columns(pl.lit(False).alias("_gs_assumed"))
    had = pl.col("comm_bytes").is_not_null()
    need = ops.filter(coll, ~had, pl.col("external_id").is_not_null()).select("rank", "external_id")
    ops = join_columns(ops, comm_annotation_bytes(host, need), ["rank", "external_id"])
    ops = _own_buffer_bytes(ops, coll & ~had & pl.col("_cb").is_null(), keys)
    from_shapes = coll & ~had & pl.col("_cb").is_not_null()
    ops = ops.with_columns(
        pl.when(from_shapes).then(pl.col("_cb")).otherwise(pl.col("comm_bytes")).alias("comm_bytes"),
        pl.when(from_shapes & pl.col("group_size").is_null()).then(pl.col("_cg")).otherwise(pl.col("group_size"))
        .cast(pl.Int32).alias("group_size"),
        from_shapes.alias("_cs"),
    ).drop("_cb", "_cg")
    assume = coll & pl.col("comm_bytes").is_not_null() & pl.col("group_size").is_null() & pl.lit(bool(world_size))
    ops = ops.with_columns(assume.alias("_gs_assumed"))
    if world_size:
        ops = ops.with_columns(
            pl.when("_gs_assumed").then(pl.lit(world_size, pl.Int32)).otherwise(pl.col("group_size")).alias("group_size"))
    sized = coll & pl.col("comm_bytes").is_not_null() & pl.col("group_size").is_not_null()
    return ops.with_columns(
        pl.when(sized & pl.col("_cs")).then(pl.lit("shapes")).when(sized).then(pl.lit("trace"))
        .otherwise(pl.col("cost_source")).alias("cost_source"),
    ).drop("_cs")


def _own_buffer_bytes(ops: pl.DataFrame, need: pl.Expr, keys: pl.DataFrame | None) -> pl.DataFrame:
    """``_cb``/``_cg``: message bytes and group size of the collective kernels ``need`` from
    their framework op's own recorded buffer (:func:`traceroof.costs.comms.collective_size`,
    once per distinct (op, shapes)); an op's bytes are spread over its collective kernels by
    duration, so that they are counted once per op. ``_cb`` kept where already set."""
    rows = ops.filter(need, pl.col("op").is_not_null(), pl.col("_skey").is_not_null())
    if keys is None or rows.height == 0:
        return ops.with_columns(pl.lit(None, dtype=pl.Int32).alias("_cg"))
    uniq = rows.select("op", "_skey").unique().join(keys, on="_skey", how="left")
    sized = [(op, k, *(costs.collective_size(op, _parse(d), _parse(t), _parse(c)) or (None, None)))
             for op, k, d, t, c in uniq.select("op", "_skey", "input_dims", "input_types",
                                               "concrete_inputs").iter_rows()]
    table = pl.DataFrame(sized, schema={"op": pl.String, "_skey": pl.UInt32, "_ob": pl.Float64, "_cg": pl.Int32},
                         orient="row")
    ops = join_columns(ops, table, ["op", "_skey"], nulls_equal=True)
    grp = ["rank", "external_id"]
    mine = need & pl.col("_ob").is_not_null()
    total = pl.when(mine).then(pl.col("dur_ns")).otherwise(0).sum().over(grp)
    n = mine.cast(pl.Int64).sum().over(grp)
    share = pl.when(total > 0).then(pl.col("dur_ns") / total).otherwise(1.0 / n)
    return ops.with_columns(
        pl.when(mine).then(pl.col("_ob") * share).otherwise(pl.col("_cb")).alias("_cb"),
        pl.when(mine).then(pl.col("_cg")).alias("_cg"),
    ).drop("_ob")


def _costed() -> pl.Expr:
    """An op has a cost model: bytes (with FLOPs, or alone: a memory-bound roofline time),
    or, for a collective, its message bytes and group size (the roofline's ``comm_ns``)."""
    coll = pl.col("kind") == "collective"
    return pl.when(coll).then(pl.col("comm_bytes").is_not_null() & pl.col("group_size").is_not_null()).otherwise(
        pl.col("bytes").is_not_null())


def _coverage(ops: pl.DataFrame) -> Coverage:
    """The :class:`Coverage` of a costed op table (before the helper columns are dropped)."""
    grp = ["rank", "external_id"]
    cov = Coverage()
    is_kern = ~pl.col("kind").is_in(["memcpy", "memset"])
    linked = is_kern & pl.col("op").is_not_null()
    kinds = ["collective", "memcpy", "memset"]
    bytes_only = ~pl.col("kind").is_in(kinds) & pl.col("bytes").is_not_null() & pl.col("flops").is_null()
    dur = pl.col("dur_ns")
    # the sums in one pass over the table (a filter per sum copied every column each time)
    sums = ops.select(
        dur.sum().alias("device"), dur.filter(linked).sum().alias("linked"),
        dur.filter(linked & _costed()).sum().alias("linked_costed"),
        pl.struct(grp).filter(pl.col("_nk") > 1).n_unique().alias("split"),
        dur.filter(is_kern).sum().alias("kernel"), dur.filter(bytes_only).sum().alias("bytes_only"),
        dur.filter(pl.col("_gs_assumed").fill_null(False)).sum().alias("gs_assumed"),
    ).row(0, named=True) if ops.height else dict.fromkeys(
        ("device", "linked", "linked_costed", "split", "kernel", "bytes_only", "gs_assumed"), 0)
    cov.device_ns = int(sums["device"] or 0)
    for src, ns in ops.group_by("cost_source").agg(pl.col("dur_ns").sum()).iter_rows():
        cov.by_source_ns[src] = int(ns)
    cov.linked_ns = int(sums["linked"] or 0)
    cov.linked_costed_ns = int(sums["linked_costed"] or 0)
    cov.split_ops = int(sums["split"] or 0)
    cov.kernel_ns = int(sums["kernel"] or 0)
    cov.bytes_only_ns = int(sums["bytes_only"] or 0)
    cov.group_size_assumed_ns = int(sums["gs_assumed"] or 0)
    graph = pl.col("graph").fill_null(False).any() if "graph" in ops.columns else pl.lit(False)
    launched = (pl.col("launch_start_ns").is_not_null().any() if "launch_start_ns" in ops.columns
                else pl.lit(True))
    # the uncosted ops by label (op, else kernel name): their time and why, in one pass
    uncosted = (ops.lazy().filter(~_costed()).with_columns(pl.coalesce("op", "name").alias("l"))
                .select("l", "dur_ns", "op", "kind", "_dims", "_tl", *(c for c in ("graph", "launch_start_ns")
                                                                      if c in ops.columns)).collect())
    why = uncosted.group_by("l").agg(
        pl.col("dur_ns").sum(), pl.col("op").first(), pl.col("kind").cast(pl.String).first(),
        pl.col("_dims").fill_null(False).any(), pl.col("_tl").fill_null(False).any(), graph.alias("_g"),
        launched.alias("_la"))
    for lbl, ns, op, kind, dims, tl, g, la in why.iter_rows():
        cov.uncosted_ns[str(lbl)] = int(ns)
        cov.uncosted_why[str(lbl)] = _why(op, kind, dims, tl, g, la)
    by_kind = uncosted.group_by("l", pl.col("kind").cast(pl.String)).agg(pl.col("dur_ns").sum())
    for lbl, kind, ns in by_kind.iter_rows():
        cov.uncosted_kinds_ns.setdefault(str(lbl), {})[str(kind or "other")] = int(ns)
    return cov
