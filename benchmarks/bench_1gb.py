#!/usr/bin/env python
"""Issue 19's 1 GB bars, in one run: traceroof ``analyze`` of a 1 GB Kineto trace against a
bare ``orjson.loads`` of the same file, and its peak RSS against the file's size.

Command (from the repo root; the inputs are bench_scale.py's, in ``$TRACEROOF_BENCH_CACHE``
or ``/tmp/traceroof-bench``, read only)::

    python benchmarks/bench_1gb.py                    # best of 2
    python benchmarks/bench_1gb.py --repeat 3 --trace PATH.json
    python benchmarks/bench_1gb.py --before /tmp/base   # also the cases of another checkout
    python benchmarks/bench_1gb.py --cases library,cli --malloc-conf dirty_decay_ms:0  # a subset; another allocator setting

Each case runs in its own subprocess (``PYTHONPATH`` = this checkout, ``_RJEM_MALLOC_CONF``
unset, so the allocator is whatever traceroof or polars choose): wall = fork → exit (imports
included); CPU = user + system of the child (``os.wait4``); peak RSS = ``ru_maxrss`` of the
child (``os.wait4``, KiB → MB of 10^6 bytes). Cases: ``orjson`` (``orjson.loads`` of the
file's bytes, then ``os._exit``: the floor, no teardown), ``cli`` and ``cli-gz`` (``traceroof
analyze FILE --chip h100 --format json -q``, plain and ``.json.gz``), ``library`` (a plain
script: ``from traceroof.io import read_trace``; ``analysis.analyze(read_trace(FILE),
chip="h100")``). The best run of each (least wall) is kept.

Bars (issue 19): wall ≤ 0.25 × orjson's wall; peak RSS ≤ 0.5 × the uncompressed file size
(the ``.gz`` case is held to the uncompressed size too). The load average is printed beside
the table, since the machine may be shared.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("TRACEROOF_BENCH_CACHE", "/tmp/traceroof-bench"))
DEFAULT_TRACE = CACHE / "kineto_qwen_x3086923_pretty_v2.json"

ORJSON = "import orjson, os, sys\nd = open(sys.argv[1], 'rb').read()\norjson.loads(d)\nos._exit(0)\n"
LIBRARY = (
    "import sys\nfrom traceroof.io import read_trace\nfrom traceroof import analysis\n"
    "analysis.analyze(read_trace(sys.argv[1]), chip='h100')\n"
)
TIME_BAR = 0.25  # issue 19: analyze wall <= 0.25x a bare orjson.loads
RSS_BAR = 0.5  # issue 19: peak RSS <= 0.5x the file


#: ``--malloc-conf``: the children's ``_RJEM_MALLOC_CONF`` (None: unset, traceroof's own choice)
MALLOC_CONF: str | None = None


def run(argv: list[str], repo: Path = REPO) -> dict[str, float]:
    """One child: wall s, CPU s (user + sys) and peak RSS MB, from ``os.wait4``; traceroof
    imported from ``repo``."""
    env = {k: v for k, v in os.environ.items() if k != "_RJEM_MALLOC_CONF"}
    if MALLOC_CONF is not None:
        env["_RJEM_MALLOC_CONF"] = MALLOC_CONF
    env["PYTHONPATH"] = str(repo)
    t0 = time.perf_counter()
    # cwd = the checkout measured: ``python -c`` / ``-m`` put the working directory first on
    # sys.path, ahead of PYTHONPATH (run from this checkout, the ``--before`` cases imported
    # this checkout's traceroof, not the other's)
    proc = subprocess.Popen(argv, env=env, cwd=repo, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.returncode != 0:
        raise SystemExit(f"bench_1gb: {' '.join(argv)} failed (exit {proc.returncode}): {err.strip()[-400:]}")
    return {"wall_s": wall, "cpu_s": ru.ru_utime + ru.ru_stime, "user_s": ru.ru_utime, "sys_s": ru.ru_stime,
            "peak_rss_mb": ru.ru_maxrss * 1024 / 1e6}


def best_of(argv: list[str], n: int, repo: Path = REPO) -> dict[str, float]:
    runs = [run(argv, repo) for _ in range(n)]
    return min(runs, key=lambda r: r["wall_s"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="the uncompressed .json trace")
    ap.add_argument("--repeat", type=int, default=2, help="best of N per case")
    ap.add_argument("--results", type=Path, help="also write the figures as JSON here")
    ap.add_argument("--before", type=Path, help="another checkout (built): its cli and library cases too")
    ap.add_argument("--cases", help="comma-separated subset of orjson,cli,cli-gz,library (default: all)")
    ap.add_argument("--malloc-conf", help="the children's _RJEM_MALLOC_CONF (default: unset), e.g. "
                    "background_thread:true,dirty_decay_ms:0,muzzy_decay_ms:0")
    args = ap.parse_args()
    global MALLOC_CONF
    MALLOC_CONF = args.malloc_conf
    trace = args.trace.resolve()  # the children run in the checkout they measure
    if args.before:
        args.before = args.before.resolve()
    gz = trace.with_name(trace.name + ".gz")
    for p in (trace, gz):
        if not p.is_file():
            raise SystemExit(f"bench_1gb: {p} is missing (bench_scale.py --generate-only makes it)")
    file_mb = trace.stat().st_size / 1e6
    py = sys.executable
    cli = [py, "-m", "traceroof.cli", "analyze"]
    tail = ["--chip", "h100", "--format", "json", "-q"]
    cases = {
        "orjson": [py, "-c", ORJSON, str(trace)],
        "cli": [*cli, str(trace), *tail],
        "cli-gz": [*cli, str(gz), *tail],
        "library": [py, "-c", LIBRARY, str(trace)],
    }
    if args.cases:
        unknown = set(args.cases.split(",")) - set(cases)
        if unknown:
            raise SystemExit(f"bench_1gb: unknown --cases {', '.join(sorted(unknown))} (known: {', '.join(cases)})")
        cases = {k: v for k, v in cases.items() if k in args.cases.split(",")}
    load = os.getloadavg()
    res = {}
    runs = [(name, argv, REPO) for name, argv in cases.items()]
    if args.before:
        runs += [(f"{name} (before)", argv, args.before) for name, argv in cases.items() if name != "orjson"]
    for name, argv, repo in runs:
        res[name] = best_of(argv, args.repeat, repo)
        print(f"{name}: {res[name]}", file=sys.stderr, flush=True)
    floor = res["orjson"]["wall_s"] if "orjson" in res else float("nan")
    print(f"\n{trace.name}: {file_mb:,.0f} MB; load average {load[0]:.1f} at start, "
          f"{os.getloadavg()[0]:.1f} at end; best of {args.repeat}; _RJEM_MALLOC_CONF "
          f"{MALLOC_CONF or 'unset'}\n")
    print("| case | wall | CPU (user+sys) | peak RSS | wall / orjson | CPU / orjson wall | RSS / file "
          "| bars (0.25x, 0.5x) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for name, r in res.items():
        tr, mr = r["wall_s"] / floor, r["peak_rss_mb"] / file_mb
        bars = "floor" if name == "orjson" else (
            f"time {'met' if tr <= TIME_BAR else 'NOT met'}, memory {'met' if mr <= RSS_BAR else 'NOT met'}")
        print(f"| {name} | {r['wall_s']:.2f} s | {r['user_s']:.2f}+{r['sys_s']:.2f} s | {r['peak_rss_mb']:,.0f} MB "
              f"| {tr:.3f} | {r['cpu_s'] / floor:.3f} | {mr:.2f} | {bars} |")
    if args.results:
        args.results.write_text(json.dumps({"trace": str(trace), "file_mb": file_mb, "load": load, "cases": res},
                                           indent=1))


if __name__ == "__main__":
    main()
