"""Before/after table of every input's headline numbers, from two ``compare_reports`` folders.

``compare_reports.py --write DIR`` saves each input's ``analyze --format json`` output as
``DIR/<label>.json``. This script reads two such folders (before and after a change) and prints
one Markdown row per input: step time, device busy share, HFU, the top finding (kind and
recoverable time) and the number of accounting-rule warnings, before → after, marking the
rows that changed.

    python benchmarks/compare_reports.py --write /tmp/before     # on the old code
    python benchmarks/compare_reports.py --write /tmp/after      # on the new code
    python benchmarks/fixture_table.py /tmp/before /tmp/after [--changed]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

# the per-input JSON outputs: "<label>.json", not the saved report or the other outputs
_SKIP = re.compile(r"\.(saved|reload|gate[^.]*|nochip)\.json$")


def _ms(ns: float | None) -> str:
    from traceroof import units

    return "—" if ns is None else units.ns(ns)


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f} %"


def headline(path: Path) -> dict[str, str]:
    """The headline numbers of one ``analyze --format json`` output (strings, for the table)."""
    try:
        # compare_reports appends the run's stderr and exit status after the JSON
        d = json.loads(path.read_text().split("\n--- stderr ---\n")[0])
    except (OSError, ValueError):
        return {"error": "no JSON report"}
    s = d.get("summary") or {}
    f = (d.get("findings") or [None])[0]
    rules = [w for w in d.get("warnings", []) if w.startswith("accounting rule")]
    return {
        "step time": _ms(s.get("step_time_ns")),
        "busy": _pct(s.get("busy_fraction")),
        "HFU": _pct(s.get("hfu")),
        "top finding": "—" if f is None else f"{f['kind']} {_ms(f.get('recoverable_ns'))}",
        "rule warnings": str(len(rules)),
    }


def rows(before: Path, after: Path) -> list[tuple[str, dict[str, str], dict[str, str]]]:
    names = sorted({p.name for d in (before, after) for p in d.glob("*.json") if not _SKIP.search(p.name)})
    return [(_short(n[: -len(".json")]), headline(before / n), headline(after / n)) for n in names]


def _short(label: str) -> str:
    """A compare_reports label without the shared folder's long prefixes."""
    for long, short in (("real-HolisticTraceAnalysis_tests_data_", "HTA/"), ("real-TraceLens_tests_traces_", "TraceLens/"),
                        ("real-xprof_xprof_convert_test_xplanes_", "xprof/"), ("real-", "")):
        if label.startswith(long):
            return short + label[len(long):]
    return label


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--changed", action="store_true", help="only the inputs whose numbers changed")
    a = ap.parse_args()
    cols = ["step time", "busy", "HFU", "top finding", "rule warnings"]
    print("| input | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for name, b, c in rows(a.before, a.after):
        if a.changed and b == c:
            continue
        cells = [b.get(k, "?") if b.get(k) == c.get(k) else f"{b.get(k, '?')} → **{c.get(k, '?')}**" for k in cols]
        print(f"| {name} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
