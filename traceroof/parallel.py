"""Running a function over many inputs in worker processes, and the on-disk size of an input.

Below :mod:`traceroof.io` and :mod:`traceroof.ingest`: reading many per-rank files and
ingesting them into a dataset share one pool runner and one progress protocol.
"""

from __future__ import annotations

import contextlib
import os
import sys
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from .errors import UsageError

if TYPE_CHECKING:
    from concurrent.futures import ProcessPoolExecutor

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
                 events_of: Callable[[T], int] | None = None,
                 while_waiting: Callable[[], None] | None = None) -> list[T]:
    """``[fn(item) for item in items]`` in ``jobs`` processes; results in input order.

    This process is one of the ``jobs``: it starts ``jobs − 1`` spawned workers (one pool for
    the call, shut down, and every child reaped, before it returns; or the ones
    :func:`early_workers` started, told to leave when it returns and reaped at the end of
    that block) that take the items from the front while it takes them from the back, each
    item run once, by whoever gets to it first (:class:`_Pool`). ``fn`` must be picklable (a
    module-level function, or a ``functools.partial`` of one). The parent reports each
    finished item to ``progress`` as it completes (its size from ``sizes``, in bytes, and
    ``events_of(result)`` events). The first failure cancels the items not started yet and
    is raised as it was raised (ours name their file). ``jobs`` defaults to the core count;
    with 1 (or one item) everything runs in this process. ``while_waiting``: called once in
    this process when it has no item left to claim, before it waits for the workers' last
    results (work the caller does next anyway, done in what would be idle time; not called
    when everything runs here); what it raises is raised.

    Raises:
        UsageError: the workers could not start because the main module calls this at
            import time (a script without ``if __name__ == "__main__":``; spawned workers
            import the main module, and so call it again).
        RuntimeError: a worker died (killed, out of memory); names the item.
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
    if _inheriting():
        _refuse_in_bootstrap()
    workers = min(jobs, len(items)) - 1
    early = _take_early(workers)
    if early is not None:  # started by :func:`early_workers`, which reaps them
        early.run(fn, items, done, while_waiting)
        early.release()
        return out
    pool = _Pool(workers)
    try:
        pool.run(fn, items, done, while_waiting)
    finally:
        pool.close()
    return out


#: items beyond this many are only ever run by the workers (the claims array's size: one
#: byte each, shared with the workers from their start, before the items are known)
CLAIM_SLOTS = 1 << 16

#: what a worker imports before its first item (``module:function``, called with no
#: argument): the readers, so that their import overlaps this process's own start
WARM_UP = "traceroof.io:warm_worker"


class _Pool:
    """``workers`` worker processes (spawned; forked when ``fork`` and :func:`fork_is_safe`)
    and the claims they share with this one.

    The workers start at once (each imports :data:`WARM_UP` first); :meth:`run` hands them
    items: every item is submitted at once (the workers take them from the front) and this
    process takes them from the back; whoever starts an item first claims it in the shared
    array (:func:`_claimed_call`), and the other skips it. Nothing is cancelled (a cancelled
    future in a pool that then breaks trips CPython 3.11's pool manager). :meth:`close`
    shuts the workers down and reaps them, and the resource tracker they started."""

    def __init__(self, workers: int, warm_up: str = WARM_UP, *, main: bool = True, fork: bool = False) -> None:
        # spawn, not fork, unless asked for and safe (:func:`fork_is_safe`): forking a process
        # whose polars/Rayon threads hold locks can deadlock
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor
        from concurrent.futures.process import BrokenProcessPool

        self.forked = fork and fork_is_safe()
        ctx = multiprocessing.get_context("fork" if self.forked else "spawn")
        self.guard = _GuardFile()
        self.tracker_was_running = _tracker_running()
        self.claims = ctx.Array("b", CLAIM_SLOTS, lock=True)
        self.pool: ProcessPoolExecutor | None = ProcessPoolExecutor(
            max_workers=workers, mp_context=ctx, initializer=_init_worker, initargs=(self.claims, warm_up))
        # what holds the named semaphores the resource tracker tracks
        self.held = [weakref.ref(q) for q in (getattr(self.pool, "_call_queue", None),
                                               getattr(self.pool, "_result_queue", None), self.claims)
                     if q is not None]
        self.used, self.workers = False, workers
        self._leaving: Any = None  # the pool's manager thread once released (:meth:`release`)
        # (a forked child runs no main module anyway; one read from stdin, ``python -``, has
        # no file a spawned worker could run: it died looking for ``<stdin>``)
        hide = (not main or not _main_is_a_file()) and not self.forked
        with self.guard.exported(), (_main_hidden() if hide else contextlib.nullcontext()):  # the workers inherit it
            for _ in range(workers):  # a pool spawns a worker per submit while none is idle
                with contextlib.suppress(BrokenProcessPool):  # one died already: run() says so
                    self.pool.submit(_nothing)

    def run(self, fn: Callable[[str], Any], items: list[str], done: Callable[[int, Any], None],
            while_waiting: Callable[[], None] | None = None) -> None:
        """Run ``fn`` over ``items`` here and in the workers, ``done(i, result)`` called here
        as each finishes, ``while_waiting()`` once this process has no item left to claim
        (:func:`run_parallel`); once per pool."""
        assert self.pool is not None and not self.used
        self.used = True
        share = _Share(items, self.guard)
        share.submit_all(self.pool, fn)
        for i in reversed(range(min(len(items), CLAIM_SLOTS))):
            if not _claim(self.claims, i):
                break  # a worker has it, and every item before it
            share.mine.add(i)
            done(i, fn(items[i]))
            share.collect(done, block=False)
        if while_waiting is not None:
            share.collect(done, block=False)  # results in already are handed on first
            while_waiting()
        share.collect(done, block=True)

    def release(self) -> None:
        """Tell the workers to leave once idle, without waiting for them: their exit then
        overlaps this process's work; :meth:`close` reaps them (it joins the pool's manager
        thread, which joins them). Kept as it is on a Python whose pool has no such thread."""
        manager = getattr(self.pool, "_executor_manager_thread", None)
        if self.pool is None or manager is None:
            return
        pool, self.pool, self._leaving = self.pool, None, manager
        pool.shutdown(wait=False)

    def close(self, *, started: bool = True) -> None:
        """Shut the workers down (``started``: they may have been handed items, and all have
        started; else they are stopped where they are, warming up), reap them and the
        resource tracker; then raise :class:`UsageError` if a worker found the main module
        without a ``__main__`` guard (this process may have run every item before such a
        worker left: the script is wrong all the same, each worker runs its top level)."""
        pool, self.pool = self.pool, None
        leaving, self._leaving = self._leaving, None
        if pool is None and leaving is None:
            return
        try:
            if pool is not None:
                if not started:
                    for proc in list((getattr(pool, "_processes", None) or {}).values()):
                        with contextlib.suppress(Exception):
                            proc.terminate()
                pool.shutdown(wait=True, cancel_futures=True)
            else:
                leaving.join()
            del pool, leaving
            self.claims = None
            # a forked pool's locks are unnamed: no resource tracker was started for them
            if not self.tracker_was_running and len(self.held) == 3 and _tracker_running():
                _stop_tracker(self.held)
            if started:
                self.guard.raise_if_tripped()
        finally:
            self.guard.remove()


_EARLY: _Pool | None = None


def _take_early(workers: int) -> _Pool | None:
    """The pool :func:`early_workers` started, if it has not run anything yet and has at
    least ``workers`` workers (then it is the caller's to run, once); one with fewer is
    stopped now (the caller starts its own)."""
    if _EARLY is None or _EARLY.used or _EARLY.pool is None:
        return None
    if _EARLY.workers < workers:
        _EARLY.close(started=False)
        return None
    return _EARLY


def drop_early() -> None:
    """Stop the workers :func:`early_workers` started, if nothing ran on them yet: the read
    they were started for turned out to be of one input (read in this process)."""
    if _EARLY is not None and not _EARLY.used:
        _EARLY.close(started=False)


@contextlib.contextmanager
def early_workers(workers: int, warm_up: str = WARM_UP) -> Iterator[None]:
    """Start ``workers`` worker processes now, for the first :func:`run_parallel` of the
    block (which then runs on them, whatever its ``jobs``, as one of its processes), so that
    their start (the imports of :data:`WARM_UP`, ~0.27 s of CPU) overlaps this process's own
    imports. They are forked when :func:`fork_is_safe` (this process holds no polars, numpy
    or thread yet: the CLI starts them before its own imports; no new interpreter, no
    re-import of traceroof, no resource tracker), else spawned (~0.45 s of CPU to start).
    Leaving the block shuts them down and reaps them (stopped at once when nothing ran on
    them), and the resource tracker a spawned pool started; nothing outlives it. Spawned
    workers do not import the main module (:func:`_main_hidden`), forked ones do not run it:
    what runs on them must be defined in another module. With ``workers`` < 1, or inside a
    worker, it does nothing.

    Raises:
        UsageError: as :func:`run_parallel`, a worker found the main module starting
            workers at import time.
    """
    global _EARLY
    if workers < 1 or _EARLY is not None or _inheriting():
        yield
        return
    _EARLY = _Pool(workers, warm_up, main=False, fork=True)
    try:
        yield
    finally:
        pool, _EARLY = _EARLY, None
        pool.close(started=pool.used)


#: modules that start native threads when imported or first used (Rayon, jemalloc's
#: background thread, OpenBLAS): a process holding one is never forked (:func:`fork_is_safe`)
THREADED_MODULES = ("polars", "numpy", "pyarrow", "torch", "jax", "jaxlib", "tensorflow")


def fork_is_safe() -> bool:
    """Whether this process may start workers by ``fork`` rather than ``spawn``: on Linux,
    with no thread but the main one and none of :data:`THREADED_MODULES` imported (a forked
    child has only the forking thread; locks other threads held stay held in it forever).
    ``--jobs 2`` on 16 ranks: a forked worker starts reading ~0.3 s sooner than a spawned
    one (no interpreter start, no re-import of traceroof, no resource tracker process for
    its unnamed locks; docs/performance.md, "Ranks in parallel (session 10)")."""
    import threading

    return (sys.platform.startswith("linux") and threading.active_count() == 1
            and not any(m in sys.modules for m in THREADED_MODULES))


@contextlib.contextmanager
def _main_hidden() -> Iterator[None]:
    """The main module's name and file hidden from the workers spawned meanwhile, so that
    they do not import it (multiprocessing's spawn runs the main module in each worker, to
    find the functions it defines; the workers of :func:`early_workers` run only traceroof's,
    and the CLI's main module would cost each ~0.05 s of CPU: click and every command)."""
    main = sys.modules.get("__main__")
    saved = {k: main.__dict__[k] for k in ("__spec__", "__file__") if main is not None and k in main.__dict__}
    try:
        for k in saved:
            if k == "__spec__":
                main.__spec__ = None  # type: ignore[union-attr]
            else:
                delattr(main, k)
        yield
    finally:
        for k, v in saved.items():
            setattr(main, k, v)


def _main_is_a_file() -> bool:
    """Whether the main module has a file a spawned worker can run (not ``python -``'s
    ``<stdin>``); True when it has no ``__file__`` (``python -c``: spawn runs nothing)."""
    main = sys.modules.get("__main__")
    f = getattr(main, "__file__", None)
    return f is None or os.path.isfile(f)


def tar_processes(jobs: int, compressed: bool, first_member_bytes: int | None = None) -> int:
    """The processes that read one tar of traces (:func:`traceroof.io.read_trace`) given
    ``jobs``: all of them for an uncompressed tar (each reads its share of the members at
    their offsets); for a compressed one (each process decompresses the whole archive, which
    cannot be entered at an offset) all of them from :data:`TAR_GZ_MIN_PROCESSES`, or from 2
    when its first trace member is a plain ``.json`` of fewer than :data:`SMALL_MEMBER_BYTES`
    (``first_member_bytes``: :func:`first_member_bytes`; None: not known); else one."""
    if not compressed:
        return jobs
    small = first_member_bytes is not None and first_member_bytes < SMALL_MEMBER_BYTES
    return jobs if jobs >= (2 if small else TAR_GZ_MIN_PROCESSES) else 1


#: the fewest processes that share a compressed tar's members (:func:`tar_processes`). Each
#: decompresses the whole archive: with two, on 2 cores, that ate the gain (16 ranks of 17.8
#: MB as one .tar.gz: shared by two 2.70-3.34 s, with 1.4-2.2 s more CPU; the old read by
#: one process 2.84-3.45 s); for N processes the read is about inflate + parse / N against
#: inflate + parse (docs/performance.md, "A tar of ranks (session 19)")
TAR_GZ_MIN_PROCESSES = 3

#: a compressed tar whose members are plain JSON below this many bytes is shared from 2
#: processes (:func:`tar_processes`): the Kineto reader decodes such a member with msgspec in
#: one thread (``kineto.NATIVE_MIN_BYTES``, the same number), so a second process halves the
#: parse, which outweighs the second inflate; a larger member is scanned by the native
#: scanner's two threads, which already fill 2 cores (docs/performance.md, "A cut or damaged
#: tar, and small members shared by two (session 20)": dlrm, 8 members of 0.9 MB, 0.98 ->
#: 0.86 s on 2 cores)
SMALL_MEMBER_BYTES = 15 * 10**6

#: how many bytes of headers and members :func:`first_member_bytes` passes over at the most
_FIRST_MEMBER_SCAN_BYTES = 1 << 20


def first_member_bytes(path: str | Path) -> int | None:
    """The size (bytes) of the first trace member of the tar ``path`` (compressed or not) when
    that member is a plain ``*.json`` (the size the Kineto reader picks its decoder by), from
    the archive's first headers (tarfile's stream mode); None when it is a ``*.json.gz``, when
    no ``*.json``/``*.json.gz`` regular member starts in the first
    :data:`_FIRST_MEMBER_SCAN_BYTES`, or when the archive cannot be read (the read says what
    is wrong). Imports no reader (the command line calls it before its imports)."""
    import tarfile
    import zlib

    try:
        with tarfile.open(path, "r|*") as tf:
            for m in tf:
                if m.isfile() and m.name.endswith((".json", ".json.gz")):
                    return m.size if m.name.endswith(".json") else None
                if m.offset_data + m.size > _FIRST_MEMBER_SCAN_BYTES:
                    return None
    except (OSError, EOFError, zlib.error, tarfile.TarError):
        return None
    return None


def likely_files(paths: Sequence[str], jobs: int | None = None) -> int:
    """How many trace files ``paths`` (the command line's inputs) probably expand to, told
    without importing a reader (:func:`early_workers` is started on it): each existing
    file 1, but a file named as a tar (``*.tar``, ``*.tar.gz``, ``*.tgz``) :data:`TAR_GUESS`
    when ``jobs`` processes (None: :func:`default_jobs`) would share its members
    (:func:`tar_processes`, compressed by its name, its first member's size read from its
    headers when that decides); a folder its ``*.json``/``*.json.gz``
    files at the top (0 when it holds a ``meta.json``: a cache); a glob its matches. A
    guess: a wrong one only costs the workers started for nothing."""
    import glob

    n = 0
    for s in paths:
        p = Path(s)
        try:
            if p.is_dir():
                names = os.listdir(p)
                if "meta.json" not in names:
                    n += sum(1 for f in names if f.endswith((".json", ".json.gz")))
            elif p.exists():
                n += TAR_GUESS if _shared_tar(s, jobs or default_jobs()) else 1
            elif any(c in s for c in "*?["):
                n += len(glob.glob(s, recursive=True))
        except OSError:
            continue
    return n


def _shared_tar(s: str, jobs: int) -> bool:
    """Whether the file ``s``, named as a tar (``*.tar``, ``*.tar.gz``, ``*.tgz``; compressed by
    its name), would be shared by ``jobs`` processes (:func:`tar_shared`)."""
    return s.endswith((".tar", ".tar.gz", ".tgz")) and tar_shared(s, jobs, not s.endswith(".tar"))


def tar_shared(path: str | Path, jobs: int, compressed: bool) -> bool:
    """Whether more than one of ``jobs`` processes reads the tar ``path`` (:func:`tar_processes`),
    its first member's headers read (:func:`first_member_bytes`) only when they decide it."""
    if jobs < 2:
        return False
    return tar_processes(jobs, compressed) > 1 or tar_processes(jobs, compressed, first_member_bytes(path)) > 1


#: the files :func:`likely_files` guesses a tar holds (as many workers as ``--jobs`` allows)
TAR_GUESS = 1 << 10


_CLAIMS: Any = None


def _nothing() -> None:
    """The task that makes the pool start a worker (:class:`_Pool`)."""


def _init_worker(claims: Any, warm_up: str = "") -> None:
    """A worker's initializer: keep the shared claims array (:class:`_Pool`), then import
    and call ``warm_up`` (``module:function``; nothing when empty)."""
    global _CLAIMS
    _CLAIMS = claims
    if warm_up:
        import importlib

        module, _, name = warm_up.partition(":")
        getattr(importlib.import_module(module), name)()


def _claim(claims: Any, i: int) -> bool:
    """Claim item ``i``: True when nobody had (it is now the caller's); items past the
    array (:data:`CLAIM_SLOTS`) are the workers' alone."""
    if i >= len(claims):
        return True
    with claims.get_lock():
        if claims[i]:
            return False
        claims[i] = 1
        return True


def _claimed_call(fn: Callable[[str], Any], i: int, item: str) -> tuple[bool, Any]:
    """In a worker: ``(True, fn(item))`` when it claims item ``i``, ``(False, None)`` when the
    parent ran it already."""
    if not _claim(_CLAIMS, i):
        return False, None
    return True, fn(item)


class _Share:
    """The futures of :meth:`_Pool.run` not collected yet (``pending``), and the items this
    process ran (``mine``: their futures' results are skipped)."""

    def __init__(self, items: list[str], guard: _GuardFile) -> None:
        self.items, self.guard = items, guard
        self.pending: dict[int, Any] = {}
        self.mine: set[int] = set()

    def submit_all(self, pool: ProcessPoolExecutor, fn: Callable[[str], Any]) -> None:
        from concurrent.futures.process import BrokenProcessPool

        for i, item in enumerate(self.items):
            try:
                self.pending[i] = pool.submit(_claimed_call, fn, i, item)
            except BrokenProcessPool as exc:  # a worker died already
                self._died(i, exc)

    def collect(self, done: Callable[[int, Any], None], *, block: bool) -> None:
        """Hand the workers' finished results to ``done`` (every one when ``block``), in
        input order among those finished together; the first error is raised as it was."""
        from concurrent.futures import FIRST_EXCEPTION, wait
        from concurrent.futures.process import BrokenProcessPool

        while self.pending:
            finished, _ = wait(list(self.pending.values()), timeout=None if block else 0,
                               return_when=FIRST_EXCEPTION)
            for i in sorted(i for i, f in self.pending.items() if f in finished):
                fut = self.pending.pop(i)
                try:
                    ran, result = fut.result()  # raises the worker's error
                except BrokenProcessPool as exc:
                    if i in self.mine:
                        continue
                    self._died(i, exc)
                if ran:
                    done(i, result)
            if not block:
                return

    def _died(self, i: int, exc: BaseException) -> None:
        self.guard.raise_if_tripped()
        raise RuntimeError(f"{self.items[i]}: a worker process died while reading it (out of memory? "
                           "try fewer --jobs)") from exc


def _tracker_running() -> bool:
    """Whether multiprocessing's resource tracker process is already running (started by
    someone else: then it is theirs and left alone)."""
    try:
        from multiprocessing import resource_tracker

        return getattr(resource_tracker._resource_tracker, "_pid", None) is not None
    except Exception:  # noqa: BLE001 - an interpreter without it: nothing to stop
        return True


def _stop_tracker(queues: list[weakref.ref[Any]]) -> None:
    """Stop (and reap) the resource tracker the pool started, once the pool's ``queues`` (and
    with them the named semaphores it tracks) are gone: it would otherwise outlive the call
    as a child of this process. While one is still referenced (an exception's traceback
    holds the pool) it is left to exit with this process, as it would have: stopping it
    would unlink semaphores still in use."""
    import gc
    from multiprocessing import resource_tracker

    gc.collect()  # the pool's queues' locks unregister themselves when collected
    if any(q() is not None for q in queues):
        return
    stop = getattr(resource_tracker._resource_tracker, "_stop", None)
    if stop is not None:
        try:
            stop()
        except Exception:  # noqa: BLE001 - best effort: it exits with this process anyway
            pass


#: the environment variable that tells a spawned worker where to say that it found itself
#: re-running the main module's top level (:func:`_refuse_in_bootstrap`)
GUARD_ENV = "TRACEROOF_SPAWN_GUARD"


class _GuardFile:
    """A file a worker writes into when it finds itself starting workers while it is being
    started (the main module without a ``__main__`` guard); the parent reads it when the
    pool breaks, to say so instead of "out of memory"."""

    def __init__(self) -> None:
        import tempfile

        fd, self.path = tempfile.mkstemp(prefix="traceroof-spawn-")
        os.close(fd)

    @contextlib.contextmanager
    def exported(self) -> Iterator[None]:
        """:data:`GUARD_ENV` set while the workers are started (they inherit it)."""
        old = os.environ.get(GUARD_ENV)
        os.environ[GUARD_ENV] = self.path
        try:
            yield
        finally:
            if old is None:
                os.environ.pop(GUARD_ENV, None)
            else:
                os.environ[GUARD_ENV] = old

    def raise_if_tripped(self) -> None:
        try:
            tripped = Path(self.path).read_text().strip()
        except OSError:
            return
        if tripped:
            main = getattr(sys.modules.get("__main__"), "__file__", None) or "the main module"
            raise UsageError(
                f"{main} starts traceroof's worker processes (jobs > 1) when it is imported: spawned "
                "workers import the main module, so each would start its own; put the script's calls "
                "under 'if __name__ == \"__main__\":' (or pass jobs=1)") from None

    def remove(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.path)


def _inheriting() -> bool:
    """Whether this is a spawned worker still importing its parent's main module
    (multiprocessing's ``current_process()._inheriting``). Without ``multiprocessing``
    imported it is not one (a spawned child imports it first), and it is not imported here:
    one file's read starts no process and pays no ~5 ms for it."""
    mp = sys.modules.get("multiprocessing")
    return mp is not None and bool(getattr(mp.current_process(), "_inheriting", False))


def _refuse_in_bootstrap() -> None:
    """In a spawned worker still importing the main module, which asks for workers itself:
    tell the parent (:class:`_GuardFile`) and leave at once, before multiprocessing raises
    its own error in every worker (its traceback, printed by each, says nothing of traceroof)."""
    path = os.environ.get(GUARD_ENV)
    if path:
        with contextlib.suppress(OSError):
            Path(path).write_text("main module without a guard\n")
    os._exit(GUARD_EXIT)


#: the exit status of a worker that left in :func:`_refuse_in_bootstrap`
GUARD_EXIT = 3


__all__ = ["run_parallel", "early_workers", "drop_early", "likely_files", "default_jobs", "input_size"]
