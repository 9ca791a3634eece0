#!/usr/bin/env python
"""CPU time of each stage of ``analysis.analyze`` on one trace, read once, analysed N times.

    python benchmarks/bench_stage_cpu.py TRACE [--repeat 3] [--dump DIR]
    PYTHONPATH=/path/to/other/checkout python benchmarks/bench_stage_cpu.py TRACE   # another checkout

CPU = user + system of the whole process (every thread, ``resource.getrusage``) around each
stage function of :mod:`traceroof.analysis` (wrapped in place), wall beside it; "without
seg/detect" is ``analyze``'s CPU less ``segment_steps`` and ``detect_findings``. ``--dump``
writes the last report's op, ranking and step tables (Parquet) and the report JSON, to
compare two checkouts' results exactly.
"""

from __future__ import annotations

import argparse
import os
import resource
import time

STAGES = ["attribute_replays", "cost_ops", "apply_roofline", "segment_steps", "rank_groups", "summarize",
          "check_roofs", "compare_ranks", "detect_findings", "light_speed", "describe_trace", "describe_coverage",
          "collect_warnings", "check_accounting"]


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--chip", default="h100")
    ap.add_argument("--dump", help="folder for the last report's tables and JSON")
    a = ap.parse_args()
    from traceroof import analysis
    from traceroof.io import read_trace

    tr = read_trace(a.trace)
    tot: dict[str, list[float]] = {}
    for s in STAGES:
        f = getattr(analysis, s)

        def wrapped(*args, _f=f, _s=s, **kw):
            c, t = _cpu(), time.perf_counter()
            try:
                return _f(*args, **kw)
            finally:
                v = tot.setdefault(_s, [0.0, 0.0])
                v[0] += _cpu() - c
                v[1] += time.perf_counter() - t
        setattr(analysis, s, wrapped)
    print(f"{a.trace}: load {os.getloadavg()[0]:.1f}")
    rep = None
    for _ in range(a.repeat):
        tot.clear()
        c, t = _cpu(), time.perf_counter()
        rep = analysis.analyze(tr, a.chip)
        cpu, wall = _cpu() - c, time.perf_counter() - t
        rest = cpu - sum(tot.get(k, [0.0])[0] for k in ("segment_steps", "detect_findings"))
        print(f"analyze {cpu:.2f} s CPU {wall:.2f} s wall; without seg/detect {rest:.2f} s CPU; "
              + ", ".join(f"{k} {v[0]:.2f}/{v[1]:.2f}" for k, v in tot.items() if v[0] >= 0.005))
    if a.dump and rep is not None:
        os.makedirs(a.dump, exist_ok=True)
        rep.ops.write_parquet(f"{a.dump}/ops.parquet")
        rep.ranking.write_parquet(f"{a.dump}/ranking.parquet")
        rep.steps.write_parquet(f"{a.dump}/steps.parquet")
        rep.save(f"{a.dump}/report.json")


if __name__ == "__main__":
    main()
