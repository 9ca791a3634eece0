"""What the stages added this round cost, as a share of the whole analysis of the same trace.

In one process, per trace: the median over ``--runs`` of ``analyze`` (the whole pipeline after
the read, the speed of light and its waterfall included), and of the stages it now runs or
offers: the graph-replay and unlaunched-kernel attribution (``analysis.attribute_replays``,
inside ``analyze``), and the outputs ``--format html`` and ``--perfetto`` write. Ratios are against the same run's ``analyze``, so the machine's load
cancels out as far as it can.

    python benchmarks/bench_stages.py [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REAL = REPO.parent / "shared" / "fixtures" / "real"
TRACES = {
    "qwen-h100": (REAL / "TraceLens/tests/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz", None),
    "hta-control-a100": (REAL / "HolisticTraceAnalysis/tests/data/trace_diff/control/control.json.gz", "a100"),
    "vllm-graph-mi300x": (REAL / "TraceLens/tests/traces/inference/vllm_decode_full/graph_execution.json.gz",
                          "mi300x"),
}


def _median(fn, runs: int) -> float:
    ts = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def measure(path: Path, chip: str | None, runs: int) -> dict[str, float]:
    from traceroof import analyze, read_trace
    from traceroof.analysis import attribute_replays
    from traceroof.render import html, perfetto

    trace = read_trace(path)
    report = analyze(trace, chip)
    out = {"ops": trace.ops.height}
    out["analyze_s"] = _median(lambda: analyze(trace, chip), runs)
    out["attribute_s"] = _median(lambda: attribute_replays(trace, None), runs)
    with tempfile.TemporaryDirectory() as d:
        out["html_s"] = _median(lambda: html.render(report), runs)
        out["perfetto_s"] = _median(lambda: perfetto.write_perfetto(report, Path(d) / "p.json.gz"), runs)
    for k in ("attribute_s", "html_s", "perfetto_s"):
        out[k.replace("_s", "_share")] = round(out[k] / out["analyze_s"], 3)
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in out.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(REPO))
    print(json.dumps({name: measure(p, chip, args.runs) for name, (p, chip) in TRACES.items()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
