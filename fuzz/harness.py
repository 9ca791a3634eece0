"""The in-process fuzz loop: inputs made, fed to a target, crashes recognised and saved.

A crash (docs/fuzzing.md) is: an exception the reader does not document (anything but
:attr:`Target.allowed`; for the file-level targets a :class:`~traceroof.errors.TraceroofError`
with exit code 70, or a message of more than one line or not naming the file), a hang over
:data:`HANG_S` seconds (a per-input ``SIGALRM`` watchdog; the parent kills a worker stuck in C
code, :mod:`fuzz.run`), or a peak RSS more than ``2 × input + 200 MB`` above the process's
RSS before the input (the kernel's peak mark reset before each input, read after it; an
address-space limit stops a runaway allocation before it takes the machine).

Input ``i`` of target ``T`` under seed ``s`` is made from ``random.Random(f"{s}:{T}:{i}")``:
every input can be made again from its index alone (a worker killed in the middle of one is
reported by the parent with the input re-made).
"""

from __future__ import annotations

import hashlib
import random
import resource
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from .targets import BadError, Target

#: seconds one input may take
HANG_S = 10
#: memory an input may add above the process's level: 2 × its size + this many bytes
MEM_SLACK_BYTES = 200 << 20


class Hang(BaseException):
    """Raised by the watchdog in the middle of an input that ran past :data:`HANG_S`."""


def _alarm(signum, frame):  # noqa: ANN001 - signal handler signature
    raise Hang(f"input ran past {HANG_S} s")


@dataclass
class Crash:
    """One crash: the target, the input's index, its kind, a signature (exception type and
    the innermost traceroof frame) and the traceback text."""

    target: str
    index: int
    kind: str
    signature: str
    text: str


@dataclass
class Result:
    """What one run of a target gave: inputs tried, CPU seconds, crashes."""

    target: str
    inputs: int = 0
    cpu_s: float = 0.0
    wall_s: float = 0.0
    crashes: list[Crash] = field(default_factory=list)


def make_input(target: Target, seed: int, index: int) -> bytes:
    """Input ``index`` of ``target`` under ``seed`` (deterministic)."""
    return target.make(random.Random(f"{seed}:{target.name}:{index}"))


def signature(exc: BaseException) -> str:
    """``Type@file:line`` of the innermost frame inside traceroof (else the innermost)."""
    tb = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in tb if "/traceroof/" in f.filename] or tb
    where = f"{Path(ours[-1].filename).name}:{ours[-1].lineno}" if ours else "?"
    return f"{type(exc).__name__}@{where}"


def _rss_now() -> int:
    """This process's resident set now, bytes (``/proc/self/statm``)."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize()


def _reset_peak() -> int:
    """Reset the kernel's peak-RSS mark to the current RSS (``/proc/self/clear_refs`` ``5``,
    Linux >= 4.0) and return the current RSS, bytes: the peak measured after an input is then
    that input's own."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass  # no reset: the peak is the process's since it started (a blow-up may hide under it)
    return _rss_now()


def _peak() -> int:
    """The peak RSS since :func:`_reset_peak`, bytes (``VmHWM``; ``ru_maxrss`` without /proc)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def limit_address_space(extra_bytes: int = 6 << 30) -> None:
    """Cap this process's address space at its current size + ``extra_bytes`` (a runaway
    allocation fails with MemoryError, a crash, instead of taking the machine)."""
    with open("/proc/self/statm") as fh:
        vm = int(fh.read().split()[0]) * resource.getpagesize()
    cap = vm + extra_bytes
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))


def run_one(target: Target, data: bytes) -> tuple[str, str, str] | None:
    """Feed ``data`` to ``target`` under the watchdog: None, or (kind, signature, text) of
    the crash."""
    before = _reset_peak()
    old = signal.signal(signal.SIGALRM, _alarm) or signal.SIG_DFL  # None: a handler set in C (libFuzzer)
    signal.setitimer(signal.ITIMER_REAL, HANG_S)
    try:
        target.run(data)
    except Hang as exc:
        return "hang", f"hang@{signature(exc).split('@', 1)[1]}", traceback.format_exc()
    except BadError as exc:
        return "bad-error", signature(exc.__cause__ or exc), traceback.format_exc()
    except target.allowed:
        pass
    except MemoryError as exc:
        return "memory", signature(exc), traceback.format_exc()
    except RecursionError as exc:
        return "exception", signature(exc), traceback.format_exc()
    except Exception as exc:  # noqa: BLE001 - every other exception is the finding
        return "exception", signature(exc), traceback.format_exc()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    grew = _peak() - before
    if grew > 2 * len(data) + MEM_SLACK_BYTES:
        return "memory", "memory", f"peak RSS grew by {grew >> 20} MB on a {len(data)}-byte input"
    return None


def save(crash: Crash, data: bytes, out: Path) -> Path:
    """Write the reproducer ``<target>-<sig hash>-<index>.bin`` and its ``.txt`` (kind,
    signature, traceback, replay command) into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha1(crash.signature.encode()).hexdigest()[:8]
    f = out / f"{crash.target}-{h}-{crash.index}.bin"
    f.write_bytes(data)
    f.with_suffix(".txt").write_text(
        f"target: {crash.target}\nindex: {crash.index}\nkind: {crash.kind}\nsignature: {crash.signature}\n"
        f"replay: python fuzz/run.py {crash.target} --replay {f}\n\n{crash.text}")
    return f


def _warm(target: Target, seed: int) -> None:
    """Load the seeds and the reader's imports before counting memory (two inputs, not
    counted, crashes ignored: the real run reports them)."""
    for i in (-1, -2):
        try:
            run_one(target, make_input(target, seed, i))
        except BaseException:  # noqa: BLE001 - only warming up
            pass


def fuzz(target: Target, seed: int, start: int, count: int, out: Path, *, seconds: float | None = None,
         progress=None, max_saved_per_signature: int = 3) -> Result:  # noqa: ANN001
    """Run inputs ``start .. start+count-1`` of ``target`` (stopping early after ``seconds``);
    save each crash's reproducer into ``out`` (at most ``max_saved_per_signature`` per
    signature). ``progress(index)`` is called before each input."""
    _warm(target, seed)
    res = Result(target.name)
    seen: dict[str, int] = {}
    t0, c0 = time.monotonic(), time.process_time()
    for i in range(start, start + count):
        if seconds is not None and time.monotonic() - t0 > seconds:
            break
        if progress is not None:
            progress(i)
        data = make_input(target, seed, i)
        got = run_one(target, data)
        res.inputs += 1
        if got is not None:
            crash = Crash(target.name, i, *got)
            res.crashes.append(crash)
            seen[crash.signature] = seen.get(crash.signature, 0) + 1
            if seen[crash.signature] <= max_saved_per_signature:
                save(crash, data, out)
    res.cpu_s = time.process_time() - c0
    res.wall_s = time.monotonic() - t0
    return res


def replay(target: Target, data: bytes) -> int:
    """Run one saved input, print what happened; 0 when it is no crash, else 1."""
    got = run_one(target, data)
    if got is None:
        print(f"{target.name}: no crash ({len(data)} bytes)")
        return 0
    kind, sig, text = got
    print(f"{target.name}: {kind} {sig}\n{text}", file=sys.stderr)
    return 1
