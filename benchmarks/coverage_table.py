"""Cost coverage of every real trace, before and after, from two ``compare_reports`` folders.

``compare_reports.py --write DIR`` saves each input's ``analyze --format json`` output as
``DIR/<label>.json``. This script reads the real traces' outputs (labels ``real-*``) from one
folder, or two (before and after a change), and prints one Markdown row per trace: whether it
records shapes, its device time, the share of device time with a cost (FLOPs and bytes, bytes
alone for memory movers, or a collective's message size) before → after, the part of it
costed by bytes alone, and what stays unknown, by kernel family (kind) with the reason
(``coverage.uncosted_families``).

    python benchmarks/compare_reports.py --write /tmp/before     # on the old code
    python benchmarks/compare_reports.py --write /tmp/after      # on the new code
    python benchmarks/coverage_table.py /tmp/before /tmp/after [--min-share 0.01]

Exit status 0. A trace whose output has no JSON report (an error) shows the error's first line.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

# the per-input JSON outputs: "<label>.json", not the saved report or the other outputs
_SKIP = re.compile(r"\.(saved|reload|gate[^.]*|nochip)\.json$")
# the label of a directory input duplicates the files inside it
_DIR_INPUTS = ("real-profiler_demo.json", "real-kineto_tb_plugin_samples_resnet50_num_workers_0.json")


def _report(path: Path) -> dict | str:
    """The JSON report of one output file, or the error line when there is none."""
    if not path.is_file():
        return "no output"
    text = path.read_text()
    body, _, err = text.partition("\n--- stderr ---\n")
    try:
        return json.loads(body)
    except ValueError:
        lines = [ln for ln in (err or body).splitlines() if ln.strip()]
        return lines[0][:100] if lines else "no JSON report"


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f} %"


def _shapes(d: dict) -> str:
    t = d.get("trace") or {}
    cov = d.get("coverage") or {}
    if t.get("format") == "xplane":
        return "HLO" if cov.get("shapes_share") else ("costs in trace" if cov.get("trace_share") else "no HLO")
    return {True: "yes", False: "no"}.get(t.get("record_shapes"), "no")


def unknown_by_family(cov: dict, min_share: float) -> str:
    """What stays unknown: ``kind share (why; e.g. label)`` per family above ``min_share``."""
    dev = cov.get("device_time_ns") or 0
    parts = []
    for f in cov.get("uncosted_families") or []:
        share = f["device_time_ns"] / dev if dev else 0.0
        if share < min_share:
            continue
        ex = f["examples"][0] if f.get("examples") else ""
        ex = ex if len(ex) <= 40 else ex[:39] + "…"
        parts.append(f"{f['kind']} {100 * share:.1f} % ({f['why']}; `{ex}`)")
    return "; ".join(parts)


def row(label: str, before: dict | str, after: dict | str, min_share: float) -> str:
    name = label[len("real-"):-len(".json")]
    if isinstance(after, str):
        return f"| `{name}` | | | | | error: {after} |"
    cov = after.get("coverage") or {}
    b = (before.get("coverage") or {}).get("costed_share") if isinstance(before, dict) else None
    a = cov.get("costed_share")
    costed = _pct(a) if b is None or round(b, 3) == round(a or 0, 3) else f"{_pct(b)} → **{_pct(a)}**"
    dev = cov.get("device_time_ns")
    dev_s = "—" if not dev else f"{dev / 1e6:,.2f} ms"
    return (f"| `{name}` | {_shapes(after)} | {dev_s} | {costed} | {_pct(cov.get('bytes_only_share'))} | "
            f"{unknown_by_family(cov, min_share)} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path, nargs="?")
    ap.add_argument("--min-share", type=float, default=0.005,
                    help="leave out unknown families below this share of device time (default 0.005)")
    args = ap.parse_args(argv)
    after_dir = args.after or args.before
    labels = sorted(p.name for d in {args.before, after_dir} for p in d.glob("real-*.json")
                    if not _SKIP.search(p.name) and p.name not in _DIR_INPUTS)
    print("| trace | shapes | device time | costed | by bytes alone | not costed, by family (reason; largest) |")
    print("|---|---|---:|---:|---:|---|")
    for label in dict.fromkeys(labels):
        print(row(label, _report(args.before / label), _report(after_dir / label), args.min_share))
    return 0


if __name__ == "__main__":
    sys.exit(main())
