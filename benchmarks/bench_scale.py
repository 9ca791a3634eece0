#!/usr/bin/env python
"""Scale benchmark (issue 7): a 1 GB+ Kineto trace and a 64-rank set, traceroof vs orjson vs HTA.

Command (from the repo root; the first run generates and caches the inputs, a few minutes)::

    .venv/bin/python benchmarks/bench_scale.py                  # everything, HTA included
    .venv/bin/python benchmarks/bench_scale.py --small --skip-hta  # smoke test, ~1 min

Options: ``--parts single,ranks``, ``--size-gb 1.0``, ``--ranks 64``, ``--rank-events 50000``,
``--rank-format gz|json``, ``--jobs 2`` (traceroof's ``--jobs`` on the rank sets),
``--single-formats json,gz``, ``--hta-formats json,gz``, ``--skip-hta``, ``--hta-python PATH``,
``--repeat N`` (best of N for traceroof and orjson; HTA runs once), ``--small``,
``--results PATH``, ``--generate-only``.

Inputs (cached in ``$TRACEROOF_BENCH_CACHE`` or ``/tmp/traceroof-bench``; every file is written
under a temporary name and renamed when complete, so an interrupted generation resumes):

A. one Kineto trace of at least ``--size-gb`` GB uncompressed, made by ``bench_kineto.py``'s
   generator (the real H100 Qwen trace replicated step after step, torch's pretty layout), plus
   its ``.json.gz``;
B. ``--ranks`` per-rank Kineto files of about ``--rank-events`` events each (whole replicas: at
   least one, ~18 k events, ~6 MB), each with ``distributedInfo.rank`` = its rank, ``world_size``
   = ``--ranks``, and one NCCL all-reduce per step (``record_param_comms`` + launch + an
   ``ncclDevKernel_AllReduce`` kernel with the collective args + flow), ``.json.gz`` by default;
   the first half of the ranks is also linked into a sibling directory (the half set).

Each measured command runs in its own subprocess: wall = fork → exit (imports included), CPU =
user + system of the child and its waited-for descendants, peak RSS = ``os.wait4`` ``ru_maxrss``
(the largest single process among the child and its descendants — not their sum), and a
sampled sum of the RSS of the whole process tree every 0.1 s (the memory in use at once when
workers run in parallel; shared copy-on-write pages are counted once per process).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_kineto as bk  # noqa: E402  (the generator and the child scripts)

REPO = bk.REPO
RANK_GEN_VERSION = 1
LAYOUT = "pretty"  # torch's export_chrome_trace layout; HTA's rank detection needs its `"rank": N` spacing


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- inputs


def _meta_write(path: Path, obj: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, path)


def single_events(size_gb: float) -> int:
    """Event count whose whole replicas make at least ``size_gb`` GB (1e9 bytes) of pretty JSON."""
    pln = bk.plan()
    n_rep = max(1, math.ceil(size_gb * 1e9 / pln.replica_bytes(LAYOUT)))
    return len(pln.once_head) + len(pln.once_tail) + n_rep * len(pln.body)


def gzip_file(src: Path, dst: Path) -> None:
    """``src`` → ``dst`` (gzip level 6, like the ``gzip`` command), via a temporary name."""
    tmp = dst.with_name(dst.name + ".part")
    size, done, shown, t = src.stat().st_size, 0, 0, time.perf_counter()
    with open(src, "rb") as fi, open(tmp, "wb") as raw, \
            gzip.GzipFile(filename="", fileobj=raw, mode="wb", compresslevel=6, mtime=0) as fo:
        while chunk := fi.read(16 << 20):
            fo.write(chunk)
            done += len(chunk)
            if done * 10 // size > shown:
                shown = done * 10 // size
                log(f"  {dst.name}: {shown * 10}% ({time.perf_counter() - t:.0f} s)")
    os.replace(tmp, dst)


def ensure_single(size_gb: float, formats: list[str]) -> dict:
    """The ≥ size_gb trace (+ .json.gz): {'json': path, 'gz': path, 'events', 'bytes', 'gen_s'}."""
    events = single_events(size_gb)
    t = time.perf_counter()
    path, n = bk.ensure_trace(events, LAYOUT, progress=True)
    out = {"json": path, "events": n, "bytes": path.stat().st_size, "gen_s": {}}
    out["gen_s"]["json"] = time.perf_counter() - t
    if "gz" in formats:
        gz = path.with_name(path.name + ".gz")
        t = time.perf_counter()
        if not gz.is_file():
            log(f"compressing {path.name} → {gz.name}…")
            gzip_file(path, gz)
        out["gz"] = gz
        out["gen_s"]["gz"] = time.perf_counter() - t
    return out


def ensure_ranks(n_ranks: int, rank_events: int, gz: bool) -> dict:
    """``n_ranks`` per-rank files in their own directory, plus a directory linking the first half."""
    pln = bk.plan(nccl=True)
    rank_events = max(rank_events, len(pln.once_head) + len(pln.once_tail) + 1)  # at least one replica
    n_ev = pln.event_count(rank_events)
    ext = ".json.gz" if gz else ".json"
    name = f"kineto_ranks{n_ranks}_x{n_ev}_{LAYOUT}_nccl_v{bk.GEN_VERSION}.{RANK_GEN_VERSION}{'_gz' if gz else ''}"
    root = bk._cache_dir()
    d = root / name
    meta_path = root / f"{name}.meta.json"  # outside the directory: HTA and traceroof read every *.json in it
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    done: dict[str, dict] = meta.get("files", {})
    d.mkdir(exist_ok=True)
    t = time.perf_counter()
    width = max(5, len(str(n_ranks - 1)))
    files = [d / f"rank-{r:0{width}d}{ext}" for r in range(n_ranks)]
    todo = [(r, f) for r, f in enumerate(files) if not (f.is_file() and f.name in done)]
    if todo:
        log(f"generating {len(todo)} of {n_ranks} rank files in {d} (~{n_ev:,} events each)…")
    for i, (r, f) in enumerate(todo):
        n, nbytes = bk.write_trace(f, rank_events, LAYOUT, rank=r, world_size=n_ranks, nccl=True, gz=gz)
        done[f.name] = {"rank": r, "events": n, "bytes": nbytes, "file_bytes": f.stat().st_size}
        if (i + 1) % max(1, len(todo) // 10) == 0 or i + 1 == len(todo):
            log(f"  {i + 1}/{len(todo)} rank files ({time.perf_counter() - t:.0f} s)")
            _meta_write(meta_path, {"files": done})
    _meta_write(meta_path, {"files": done, "complete": True})
    half = root / f"{name}.first{n_ranks // 2}"
    half.mkdir(exist_ok=True)
    for f in files[: n_ranks // 2]:
        link = half / f.name
        if not link.is_symlink():
            link.symlink_to(f)
    info = [done[f.name] for f in files]
    return {
        "dir": d, "half_dir": half, "files": files, "gen_s": time.perf_counter() - t,
        "events": [x["events"] for x in info], "bytes": [x["bytes"] for x in info],
        "file_bytes": [x["file_bytes"] for x in info],
    }


# --------------------------------------------------------------------------- measuring


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                out.extend(int(x) for x in fh.read().split())
    except OSError:
        pass
    return out


def _tree_rss(pid: int) -> int:
    total, stack, page = 0, [pid], os.sysconf("SC_PAGE_SIZE")
    while stack:
        p = stack.pop()
        try:
            with open(f"/proc/{p}/statm") as fh:
                total += int(fh.read().split()[1]) * page
        except (OSError, IndexError, ValueError):
            continue
        stack.extend(_children(p))
    return total


def run_child(cmd: list[str], log_path: Path, env: dict[str, str] | None = None) -> dict:
    """Run ``cmd`` (stdout → /dev/null, stderr → ``log_path``): wall, CPU, peak RSS, tree RSS, rc."""
    peak = [0]
    stop = threading.Event()
    with open(log_path, "wb") as err:
        t = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=str(REPO))

        def sample() -> None:
            while not stop.wait(0.1):
                peak[0] = max(peak[0], _tree_rss(p.pid))

        th = threading.Thread(target=sample, daemon=True)
        th.start()
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t
        stop.set()
        th.join()
        p.returncode = os.waitstatus_to_exitcode(status)
    return {"wall_s": wall, "cpu_s": ru.ru_utime + ru.ru_stime, "rss": ru.ru_maxrss * 1024,
            "tree_rss": max(peak[0], ru.ru_maxrss * 1024), "rc": p.returncode}


def measure(name: str, cmd: list, work: Path, repeat: int, env: dict[str, str] | None = None,
            key: str = "wall_s") -> dict:
    """Best of ``repeat`` runs (by ``key``); ``@RESULT`` in ``cmd`` → a JSON file the child writes."""
    best: dict | None = None
    for i in range(repeat):
        res_file = work / f"{name}.{i}.result.json"
        log_file = work / f"{name}.{i}.log"
        c = [str(res_file) if x == "@RESULT" else str(x) for x in cmd]
        r = run_child(c, log_file, env)
        r["log"] = str(log_file)
        if r["rc"] != 0:
            tail = log_file.read_text(errors="replace")[-2000:]
            log(f"  {name}: exit code {r['rc']}\n{tail}")
            r["failed"] = True
        if res_file.is_file():
            r.update(json.loads(res_file.read_text()))
        log(f"  {name} run {i + 1}: {r['wall_s']:.2f} s wall, {r['cpu_s']:.2f} s CPU, "
            f"peak RSS {r['rss'] / 1e9:.2f} GB (tree {r['tree_rss'] / 1e9:.2f} GB)")
        if best is None or best.get("failed") or (not r.get("failed") and r.get(key, r["wall_s"]) < best.get(key, best["wall_s"])):
            best = r
    assert best is not None
    best["runs"] = repeat
    return best


_REANALYZE_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import traceroof, traceroof.io, traceroof.analysis
t1 = time.perf_counter()
trace = traceroof.read_trace(sys.argv[1])
t2 = time.perf_counter()
report = traceroof.analyze(trace, "h100")
t3 = time.perf_counter()
res = {"import_s": t1 - t0, "read_s": t2 - t1, "analyze_s": t3 - t2, "read_analyze_s": t3 - t1,
       "ops": trace.ops.height, "host": trace.host.height}
print(json.dumps(res))
with open(sys.argv[2], "w") as fh:
    json.dump(res, fh)
"""

_ORJSON_MANY_CHILD = r"""
import gzip, json, os, sys, time
t0 = time.perf_counter()
import orjson
n = 0
for path in sys.argv[2:]:
    data = open(path, "rb").read()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    obj = orjson.loads(data)
    n += len(obj["traceEvents"])
    del obj, data
with open(sys.argv[1], "w") as fh:
    json.dump({"inner_s": time.perf_counter() - t0, "events": n}, fh)
os._exit(0)  # no teardown
"""

_HTA_CHILD = r"""
import json, logging, os, sys, time
t0 = time.perf_counter()
from hta.trace_analysis import TraceAnalysis
_h = logging.StreamHandler(sys.stderr)  # HTA's INFO lines (its pool size) into the log file
_h.setLevel(logging.INFO)
logging.getLogger("hta").addHandler(_h)
logging.getLogger("hta").setLevel(logging.INFO)
t1 = time.perf_counter()
a = TraceAnalysis(trace_dir=sys.argv[1])
t2 = time.perf_counter()
traces = a.t.traces
with open(sys.argv[2], "w") as fh:
    json.dump({"inner_s": t2 - t0, "import_s": t1 - t0, "load_s": t2 - t1, "ranks": len(traces),
               "rows": int(sum(len(df) for df in traces.values()))}, fh)
os._exit(0)
"""


def _tr() -> list[str]:
    return bk._traceroof_cmd()


def _hta_env() -> dict[str, str]:
    return {**os.environ, "PYTHONWARNINGS": "ignore"}


def _hta_version(python: Path) -> str | None:
    try:
        out = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('HolisticTraceAnalysis'))"],
                             capture_output=True, text=True, timeout=60)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _hta_pool(log_file: str) -> str | None:
    """HTA's own 'using N processes for parsing.' line, when it logged one."""
    try:
        for line in Path(log_file).read_text(errors="replace").splitlines():
            if "processes for parsing" in line:
                return line.split("using", 1)[-1].strip()
    except OSError:
        pass
    return None


def _dir_bytes(d: Path) -> int:
    return sum(f.stat().st_size for f in d.rglob("*") if f.is_file())


# --------------------------------------------------------------------------- parts


def part_single(args: argparse.Namespace, work: Path, hta_ok: bool) -> dict:
    inp = ensure_single(args.size_gb, args.single_formats)
    n, size = inp["events"], inp["bytes"]
    log(f"single: {inp['json']} ({size / 1e9:.3f} GB, {n:,} events)"
        + (f", gz {inp['gz'].stat().st_size / 1e9:.3f} GB" if "gz" in inp else ""))
    rows: list[dict] = []
    cache = work / "single.cache"
    for fmt in args.single_formats:
        path = inp[fmt]
        label = f"{fmt} {path.stat().st_size / 1e6:,.0f} MB"
        tag = f"single-{fmt}"
        res = {}
        res["orjson.loads"] = measure(f"{tag}-orjson", [sys.executable, "-c", bk._ORJSON_CHILD, path, "@RESULT"], work, args.repeat)
        c = cache if fmt == args.single_formats[0] else work / f"single-{fmt}.cache"
        res["traceroof ingest"] = measure(f"{tag}-ingest", [*_tr(), "ingest", path, "-o", c, "-q"], work, args.repeat)
        res["traceroof analyze"] = measure(
            f"{tag}-analyze", [*_tr(), "analyze", path, "--chip", "h100", "--format", "json", "-q"], work, args.repeat)
        if hta_ok and fmt in args.hta_formats:
            hdir = work / f"hta-{fmt}"
            hdir.mkdir()
            (hdir / path.name).symlink_to(path)
            res["HTA TraceAnalysis"] = measure(f"{tag}-hta", [args.hta_python, "-c", _HTA_CHILD, hdir, "@RESULT"],
                                               work, 1, env=_hta_env())
        for tool, r in res.items():
            rows.append({"input": fmt, "label": label, "tool": tool, **r})
    # re-analysis from the cache written by the first format's ingest
    cache_bytes = _dir_bytes(cache) if cache.is_dir() else 0
    cl = f"cache {cache_bytes / 1e6:,.0f} MB"
    r = measure("single-cache-analyze", [*_tr(), "analyze", cache, "--chip", "h100", "--format", "json", "-q"], work, args.repeat)
    rows.append({"input": "cache", "label": cl, "tool": "traceroof analyze CACHE", **r})
    r = measure("single-cache-inproc", [sys.executable, "-c", _REANALYZE_CHILD, cache, "@RESULT"], work, args.repeat,
                key="read_analyze_s")
    rows.append({"input": "cache", "label": cl, "tool": "in-process read_trace(CACHE) + analyze()", **r})

    # table
    by = {(x["input"], x["tool"]): x for x in rows}
    lines = [
        f"Part A: one Kineto trace, {n:,} events, {size / 1e9:.3f} GB uncompressed ({LAYOUT} layout)"
        + (f", {inp['gz'].stat().st_size / 1e6:,.0f} MB gzipped" if "gz" in inp else ""),
        "",
        "| input | tool | wall s | CPU s | events/s | peak RSS GB | tree RSS GB | RSS / uncompressed | vs orjson | vs HTA |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for x in rows:
        w = x["wall_s"]
        oj = by.get((x["input"], "orjson.loads"), by.get((args.single_formats[0], "orjson.loads")))
        hta = by.get((x["input"], "HTA TraceAnalysis"), by.get((args.single_formats[0], "HTA TraceAnalysis")))
        tool = x["tool"] + (" (FAILED)" if x.get("failed") else "")
        if "read_analyze_s" in x:
            tool += (f": read_trace {x['read_s']:.3f} s + analyze {x['analyze_s']:.3f} s = "
                     f"{x['read_analyze_s']:.3f} s (imports {x['import_s']:.2f} s)")
        lines.append(
            f"| {x['label']} | {tool} | {w:.2f} | {x['cpu_s']:.2f} | {n / w:,.0f} | {x['rss'] / 1e9:.2f} | "
            f"{x['tree_rss'] / 1e9:.2f} | {x['rss'] / size:.2f}x | "
            + (f"{oj['wall_s'] / w:.2f}x | " if oj else "– | ")
            + (f"{hta['wall_s'] / w:.1f}x |" if hta else "– |")
        )
    verdicts = []

    def check(name: str, ok: bool | None, detail: str) -> None:
        verdicts.append({"target": name, "result": "n/a" if ok is None else ("PASS" if ok else "FAIL"), "detail": detail})

    for fmt in args.single_formats:
        a, ing = by.get((fmt, "traceroof analyze")), by.get((fmt, "traceroof ingest"))
        hta = by.get((fmt, "HTA TraceAnalysis"))
        for tool, x in (("analyze", a), ("ingest", ing)):
            if x is None:
                continue
            if hta and not hta.get("failed"):
                check(f"{fmt}: {tool} ≥ 10x faster than HTA", hta["wall_s"] >= 10 * x["wall_s"],
                      f"{hta['wall_s'] / x['wall_s']:.1f}x ({x['wall_s']:.2f} s vs HTA {hta['wall_s']:.2f} s)")
                check(f"{fmt}: {tool} peak RSS ≤ 1/4 of HTA's", 4 * x["rss"] <= hta["rss"],
                      f"{x['rss'] / hta['rss']:.2f} of HTA's ({x['rss'] / 1e9:.2f} GB vs {hta['rss'] / 1e9:.2f} GB)")
            else:
                check(f"{fmt}: {tool} ≥ 10x faster than HTA", None, "HTA not run")
                check(f"{fmt}: {tool} peak RSS ≤ 1/4 of HTA's", None, "HTA not run")
            check(f"{fmt}: {tool} peak RSS ≤ 1x the uncompressed file", x["rss"] <= size,
                  f"{x['rss'] / size:.2f}x ({x['rss'] / 1e9:.2f} GB for {size / 1e9:.2f} GB)")
    ip = by.get(("cache", "in-process read_trace(CACHE) + analyze()"))
    if ip and "read_analyze_s" in ip:
        check("re-analysis of the cached trace < 1 s (in process)", ip["read_analyze_s"] < 1.0,
              f"read_trace {ip['read_s']:.3f} s + analyze {ip['analyze_s']:.3f} s = {ip['read_analyze_s']:.3f} s")
    lines.append("")
    for v in verdicts:
        lines.append(f"- target: {v['target']} → **{v['result']}** ({v['detail']})")
    return {
        "inputs": {k: str(v) if isinstance(v, Path) else v for k, v in inp.items()},
        "gz_bytes": inp["gz"].stat().st_size if "gz" in inp else None,
        "cache_bytes": cache_bytes, "rows": rows, "targets": verdicts, "markdown": "\n".join(lines),
    }


def part_ranks(args: argparse.Namespace, work: Path, hta_ok: bool) -> dict:
    R, J = args.ranks, args.jobs
    inp = ensure_ranks(R, args.rank_events, args.rank_format == "gz")
    files: list[Path] = inp["files"]
    ev, by_ = inp["events"], inp["bytes"]
    log(f"ranks: {inp['dir']} ({R} files, {sum(ev):,} events, {sum(by_) / 1e9:.3f} GB uncompressed, "
        f"{sum(inp['file_bytes']) / 1e9:.3f} GB on disk)")
    sets = {
        "1 rank": (files[0], 1, ev[0], by_[0]),
        f"{R // 2} ranks": (inp["half_dir"], J, sum(ev[: R // 2]), sum(by_[: R // 2])),
        f"{R} ranks": (inp["dir"], J, sum(ev), sum(by_)),
    }
    rows: list[dict] = []
    for label, (path, jobs, n, size) in sets.items():
        tag = "ranks-" + label.replace(" ", "")
        for tool, cmd in (
            ("traceroof ingest", [*_tr(), "ingest", path, "-o", work / f"{tag}.cache", "-q", "--jobs", jobs]),
            ("traceroof analyze", [*_tr(), "analyze", path, "--chip", "h100", "--format", "json", "-q", "--jobs", jobs]),
        ):
            r = measure(f"{tag}-{tool.split()[-1]}", cmd, work, args.repeat)
            rows.append({"set": label, "tool": f"{tool} --jobs {jobs}", "kind": tool, "jobs": jobs,
                         "events": n, "bytes": size, **r})
        cm = work / f"{tag}.cache" / "meta.json"
        if cm.is_file():
            try:
                m = json.loads(cm.read_text())
                ranks = m.get("ranks") or (m.get("meta") or {}).get("ranks")
                if ranks is not None and len(ranks) != int(label.split()[0]):
                    log(f"  WARNING: the {label} cache holds {len(ranks)} ranks")
            except (ValueError, AttributeError):
                pass
    r = measure("ranks-orjson", [sys.executable, "-c", _ORJSON_MANY_CHILD, "@RESULT", *files], work, args.repeat)
    rows.append({"set": f"{R} ranks", "tool": "orjson.loads, files one after another", "kind": "orjson",
                 "events": sum(ev), "bytes": sum(by_), **r})
    hta_note = None
    if hta_ok:
        r = measure("ranks-hta", [args.hta_python, "-c", _HTA_CHILD, inp["dir"], "@RESULT"], work, 1, env=_hta_env())
        hta_note = _hta_pool(r["log"])
        rows.append({"set": f"{R} ranks", "tool": "HTA TraceAnalysis", "kind": "hta",
                     "events": sum(ev), "bytes": sum(by_), **r})

    t1 = {x["kind"]: x["wall_s"] for x in rows if x["set"] == "1 rank"}
    oj = next((x for x in rows if x["kind"] == "orjson"), None)
    hta = next((x for x in rows if x["kind"] == "hta"), None)
    lines = [
        f"Part B: {R} per-rank Kineto files ({args.rank_format}), {ev[0]:,} events / "
        f"{by_[0] / 1e6:.1f} MB uncompressed / {inp['file_bytes'][0] / 1e6:.1f} MB on disk each; "
        f"traceroof --jobs {J} on the rank sets; ideal = (ranks / jobs) × t1",
        "",
        "| set | tool | wall s | CPU s | events/s | peak RSS GB | tree RSS GB | tree RSS / uncompressed set | vs ideal | vs orjson (events/s) | vs HTA (events/s) |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for x in rows:
        w = x["wall_s"]
        nr = int(x["set"].split()[0])
        ideal = ""
        if x["kind"] in t1 and x["set"] != "1 rank":
            ideal = f"{w / (nr / x['jobs'] * t1[x['kind']]):.2f}x"
        elif x["set"] == "1 rank":
            ideal = "t1"
        tool = x["tool"] + (" (FAILED)" if x.get("failed") else "")
        if x["kind"] == "hta" and hta_note:
            tool += f" ({hta_note})"
        lines.append(
            f"| {x['set']} | {tool} | {w:.2f} | {x['cpu_s']:.2f} | {x['events'] / w:,.0f} | {x['rss'] / 1e9:.2f} | "
            f"{x['tree_rss'] / 1e9:.2f} | {x['tree_rss'] / x['bytes']:.2f}x | {ideal or '–'} | "
            + (f"{oj['wall_s'] / w * x['events'] / oj['events']:.2f}x | " if oj else "– | ")
            + (f"{hta['wall_s'] / w * x['events'] / hta['events']:.1f}x |" if hta else "– |")
        )
    verdicts = []
    for kind in ("traceroof analyze", "traceroof ingest"):
        x = next((r for r in rows if r["kind"] == kind and r["set"] == f"{R} ranks"), None)
        if x is None or kind not in t1:
            continue
        bound = 1.2 * (R / J) * t1[kind]
        ratio = x["wall_s"] / ((R / J) * t1[kind])
        verdicts.append({
            "target": f"{kind.split()[1]}: {R} ranks on {J} jobs ≤ 1.2 × {R / J:g} × t1",
            "result": "PASS" if x["wall_s"] <= bound and not x.get("failed") else "FAIL",
            "detail": f"{x['wall_s']:.2f} s vs bound {bound:.2f} s (t1 {t1[kind]:.2f} s): ratio {ratio:.2f}x of {R / J:g} × t1",
        })
    if hta:
        a = next(r for r in rows if r["kind"] == "traceroof analyze" and r["set"] == f"{R} ranks")
        verdicts.append({"target": f"analyze {R} ranks vs HTA (info)", "result": "info",
                         "detail": f"{hta['wall_s'] / a['wall_s']:.1f}x faster; peak RSS (tree) "
                                   f"{a['tree_rss'] / 1e9:.2f} GB vs HTA {hta['tree_rss'] / 1e9:.2f} GB"})
    lines.append("")
    for v in verdicts:
        lines.append(f"- target: {v['target']} → **{v['result']}** ({v['detail']})")
    if hta:
        lines.append(f"- HTA settings: TraceAnalysis(trace_dir=DIR) defaults: use_multiprocessing=True, "
                     f"use_memory_profiling=True (> 8 ranks: parses rank 0 once under tracemalloc to size a "
                     f"fork Pool of min(cpu_count, ranks, 0.8 × free RAM / that peak) processes); "
                     f"logged: {hta_note or 'no pool line'}")
    return {
        "inputs": {"dir": str(inp["dir"]), "half_dir": str(inp["half_dir"]), "ranks": R,
                   "events_per_rank": ev[0], "events": sum(ev), "bytes": sum(by_),
                   "file_bytes": sum(inp["file_bytes"]), "format": args.rank_format, "gen_s": inp["gen_s"]},
        "rows": rows, "targets": verdicts, "hta_pool": hta_note, "markdown": "\n".join(lines),
    }


# --------------------------------------------------------------------------- machine


def _meminfo() -> dict[str, int]:
    out = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            k, v = line.split(":", 1)
            if k in ("MemTotal", "MemAvailable"):
                out[k] = int(v.split()[0]) * 1024
    except OSError:
        pass
    return out


def machine(args: argparse.Namespace) -> dict:
    cpu = None
    try:
        cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                    if ln.startswith("model name")), None)
    except OSError:
        pass

    def cmd(c: list[str]) -> str | None:
        try:
            return subprocess.run(c, capture_output=True, text=True, cwd=str(REPO), timeout=60).stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            return None

    return {
        "nproc": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)), "cpu": cpu,
        "ram_total_bytes": _meminfo().get("MemTotal"), "ram_available_bytes_at_start": _meminfo().get("MemAvailable"),
        "loadavg_start": os.getloadavg(), "python": sys.version.split()[0], "platform": platform.platform(),
        "traceroof": cmd([*_tr(), "--version"]), "git_commit": cmd(["git", "rev-parse", "--short", "HEAD"]),
        "git_dirty": bool(cmd(["git", "status", "--porcelain", "--untracked-files=no"])),
        "hta": _hta_version(args.hta_python) if not args.skip_hta and args.hta_python.is_file() else None,
    }


def _machine_line(m: dict) -> str:
    la0, la1 = m["loadavg_start"], m.get("loadavg_end") or ("?",) * 3
    fmt = lambda la: "/".join(f"{x:.2f}" if isinstance(x, float) else str(x) for x in la)  # noqa: E731
    return (f"machine: {m['nproc']} CPUs ({m['cpu']}), {m['ram_total_bytes'] / 2**30:.1f} GiB RAM; load average "
            f"{fmt(la0)} at start, {fmt(la1)} at end; python {m['python']}; {m['traceroof']} "
            f"(git {m['git_commit']}{', dirty tree' if m['git_dirty'] else ''}); HTA {m['hta'] or 'not run'}. "
            "wall = fork → exit; peak RSS = wait4 ru_maxrss (largest process); tree RSS = sampled sum over the "
            "process tree")


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", default="single,ranks", help="comma-separated: single, ranks")
    ap.add_argument("--size-gb", type=float, default=None, help="single trace size, GB uncompressed (default 1.0)")
    ap.add_argument("--single-formats", default="json,gz", help="inputs of part A: json, gz")
    ap.add_argument("--ranks", type=int, default=None, help="ranks of part B (default 64)")
    ap.add_argument("--rank-events", type=int, default=None, help="events per rank file (default 50,000)")
    ap.add_argument("--rank-format", choices=("gz", "json"), default="gz")
    ap.add_argument("--jobs", type=int, default=2, help="traceroof --jobs for the rank sets (default 2)")
    ap.add_argument("--hta-python", type=Path, default=bk.DEFAULT_HTA_VENV / "bin" / "python")
    ap.add_argument("--hta-formats", default="json,gz", help="part A inputs HTA runs on (default both)")
    ap.add_argument("--skip-hta", action="store_true")
    ap.add_argument("--repeat", type=int, default=1, help="best of N for traceroof and orjson (HTA: once)")
    ap.add_argument("--small", action="store_true", help="smoke test: ~50 MB trace, 8 ranks of one replica (~6 MB)")
    ap.add_argument("--results", type=Path, default=None,
                    help="JSON results file (default $CACHE/scale_results.json, scale_results_small.json with --small)")
    ap.add_argument("--generate-only", action="store_true", help="generate (or complete) the inputs and stop")
    args = ap.parse_args(argv)
    parts = [p for p in args.parts.split(",") if p]
    if unknown := set(parts) - {"single", "ranks"}:
        ap.error(f"unknown parts: {', '.join(sorted(unknown))}")
    args.size_gb = args.size_gb or (0.05 if args.small else 1.0)
    args.ranks = args.ranks or (8 if args.small else 64)
    args.rank_events = args.rank_events or (6_000 if args.small else 50_000)
    args.single_formats = [f for f in args.single_formats.split(",") if f]
    args.hta_formats = [f for f in args.hta_formats.split(",") if f]
    if args.ranks < 2:
        ap.error("--ranks must be at least 2")
    results_path = args.results or bk._cache_dir() / ("scale_results_small.json" if args.small else "scale_results.json")

    if args.generate_only:
        t = time.perf_counter()
        if "single" in parts:
            s = ensure_single(args.size_gb, args.single_formats)
            log(f"single: {s['json']} {s['bytes'] / 1e9:.3f} GB, {s['events']:,} events"
                + (f"; {s['gz']} {s['gz'].stat().st_size / 1e9:.3f} GB" if "gz" in s else ""))
        if "ranks" in parts:
            r = ensure_ranks(args.ranks, args.rank_events, args.rank_format == "gz")
            log(f"ranks: {r['dir']} {len(r['files'])} files, {sum(r['events']):,} events, "
                f"{sum(r['bytes']) / 1e9:.3f} GB uncompressed, {sum(r['file_bytes']) / 1e9:.3f} GB on disk")
        log(f"inputs ready in {time.perf_counter() - t:.0f} s")
        return 0

    m = machine(args)
    hta_ok = not args.skip_hta and bk.ensure_hta(args.hta_python)
    if hta_ok and not m["hta"]:
        m["hta"] = _hta_version(args.hta_python)
    work = Path(tempfile.mkdtemp(prefix="bench-scale-", dir=bk._cache_dir()))
    out: dict = {"machine": m, "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}}
    try:
        if "single" in parts:
            out["single"] = part_single(args, work, hta_ok)
        if "ranks" in parts:
            out["ranks"] = part_ranks(args, work, hta_ok)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    m["loadavg_end"] = os.getloadavg()
    m["ram_available_bytes_at_end"] = _meminfo().get("MemAvailable")
    md = [out[p]["markdown"] for p in ("single", "ranks") if p in out] + [_machine_line(m)]
    out["markdown"] = "\n\n".join(md)
    print()
    print(out["markdown"])
    results_path.parent.mkdir(parents=True, exist_ok=True)
    results_path.write_text(json.dumps(out, indent=1, default=str))
    print(f"\nresults: {results_path}")
    failed = [r["tool"] for p in ("single", "ranks") if p in out for r in out[p]["rows"] if r.get("failed")]
    if failed:
        print(f"FAILED runs: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
