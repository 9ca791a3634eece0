"""Reports before and after a change: byte-identical (minus ``created_at``) on every input.

Runs the command line (``traceroof analyze`` in every output format, the saved report,
the saved report read back, ``gate`` and ``estimate``) on every real trace under
``../shared/fixtures/real``, every generated fixture, caches written by ``ingest`` and
multi-rank sets, and writes each output to a folder; ``--check`` compares a folder written
before a change with a fresh run, byte for byte.

    python benchmarks/compare_reports.py --write /tmp/before      # on the old code
    python benchmarks/compare_reports.py --check /tmp/before      # on the new code

Exit status 0 when every output is identical, 1 otherwise (the differing outputs are
listed, with the first differing line of each).
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REAL = REPO.parent / "shared" / "fixtures" / "real"
FIXTURES = REPO / "fixtures"
sys.path.insert(0, str(FIXTURES))

_CREATED = re.compile(rb'"created_at": ?"[^"]*"')
# paths of temporary folders made by this script differ from run to run
_TMP = re.compile(rb"/tmp/tr-compare-[A-Za-z0-9_]+")


def real_inputs() -> list[Path]:
    """Every file under the real fixtures, and the directories that are one input."""
    files = sorted(p for p in REAL.rglob("*") if p.is_file() and p.name != "MANIFEST.md")
    dirs = [REAL / "profiler" / "demo", REAL / "kineto" / "tb_plugin" / "samples" / "resnet50_num_workers_0"]
    return files + [d for d in dirs if d.exists()]


def generated_inputs() -> list[Path]:
    return sorted(p for p in FIXTURES.rglob("*") if p.is_file()
                  and p.name.endswith((".json.gz", ".xplane.pb")) and "models" not in p.parts)


def make_sets(tmp: Path) -> list[tuple[str, list[str]]]:
    """Multi-rank sets and caches, made fresh in ``tmp`` (deterministic content)."""
    from click.testing import CliRunner
    from tracegen import Kernel, TraceBuilder

    from traceroof.cli import cli

    ranks = tmp / "ranks8"
    ranks.mkdir()
    for r in range(8):
        b = TraceBuilder(rank=r, world_size=8)
        for s in range(2):
            b.begin_step(s)
            for k in range(6):
                b.op("aten::mm", [[64, 128], [128, 256]], ["c10::BFloat16", "c10::BFloat16"],
                     [Kernel("sm90_xmma_gemm_bf16", 5_000 + 37 * r + 11 * k)])
                b.op("aten::add", [[64, 256], [64, 256]], ["c10::BFloat16", "c10::BFloat16"],
                     [Kernel("vectorized_elementwise_kernel", 1_000 + r)])
            b.end_step()
        b.write(ranks / f"rank-{r}.json.gz")
    hta = REAL / "HolisticTraceAnalysis" / "tests" / "data" / "trace_filter"
    sets: list[tuple[str, list[str]]] = [
        ("set-ranks8-dir", [str(ranks)]),
        ("set-ranks8-glob", [str(ranks / "rank-*.json.gz")]),
        ("set-hta-pair", [str(hta / "sampled_rank-0.json.gz"), str(hta / "sampled_rank-1.json.gz")]),
    ]
    runner = CliRunner()
    cache_of = {
        "example": [str(FIXTURES / "example_h100_decoder.json.gz")],
        "qwen": [str(REAL / "TraceLens/tests/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz")],
        "tpu": [str(REAL / "xprof/xprof/convert/test_xplanes/tpu_inference_2.xplane.pb")],
        "hta-pair": sets[2][1],
        "ranks8": [str(ranks)],
    }
    for name, src in cache_of.items():
        out = tmp / f"cache-{name}"
        res = runner.invoke(cli, ["ingest", *src, "-o", str(out), "-q", "--jobs", "1"])
        if res.exit_code != 0:
            raise SystemExit(f"ingest {name} failed: {res.output}")
        sets.append((f"cache-{name}", [str(out)]))
    return sets


def _label(p: Path) -> str:
    try:
        rel = p.relative_to(REAL)
        base = "real-"
    except ValueError:
        rel = p.relative_to(FIXTURES)
        base = "fix-"
    return base + re.sub(r"[^A-Za-z0-9_.-]+", "_", str(rel))


def _run(args: list[str]) -> bytes:
    from click.testing import CliRunner

    from traceroof.cli import cli

    res = CliRunner().invoke(cli, args, env={"COLUMNS": "120"})
    out = res.stdout_bytes + b"\n--- stderr ---\n" + (res.stderr_bytes or b"")
    out += f"\n--- exit {res.exit_code} ---\n".encode()
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        out += f"exception: {type(res.exception).__name__}: {res.exception}\n".encode()
    return out


def outputs_for(label: str, src: list[str], tmp: Path) -> dict[str, bytes]:
    """Every output for one input: the formats, the saved report, its reload, gate."""
    out: dict[str, bytes] = {}
    table = _run(["analyze", *src, "-q", "--jobs", "1"])
    chip: list[str] = []
    if b"--- exit 5 ---" in table:
        # no chip detected: the rest of the pipeline still runs with an explicit one
        chip = ["--chip", "h100"]
        out[f"{label}.nochip.txt"] = table
        table = _run(["analyze", *src, "-q", "--jobs", "1", *chip])
    out[f"{label}.table.txt"] = table
    if b"--- exit 0 ---" not in table:
        return out
    for fmt in ("json", "markdown", "csv"):
        out[f"{label}.{fmt}"] = _run(["analyze", *src, "-q", "--jobs", "1", *chip, "--format", fmt, "--top", "1000"])
    saved = tmp / f"{label}.report.json"
    _run(["analyze", *src, "-q", "--jobs", "1", *chip, "-o", str(saved)])
    out[f"{label}.saved.json"] = saved.read_bytes() if saved.exists() else b"<not written>"
    if saved.exists():
        out[f"{label}.reload.txt"] = _run(["analyze", str(saved), "-q"])
        out[f"{label}.gate.txt"] = _run(["gate", str(saved), "-q", "--min-hfu", "0.01"])
        out[f"{label}.gate-baseline.txt"] = _run(["gate", str(saved), "-q", "--baseline", str(saved), "--max-drop", "0.0"])
    return out


def extra_outputs() -> dict[str, bytes]:
    """Options that change the analysis: model FLOPs, step/rank filters, estimate, chips."""
    ex = str(FIXTURES / "example_h100_decoder.json.gz")
    qwen = str(REAL / "TraceLens/tests/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz")
    models = FIXTURES / "models"
    return {
        "extra-example-model.json": _run(["analyze", ex, "-q", "--format", "json", "--model",
                                          str(models / "llama3.2-1b.json"), "--tokens-per-step", "4096"]),
        "extra-example-mfps.txt": _run(["analyze", ex, "-q", "--model-flops-per-step", "1e12"]),
        "extra-example-step.json": _run(["analyze", ex, "-q", "--format", "json", "--step", "1"]),
        "extra-example-kernel.json": _run(["analyze", ex, "-q", "--format", "json", "--group-by", "kernel"]),
        "extra-qwen-rank.json": _run(["analyze", qwen, "-q", "--format", "json", "--rank", "0"]),
        "extra-chips.txt": _run(["chips"]),
        "extra-estimate.txt": _run(["estimate", "--model", str(models / "llama2-7b.json"), "--chip", "h100"]),
        "extra-estimate-mixtral.txt": _run(["estimate", "--model", str(models / "mixtral-8x7b.json"), "--chip", "mi300x"]),
        "extra-gate-mfu.txt": _run(["gate", ex, "-q", "--model-flops-per-step", "1e12", "--min-mfu", "0.5"]),
    }


def normalize(data: bytes) -> bytes:
    """Without what differs between runs and checkouts: the time, temporary folders, the
    checkout's own path (a worktree elsewhere must compare equal)."""
    data = _TMP.sub(b"<tmp>", _CREATED.sub(b'"created_at": "-"', data))
    return data.replace(str(REPO).encode(), b"<repo>")


def collect() -> dict[str, bytes]:
    tmp = Path(tempfile.mkdtemp(prefix="tr-compare-"))
    try:
        results: dict[str, bytes] = {}
        inputs = [(_label(p), [str(p)]) for p in real_inputs() + generated_inputs()]
        inputs += make_sets(tmp)
        for i, (label, src) in enumerate(inputs):
            print(f"[{i + 1}/{len(inputs)}] {label}", file=sys.stderr, flush=True)
            results.update(outputs_for(label, src, tmp))
        results.update(extra_outputs())
        return {k: normalize(v) for k, v in results.items()}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--write", type=Path, help="write every output to this folder")
    g.add_argument("--check", type=Path, help="compare a fresh run with this folder")
    a = ap.parse_args()
    os.environ.setdefault("POLARS_MAX_THREADS", "2")
    results = collect()
    if a.write:
        a.write.mkdir(parents=True, exist_ok=True)
        for name, data in results.items():
            (a.write / name).write_bytes(data)
        digest = hashlib.sha256(b"".join(results[k] for k in sorted(results))).hexdigest()[:16]
        print(f"wrote {len(results)} outputs to {a.write} (digest {digest})")
        return 0
    before = {p.name: p.read_bytes() for p in a.check.iterdir()}
    bad = 0
    for name in sorted(set(before) | set(results)):
        old, new = before.get(name), results.get(name)
        if old == new:
            continue
        bad += 1
        if old is None or new is None:
            print(f"DIFF {name}: only {'after' if old is None else 'before'}")
            continue
        diff = list(difflib.unified_diff(old.decode(errors="replace").splitlines(),
                                         new.decode(errors="replace").splitlines(), lineterm="", n=0))
        print(f"DIFF {name}: " + " | ".join(d[:200] for d in diff[2:6]))
    print(json.dumps({"outputs": len(results), "identical": len(results) - bad, "different": bad}))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
