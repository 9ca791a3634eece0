"""Coverage-guided fuzzing with atheris (libFuzzer): ``python fuzz/run.py TARGET --engine atheris``.

Each target runs in its own process (``python -m fuzz.atheris_main TARGET [libFuzzer flags]``):
traceroof's modules are imported under ``atheris.instrument_imports`` (coverage feedback), the
corpus is seeded with structured inputs (:attr:`fuzz.targets.Target.make`), and libFuzzer
mutates bytes. Each input goes through :func:`fuzz.harness.run_one` (the same crash rules and
watchdog as the structured engine; libFuzzer's own timeout is off, ``-timeout=0``); a crash is
raised, so libFuzzer writes the input as ``<out>/atheris-<target>-crash-<sha1>``.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    __package__ = "fuzz"  # noqa: A001

#: the modules a target may reach, imported under instrumentation
INSTRUMENTED = (
    "traceroof.io", "traceroof.cache", "traceroof.report", "traceroof.report_schema", "traceroof.gate",
    "traceroof.analysis", "traceroof.parsers.kineto", "traceroof.parsers.kineto_decode",
    "traceroof.parsers.kineto_stream", "traceroof.parsers.kineto_recover", "traceroof.parsers.kineto_times",
    "traceroof.parsers.kineto_columns", "traceroof.parsers.kineto_link", "traceroof.parsers.tar",
    "traceroof.parsers.protowire", "traceroof.parsers.xplane", "traceroof.parsers.xplane_convert",
    "traceroof.parsers.xplane_assemble", "traceroof.parsers.xplane_proto", "traceroof.parsers.xplane_steps",
    "traceroof.parsers.perfetto", "traceroof.parsers.jax_trace_json", "traceroof.parsers.cache_dir",
)
SEEDS_PER_TARGET = 30
_DONE = re.compile(rb"Done (\d+) runs in (\d+) second")


class CrashFound(Exception):
    """Raised to libFuzzer for an input that crashed (it saves the input)."""


def _main(argv: list[str]) -> None:
    import importlib

    import atheris

    name, flags = argv[0], argv[1:]
    with atheris.instrument_imports(include=["traceroof"]):
        for mod in INSTRUMENTED:
            importlib.import_module(mod)
    from fuzz import harness
    from fuzz.targets import targets

    target = targets()[name]

    def one(data: bytes) -> None:
        got = harness.run_one(target, data)
        if got is not None:
            kind, sig, text = got
            raise CrashFound(f"{kind} {sig}\n{text}")

    atheris.Setup([sys.argv[0], *flags], one)
    atheris.Fuzz()


def _seed_corpus(name: str, seed: int, folder: Path) -> None:
    from fuzz.targets import targets

    folder.mkdir(parents=True, exist_ok=True)
    t = targets()[name]
    for i in range(SEEDS_PER_TARGET):
        (folder / f"seed-{i}").write_bytes(t.make(random.Random(f"{seed}:{name}:corpus:{i}")))


def run_atheris(names: list[str], weights: dict[str, float], args: argparse.Namespace):  # noqa: ANN201
    """Run each target under libFuzzer (``--jobs`` at a time), its share of ``--runs`` (and of
    ``--seconds``); returns the runner's bookkeeping (:class:`fuzz.run._Run`)."""
    from fuzz.run import _Run, plan

    out = Path(args.out)
    run = _Run(args.seed, out, None)
    shares = {n: 0 for n in names}
    for n, _, k in plan(names, weights, args.runs, 1):
        shares[n] += k
    total_w = sum(weights[n] for n in names)
    procs: list[tuple[str, subprocess.Popen]] = []
    todo = list(names)
    while todo or procs:
        while todo and len(procs) < args.jobs:
            n = todo.pop(0)
            corpus = out / f"corpus-{n}"
            _seed_corpus(n, args.seed, corpus)
            flags = [f"-runs={shares[n]}", "-timeout=0", "-rss_limit_mb=4096", f"-seed={args.seed + 1}",
                     f"-artifact_prefix={out}/atheris-{n}-", "-print_final_stats=1", str(corpus)]
            if args.seconds:
                flags.insert(0, f"-max_total_time={max(1, int(args.seconds * weights[n] / total_w))}")
            with open(out / f"atheris-{n}.log", "wb") as log:  # a file, not a pipe: a full pipe blocks libFuzzer
                p = subprocess.Popen([sys.executable, "-m", "fuzz.atheris_main", n, *flags],
                                     cwd=Path(__file__).resolve().parents[1], stdout=log, stderr=subprocess.STDOUT)
            procs.append((n, p))
        time.sleep(0.2)
        for n, p in list(procs):
            if p.poll() is None:
                continue
            procs.remove((n, p))
            _collect(run, n, p, out)
    return run


def _collect(run, n: str, p: subprocess.Popen, out: Path) -> None:  # noqa: ANN001
    log = (out / f"atheris-{n}.log").read_bytes()
    m = _DONE.search(log)
    execs = re.findall(rb"stat::number_of_executed_units:\s*(\d+)", log)
    run.inputs[n] = int(execs[-1]) if execs else (int(m.group(1)) if m else 0)
    cpu = re.findall(rb"stat::average_exec_per_sec:\s*(\d+)", log)
    rate = int(cpu[-1]) if cpu else 0
    run.cpu[n] = run.inputs[n] / rate if rate else 0.0
    for f in sorted(out.glob(f"atheris-{n}-*")):
        if f.is_file() and not f.name.endswith(".log"):
            run.crashes.append((n, -1, "atheris", f.name))
    if p.returncode not in (0, None) and not any(c[0] == n for c in run.crashes):
        run.crashes.append((n, -1, "atheris", f"libFuzzer exit {p.returncode} (see {out}/atheris-{n}.log)"))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    _main(sys.argv[1:])
