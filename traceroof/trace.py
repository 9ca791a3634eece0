"""``Trace``: what a parser produces. An op table, a host table and the metadata."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from .schema import HOST_SCHEMA, OP_SCHEMA, conform, validate


@dataclass
class DeviceInfo:
    """What the trace says about one device (Kineto ``deviceProperties`` / XPlane plane stats).

    ``memory_bytes`` is the usable memory the runtime reported; ``peak_*`` are only present
    when the trace itself states peaks (XPlane), in FLOP/s and B/s.
    """

    name: str = ""
    index: int | None = None
    compute_major: int | None = None
    compute_minor: int | None = None
    num_sms: int | None = None
    memory_bytes: int | None = None
    peak_flops_per_s: float | None = None
    peak_hbm_bytes_per_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class TraceMeta:
    """Everything about a trace that is not a row of a table.

    Attributes:
        format: ``kineto`` or ``xplane``.
        sources: the file(s) read, as given.
        origin_ns: absolute time (ns, the trace's own clock) of ``start_ns == 0``.
        base_time_ns: Kineto ``baseTimeNanoseconds`` (unix ns of ``ts == 0``), when present.
        devices: one entry per device the trace describes.
        ranks: the ranks present; ``world_size`` from ``distributedInfo`` when present.
        versions: framework/runtime versions the trace names.
        warnings: tolerable oddities and losses, every output shows them.
        stats: counters (events read, skipped, repaired, by category, ...).
        synthetic: true when the trace says it was generated, not recorded.
        rank_labels: rank → the label the trace gives it (SGLang's merged traces:
            ``{1: "TP01"}``); empty when the trace labels no rank.
    """

    format: str = "unknown"
    sources: list[str] = field(default_factory=list)
    origin_ns: int = 0
    base_time_ns: int | None = None
    devices: list[DeviceInfo] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)
    world_size: int | None = None
    versions: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)
    synthetic: bool = False
    record_shapes: bool | None = None
    rank_labels: dict[int, str] = field(default_factory=dict)

    def warn(self, message: str) -> None:
        """Record a warning once (identical messages are not repeated)."""
        if message not in self.warnings:
            self.warnings.append(message)

    def count(self, key: str, n: int = 1) -> None:
        self.stats[key] = self.stats.get(key, 0) + n


@dataclass(frozen=True)
class StoredCosts:
    """Chip-independent costs stored with a trace (``traceroof ingest`` writes them), as data.

    Attributes:
        model_id: the cost model that computed them (``traceroof.costing.cost_model_id()``);
            the analysis uses them only under the same id.
        columns: the cost columns (``kind``, ``dtype``, ``flops``, ``bytes``, ``cost_source``)
            of every op of the trace's op table, in its row order.
        coverage: that costing's coverage, in its JSON form (``Coverage.to_json()``).
    """

    model_id: str
    columns: pl.DataFrame
    coverage: dict[str, Any]


@dataclass
class Trace:
    """A parsed trace: ``ops`` (OP_SCHEMA), ``host`` (HOST_SCHEMA) and ``meta``.

    Tables are conformed to their schemas on construction, so downstream code can rely on
    every declared column being present with its dtype. ``stored_costs`` belong to the op
    table the trace was read with: assigning a new ``ops`` drops them (the new table is
    costed afresh). ``prepared`` holds what the per-rank workers already did for the
    analysis (:class:`traceroof.rank_prep.Prepared`: eager-matched unlaunched kernels and
    costs, per rank); assigning a new ``ops`` or ``host`` drops it too.
    """

    ops: pl.DataFrame
    host: pl.DataFrame
    meta: TraceMeta
    #: costs stored with a cache for exactly this op table, else None
    stored_costs: StoredCosts | None = field(default=None, compare=False, repr=False)
    #: the per-rank analysis done by the workers that read it (traceroof.rank_prep), else None
    prepared: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        stored, prepared = self.stored_costs, self.prepared
        self.ops = validate(conform(self.ops, OP_SCHEMA), OP_SCHEMA, what="op table")
        self.host = validate(conform(self.host, HOST_SCHEMA), HOST_SCHEMA, what="host table")
        if stored is not None and stored.columns.height != self.ops.height:
            raise ValueError(f"stored costs for {stored.columns.height} ops, the op table has {self.ops.height}")
        object.__setattr__(self, "stored_costs", stored)
        object.__setattr__(self, "prepared", prepared)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "ops":  # a new op table: the stored costs were for the old one
            object.__setattr__(self, "stored_costs", None)
        if name in ("ops", "host"):  # and what the workers prepared was for the old tables
            object.__setattr__(self, "prepared", None)
        object.__setattr__(self, name, value)

    @property
    def device_time_ns(self) -> int:
        """Sum of device-op durations, ns (not a union: overlapping streams add)."""
        return int(self.ops["dur_ns"].sum() or 0)
