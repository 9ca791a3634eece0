"""Findings: detectors that say *why* time was lost and *what to do*, with the time it gives back.

A detector is a function ``detect(ctx: FindingContext) -> list[Finding]`` registered by
name with :func:`register`. :func:`run_detectors` runs the chosen ones and returns their
findings sorted by recoverable time, largest first. One module per detector; each has a doc
page under ``docs/findings/``.

Detectors hand each other nothing through strings: the context's inputs are typed fields
(the cross-rank view included), :attr:`FindingContext.chosen` names the run's detectors, and
what several of them read is a typed field of :class:`Shared`, filled once by its owner.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import polars as pl

from ..chips import ChipSpec
from ..errors import UsageError
from ..trace import TraceMeta

if TYPE_CHECKING:
    from ..ranks import Comparison


class RankView(NamedTuple):
    """The cross-rank results a run's detectors read: ``comparison``
    (:func:`traceroof.ranks.compare_collectives`) and ``section`` (the report's ``ranks``
    section, :func:`traceroof.ranks.analyze_ranks`); both None with fewer than 2 ranks."""

    comparison: Comparison | None
    section: dict[str, Any] | None


@dataclass
class Shared:
    """Results derived from a context that several detectors (or several ranks of one detector)
    read: each is computed once, on first use, by the one function that owns it, and is None
    until then. Owning the idle timeline in one place is what attributes every device-idle gap
    once, to exactly one detector.

    Attributes:
        device_order: :func:`~traceroof.findings._common.device_order`.
        windows: per rank, ``(first start, last end)`` ns (:func:`~traceroof.findings._common.windows`).
        devices: per rank, devices its ops run on (:func:`~traceroof.findings._common.devices`).
        busy: per rank, device busy ns (:func:`~traceroof.findings._common.busy_ns`).
        device_busy: per (rank, device), device busy ns
            (:func:`~traceroof.findings._common.device_busy_ns`).
        timeline, stretches: the idle-gap attribution (:func:`~traceroof.findings._idle.timeline`).
        rank_view: the cross-rank view (:func:`~traceroof.findings.straggler.rank_view`).
        stragglers: the straggler ranks worth a finding (``straggler._reported``).
        straggler_waits: the waits the straggler finding claims
            (:func:`~traceroof.findings.straggler.claimed_waits`).
    """

    device_order: pl.DataFrame | None = None
    windows: dict[int, tuple[int, int]] | None = None
    devices: dict[int, int] | None = None
    busy: dict[int, int] | None = None
    device_busy: dict[tuple[int, int | None], int] | None = None
    timeline: pl.DataFrame | None = None
    stretches: pl.DataFrame | None = None
    rank_view: RankView | None = None
    stragglers: list[tuple[dict[str, Any], float, int, float | None]] | None = None
    straggler_waits: pl.DataFrame | None = None


@dataclass
class FindingContext:
    """What every detector may read.

    Attributes:
        ops: the op table with roofline columns (``expected_ns``, ``bound``, ``gap_ns`` ...).
        host: the host table (framework ops, runtime calls, annotations).
        steps: the per-step table (``traceroof.steps.STEP_SCHEMA``).
        chip: the chip the ops ran on.
        meta: trace metadata (warnings, stats).
        ranks: the report's ``ranks`` section (:func:`traceroof.ranks.analyze_ranks`) when the
            caller has it already; None: computed from ``ops`` when a detector needs it.
        rank_comparison: :func:`traceroof.ranks.compare_collectives` of ``ops`` when the caller
            has it already; None: computed when needed.
        captures: the graph-capture windows (:func:`traceroof.graph_capture.windows`) when the
            caller has them already; None: computed from ``host`` when a detector needs them.
        chosen: the detectors of this run (set by :func:`run_detectors`; None: every detector
            counts as running), so a detector that leaves time to another knows it runs.
        shared: results the detectors of one run share (:class:`Shared`), filled as they are
            first needed.
        warnings: what the detectors left out and why (one line each, for the report's
            warnings: nothing is dropped without a word); the one field a detector writes.
    """

    ops: pl.DataFrame
    host: pl.DataFrame
    steps: pl.DataFrame
    chip: ChipSpec
    meta: TraceMeta
    ranks: dict[str, Any] | None = None
    rank_comparison: Comparison | None = None
    captures: pl.DataFrame | None = None
    chosen: tuple[str, ...] | None = None
    shared: Shared = field(default_factory=Shared, init=False, repr=False, compare=False)
    warnings: list[str] = field(default_factory=list, init=False, repr=False, compare=False)


@dataclass
class Finding:
    """One diagnosis.

    Attributes:
        kind: the detector's registered name (``unfused_elementwise`` ...).
        title: one line: what and where.
        severity: ``high`` / ``medium`` / ``low`` (share of step time recoverable).
        recoverable_ns: estimated time the fix gives back, ns (the detector's doc page gives
            the arithmetic).
        explanation: one paragraph with the fix a practitioner would try.
        evidence: every number behind the estimate, unit-suffixed keys.
        rank, step, stream, start_ns, end_ns: where it points (null when it spans several).
        device: the one device of the rank the finding's time is on, set when the rank drives
            several devices (an XPlane host with 4 TPU chips): its claim is then bounded by that
            device's idle / exposed communication, and its share is of that device's window.
            None (and absent from the JSON) for a rank with one device, whose findings are all
            on it, and for findings not tied to one device (busy claims of named ops).
        ops: labels (op or kernel names) of the ops involved.
        occurrences: how many instances were grouped into this finding.
    """

    kind: str
    title: str
    severity: str
    recoverable_ns: float
    explanation: str
    evidence: dict[str, Any] = field(default_factory=dict)
    rank: int | None = None
    device: int | None = field(default=None, metadata={"omit_none": True})
    step: int | None = None
    stream: int | None = None
    start_ns: int | None = None
    end_ns: int | None = None
    ops: list[str] = field(default_factory=list)
    occurrences: int = 1
    docs: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of the finding (``device`` left out when None)."""
        d = asdict(self)
        if d["device"] is None:
            del d["device"]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Finding:
        """Inverse of :meth:`to_dict` (a saved report's finding); unknown keys are ignored."""
        from dataclasses import fields

        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})


Detector = Callable[[FindingContext], list[Finding]]

DETECTORS: dict[str, Detector] = {}


def register(name: str) -> Callable[[Detector], Detector]:
    """Register a detector under ``name`` (a duplicate name raises ``ValueError``)."""

    def deco(fn: Detector) -> Detector:
        if name in DETECTORS:
            raise ValueError(f"detector {name!r} registered twice")
        DETECTORS[name] = fn
        return fn

    return deco


def _load_builtin() -> None:
    import importlib
    import pkgutil

    for m in pkgutil.iter_modules(__path__):
        if not m.name.startswith("_"):
            importlib.import_module(f"{__name__}.{m.name}")


def run_detectors(ctx: FindingContext, names: list[str] | None = None) -> list[Finding]:
    """Run the named detectors (default: all), one after the other in this thread, largest
    recoverable time first.

    Raises:
        UsageError: an unknown detector name (the message lists the known ones).
    """
    _load_builtin()
    if names is None:
        chosen = list(DETECTORS)
    else:
        unknown = [n for n in names if n not in DETECTORS]
        if unknown:
            raise UsageError(f"--findings: unknown {unknown}; known: {sorted(DETECTORS)}")
        chosen = names
    out: list[Finding] = []
    if ctx.ops.height == 0:
        return out
    ctx.chosen = tuple(chosen)  # detectors that leave time to another check it runs
    for name in chosen:
        out.extend(DETECTORS[name](ctx))
    out = sorted(out, key=lambda f: (-(f.recoverable_ns or 0.0), f.kind, f.title))
    _cap_to_window(ctx, out)
    return sorted(out, key=lambda f: (-(f.recoverable_ns or 0.0), f.kind, f.title))


def _cap_to_window(ctx: FindingContext, findings: list[Finding]) -> None:
    """Guarantee that a rank's claims sum to at most its window (BC-33), and the claims on
    one device of a rank driving several (:attr:`Finding.device`) to at most the rank's window
    on that device (its length: the device-time of one device).

    The detectors claim disjoint time by construction (idle gaps are attributed once; busy
    claims are bounded by the time their own ops run), so this only bites when busy claims of
    kernels running concurrently on different streams overlap. Then the smaller findings are
    cut, largest first kept, and the cut is recorded in their evidence.
    """
    from ._common import wall_ns, windows

    w = windows(ctx)
    everything = (min((a for a, _ in w.values()), default=0), max((b for _, b in w.values()), default=0))
    used: dict[int | None, float] = {}
    used_on: dict[tuple[int | None, int], float] = {}
    per_device = any(f.device is not None for f in findings)
    for f in findings:
        s, e = w.get(f.rank, (0, 0)) if f.rank is not None else everything
        # per-device findings share a rank's device-time: its window length × its devices
        rank_room = wall_ns(ctx, f.rank) if f.rank is not None and per_device else e - s
        room = max(rank_room - used.get(f.rank, 0.0), 0.0)
        if f.device is not None:
            room = min(room, max((e - s) - used_on.get((f.rank, f.device), 0.0), 0.0))
        if f.recoverable_ns > room:
            f.evidence["recoverable_before_cap_ns"] = f.recoverable_ns
            f.recoverable_ns = room
        used[f.rank] = used.get(f.rank, 0.0) + f.recoverable_ns
        if f.device is not None:
            used_on[(f.rank, f.device)] = used_on.get((f.rank, f.device), 0.0) + f.recoverable_ns


__all__ = ["Finding", "FindingContext", "RankView", "Shared", "DETECTORS", "register", "run_detectors"]
