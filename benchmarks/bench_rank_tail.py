#!/usr/bin/env python
"""Per-stage CPU of the parent's analysis of many ranks (issue 19 item 4: the serial tail).

    PYTHONPATH=TREE python benchmarks/bench_rank_tail.py RANKS_DIR [--chip h100] [--runs 7] [--jobs 2]

The ranks are read as ``traceroof analyze RANKS_DIR --jobs J`` reads them
(``read_trace(..., jobs=J, prepare=True)``: the per-rank stages done by the readers), once;
then ``analysis.analyze`` and the JSON rendering run once untimed (imports, caches) and
``--runs`` times timed in this process. Printed per :data:`traceroof.analysis.STAGES` stage
and per detector: the median and the least CPU (``time.process_time``: every thread of the
process) in ms. For a before → after, run it with each tree's ``PYTHONPATH`` alternately, from
outside both repository roots (``python -c``/script paths put the working directory first on
``sys.path``).
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ranks_dir")
    ap.add_argument("--chip", default="h100")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args()

    import traceroof.findings as F
    from traceroof import analysis
    from traceroof.io import read_trace
    from traceroof.render import render

    trace = read_trace(a.ranks_dir, jobs=a.jobs, prepare=True, chip=a.chip)
    F._load_builtin()
    acc: dict[str, list[float]] = {}

    def timed(fn, key):
        def run(*args, **kw):
            t = time.process_time()
            try:
                return fn(*args, **kw)
            finally:
                acc.setdefault(key, []).append(time.process_time() - t)
        return run

    for s in analysis.STAGES:
        if hasattr(analysis, s):
            setattr(analysis, s, timed(getattr(analysis, s), s))
    analysis.summarize = timed(analysis.summarize, "summarize")
    for name in list(F.DETECTORS):
        F.DETECTORS[name] = timed(F.DETECTORS[name], "  detector " + name)

    def once() -> None:
        t = time.process_time()
        rep = analysis.analyze(trace, a.chip)
        acc.setdefault("analyze (all stages)", []).append(time.process_time() - t)
        t = time.process_time()
        render(rep, "json", top=20)
        acc.setdefault("render json", []).append(time.process_time() - t)

    once()
    acc.clear()
    for _ in range(a.runs):
        once()
    for k, v in acc.items():
        print(f"{k:34s} {statistics.median(v) * 1e3:8.1f} ms  (least {min(v) * 1e3:.1f})")


if __name__ == "__main__":
    main()
