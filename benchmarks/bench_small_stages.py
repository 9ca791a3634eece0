"""Benchmark: where one small trace's ``analyze`` spends its CPU, stage by stage, in fresh
processes, for one or more checkouts timed in alternation (the same load for each).

Each run is a fresh interpreter (bytecode cached as for an installed package: see
``bench_small.py``) that times, in process CPU (user + system, every thread):

  import polars            the floor's own import
  import traceroof.cli     click and the command line
  import analysis+render   the pipeline's modules (``traceroof.analysis``, ``traceroof.render``)
  import io                the one input door
  read_trace               the read, the reader's modules imported on the way (a first read)
  analyze                  the analysis (its lazily imported stages included)
  render json              the JSON text

    python benchmarks/bench_small_stages.py TRACE [--chip h100] [--runs 7] [--repo DIR ...]

Prints the minimum and median per stage and checkout (``--repo`` repeatable; default: this
checkout), and the load average at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_CHILD = r"""
import json, resource, sys
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
out = []
def mark(name):
    out.append((name, cpu()))
mark("start")
import polars
mark("import polars")
import traceroof.cli
mark("import traceroof.cli")
from traceroof.analysis import analyze
from traceroof.render import render
mark("import analysis+render")
from traceroof.io import read_trace
mark("import io")
import gc
gc.disable()  # as the command line's one-shot commands run
trace = read_trace(sys.argv[1], prepare=True)
mark("read_trace")
report = analyze(trace, sys.argv[2] or None)
mark("analyze")
render(report, "json", top=20)
mark("render json")
print(json.dumps([[n1, 1e3 * (c1 - c0)] for (_, c0), (n1, c1) in zip(out, out[1:])]))
"""


def run_once(repo: Path, trace: str, chip: str, pycache: str) -> dict[str, float]:
    """CPU ms per stage of one fresh process importing ``repo``."""
    env = dict(os.environ, PYTHONPATH=str(repo), PYTHONPYCACHEPREFIX=pycache)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    res = subprocess.run([sys.executable, "-c", _CHILD, trace, chip], env=env, cwd=str(repo),
                         capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        raise SystemExit(f"bench_small_stages: {repo}: the run failed:\n{res.stderr[-2000:]}")
    stages = dict(json.loads(res.stdout.strip().splitlines()[-1]))
    stages["total"] = sum(stages.values())
    return stages


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--chip", default="", help="--chip of the analysis (default: detected)")
    ap.add_argument("--runs", type=int, default=7, help="fresh processes per checkout")
    ap.add_argument("--repo", type=Path, action="append", help="a checkout to time (repeatable)")
    a = ap.parse_args()
    repos = [r.resolve() for r in (a.repo or [REPO])]
    got: dict[Path, list[dict[str, float]]] = {r: [] for r in repos}
    with tempfile.TemporaryDirectory(prefix="bench-stages-pyc-") as pycache:
        for i, r in enumerate(repos):  # warm-up: writes the bytecode
            run_once(r, a.trace, a.chip, f"{pycache}/{i}")
        for _ in range(a.runs):
            for i, r in enumerate(repos):
                got[r].append(run_once(r, a.trace, a.chip, f"{pycache}/{i}"))
    names = list(got[repos[0]][0])
    print("| stage (CPU ms, min / median of %d) | " % a.runs + " | ".join(str(r) for r in repos) + " |")
    print("|---|" + "---:|" * len(repos))
    for n in names:
        cells = [f"{min(x[n] for x in got[r]):.1f} / {statistics.median(x[n] for x in got[r]):.1f}" for r in repos]
        print(f"| {n} | " + " | ".join(cells) + " |")
    print(f"\nload {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
