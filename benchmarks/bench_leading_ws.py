"""CPU of the in-memory Kineto read's text check past leading white space (issue 19 item 7,
session 11): ``kineto._check_text`` on a Kineto JSON behind 60 MiB of white space, in this
tree and in a before-tree, each in its own process, best of ``--repeat`` runs.

    PYTHONPATH=. python benchmarks/bench_leading_ws.py --before /work/main

Two texts: plain, and behind a UTF-8 byte-order mark. Prints per tree the CPU seconds (``time.process_time``) of one ``_check_text`` call, the
peak resident memory growth (MiB) and the ratio after/before.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_CHILD = r"""
import json, resource, sys, time
from traceroof.parsers import kineto
ws_mib, repeat, bom = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "bom"
body = b'{"traceEvents": []}'
data = (b"\xef\xbb\xbf" if bom else b"") + b" " * (ws_mib << 20) + body
best = None
rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
for _ in range(repeat):
    t = time.process_time()
    out = kineto._check_text(data, "<bench>")
    t = time.process_time() - t
    assert out is data or out[-len(body):] == body
    best = t if best is None else min(best, t)
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0
print(json.dumps({"cpu_s": best, "rss_growth_mib": rss / 1024}))
"""


def run(tree: Path, ws_mib: int, repeat: int, bom: str) -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD, str(ws_mib), str(repeat), bom], check=True,
                         capture_output=True, text=True, env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
                         cwd=str(tree))
    return json.loads(out.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", type=Path, required=True, help="the before-tree (e.g. /work/main)")
    ap.add_argument("--ws-mib", type=int, default=60, help="MiB of leading white space (default 60)")
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    for bom in ("plain", "bom"):
        before, after = run(a.before, a.ws_mib, a.repeat, bom), run(REPO, a.ws_mib, a.repeat, bom)
        for name, r in (("before", before), ("after", after)):
            print(f"{bom:5s} {name:6s} cpu {r['cpu_s'] * 1e3:8.2f} ms  peak RSS growth {r['rss_growth_mib']:6.1f} MiB")
        print(f"{bom:5s} ratio after/before cpu {after['cpu_s'] / before['cpu_s']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
