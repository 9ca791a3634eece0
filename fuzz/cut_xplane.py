"""The cut sweep of the ``.xplane.pb`` reader (issue 19 item 6; docs/fuzzing.md, "Session 10").

Each real (``../shared/fixtures/real``) and generated (``fixtures/``) ``.xplane.pb`` is cut at
every 1/64 of its size, at bytes 1, 2, 3, 5 and 9, and around and inside its first three
planes; each cut is read by ``read_trace`` from a temporary file. Prints, per file, how many
cuts were rejected whole (``TraceFormatError``) and the first of them, then the totals, the
rejected ones split by why: ``no_plane`` (the file ends before its first plane's first field
is complete), ``no_line`` (planes or a plane's name are complete, but no line and no event:
nothing usable, exit 4 as well), ``other``; any other exception is a crash (exit 1). Of the
cuts read: ``lost_name_cuts`` (ops named ``<event metadata ID: not in the file>``: their names
were lost with the cut), ``empty_names`` (ops named ``""``) and ``nameless_steps`` (steps
inferred from an empty or lost name), both 0 since session 11.

Run: ``PYTHONPATH=. python fuzz/cut_xplane.py [--small]`` (``--small``: files under 4 MB).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REAL = REPO.parent / "shared" / "fixtures" / "real"


def _cuts(data: bytes) -> list[int]:
    """The offsets to cut ``data`` at (see the module docstring)."""
    from traceroof.parsers import xplane_proto as xp

    n = len(data)
    cuts = [n * k // 64 for k in range(1, 64)] + [1, 2, 3, 5, 9]
    planes = [value for num, _wt, value, _tag, _end in xp.iter_fields(memoryview(data), 0, n) if num == 1]
    for s, e in planes[:3]:
        cuts += [s - 2, s - 1, s, s + 1, s + 2, s + 10, s + 100, s + 1000, (s + e) // 3, (s + e) // 2, e - 1]
    return sorted({c for c in cuts if 0 < c < n})


def main(argv: list[str]) -> int:
    from traceroof.errors import TraceFormatError
    from traceroof.io import read_trace

    files = sorted(REAL.rglob("*.xplane.pb")) + sorted(REPO.glob("fixtures/*/*.xplane.pb"))
    if "--small" in argv:
        files = [f for f in files if f.stat().st_size < 4_000_000]
    totals = {"cuts": 0, "rejected": 0, "no_plane": 0, "no_line": 0, "other": 0, "crashes": 0,
              "lost_name_cuts": 0, "empty_names": 0, "nameless_steps": 0}
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "cut.xplane.pb"
        for f in files:
            data = f.read_bytes()
            rejected: list[tuple[int, str]] = []
            cuts = _cuts(data)
            for c in cuts:
                p.write_bytes(data[:c])
                try:
                    t = read_trace(p)
                    lost = t.ops["name"].str.starts_with("<event metadata ").sum()
                    totals["lost_name_cuts"] += bool(lost)
                    totals["empty_names"] += int((t.ops["name"] == "").sum())  # (session 11: must be 0)
                    totals["nameless_steps"] += any(" of  (" in w or "executions of <event metadata" in w
                                                    for w in t.meta.warnings)  # (must be 0)
                except TraceFormatError as exc:
                    rejected.append((c, str(exc).split(": ", 1)[1]))
                    why = str(exc)
                    totals["no_plane" if "an XSpace with a complete plane" in why else
                           "no_line" if "an XSpace with a complete line of events" in why else "other"] += 1
                except Exception as exc:  # noqa: BLE001 - a crash: counted and shown
                    totals["crashes"] += 1
                    rejected.append((c, f"CRASH {type(exc).__name__}: {exc}"))
            totals["cuts"] += len(cuts)
            totals["rejected"] += len(rejected)
            first = f"; first at byte {rejected[0][0]}: {rejected[0][1][:120]}" if rejected else ""
            at = sorted(c for c, _ in rejected)
            print(f"{f}: {len(data):,} bytes, {len(cuts)} cuts, {len(rejected)} rejected whole "
                  f"(at bytes {at[:8]}{' …' if len(at) > 8 else ''}){first}", flush=True)
    print(totals)
    return 1 if totals["crashes"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
