"""Running a function over many inputs in worker processes, and the on-disk size of an input.

Below :mod:`traceroof.io` and :mod:`traceroof.ingest`: reading many per-rank files and
ingesting them into a dataset share one pool runner and one progress protocol.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from .progress import Progress

T = TypeVar("T")


def input_size(path: str) -> int:
    """Bytes on disk of an input: a file's size, or the total of a directory's files (0 when
    it cannot be read). Used for progress, never raises."""
    p = Path(path)
    try:
        if p.is_dir():
            return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
        return p.stat().st_size
    except OSError:
        return 0


def default_jobs() -> int:
    """Worker processes when ``jobs`` is not given: the cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def run_parallel(fn: Callable[[str], T], items: list[str], *, jobs: int | None = None,
                 progress: Progress | None = None, sizes: list[int] | None = None,
                 events_of: Callable[[T], int] | None = None) -> list[T]:
    """``[fn(item) for item in items]`` in ``jobs`` spawned processes; results in input order.

    ``fn`` must be picklable (a module-level function, or a ``functools.partial`` of one).
    The parent reports each finished item to ``progress`` as it completes (its size from
    ``sizes``, in bytes, and ``events_of(result)`` events). The first failure cancels the
    items not started yet and is raised as the worker raised it (ours name their file).
    ``jobs`` defaults to the core count; with 1 (or one item) everything runs in this process.
    """
    jobs = jobs or default_jobs()
    sizes = sizes if sizes is not None else [0] * len(items)
    out: list[Any] = [None] * len(items)

    def done(i: int, result: Any) -> None:
        out[i] = result
        if progress is not None:
            progress.file_done(items[i], sizes[i], events_of(result) if events_of else 0)

    if len(items) <= 1 or jobs == 1:
        for i, item in enumerate(items):
            done(i, fn(item))
        return out
    # spawn, not fork: forking a process whose polars/Rayon threads hold locks can deadlock
    ctx = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(max_workers=min(jobs, len(items)), mp_context=ctx)
    try:
        pending = {pool.submit(fn, item): i for i, item in enumerate(items)}
        while pending:
            finished, _ = wait(list(pending), return_when=FIRST_EXCEPTION)
            for fut in sorted(finished, key=lambda f: pending[f]):
                i = pending.pop(fut)
                try:
                    result = fut.result()  # raises the worker's error
                except BrokenProcessPool as exc:
                    raise RuntimeError(
                        f"{items[i]}: a worker process died while reading it (out of memory? "
                        "try fewer --jobs)") from exc
                done(i, result)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return out


__all__ = ["run_parallel", "default_jobs", "input_size"]
