"""Fuzz traceroof's readers: ``python fuzz/run.py TARGET|all --runs N [--seconds S] [--jobs J]``.

Engines: ``structured`` (default; :mod:`fuzz.harness` with the mutators of :mod:`fuzz.targets`,
pure Python, deterministic with ``--seed``) or ``atheris`` (coverage-guided byte mutation by
libFuzzer, seeded with structured inputs; :mod:`fuzz.atheris_main`; needs the ``fuzz`` extra).

``all`` splits ``--runs`` across the targets by weight. Inputs run in worker processes
(``--jobs``), in chunks; a worker that dies or stops moving for 3 × 10 s on one input (stuck in
C code, out of memory) is reported as a crash of that input, re-made from its index, and the
chunk goes on past it. Prints a summary table (inputs, CPU seconds, inputs per CPU second,
crashes and their signatures) and exits 1 when anything crashed, with the reproducers in the
folder it names (``--out``, default ``fuzz-out/``). ``--replay FILE`` runs one reproducer.
See docs/fuzzing.md.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import queue
import shutil
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: python fuzz/run.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    __package__ = "fuzz"  # noqa: A001

#: inputs per worker process (a fresh process per chunk: bounded state, load balanced)
CHUNK = 20_000
#: inputs of each target's first chunk (the round robin reaches every target soon)
PROBE = 1_000
#: seconds without progress on one input after which the parent kills the worker
STUCK_S = 30


def _worker(name: str, seed: int, start: int, count: int, out: str, deadline: float | None,
            cur, results) -> None:  # noqa: ANN001 - multiprocessing proxies
    from fuzz import harness
    from fuzz.targets import targets

    harness.limit_address_space()
    t = targets()[name]
    left = None if deadline is None else max(0.0, deadline - time.time())

    def progress(i: int) -> None:
        cur.value = i

    try:
        res = harness.fuzz(t, seed, start, count, Path(out), seconds=left, progress=progress)
    finally:
        from fuzz import seeds

        shutil.rmtree(seeds.workdir(), ignore_errors=True)
    results.put((name, start, res.inputs, res.cpu_s, [(c.index, c.kind, c.signature) for c in res.crashes]))


def _shares(names: list[str], weights: dict[str, float], runs: int) -> dict[str, int]:
    """``runs`` split by weight by largest remainders, so the shares sum to ``runs`` (rounding
    each share alone made 999,998 of ``--runs 1000000``); a target whose share rounds down to
    0 still gets 1 input, so a ``--runs`` below a few hundred runs a few more."""
    total = sum(weights[n] for n in names)
    exact = {n: runs * weights[n] / total for n in names}
    shares = {n: max(1, math.floor(exact[n])) for n in names}
    by_remainder = sorted(names, key=lambda n: exact[n] - math.floor(exact[n]), reverse=True)
    for n in by_remainder[:max(0, runs - sum(shares.values()))]:
        shares[n] += 1
    return shares


def plan(names: list[str], weights: dict[str, float], runs: int, jobs: int) -> list[tuple[str, int, int]]:
    """``(target, start, count)`` chunks: ``runs`` split by weight, each target's share cut
    into pieces of at most :data:`CHUNK` (and at least ``jobs`` pieces when it is big),
    ordered round robin over the targets."""
    shares = _shares(names, weights, runs) if len(names) > 1 else {names[0]: runs}
    per: list[list[tuple[str, int, int]]] = []
    for n in names:
        share = shares[n]
        pieces = max(math.ceil(share / CHUNK), min(jobs, math.ceil(share / 500)))
        size = math.ceil(share / pieces)
        chunks = [(n, s, min(size, share - s)) for s in range(0, share, size)]
        if chunks[0][2] > PROBE:  # a first, short chunk of each target: a timed run reaches them all
            chunks[:1] = [(n, 0, PROBE), (n, PROBE, chunks[0][2] - PROBE)]
        per.append(chunks)
    # round robin over the targets: a run cut short by --seconds has reached every one
    return [c for i in range(max(map(len, per))) for chunks in per if i < len(chunks) for c in [chunks[i]]]


class _Run:
    """The parent's bookkeeping: running workers, totals, crashes."""

    def __init__(self, seed: int, out: Path, deadline: float | None) -> None:
        self.ctx = mp.get_context("spawn")
        self.results = self.ctx.Queue()
        self.seed, self.out, self.deadline = seed, out, deadline
        self.inputs: dict[str, int] = {}
        self.cpu: dict[str, float] = {}
        self.crashes: list[tuple[str, int, str, str]] = []
        self.running: list[dict] = []

    def start(self, task: tuple[str, int, int]) -> None:
        name, s, n = task
        cur = self.ctx.Value("q", s - 1)
        p = self.ctx.Process(target=_worker, args=(name, self.seed, s, n, str(self.out), self.deadline, cur,
                                                    self.results), daemon=True)
        p.start()
        self.running.append({"p": p, "task": task, "cur": cur, "seen": s - 1, "since": time.monotonic(),
                             "done": False})

    def collect(self) -> None:
        while True:
            try:
                name, start, n, cpu, crashes = self.results.get(timeout=0.2)
            except queue.Empty:
                return
            self.inputs[name] = self.inputs.get(name, 0) + n
            self.cpu[name] = self.cpu.get(name, 0.0) + cpu
            self.crashes += [(name, i, k, s) for i, k, s in crashes]
            for r in self.running:
                if r["task"][0] == name and r["task"][1] == start:
                    r["done"] = True

    def reap(self) -> list[tuple[str, int, int]]:
        """Finished workers removed; dead or stuck ones reported, their chunk's rest returned."""
        again, keep = [], []
        now = time.monotonic()
        for r in self.running:
            p, (name, s, n) = r["p"], r["task"]
            if r["cur"].value != r["seen"]:
                r["seen"], r["since"] = r["cur"].value, now
            stuck = p.is_alive() and now - r["since"] > STUCK_S
            if stuck:
                p.kill()
                p.join()
            if p.is_alive():
                keep.append(r)
                continue
            p.join()
            if not r["done"]:
                self.collect()  # its result may have reached the queue just before it exited
            if r["done"]:
                continue
            i = r["cur"].value
            why = "hang (killed)" if stuck else f"worker died (exit {p.exitcode})"
            self._lost(name, i, why)
            if i + 1 < s + n and (self.deadline is None or time.time() < self.deadline):
                again.append((name, i + 1, s + n - i - 1))
        self.running = keep
        return again

    def _lost(self, name: str, i: int, why: str) -> None:
        from fuzz import harness
        from fuzz.targets import targets

        t = targets()[name]
        data = harness.make_input(t, self.seed, i)
        crash = harness.Crash(name, i, "hang" if "hang" in why else "died", why, why)
        harness.save(crash, data, self.out)
        self.crashes.append((name, i, crash.kind, why))
        self.inputs[name] = self.inputs.get(name, 0) + 1


def run_structured(names: list[str], weights: dict[str, float], args: argparse.Namespace) -> _Run:
    deadline = None if args.seconds is None else time.time() + args.seconds
    run = _Run(args.seed, Path(args.out), deadline)
    todo = plan(names, weights, args.runs, args.jobs)
    while todo or run.running:
        if deadline is not None and time.time() > deadline:
            todo = []  # time is up: no new chunk (the running ones stop at their next input)
        while todo and len(run.running) < args.jobs:
            run.start(todo.pop(0))
        run.collect()
        todo = run.reap() + todo
        if deadline is not None and time.time() > deadline + 60:
            for r in run.running:
                r["p"].kill()
    run.collect()
    return run


def summary(run: _Run, names: list[str], wall_s: float) -> str:
    """The summary table: one row per target, and the totals."""
    rows = [f"{'target':<14} {'inputs':>9} {'cpu s':>8} {'inputs/cpu s':>12} {'crashes':>7}  signatures"]
    for n in names:
        cr = [c for c in run.crashes if c[0] == n]
        sigs = sorted({c[3] for c in cr})
        k, cpu = run.inputs.get(n, 0), run.cpu.get(n, 0.0)
        rate = f"{k / cpu:,.0f}" if cpu > 0 else "-"
        rows.append(f"{n:<14} {k:>9,} {cpu:>8.1f} {rate:>12} {len(cr):>7}  {', '.join(sigs[:4])}"
                    + (f" (+{len(sigs) - 4})" if len(sigs) > 4 else ""))
    tot = sum(run.inputs.values())
    rows.append(f"{'total':<14} {tot:>9,} {sum(run.cpu.values()):>8.1f} {'':>12} {len(run.crashes):>7}"
                f"  ({wall_s:.0f} s wall)")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fuzz/run.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("target", help="a target name, or 'all' (see --list)")
    ap.add_argument("--runs", type=int, default=10_000, help="inputs in all (split by weight for 'all')")
    ap.add_argument("--seconds", type=float, help="stop after this many seconds (wall)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="fuzz-out", help="folder for reproducers (and atheris corpora)")
    ap.add_argument("--engine", choices=("structured", "atheris"), default="structured")
    ap.add_argument("--replay", metavar="FILE", help="run one saved input of TARGET and print the outcome")
    ap.add_argument("--list", action="store_true", help="list the targets and exit")
    args = ap.parse_args(argv)
    from fuzz.targets import targets

    ts = targets()
    if args.list:
        for t in ts.values():
            print(f"{t.name:<14} weight {t.weight:>4g}  {t.what}")
        return 0
    names = list(ts) if args.target == "all" else [args.target]
    unknown = [n for n in names if n not in ts]
    if unknown:
        print(f"fuzz/run.py: unknown target {unknown[0]!r}; targets: {', '.join(ts)}, all", file=sys.stderr)
        return 2
    if args.replay:
        from fuzz import harness

        return harness.replay(ts[names[0]], Path(args.replay).read_bytes())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    if args.engine == "atheris":
        from fuzz.atheris_main import run_atheris

        run = run_atheris(names, {n: ts[n].weight for n in names}, args)
    else:
        run = run_structured(names, {n: ts[n].weight for n in names}, args)
    print(summary(run, names, time.monotonic() - t0))
    if run.crashes:
        print(f"{len(run.crashes)} crashes; reproducers in {out.resolve()} (replay: python fuzz/run.py TARGET "
              f"--replay FILE)")
        return 1
    print("0 crashes")
    return 0


if __name__ == "__main__":
    code = main()
    from fuzz import seeds

    shutil.rmtree(seeds.workdir(), ignore_errors=True)
    sys.exit(code)
