#!/usr/bin/env python
"""How many polars queries ``analysis.analyze`` runs on one trace, per stage and per function.

    python benchmarks/count_queries.py TRACE [CHIP] [--repeat 3] [--top 40] [--lines]
    PYTHONPATH=/path/to/other/checkout python benchmarks/count_queries.py TRACE   # another checkout
    python benchmarks/count_queries.py RANKS_DIR h100 --jobs 2   # the parent's analysis of ranks read as the CLI does

A query is a call of ``polars.LazyFrame.collect`` or ``LazyFrame._collect_eager`` (every eager
``DataFrame`` operation — ``filter``, ``select``, ``with_columns``, ``sort``, ``join``,
``group_by`` — and many ``Series`` methods are a lazy query collected at once). Each is
attributed to the :data:`traceroof.analysis.STAGES` function and the innermost traceroof
function (``--lines``: and line) on the stack (:func:`traceroof.frames.done` counts for its
caller), with the seconds spent inside it. The trace is
read once and analysed once untimed (imports, caches), then ``--repeat`` times counted; the
figures are per ``analyze`` (issue 19, small traces: session 10, docs/performance.md).
"""

from __future__ import annotations

import argparse
import collections
import resource
import sys
import time


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("chip", nargs="?", default=None, help="a chip name (default: detected)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--top", type=int, default=40, help="functions listed")
    ap.add_argument("--lines", action="store_true", help="attribute to the line, not the function")
    ap.add_argument("--jobs", type=int, default=None,
                    help="read as the CLI reads with --jobs N (read_trace(..., jobs=N, prepare=True)): the "
                         "per-rank stages done by the readers, as the parent's analysis then runs")
    a = ap.parse_args()
    import polars as pl

    from traceroof import analysis
    from traceroof.io import read_trace

    tr = (read_trace(a.trace) if a.jobs is None else
          read_trace(a.trace, jobs=a.jobs, prepare=True, chip=a.chip))
    analysis.analyze(tr, a.chip)  # untimed: imports and first-use costs
    n_stage: collections.Counter[str] = collections.Counter()
    s_stage: collections.Counter[str] = collections.Counter()
    n_fn: collections.Counter[str] = collections.Counter()
    s_fn: collections.Counter[str] = collections.Counter()

    def counted(orig):
        def run(self, *args, **kw):
            f, stage, inner = sys._getframe(1), "(outside a stage)", None
            while f is not None:
                mod = f.f_globals.get("__name__", "")
                if mod.startswith("traceroof"):
                    if inner is None and mod != "traceroof.frames":  # frames.done: its caller's
                        inner = f"{mod.removeprefix('traceroof.')}.{f.f_code.co_name}" + (
                            f":{f.f_lineno}" if a.lines else "")
                    if mod == "traceroof.analysis" and f.f_code.co_name in analysis.STAGES:
                        stage = f.f_code.co_name
                f = f.f_back
            t = time.perf_counter()
            try:
                return orig(self, *args, **kw)
            finally:
                d = time.perf_counter() - t
                n_stage[stage] += 1
                s_stage[stage] += d
                n_fn[inner or "(not traceroof)"] += 1
                s_fn[inner or "(not traceroof)"] += d
        return run

    pl.LazyFrame.collect = counted(pl.LazyFrame.collect)  # type: ignore[method-assign]
    pl.LazyFrame._collect_eager = counted(pl.LazyFrame._collect_eager)  # type: ignore[method-assign]
    c = _cpu()
    for _ in range(a.repeat):
        analysis.analyze(tr, a.chip)
    n = a.repeat
    print(f"{a.trace}: {sum(n_stage.values()) / n:.0f} queries per analyze, {sum(s_stage.values()) / n * 1e3:.1f} ms "
          f"in them; analyze {(_cpu() - c) / n * 1e3:.1f} ms CPU (counting included)")
    for k, v in n_stage.most_common():
        print(f"  {v / n:6.0f} {s_stage[k] / n * 1e3:7.1f} ms  {k}")
    print("by function:")
    for k, v in n_fn.most_common(a.top):
        print(f"  {v / n:6.0f} {s_fn[k] / n * 1e3:7.1f} ms  {k}")


if __name__ == "__main__":
    main()
