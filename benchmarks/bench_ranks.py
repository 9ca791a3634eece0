#!/usr/bin/env python
"""Benchmark: many ranks, ``traceroof analyze --jobs 1`` against ``--jobs 2`` (issue 19 item 4).

Command (from the repo root)::

    python benchmarks/bench_ranks.py [--ranks-dir DIR] [--ranks 16] [--runs 4] [--jobs 2]

Input: the first ``--ranks`` files of ``--ranks-dir`` (default: the 64 gzipped rank files
``bench_scale.py`` writes, ``/tmp/traceroof-bench/kineto_ranks64_x54552_pretty_nccl_v2.1_gz``,
54,552 events each), linked into a temporary folder (the source is only read). Each run is
``python -m traceroof.cli analyze FOLDER --chip h100 --format json -q --jobs J > /dev/null``
in its own process, ``--jobs 1`` and ``--jobs N`` alternating (``--runs`` pairs), so that the
two settings see the same load on a shared machine. Per run: wall (fork to exit), CPU
(user + sys of the command and its children, from ``os.wait4``), peak RSS (``ru_maxrss``:
the largest process of the tree). Printed: every run, the load average before each pair, and
per pair the ratio wall(``--jobs N``) / wall(``--jobs 1``), their median and the best, and the
parent's CPU after the last worker result (``tail``: what the wall waits for); target
(issue 19): ratio ≤ 0.6 with 2 jobs on 2 cores. ``--before-src DIR`` runs each pair with the
traceroof in DIR too, just before this tree's (``git archive fa36e88 traceroof | tar -x -C
DIR``), for a before → after in the same run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DIR = Path(os.environ.get("TRACEROOF_BENCH_CACHE", "/tmp/traceroof-bench")) / "kineto_ranks64_x54552_pretty_nccl_v2.1_gz"


#: runs ``traceroof.cli`` as ``python -m traceroof.cli`` does (its workers import it as their
#: main module, as then), then writes the CPU of this process and of its reaped children (also
#: when the command ends the process itself with ``os._exit``: ``traceroof.cli_entry.entry``),
#: and the CPU this process spent after ``traceroof.parallel.run_parallel`` returned (the
#: parent's serial tail once every worker result is in: merge, analysis, rendering, exit; read
#: from ``time.process_time``; ``-1`` when the read ran in no pool)
DRIVER = """
import os, resource, runpy, sys, time
sys.argv = ["traceroof", *sys.argv[1:]]
import traceroof.parallel as _par
_run, _mark = _par.run_parallel, []
def _timed(*a, **k):
    out = _run(*a, **k)
    _mark.append(time.process_time())
    return out
_par.run_parallel = _timed  # before traceroof.io imports it
def split():
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    tail = time.process_time() - _mark[0] if _mark else -1.0
    sys.stderr.write(f"\\nCPU-SPLIT {me.ru_utime + me.ru_stime:.3f} {kids.ru_utime + kids.ru_stime:.3f} {tail:.3f}\\n")
    sys.stderr.flush()
_exit = os._exit
def fast_exit(code):  # the one-shot command's own os._exit (traceroof.cli_entry.entry): split first
    split()
    _exit(code)
os._exit = fast_exit
try:
    runpy.run_module("traceroof.cli", run_name="__main__", alter_sys=True)
finally:
    split()
"""


def run(folder: Path, jobs: int, src: Path = REPO) -> dict[str, float]:
    """One ``analyze`` of ``folder`` with ``--jobs jobs`` by the traceroof in ``src``: wall s,
    CPU s (user + sys of the tree), peak RSS MB, and the CPU of the parent alone
    (``parent_cpu_s``: the one that also does the analysis of the merged trace), of its
    workers (``workers_cpu_s``), and the parent's CPU after the last worker result
    (``tail_cpu_s``, :data:`DRIVER`)."""
    cmd = [sys.executable, "-c", DRIVER, "analyze", str(folder), "--chip", "h100", "--format", "json",
           "-q", "--jobs", str(jobs)]
    env = dict(os.environ, PYTHONPATH=str(Path(src).resolve()))
    t0 = time.perf_counter()
    # run outside any checkout: ``python -c`` puts the working directory first on sys.path, so
    # run from a repository root it would import that tree's traceroof, not the one in ``src``
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=folder.parent)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    err = p.stderr.read().decode() if p.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{err}")
    split = [line.split()[1:] for line in err.splitlines() if line.startswith("CPU-SPLIT ")]
    if not split:
        raise SystemExit(f"{' '.join(cmd)}: no CPU-SPLIT line on stderr:\n{err}")
    parent, workers, tail = (float(x) for x in split[-1])
    return {"wall_s": wall, "cpu_s": ru.ru_utime + ru.ru_stime, "rss_mb": ru.ru_maxrss / 1024,
            "parent_cpu_s": parent, "workers_cpu_s": workers, "tail_cpu_s": tail}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks-dir", type=Path, default=DEFAULT_DIR)
    ap.add_argument("--ranks", type=int, default=16)
    ap.add_argument("--runs", type=int, default=4, help="pairs of runs (--jobs 1, --jobs N), alternating")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--before-src", type=Path, default=None,
                    help="a folder holding another traceroof (e.g. `git archive <commit> traceroof | tar -x -C DIR`): "
                         "each pair is then run by it too, just before this tree's")
    args = ap.parse_args()
    files = sorted(p for p in args.ranks_dir.iterdir() if p.name.endswith((".json", ".json.gz")))[: args.ranks]
    if len(files) < args.ranks:
        raise SystemExit(f"{args.ranks_dir}: {len(files)} rank files, {args.ranks} asked for "
                         "(benchmarks/bench_scale.py writes them)")
    with tempfile.TemporaryDirectory(prefix="bench-ranks-") as tmp:
        folder = Path(tmp) / f"ranks{args.ranks}"
        folder.mkdir()
        for f in files:
            (folder / f.name).symlink_to(f)
        size = sum(f.stat().st_size for f in files)
        print(f"{args.ranks} ranks, {size / 1e6:.1f} MB on disk; cores available: {len(os.sched_getaffinity(0))}")
        print(f"{'pair':>4} {'load 1m':>7} {'code':>6} {'jobs':>4} {'wall s':>7} {'cpu s':>7} {'parent':>7} "
              f"{'workers':>7} {'tail':>5} {'rss MB':>7}  ratio  cpu-ratio")
        trees = ([("before", args.before_src)] if args.before_src else []) + [("this", REPO)]
        ratios: dict[str, list[float]] = {name: [] for name, _ in trees}
        cpu_ratios: dict[str, list[float]] = {name: [] for name, _ in trees}
        tails: dict[str, list[float]] = {name: [] for name, _ in trees}
        for k in range(args.runs):
            for name, src in trees:
                load = os.getloadavg()[0]
                one = run(folder, 1, src)
                many = run(folder, args.jobs, src)
                ratios[name].append(many["wall_s"] / one["wall_s"])
                cpu_ratios[name].append(many["parent_cpu_s"] / one["cpu_s"])
                tails[name].append(many["tail_cpu_s"])
                for j, r in ((1, one), (args.jobs, many)):
                    tail = f"  {ratios[name][-1]:.2f}  {cpu_ratios[name][-1]:.2f}" if j != 1 else ""
                    print(f"{k + 1:>4} {load:>7.2f} {name:>6} {j:>4} {r['wall_s']:>7.2f} {r['cpu_s']:>7.2f} "
                          f"{r['parent_cpu_s']:>7.2f} {r['workers_cpu_s']:>7.2f} {r['tail_cpu_s']:>5.2f} {r['rss_mb']:>7.0f}{tail}")
    for name, rs in ratios.items():
        med, best = statistics.median(rs), min(rs)
        verdict = "met" if med <= 0.6 else "not met"
        print(f"{name}: wall(--jobs {args.jobs}) / wall(--jobs 1): median {med:.2f}, best {best:.2f} over {len(rs)} "
              f"pairs; target ≤ 0.6: {verdict} (median); parent CPU (--jobs {args.jobs}) / CPU (--jobs 1): median "
              f"{statistics.median(cpu_ratios[name]):.2f}; the parent's CPU after the last worker result (--jobs "
              f"{args.jobs}): median {statistics.median(tails[name]):.2f} s")


if __name__ == "__main__":
    main()
