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

    python benchmarks/bench_small.py [--repeat 5] [--only bert] [--baseline DIR]

``--repo DIR`` times another checkout (``PYTHONPATH=DIR``); ``--baseline DIR`` times a second
checkout in the same rounds (interleaved with this one, against the same floor), for
before/after columns that saw the same load.
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
    """(wall s, CPU s user+system, exit code) of one run of ``cmd``, stdout discarded.

    Run in the checkout's folder (``env["PYTHONPATH"]``): ``python -m`` puts the working
    folder first on ``sys.path``, so from any other checkout's folder ``--baseline`` would time
    that checkout's code (the session-8 fix: before it, both columns timed the folder the
    benchmark was started from)."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    rc = subprocess.run(cmd, env=env, cwd=env["PYTHONPATH"], stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL).returncode
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime), rc


def chip_args(path: Path, env: dict[str, str]) -> list[str]:
    """``--chip`` for ``path``: none when the trace names its chip, else :data:`CHIPS`."""
    probe = [sys.executable, "-m", "traceroof.cli", "analyze", str(path), "--format", "json", "-q"]
    if timed(probe, env)[2] != 5:
        return []
    return ["--chip", CHIPS.get(path.name, DEFAULT_CHIP)]


def run(real: Path, repos: list[Path], repeat: int, only: str | None) -> list[dict]:
    """One row per input and checkout (``repos[0]`` first), each the best of ``repeat``
    rounds; every round times the floor, then each input under each checkout."""
    paths = [p for p in inputs(real) if not only or only in str(p)]
    with tempfile.TemporaryDirectory(prefix="bench-small-pyc-") as pycache:
        envs = [_env(r, f"{pycache}/{i}") for i, r in enumerate(repos)]
        floor_cmd = [sys.executable, "-c", "import polars"]
        cmds = {}
        for p in paths:  # the probe is also the warm-up run that writes the bytecode
            chip = chip_args(p, envs[0])
            for e in envs[1:]:
                timed([sys.executable, "-m", "traceroof.cli", "analyze", str(p), *chip, "--format", "json", "-q"], e)
            cmds[p] = [sys.executable, "-m", "traceroof.cli", "analyze", str(p), *chip, "--format", "json", "-q"]
        timed(floor_cmd, envs[0])
        floor: list[tuple[float, float]] = []
        runs: dict[tuple[Path, int], list[tuple[float, float, int]]] = {(p, i): [] for p in paths
                                                                        for i in range(len(repos))}
        for _ in range(repeat):
            floor.append(timed(floor_cmd, envs[0])[:2])
            for p in paths:
                for i, e in enumerate(envs):
                    runs[(p, i)].append(timed(cmds[p], e))
    f_wall = min(w for w, _ in floor)
    f_cpu = min(c for _, c in floor)
    rows = []
    for p in paths:
        for i, repo in enumerate(repos):
            r = runs[(p, i)]
            wall, cpu = min(w for w, _, _ in r), min(c for _, c, _ in r)
            target = 1.5 if p.name == BERT else 3.0
            rows.append({"input": str(p.relative_to(real)), "repo": str(repo), "bytes": _size(p),
                         "chip": " ".join(cmds[p][5:7]) if "--chip" in cmds[p] else "detected",
                         "exit": r[-1][2], "wall_s": wall, "cpu_s": cpu, "floor_wall_s": f_wall,
                         "floor_cpu_s": f_cpu, "ratio": wall / f_wall, "cpu_ratio": cpu / f_cpu,
                         "target": target, "met": wall / f_wall <= target,
                         "cpu_met": cpu / f_cpu <= target})
    return rows


def _size(p: Path) -> int:
    return p.stat().st_size if p.is_file() else sum(q.stat().st_size for q in p.rglob("*") if q.is_file())


def markdown(rows: list[dict]) -> str:
    """The table: one line per input, a group of columns per checkout (the first: --repo)."""
    f = rows[0]
    repos = list(dict.fromkeys(r["repo"] for r in rows))
    out = [f"floor `python -c \"import polars\"`: {f['floor_wall_s']:.3f} s wall, {f['floor_cpu_s']:.3f} s CPU; "
           f"checkouts: " + ", ".join(f"[{i}] {r}" for i, r in enumerate(repos)), ""]
    head = "| input | bytes | chip | exit |"
    rule = "|---|---:|---|---:|"
    for i in range(len(repos)):
        head += f" [{i}] wall s | [{i}] CPU s | [{i}] wall ratio | [{i}] CPU ratio | [{i}] met (wall/CPU) |"
        rule += "---:|---:|---:|---:|---|"
    out += [head.replace("| input", "| input (target: wall ratio ≤ 3x, bert ≤ 1.5x)", 1), rule]
    by_input: dict[str, list[dict]] = {}
    for r in rows:
        by_input.setdefault(r["input"], []).append(r)
    for name, rs in by_input.items():
        line = f"| `{name}` | {rs[0]['bytes']:,} | {rs[0]['chip']} | {rs[0]['exit']} |"
        for r in rs:
            line += (f" {r['wall_s']:.3f} | {r['cpu_s']:.3f} | {r['ratio']:.2f}x | {r['cpu_ratio']:.2f}x |"
                     f" {'yes' if r['met'] else 'NO'}/{'yes' if r['cpu_met'] else 'NO'} |")
        out.append(line)
    for i, repo in enumerate(repos):
        mine = [r for r in rows if r["repo"] == repo]
        out.append(f"\n[{i}] {sum(r['met'] for r in mine)} of {len(mine)} inputs meet their target in wall time, "
                   f"{sum(r['cpu_met'] for r in mine)} in CPU time")
    out.append(f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5, help="runs of each command; the best is kept")
    ap.add_argument("--only", help="only inputs whose path contains this")
    ap.add_argument("--repo", type=Path, default=REPO, help="the checkout to time (PYTHONPATH)")
    ap.add_argument("--baseline", type=Path, help="a second checkout timed in the same rounds")
    ap.add_argument("--real", type=Path, default=REAL, help="the real fixtures folder")
    a = ap.parse_args()
    if not a.real.is_dir():
        raise SystemExit(f"bench_small: {a.real}: no such folder (the real fixtures)")
    repos = [a.repo.resolve()] + ([a.baseline.resolve()] if a.baseline else [])
    rows = run(a.real, repos, a.repeat, a.only)
    print(markdown(rows))
    return 0 if all(r["met"] for r in rows if r["repo"] == str(repos[0])) else 1


if __name__ == "__main__":
    raise SystemExit(main())
