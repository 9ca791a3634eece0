#!/usr/bin/env python
"""Scaling check (issue 19): time and RSS per event of ``read_trace`` and ``analyze`` from 10^5 to 10^7 events.

Command (from the repo root; the first run generates and caches the inputs: ~3.3 GB for 10^7)::

    python benchmarks/bench_linear.py                        # 10^5, 10^6, 10^7 events
    python benchmarks/bench_linear.py --events 100000,1000000 # a quicker check
    python benchmarks/bench_linear.py --warm ...             # the reader's imports before the timer
    python benchmarks/bench_linear.py --generate-only

Inputs: ``bench_kineto.py``'s generator (the real H100 Qwen trace replicated step after step,
torch's pretty layout), cached in ``$TRACEROOF_BENCH_CACHE`` or ``/tmp/traceroof-bench``
(existing files are reused, never rewritten; a new one is written under a temporary name).

Each trace is measured in a fresh child process (so its peak RSS is its own): CPU time (user +
system of the process, every thread: ``resource.getrusage``) and wall time of ``read_trace``,
of ``analyze(trace, chip="h100")`` and of each stage of :data:`traceroof.analysis.STAGES`
(each stage wrapped in place); peak RSS (``ru_maxrss``) after the read and after the analysis.
The figures are printed per event (ns of CPU per event, bytes of peak RSS per event) with their
ratio to the smallest trace's; the issue's bar is every ratio within 10 % (0.90–1.10). Fixed
costs (a stage's setup, imports done lazily) weigh on the smallest trace alone, so the marginal
CPU per added event between consecutive sizes is printed too: linear means those are equal. A stage
under 1 % of ``analyze`` is shown but not judged (its per-event figure is noise). ``uptime``'s
load is printed with the figures: a loaded machine inflates CPU time too.

Exit status 0 when every judged ratio is within ``--tolerance`` (default 0.10), 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_kineto as bk  # noqa: E402  (the generator)

REPO = bk.REPO
LAYOUT = "pretty"

_CHILD = r"""
import json, os, resource, sys, time
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
def peak_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
import polars  # noqa: F401  (imports are not the trace's cost)
from traceroof import analysis
from traceroof.io import read_trace
from traceroof.parsers import kineto_link
out = {"stages": {}}
if os.environ.get("BENCH_LINEAR_WARM") == "1":
    # --warm: the modules a first native read imports (numpy and numpy.ma, which polars'
    # Series-from-numpy loads, and the Kineto reader's own), imported before the timer: a
    # per-process cost, not a per-event one (measured and reported apart)
    c0 = cpu()
    import numpy, numpy.ma  # noqa: E401,F401
    from traceroof.parsers import kineto, kineto_native_frames, kineto_stream  # noqa: F401
    out["warm_imports_cpu_s"] = cpu() - c0
base_rss = peak_bytes()
link = kineto_link.build_tables
def timed_link(*a, **k):
    c, w = cpu(), time.perf_counter()
    try:
        return link(*a, **k)
    finally:
        out["link"] = {"cpu_s": cpu() - c, "wall_s": time.perf_counter() - w}
kineto_link.build_tables = timed_link
for mod in list(sys.modules.values()):
    if getattr(mod, "__name__", "").startswith("traceroof.parsers") and getattr(mod, "build_tables", None) is link:
        mod.build_tables = timed_link
c, w = cpu(), time.perf_counter()
trace = read_trace(sys.argv[1])
out["read"] = {"cpu_s": cpu() - c, "wall_s": time.perf_counter() - w, "peak_rss": peak_bytes(), "base_rss": base_rss}
out["events"] = trace.meta.stats.get("events")
out["ops"], out["host"] = trace.ops.height, trace.host.height
for name in analysis.STAGES:
    f = getattr(analysis, name)
    def wrap(*a, _f=f, _n=name, **k):
        c0 = cpu()
        try:
            return _f(*a, **k)
        finally:
            out["stages"][_n] = out["stages"].get(_n, 0.0) + cpu() - c0
    setattr(analysis, name, wrap)
c, w = cpu(), time.perf_counter()
analysis.analyze(trace, chip="h100")
out["analyze"] = {"cpu_s": cpu() - c, "wall_s": time.perf_counter() - w, "peak_rss": peak_bytes()}
with open(sys.argv[2], "w") as fh:
    json.dump(out, fh)
"""


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def measure(path: Path, warm: bool = False) -> dict:
    """One child process: read, then analyze ``path`` (the figures of :data:`_CHILD`);
    ``warm``: the reader's modules imported before the timer (``--warm``)."""
    with tempfile.TemporaryDirectory(prefix="bench-linear-") as tmp:
        res = Path(tmp) / "out.json"
        env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   BENCH_LINEAR_WARM="1" if warm else "0")
        proc = subprocess.run([sys.executable, "-c", _CHILD, str(path), str(res)], env=env,
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"measuring {path} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        return json.loads(res.read_text())


def load() -> str:
    """The 1/5/15-minute load averages, as ``uptime`` prints them."""
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def per_event(results: list[tuple[int, dict]]) -> list[tuple[str, list[float], str, bool]]:
    """Rows ``(figure, per-event values per trace, unit, judged)``: CPU ns per event of the
    read, the link stage, analyze and each stage; peak RSS bytes per event after the read and
    after the analysis (above the interpreter's own, measured before the read)."""
    rows: list[tuple[str, list[float], str, bool]] = []

    def add(name: str, values: list[float], unit: str, judged: bool = True) -> None:
        rows.append((name, values, unit, judged))

    ev = [n for n, _ in results]
    add("read_trace CPU", [r["read"]["cpu_s"] * 1e9 / n for n, r in results], "ns/event")
    if all("link" in r for _, r in results):
        add("  build_tables CPU", [r["link"]["cpu_s"] * 1e9 / n for n, r in results], "ns/event")
    add("read_trace peak RSS", [(r["read"]["peak_rss"] - r["read"]["base_rss"]) / n for n, r in results],
        "B/event")
    add("analyze CPU", [r["analyze"]["cpu_s"] * 1e9 / n for n, r in results], "ns/event")
    total = [r["analyze"]["cpu_s"] for _, r in results]
    for stage in results[-1][1]["stages"]:
        vals = [r["stages"].get(stage, 0.0) * 1e9 / n for n, r in results]
        share = min(r["stages"].get(stage, 0.0) / t if t else 0.0 for (_, r), t in zip(results, total))
        add(f"  {stage} CPU", vals, "ns/event", judged=share >= 0.01)
    add("analyze peak RSS", [(r["analyze"]["peak_rss"] - r["read"]["base_rss"]) / n for n, r in results],
        "B/event")
    assert len(ev) == len(results)
    return rows


def _marginal(results: list[tuple[int, dict]], i: int, what: str) -> float:
    """CPU ns per event added from trace ``i`` to trace ``i + 1`` (``what``: read or analyze)."""
    (n0, r0), (n1, r1) = results[i], results[i + 1]
    return (r1[what]["cpu_s"] - r0[what]["cpu_s"]) * 1e9 / max(n1 - n0, 1)


def report(results: list[tuple[int, dict]], tolerance: float) -> int:
    """Print the per-event table and the marginal costs; 1 when a judged ratio is out of
    ``tolerance``, else 0."""
    rows = per_event(results)
    head = f"{'figure':28}" + "".join(f"{n:>14,}" for n, _ in results) + "   ratios to the first"
    print(f"load average {load()}")
    print(head)
    bad = 0
    for name, vals, unit, judged in rows:
        ratios = [v / vals[0] if vals[0] else float("nan") for v in vals]
        ok = all(abs(x - 1) <= tolerance for x in ratios)
        bad += judged and not ok
        mark = "" if not judged else (" ok" if ok else " OUT")
        print(f"{name:28}" + "".join(f"{v:>14.1f}" for v in vals) + f" {unit:9}"
              + " ".join(f"{x:.2f}" for x in ratios) + mark)
    if len(results) > 1:
        # fixed costs (a stage's setup, the chip table) weigh on the smallest trace's per-event
        # figure; the marginal cost between consecutive sizes is free of them: linear means equal
        print("marginal CPU per added event (fixed costs cancel): "
              + "; ".join(f"{results[i][0]:,}→{results[i + 1][0]:,}: read "
                          f"{_marginal(results, i, 'read'):.0f} ns, analyze {_marginal(results, i, 'analyze'):.0f} ns"
                          for i in range(len(results) - 1)))
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", default="100000,1000000,10000000",
                    help="comma-separated event counts (default 10^5, 10^6, 10^7)")
    ap.add_argument("--tolerance", type=float, default=0.10, help="allowed |ratio - 1| (default 0.10)")
    ap.add_argument("--generate-only", action="store_true", help="generate (or reuse) the inputs and stop")
    ap.add_argument("--results", type=Path, default=None, help="write the raw figures as JSON here")
    ap.add_argument("--warm", action="store_true",
                    help="import numpy and the Kineto reader's modules before timing the read (their "
                         "CPU is printed apart): the per-event figures without the per-process imports")
    ap.add_argument("--from-results", type=Path, default=None, help="print the table of a --results file, measure nothing")
    a = ap.parse_args(argv)
    if a.from_results:
        saved = json.loads(a.from_results.read_text())
        print(f"(figures measured at load {saved['load']})")
        return report([(int(n), r) for n, r in saved["results"]], a.tolerance)
    counts = sorted(int(float(x)) for x in a.events.split(","))
    paths = [bk.ensure_trace(n, LAYOUT, progress=True) for n in counts]
    if a.generate_only:
        for p, n in paths:
            log(f"{p} ({n:,} events)")
        return 0
    results = []
    for p, n in paths:
        log(f"measuring {p.name} ({n:,} events, {p.stat().st_size / 1e6:.0f} MB; load {load()})…")
        r = measure(p, a.warm)
        results.append((int(r.get("events") or n), r))
        if "warm_imports_cpu_s" in r:
            log(f"  (imported before the timer: {r['warm_imports_cpu_s']:.3f} s CPU)")
        log(f"  read {r['read']['cpu_s']:.2f} s CPU ({r['read']['wall_s']:.2f} s wall), analyze "
            f"{r['analyze']['cpu_s']:.2f} s CPU ({r['analyze']['wall_s']:.2f} s wall), peak RSS "
            f"{r['analyze']['peak_rss'] / 2**20:.0f} MiB; load {load()}")
    if a.results:
        a.results.write_text(json.dumps({"load": load(), "results": results}, indent=1))
    return report(results, a.tolerance)


if __name__ == "__main__":
    sys.exit(main())
