"""Memory per analysis stage: RSS before, peak during and held after each stage of
``analysis.analyze`` (and any other function named), in one process.

A thread reads ``/proc/self/statm`` every 3 ms; each stage (a module-level function wrapped
for the run) resets the peak when it starts. The allocator is told to return freed memory at
once (``_RJEM_MALLOC_CONF=background_thread:true,dirty_decay_ms:0,muzzy_decay_ms:0`` unless
the variable is set) so that RSS is the memory in use, not what jemalloc keeps for a while.
MB are 10^6 bytes; CPU is this process's user + system time over the stage.

    python benchmarks/mem_stages.py TRACE [module:function ...]
    python benchmarks/mem_stages.py /tmp/traceroof-bench/kineto_qwen_x3086923_pretty_v2.json \\
        traceroof.costing:compute_costs traceroof.timeline:partition
"""

from __future__ import annotations

import os
import sys
import threading
import time

os.environ.setdefault("_RJEM_MALLOC_CONF", "background_thread:true,dirty_decay_ms:0,muzzy_decay_ms:0")

STAGES = ["attribute_replays", "cost_ops", "apply_roofline", "segment_steps", "rank_groups", "summarize",
          "check_roofs", "compare_ranks", "detect_findings", "light_speed", "describe_trace", "check_accounting"]
_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_mb() -> float:
    """Resident set size now, MB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE / 1e6


def main() -> None:
    import importlib

    import traceroof  # noqa: F401  (before polars: the allocator setting)
    from traceroof import analysis
    from traceroof.io import read_trace

    peak = [0.0]

    def sample() -> None:
        while True:
            peak[0] = max(peak[0], rss_mb())
            time.sleep(0.003)

    threading.Thread(target=sample, daemon=True).start()
    rows: list[tuple[str, float, float, float, float]] = []

    def wrap(mod: object, name: str) -> None:
        f = getattr(mod, name)

        def staged(*a: object, **k: object) -> object:
            before = rss_mb()
            peak[0] = before
            t0 = time.process_time()
            out = f(*a, **k)
            rows.append((name, before, peak[0], rss_mb(), time.process_time() - t0))
            return out

        setattr(mod, name, staged)

    for spec in sys.argv[2:]:
        m, n = spec.split(":")
        wrap(importlib.import_module(m), n)
    for n in STAGES:
        wrap(analysis, n)
    start = rss_mb()
    peak[0] = start
    trace = read_trace(sys.argv[1])
    print(f"read_trace           before {start:6.0f} peak {peak[0]:6.0f} held {rss_mb():6.0f}")
    analysis.analyze(trace, "h100")
    for name, b, p, h, c in rows:
        print(f"{name:20s} before {b:6.0f} peak {p:6.0f} held {h:6.0f} cpu {c:5.2f} s")
    print(f"after analyze: {rss_mb():.0f} MB held")


if __name__ == "__main__":
    main()
