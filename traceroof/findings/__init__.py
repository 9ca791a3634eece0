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

import copy
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

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


T = TypeVar("T")


@dataclass
class Shared:
    """Results derived from a context that several detectors (or several ranks of one detector)
    read: each is computed once, on first use, by the one function that owns it
    (:meth:`once`), and is None until then. Owning the idle timeline in one place is what
    attributes every device-idle gap once, to exactly one detector. Detectors may run in
    threads (:func:`run_detectors`): :meth:`once` computes a field under its own lock, so a
    second thread that needs it waits for the first one's value instead of computing it again.

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
    _locks: dict[str, threading.RLock] = field(init=False, repr=False, compare=False)  # set in __post_init__

    def __post_init__(self) -> None:
        self._locks = {f.name: threading.RLock() for f in fields(self) if not f.name.startswith("_")}

    def once(self, name: str, compute: Callable[[], T]) -> T:
        """The field ``name``, set to ``compute()`` first when it is None: computed once per
        context even when detectors in several threads ask at the same time (each field has
        its own re-entrant lock; a field's computation may ask for another field, never the
        other way round, so the locks are always taken in one order). ``compute`` may set other
        fields first (the idle timeline sets ``stretches``, then returns the timeline)."""
        value = getattr(self, name)
        if value is not None:
            return value  # type: ignore[no-any-return]
        with self._locks[name]:
            value = getattr(self, name)
            if value is None:
                value = compute()
                setattr(self, name, value)
        return value  # type: ignore[no-any-return]


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

#: detectors that take most of the time (measured per detector with
#: ``benchmarks/bench_rank_tail.py``; docs/performance.md, "Detectors in two threads
#: (session 17)"): started first when the detectors run in threads, so the longest one does
#: not start last
HEAVY: set[str] = set()

#: the threads :func:`run_detectors` runs the detectors in by default (at most the cores this
#: process may run on): measured on 2 cores, from bert's 61 ops to the 1 GB trace's 290,190
#: (docs/performance.md, "Detectors in two threads (session 17)")
DETECTOR_THREADS = 2


def register(name: str, *, heavy: bool = False) -> Callable[[Detector], Detector]:
    """Register a detector under ``name`` (a duplicate name raises ``ValueError``);
    ``heavy``: one of the longest (:data:`HEAVY`)."""

    def deco(fn: Detector) -> Detector:
        if name in DETECTORS:
            raise ValueError(f"detector {name!r} registered twice")
        DETECTORS[name] = fn
        if heavy:
            HEAVY.add(name)
        return fn

    return deco


def _load_builtin() -> None:
    import importlib
    import pkgutil

    for m in pkgutil.iter_modules(__path__):
        if not m.name.startswith("_"):
            importlib.import_module(f"{__name__}.{m.name}")


def run_detectors(ctx: FindingContext, names: list[str] | None = None, *, threads: int | None = None) -> list[Finding]:
    """Run the named detectors (default: all) and return their findings, largest recoverable
    time first.

    With ``threads`` > 1 (default: :data:`DETECTOR_THREADS`, at most the cores this process
    may run on) the detectors run in that many threads, the :data:`HEAVY` ones started first:
    polars releases the GIL while it runs a query, and most of a detector's time is in its
    queries. The result is
    the same as one after the other: each detector writes its warnings to a list of its own
    (appended to ``ctx.warnings`` in the order of ``names``), reads the shared results through
    :meth:`Shared.once`, and its findings are taken in the order of ``names`` before the sort.

    Raises:
        UsageError: an unknown detector name (the message lists the known ones).
        Whatever a detector raises (the first in the order of ``names``).
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
    for found in _run_each(ctx, chosen, _threads(threads)):
        out.extend(found)
    out = sorted(out, key=lambda f: (-(f.recoverable_ns or 0.0), f.kind, f.title))
    _cap_to_window(ctx, out)
    return sorted(out, key=lambda f: (-(f.recoverable_ns or 0.0), f.kind, f.title))


def _threads(threads: int | None) -> int:
    """:func:`run_detectors`' thread count: ``threads``, else :data:`DETECTOR_THREADS` or the
    cores this process may run on, the fewer."""
    if threads is not None:
        return max(int(threads), 1)
    from ..parallel import default_jobs

    return max(min(DETECTOR_THREADS, default_jobs()), 1)


def _run_each(ctx: FindingContext, chosen: list[str], threads: int) -> list[list[Finding]]:
    """Each chosen detector's findings, in the order of ``chosen``: one after the other in
    this thread, or in ``threads`` threads (:func:`run_detectors`), each on a copy of ``ctx``
    that shares everything but its ``warnings``."""
    if threads <= 1 or len(chosen) < 2:
        return [DETECTORS[name](ctx) for name in chosen]
    from concurrent.futures import ThreadPoolExecutor

    views = {name: copy.copy(ctx) for name in chosen}
    for view in views.values():
        view.warnings = []
    start = sorted(chosen, key=lambda n: n not in HEAVY)  # stable: the heavy ones first
    with ThreadPoolExecutor(max_workers=min(threads, len(chosen)), thread_name_prefix="traceroof-detector") as pool:
        futures = {name: pool.submit(DETECTORS[name], views[name]) for name in start}
        results = [futures[name].result() for name in chosen]
    for name in chosen:
        ctx.warnings.extend(views[name].warnings)
    return results


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
