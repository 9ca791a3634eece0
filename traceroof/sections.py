"""The typed sections of a :class:`~traceroof.report.Report`, and their JSON form.

Each section is a frozen dataclass built by one stage of :func:`traceroof.analysis.analyze`.
Its JSON object is written and read by one generic converter over the dataclass fields
(:func:`section_to_dict`, :func:`section_from_dict`), in field order, so the report's key
order is the fields' order. Field metadata says how a field maps to JSON:

* ``key``: the JSON key when it is not the field name (``HfuInfo.value`` → ``"hfu"``);
* ``omit_none``: the key is left out when the value is None (keys present only sometimes);
* ``flatten``: a nested section whose keys sit in the parent object (the summary's groups);
* ``section``: the dataclass of a nested section (or of each item of a list of them).

``docs/report-json.md`` describes every key; :mod:`traceroof.report_schema` checks them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, TypeVar

S = TypeVar("S")


def _opt(*, key: str | None = None, omit_none: bool = False, flatten: bool = False,
         section: type | None = None, default: Any = None) -> Any:
    """A field with its JSON mapping (see the module docstring)."""
    meta = {"key": key, "omit_none": omit_none, "flatten": flatten, "section": section}
    return field(default=default, metadata=meta)


def _key(f: dataclasses.Field[Any]) -> str:
    return f.metadata.get("key") or f.name


def section_to_dict(obj: Any) -> dict[str, Any]:
    """The JSON object of a section: its fields in order, mapped by their metadata."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if v is None and (f.metadata.get("omit_none") or f.metadata.get("flatten")):
            continue
        if f.metadata.get("flatten"):
            out.update(section_to_dict(v))
        elif dataclasses.is_dataclass(v):
            out[_key(f)] = section_to_dict(v)
        elif isinstance(v, list) and f.metadata.get("section"):
            out[_key(f)] = [section_to_dict(x) if dataclasses.is_dataclass(x) else x for x in v]
        else:
            out[_key(f)] = v
    return out


def _flat_keys(cls: type) -> set[str]:
    keys: set[str] = set()
    for f in dataclasses.fields(cls):
        keys |= _flat_keys(f.metadata["section"]) if f.metadata.get("flatten") else {_key(f)}
    return keys


def section_from_dict(cls: type[S], d: dict[str, Any], *, strict: bool = False) -> S:
    """Rebuild section ``cls`` from :func:`section_to_dict` output. A key missing from ``d``
    (a report saved by an older traceroof) takes the field's default; a flattened group
    none of whose keys is present is None.

    Raises:
        ValueError: ``strict`` and ``d`` has a key the section has no field for (it would be
            dropped from the JSON: a producer added a key without adding the field).
    """
    if strict and d.keys() - _flat_keys(cls):
        raise ValueError(f"{cls.__name__}: no field for key(s) {sorted(d.keys() - _flat_keys(cls))}")
    kw: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        sub = f.metadata.get("section")
        if f.metadata.get("flatten"):
            kw[f.name] = section_from_dict(sub, d) if _flat_keys(sub) & d.keys() else None
            continue
        if _key(f) not in d:
            continue
        v = d[_key(f)]
        if sub is not None and isinstance(v, dict):
            v = section_from_dict(sub, v)
        elif sub is not None and isinstance(v, list):
            v = [section_from_dict(sub, x) if isinstance(x, dict) else x for x in v]
        kw[f.name] = v
    return cls(**kw)


class _Section:
    """``to_dict``/``from_dict`` through the generic converter."""

    def to_dict(self) -> dict[str, Any]:
        return section_to_dict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Any:
        return section_from_dict(cls, d)


# --------------------------------------------------------------------------- trace


@dataclass(frozen=True)
class TraceInfo(_Section):
    """What was read. Counts are of the analysed ops (after ``--rank``/``--step``);
    ``device_time_ns`` is their summed duration (ns)."""

    format: str = ""
    sources: list[str] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)
    world_size: int | None = None
    devices: list[str] = field(default_factory=list)
    synthetic: bool = False
    device_ops: int = 0
    device_time_ns: int = 0
    host_events: int = 0
    stats: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, Any] = field(default_factory=dict)
    record_shapes: bool | None = None
    #: rank (as a string: a JSON key) → the label the trace gives it (SGLang: ``"TP01-PP00"``);
    #: only when the trace labels its ranks
    rank_labels: dict[str, str] | None = _opt(omit_none=True)


# --------------------------------------------------------------------------- chip


@dataclass(frozen=True)
class TraceSays(_Section):
    """The peaks the trace itself states (XPlane device plane stats), to compare with."""

    device: str | None = None
    peak_flops_per_s: float | None = None
    peak_hbm_bytes_per_s: float | None = None


@dataclass(frozen=True)
class ChipInfo(_Section):
    """The chip the roofline is drawn for: dense peaks (FLOP/s per dtype), HBM (B/s, bytes),
    the bf16 ridge point (FLOP/byte), launch overhead (ns), and where each figure comes from.
    ``reason`` says how it was chosen (``--chip h100``, ``detected: ...``)."""

    key: str = ""
    name: str = ""
    reason: str = ""
    peak_flops_per_s: dict[str, float] = field(default_factory=dict)
    hbm_bytes_per_s: float | None = None
    hbm_bytes: float | None = None
    ridge_point_bf16: float | None = None
    launch_overhead_ns: float | None = None
    sources: dict[str, Any] = field(default_factory=dict)
    peak_source: str | None = None
    hbm_source: str | None = None
    trace_says: TraceSays | None = _opt(omit_none=True, section=TraceSays)


# --------------------------------------------------------------------------- coverage


@dataclass(frozen=True)
class GraphInfo(_Section):
    """One CUDA/HIP graph replayed on a rank (:mod:`traceroof.graph_replay`): a distinct
    sequence of replayed kernel names. ``graph``: its number on the rank (1 = first replayed);
    ``launches``: its replays; ``kernels_per_replay``: kernels of one replay (copies and fills
    left out); ``method``: how its kernels got framework ops (``capture_window``,
    ``capture_trace``, ``eager_match`` or ``unattributed``); ``source``: the capture trace
    file (``capture_trace``, or ``eager_match`` from one), else None; ``kernels_matched``:
    kernels of one replay attributed; ``device_time_ns`` / ``attributed_ns``: device time of
    all its replays' kernels / of those attributed, ns; ``note``: why not (better)
    attributed, None when nothing is to be said."""

    rank: int = 0
    graph: int = 0
    launches: int = 0
    kernels_per_replay: int = 0
    method: str = "unattributed"
    source: str | None = None
    kernels_matched: int = 0
    device_time_ns: int = 0
    attributed_ns: int = 0
    note: str | None = None


@dataclass(frozen=True)
class UnlaunchedInfo(_Section):
    """The kernels with no launch in the trace (queued before the host recording began) and
    how many were given framework ops by an eager match (:mod:`traceroof.unlaunched`):
    ``kernels`` (copies and fills left out), ``device_time_ns`` (ns, theirs),
    ``kernels_matched`` / ``attributed_ns`` (those given an op, ns), ``method``
    (``eager_match``, or ``unattributed`` when no run matched)."""

    kernels: int = 0
    device_time_ns: int = 0
    kernels_matched: int = 0
    attributed_ns: int = 0
    method: str = "unattributed"


@dataclass(frozen=True)
class CoverageInfo(_Section):
    """Share of device time with a cost model. Shares are fractions of ``device_time_ns``
    (None when there are no device ops); ``kernel_time_ns`` is the kernels' part of
    ``device_time_ns`` (copies and fills excluded), the time ``linked_device_time_ns`` is a
    part of; ``bytes_only_share`` the part of ``costed_share`` costed by bytes alone (FLOPs
    unknown: memory-bound roofline time, left out of HFU); ``uncosted_top`` is
    ``[[label, ns], ...]``; ``uncosted_families`` the uncosted time by (kind, reason):
    ``[{kind, why, device_time_ns, examples}, ...]``, largest first (ns add up to the
    uncosted device time); ``graphs``: one :class:`GraphInfo` per replayed CUDA/HIP graph
    (absent when the trace replays none); ``unlaunched``: the kernels with no launch in the
    trace and how many an eager match attributed (:class:`UnlaunchedInfo`; absent when none)."""

    device_time_ns: int = 0
    by_source_ns: dict[str, int] | None = _opt(omit_none=True)
    costed_share: float | None = None
    shapes_share: float | None = None
    trace_share: float | None = None
    linked_device_time_ns: int | None = _opt(omit_none=True)
    linked_costed_share: float | None = _opt(omit_none=True)
    kernel_time_ns: int | None = _opt(omit_none=True)
    split_ops: int | None = _opt(omit_none=True)
    bytes_only_share: float | None = _opt(omit_none=True)
    uncosted_top: list[Any] | None = _opt(omit_none=True)
    uncosted_families: list[Any] | None = _opt(omit_none=True)
    graphs: list[GraphInfo] | None = _opt(omit_none=True, section=GraphInfo)
    unlaunched: UnlaunchedInfo | None = _opt(omit_none=True, section=UnlaunchedInfo)

    @property
    def flops_unknown_share(self) -> float | None:
        """Share of device time whose FLOPs are unknown: no cost model, or costed by bytes
        alone (HFU leaves both out); None with no device ops."""
        if self.costed_share is None:
            return None
        return (1.0 - self.costed_share) + (self.bytes_only_share or 0.0)


# --------------------------------------------------------------------------- summary


@dataclass(frozen=True)
class StepStats(_Section):
    """Means over complete steps (ns per step; ``busy_fraction`` a fraction; FLOPs per
    step of one rank, None when no op is costed)."""

    complete_steps: int = 0
    step_time_ns: float | None = None
    step_time_median_ns: float | None = None
    busy_ns: float | None = None
    busy_fraction: float | None = None
    compute_bound_ns: float | None = None
    memory_bound_ns: float | None = None
    #: busy with ops of no cost model (their bound unknown): neither compute- nor memory-bound
    unknown_bound_ns: float | None = _opt(omit_none=True)
    comm_ns: float | None = None
    comm_exposed_ns: float | None = None
    idle_ns: float | None = None
    flops_per_step: float | None = None
    devices_per_rank: int | None = None
    queue_lag_ns: float | None = _opt(omit_none=True)
    device_lag_ns: float | None = _opt(omit_none=True)


@dataclass(frozen=True)
class TimelineInfo(_Section):
    """The partition of every device's timeline into buckets (:mod:`traceroof.timeline`,
    accounting rule 2), of the whole trace (before ``--step``).

    ``buckets``: per (rank, device, bucket) ``ops``, ``wall_ns`` (null for
    ``outside_recording``) and ``busy_ns``; ``windows``: per (rank, device) its recorded
    ``span`` and each step's device window (``start_ns``, ``end_ns``, ``wall_ns``);
    ``outside_recording``: ops off the timeline, per reason; ``capture_windows``: graph-capture
    windows found on the host. All times ns.
    """

    buckets: list[dict[str, Any]] = field(default_factory=list)
    windows: list[dict[str, Any]] = field(default_factory=list)
    outside_recording: dict[str, int] = field(default_factory=dict)
    capture_windows: int = 0


@dataclass(frozen=True)
class HfuInfo(_Section):
    """HFU (fraction, per device) against the dense peak (FLOP/s) of the dtype carrying most
    matrix FLOPs; ``value`` None when unknown or above 100 % (then an inconsistency)."""

    peak_dtype: str | None = _opt(key="hfu_peak_dtype")
    peak_flops_per_s: float | None = _opt(key="hfu_peak_flops_per_s")
    achieved_flops_per_s: float | None = _opt(omit_none=True)
    value: float | None = _opt(key="hfu")


@dataclass(frozen=True)
class RooflineInfo(_Section):
    """Σ expected / Σ measured over costed ops, and the share of device time it covers."""

    efficiency: float | None = _opt(key="roofline_efficiency")
    covers: float | None = _opt(key="roofline_efficiency_covers")


@dataclass(frozen=True)
class MfuInfo(_Section):
    """MFU (fraction) from model FLOPs per step of the whole job over ``devices`` devices;
    ``value`` None when above 100 % (then an inconsistency, and no ``note``)."""

    value: float | None = _opt(key="mfu")
    note: str | None = _opt(key="mfu_note", omit_none=True)
    model_flops_per_step: float | None = None
    devices: int | None = _opt(key="mfu_devices")


@dataclass(frozen=True)
class DeviceStats(_Section):
    """One device of a rank driving several (rule 3: accounted per device), over the rank's
    complete steps (:func:`traceroof.device_accounting.per_device`): means per step, ns, of the
    rank's step wall and of this device's busy union (all its streams), idle (wall − busy),
    communication union and its part exposed (no compute beside it on the device); FLOPs of
    its ops per step; ``busy_fraction`` = busy / wall and ``hfu`` = FLOPs / (wall × peak),
    fractions (``hfu`` None when unknown or above 100 %)."""

    rank: int = 0
    device: int | None = None
    steps: int = 0
    wall_ns: float | None = None
    busy_ns: float | None = None
    idle_ns: float | None = None
    busy_fraction: float | None = None
    comm_ns: float | None = None
    comm_exposed_ns: float | None = None
    flops_per_step: float | None = None
    hfu: float | None = None


@dataclass(frozen=True)
class Summary(_Section):
    """The headline numbers. Groups are None (their keys absent from the JSON) when they
    do not apply: no steps, no device ops, no model FLOPs given."""

    steps: int = 0
    step: StepStats | None = _opt(flatten=True, section=StepStats)
    hfu: HfuInfo | None = _opt(flatten=True, section=HfuInfo)
    roofline: RooflineInfo | None = _opt(flatten=True, section=RooflineInfo)
    mfu: MfuInfo | None = _opt(flatten=True, section=MfuInfo)
    #: one row per (rank, device) when a rank drives several devices; None (absent) otherwise
    devices: list[DeviceStats] | None = _opt(omit_none=True, section=DeviceStats)
    timeline: TimelineInfo | None = _opt(omit_none=True, section=TimelineInfo)

    @property
    def step_time_ns(self) -> float | None:
        """Mean step time (ns), None without steps."""
        return self.step.step_time_ns if self.step else None


# --------------------------------------------------------------------------- the rest


@dataclass(frozen=True)
class InconsistencyInfo(_Section):
    """A result that cannot be true (HFU/MFU above 100 %, an op above its roof), with the
    inputs to suspect. ``op``/``count``/``max_efficiency`` only for ops above their roof."""

    what: str = ""
    value: float | None = _opt(omit_none=True)
    op: str | None = _opt(omit_none=True)
    count: int | None = _opt(omit_none=True)
    max_efficiency: float | None = _opt(omit_none=True)
    suspects: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Filters(_Section):
    """The ``--rank``/``--step``/``--group-by`` the report was made with."""

    rank: int | None = None
    step: int | None = None
    group_by: str | None = None


@dataclass(frozen=True)
class RanksInfo(_Section):
    """The cross-rank view (:func:`traceroof.ranks.analyze_ranks`, docs/ranks.md): clock
    alignment, per-rank and per-step rows, the slowest rank, the straggler, collective waits."""

    ranks: list[int] = field(default_factory=list)
    alignment: dict[str, Any] = field(default_factory=dict)
    per_rank: list[dict[str, Any]] = field(default_factory=list)
    per_step: list[dict[str, Any]] = field(default_factory=list)
    slowest_rank: dict[str, Any] | None = None
    straggler: dict[str, Any] | None = None
    collectives: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------- speed of light


@dataclass(frozen=True)
class WaterfallTerm(_Section):
    """One term of the waterfall from the measured step down to the speed of light
    (:mod:`traceroof.waterfall`, docs/speed-of-light.md). ``ns``: per step (mean over the
    complete device-steps); ``total_ns``: over all of them, int ns (the terms' totals add up
    exactly to measured − speed of light). ``source``: ``finding``, ``gap`` (per-op gaps of one
    op kind), ``idle``, ``concurrency``, ``hidden_comm`` or ``cap``. For a finding:
    ``finding`` (its kind), ``claimed_ns`` (its whole recoverable time per step) and
    ``what_if_ns`` (the step time if that fix alone were made: measured − claimed)."""

    term: str = ""
    source: str = ""
    ns: float = 0.0
    total_ns: int = 0
    finding: str | None = _opt(omit_none=True)
    claimed_ns: float | None = _opt(omit_none=True)
    what_if_ns: float | None = _opt(omit_none=True)


@dataclass(frozen=True)
class StepLight(_Section):
    """One (rank, step): its measured wall and speed of light (ns, means over its devices)."""

    rank: int = 0
    step: int | None = None
    measured_ns: float = 0.0
    speed_of_light_ns: float = 0.0


@dataclass(frozen=True)
class SpeedOfLightInfo(_Section):
    """The step's speed of light (:mod:`traceroof.speed_of_light`) and the waterfall down to
    it, means per complete device-step (ns) over ``device_steps`` of them; ``*_total_ns`` are
    the int sums. ``fraction`` = speed of light / measured. ``uncosted_ns``: op time with no
    cost model, counted at its measured time. ``model_floor_ns``: model FLOPs per step ÷
    (devices × dense peak), when ``--model`` is given; ``model_floor_note`` says when it is
    above the speed of light, and why."""

    device_steps: int = 0
    measured_ns: float | None = None
    speed_of_light_ns: float | None = None
    fraction: float | None = None
    measured_total_ns: int = 0
    speed_of_light_total_ns: int = 0
    uncosted_ns: float | None = None
    model_floor_ns: float | None = _opt(omit_none=True)
    model_floor_note: str | None = _opt(omit_none=True)
    convention: str = ""
    waterfall: list[WaterfallTerm] = field(default_factory=list, metadata={"section": WaterfallTerm})
    per_step: list[StepLight] = field(default_factory=list, metadata={"section": StepLight})


__all__ = [
    "ChipInfo", "CoverageInfo", "DeviceStats", "Filters", "GraphInfo", "HfuInfo", "InconsistencyInfo", "MfuInfo",
    "RanksInfo", "RooflineInfo", "SpeedOfLightInfo", "StepLight", "StepStats", "Summary", "TimelineInfo", "TraceInfo",
    "TraceSays", "UnlaunchedInfo", "WaterfallTerm", "section_from_dict", "section_to_dict",
]
