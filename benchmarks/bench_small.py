"""Benchmark: small traces end to end, against the time it takes to ``import polars``.

For every real trace under 100 MB under ``../shared/fixtures/real`` (Kineto JSON, .tar.gz,
XPlane, the jax and TensorBoard profile directories, and the files traceroof refuses, timed to
their error), times in a fresh subprocess each, best of ``--repeat``:

  floor     ``python -c "import polars"``
  analyze   ``python -m traceroof.cli analyze FILE --chip CHIP --format json -q > /dev/null``

both interpreter start included, interleaved (floor, then every trace, ``--repeat`` rounds), so
a change in the machine's load hits both sides. The ratio is analyze's best wall over the
floor's best wall; the target (issue 19) is <= 3x for every trace and <= 1.5x for the bert H100
trace. CPU time (user + system, ``resource.getrusage(RUSAGE_CHILDREN)``) is given beside it.

Bytecode: the children run with ``PYTHONDONTWRITEBYTECODE`` removed and ``PYTHONPYCACHEPREFIX``
pointing at a temporary folder (one untimed warm-up run each), as an installed package has
its ``.pyc`` files; compiling traceroof's sources on every start would add ~50 ms.

    python benchmarks/bench_small.py [--repeat 5] [--only bert] [--markdown]

``--repo DIR`` times another checkout (``PYTHONPATH=DIR``), for before/after figures.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REAL = REPO.parent / "shared" / "fixtures" / "real"
LIMIT_BYTES = 100 * 10**6

#: the chip of the traces that do not name a detectable one (exit 5 without --chip), from
#: MANIFEST.md; every other trace runs with the chip detected from it (no --chip)
CHIPS = {
    "mi250_minitoy_train_ROCm6_2_kineto.json.gz": "mi250",
    "graph_execution.json.gz": "mi300x",
}
#: the chip for the rest of the exit-5 traces (no device recorded: CPU-only, trimmed)
DEFAULT_CHIP = "h100"
BERT = "gaunernst_bert-small-uncased__1016001.json.gz"


def inputs(real: Path) -> list[Path]:
    """Every file under ``real`` below the size limit (MANIFEST.md aside), and the two
    directories that are one input each."""
    files = sorted(p for p in real.rglob("*") if p.is_file() and p.name != "MANIFEST.md"
                   and p.stat().st_size < LIMIT_BYTES)
    dirs = [real / "profiler" / "demo", real / "kineto" / "tb_plugin" / "samples" / "resnet50_num_workers_0"]
    return files + [d for d in dirs if d.is_dir()]


def _env(repo: Path, pycache: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(repo), PYTHONPYCACHEPREFIX=pycache)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    """(wall s, CPU s user+system, exit code) of one run of ``cmd``, stdout discarded."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    rc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime), rc


def chip_args(path: Path, env: dict[str, str]) -> list[str]:
    """``--chip`` for ``path``: none when the trace names its chip, else :data:`CHIPS`."""
    probe = [sys.executable, "-m", "traceroof.cli", "analyze", str(path), "--format", "json", "-q"]
    if timed(probe, env)[2] != 5:
        return []
    return ["--chip", CHIPS.get(path.name, DEFAULT_CHIP)]


def run(real: Path, repo: Path, repeat: int, only: str | None) -> list[dict]:
    paths = [p for p in inputs(real) if not only or only in str(p)]
    with tempfile.TemporaryDirectory(prefix="bench-small-pyc-") as pycache:
        env = _env(repo, pycache)
        floor_cmd = [sys.executable, "-c", "import polars"]
        cmds = {}
        for p in paths:  # the probe is also the warm-up run that writes the bytecode
            cmds[p] = [sys.executable, "-m", "traceroof.cli", "analyze", str(p), *chip_args(p, env),
                       "--format", "json", "-q"]
        timed(floor_cmd, env)
        floor: list[tuple[float, float]] = []
        runs: dict[Path, list[tuple[float, float, int]]] = {p: [] for p in paths}
        for _ in range(repeat):
            floor.append(timed(floor_cmd, env)[:2])
            for p in paths:
                runs[p].append(timed(cmds[p], env))
    f_wall = min(w for w, _ in floor)
    f_cpu = min(c for _, c in floor)
    rows = []
    for p in paths:
        wall = min(w for w, _, _ in runs[p])
        cpu = min(c for _, c, _ in runs[p])
        target = 1.5 if p.name == BERT else 3.0
        rows.append({"input": str(p.relative_to(real)), "bytes": _size(p), "chip": " ".join(cmds[p][5:7])
                     if "--chip" in cmds[p] else "detected", "exit": runs[p][-1][2], "wall_s": wall,
                     "cpu_s": cpu, "floor_wall_s": f_wall, "floor_cpu_s": f_cpu, "ratio": wall / f_wall,
                     "target": target, "met": wall / f_wall <= target})
    return rows


def _size(p: Path) -> int:
    return p.stat().st_size if p.is_file() else sum(q.stat().st_size for q in p.rglob("*") if q.is_file())


def markdown(rows: list[dict]) -> str:
    f = rows[0]
    out = [f"floor `python -c \"import polars\"`: {f['floor_wall_s']:.3f} s wall, {f['floor_cpu_s']:.3f} s CPU",
           "", "| input | bytes | chip | exit | wall s | CPU s | ratio | target | met |",
           "|---|---:|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        out.append(f"| `{r['input']}` | {r['bytes']:,} | {r['chip']} | {r['exit']} | {r['wall_s']:.3f} | "
                   f"{r['cpu_s']:.3f} | {r['ratio']:.2f}x | {r['target']}x | {'yes' if r['met'] else 'NO'} |")
    met = sum(r["met"] for r in rows)
    out.append(f"\n{met} of {len(rows)} inputs meet their target; "
               f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5, help="runs of each command; the best is kept")
    ap.add_argument("--only", help="only inputs whose path contains this")
    ap.add_argument("--repo", type=Path, default=REPO, help="the checkout to time (PYTHONPATH)")
    ap.add_argument("--real", type=Path, default=REAL, help="the real fixtures folder")
    a = ap.parse_args()
    if not a.real.is_dir():
        raise SystemExit(f"bench_small: {a.real}: no such folder (the real fixtures)")
    rows = run(a.real, a.repo.resolve(), a.repeat, a.only)
    print(markdown(rows))
    return 0 if all(r["met"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
