"""Watch a folder that a profiler fills with traces, and analyze each one as it lands.

torch.profiler has no server to attach to, but ``torch.profiler.schedule`` with
``on_trace_ready=torch.profiler.tensorboard_trace_handler(DIR)`` writes one trace per cycle,
``DIR/<worker>.<time ms>.pt.trace.json`` (``.json.gz`` with ``use_gzip=True``;
torch/profiler/profiler.py). :func:`watch` polls ``DIR`` and yields a :class:`Landed` for each
new trace once its size held still over two polls (a file still being written is not read),
in the order they were written; :class:`History` keeps the headline numbers of each and
draws the strip of step time, busy share and HFU across them (docs/watch.md).

Nothing is dropped silently: a trace that cannot be read is a :class:`Landed` with its error
(and the watch goes on); files of other kinds in the folder are never read.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import InputNotFoundError, TraceroofError

#: the names tensorboard_trace_handler writes (torch/profiler/profiler.py), and jax's
PATTERNS = ("*.pt.trace.json", "*.pt.trace.json.gz", "*.xplane.pb")


@dataclass
class Landed:
    """One trace that landed: its path, and its report or the one-line error that stopped
    it (exactly one of the two is set)."""

    path: Path
    report: Any = None
    error: str | None = None


def _candidates(root: Path) -> list[Path]:
    found = {p for pat in PATTERNS for p in root.rglob(pat) if p.is_file()}
    return sorted(found, key=lambda p: (p.stat().st_mtime_ns, str(p)))


def watch(root: str | os.PathLike, analyze: Callable[[Path], Any], *, every_s: float = 1.0,
          count: int | None = None, idle_timeout_s: float | None = None,
          new_only: bool = False, sleep: Callable[[float], None] = time.sleep,
          clock: Callable[[], float] = time.monotonic) -> Iterator[Landed]:
    """Yield each trace that lands under ``root`` (recursively), analyzed by ``analyze``.

    Args:
        root: the folder (it must exist).
        analyze: path -> report; a :class:`TraceroofError` it raises becomes the
            :class:`Landed`'s ``error``.
        every_s: seconds between polls.
        count: stop after this many traces (None: no limit).
        idle_timeout_s: stop when no new trace landed for this many seconds (None: never).
        new_only: skip the traces already there when the watch starts.
        sleep, clock: injectable for tests (seconds).

    Raises:
        InputNotFoundError: ``root`` is not a folder.
    """
    folder = Path(root)
    if not folder.is_dir():
        raise InputNotFoundError(f"{folder}: no such folder to watch")
    done: set[Path] = set(_candidates(folder)) if new_only else set()
    sizes: dict[Path, int] = {}
    n = 0
    last = clock()
    while True:
        for p in _candidates(folder):
            if p in done:
                continue
            size = p.stat().st_size
            if sizes.get(p) != size or size == 0:  # still being written: wait a poll
                sizes[p] = size
                continue
            done.add(p)
            last = clock()
            try:
                landed = Landed(p, report=analyze(p))
            except TraceroofError as exc:
                landed = Landed(p, error=str(exc))
            yield landed
            n += 1
            if count is not None and n >= count:
                return
        if idle_timeout_s is not None and clock() - last >= idle_timeout_s:
            return
        sleep(every_s)


#: eight heights of the strip (U+2581..U+2588); "·" is a trace without the number
BLOCKS = "▁▂▃▄▅▆▇█"


def strip(values: list[float | None]) -> str:
    """A one-line chart of ``values``: each a block from lowest to highest of them, "·" for
    None (unknown is not drawn as low)."""
    known = [v for v in values if v is not None]
    if not known:
        return "·" * len(values)
    lo, hi = min(known), max(known)
    span = hi - lo
    out = []
    for v in values:
        if v is None:
            out.append("·")
        else:
            out.append(BLOCKS[0 if span == 0 else min(7, int((v - lo) / span * 8))])
    return "".join(out)


@dataclass
class History:
    """The headline numbers of each trace analyzed so far, oldest first: ``step_time_ns``
    (mean step time, ns), ``busy_fraction`` (device busy share of the step, 0..1) and
    ``hfu`` (0..1); None where a trace does not have it (no steps, no costed FLOPs)."""

    names: list[str] = field(default_factory=list)
    step_time_ns: list[float | None] = field(default_factory=list)
    busy_fraction: list[float | None] = field(default_factory=list)
    hfu: list[float | None] = field(default_factory=list)

    def add(self, name: str, report: Any) -> None:
        s = report.summary
        self.names.append(name)
        self.step_time_ns.append(s.step_time_ns)
        self.busy_fraction.append(s.step.busy_fraction if s.step else None)
        self.hfu.append(s.hfu.value if s.hfu else None)

    def lines(self) -> list[str]:
        """The strip: one line per number, with its latest value."""
        def last(xs: list[float | None], fmt: Callable[[float], str]) -> str:
            return fmt(xs[-1]) if xs and xs[-1] is not None else "unknown"

        return [
            f"step time  {strip(self.step_time_ns)}  {last(self.step_time_ns, lambda v: f'{v / 1e6:.2f} ms')}",
            f"busy       {strip(self.busy_fraction)}  {last(self.busy_fraction, lambda v: f'{v:.1%}')}",
            f"HFU        {strip(self.hfu)}  {last(self.hfu, lambda v: f'{v:.2%}')}",
        ]

    def to_dict(self) -> dict[str, list]:
        return {"traces": list(self.names), "step_time_ns": list(self.step_time_ns),
                "busy_fraction": list(self.busy_fraction), "hfu": list(self.hfu)}


def check(history: History, *, min_hfu: float | None = None, min_busy: float | None = None,
          max_step_time_increase: float | None = None) -> list[str]:
    """The limits the latest trace of ``history`` breaks (empty: none), for ``watch``'s
    gate-like exit: HFU and busy share below a floor (fractions), step time more than
    ``max_step_time_increase`` (a fraction: 0.05 = 5 %) above the first trace's. A number
    that is unknown breaks a limit on it (it cannot be shown to hold)."""
    broken = []
    name = history.names[-1]
    hfu, busy, step = history.hfu[-1], history.busy_fraction[-1], history.step_time_ns[-1]
    if min_hfu is not None and (hfu is None or hfu < min_hfu):
        broken.append(f"{name}: HFU {_pct(hfu)} < {min_hfu:.2%}")
    if min_busy is not None and (busy is None or busy < min_busy):
        broken.append(f"{name}: busy {_pct(busy)} < {min_busy:.2%}")
    if max_step_time_increase is not None:
        first = history.step_time_ns[0]
        if step is None or first is None:
            broken.append(f"{name}: step time unknown, cannot compare with the first trace")
        elif step > first * (1 + max_step_time_increase):
            broken.append(f"{name}: step time {step / 1e6:.2f} ms is {step / first - 1:+.1%} "
                          f"vs the first trace's {first / 1e6:.2f} ms "
                          f"(limit +{max_step_time_increase:.1%})")
    return broken


def _pct(v: float | None) -> str:
    return "unknown" if v is None else f"{v:.2%}"
