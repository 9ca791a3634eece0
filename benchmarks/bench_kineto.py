#!/usr/bin/env python
"""Benchmark: ``traceroof analyze`` vs a bare ``orjson.loads`` vs HTA, on a ≥ 2 M-event Kineto trace.

Command (from the repo root; the first run generates and caches the traces, ~1 min each,
and creates the HTA venv if it is missing)::

    .venv/bin/python benchmarks/bench_kineto.py

Options: ``--events N`` (default 2,000,000), ``--formats pretty,compact`` (default both),
``--hta-python PATH`` (default /tmp/hta-venv/bin/python, created with
``python3 -m venv /tmp/hta-venv && /tmp/hta-venv/bin/pip install holistictraceanalysis`` when
missing), ``--skip-hta``, ``--hta-formats`` (default: pretty only; HTA takes minutes),
``--repeat N`` (best of N for traceroof and orjson), ``--no-read-only``.

What it does
------------
1. Generates (once; cached in ``$TRACEROOF_BENCH_CACHE`` or ``/tmp/traceroof-bench``, outside
   the repo) a Kineto trace of at least ``--events`` events by replicating, step after step,
   the real H100 trace ``TraceLens/tests/traces/h100/Qwen_Qwen1.5-0.5B-Chat`` from
   ``../shared/fixtures/real`` (torch 2.6, record_shapes + with_stack + profile_memory):
   ``cpu_op`` with ``Input Dims``/``Input type``/``Input Strides``/``Concrete Inputs``/``External
   id``, ``cuda_runtime`` ``cudaLaunchKernel`` with ``correlation``, ``kernel``/``gpu_memset``
   events with their full arg set, ``ac2g`` flows, ``python_function`` frames, ``[memory]``
   instants, ``ProfilerStep#N`` annotations (host and device), ``deviceProperties``
   "NVIDIA H100 80GB HBM3", ``distributedInfo``. Every replica is shifted in time and gets
   fresh External ids, correlations, flow ids, Python ids and Ev Idx, so links stay valid.
   Timestamps are written as torch writes them: floats with 3 decimals. Two layouts: ``pretty``
   (torch's ``export_chrome_trace`` layout: one key group per line, args on one line) and
   ``compact`` (no whitespace).
2. Measures, each in its own subprocess (wall time from fork to exit; peak RSS from
   ``os.wait4``'s ``ru_maxrss``, which covers the child and its descendants):

   * ``traceroof analyze FILE --chip h100 --format json -q > /dev/null`` (end to end);
   * ``traceroof.io.read_trace(FILE)`` only (parse, for the split);
   * a bare ``orjson.loads(open(FILE, "rb").read())`` (what any Python tool pays to read it;
     the child exits with ``os._exit`` so it pays no teardown);
   * HTA: ``TraceAnalysis(trace_dir=DIR)`` on a directory holding (a link to) the file, run
     by the interpreter of a separate venv.
3. Prints a table: wall s, events/s, peak RSS, RSS / file size, speed vs orjson and vs HTA,
   and checks the targets of issue 2: analyze no slower than orjson, ≥ 5x faster than HTA,
   peak RSS ≤ 2x the uncompressed file.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO.parent / "shared" / "fixtures" / "real" / "TraceLens" / "tests" / "traces" / "h100" / (
    "Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
)
GEN_VERSION = 2  # 2: the recording window spans every replica
DEFAULT_HTA_VENV = Path("/tmp/hta-venv")


# --------------------------------------------------------------------------- generation


def _cache_dir() -> Path:
    d = Path(os.environ.get("TRACEROOF_BENCH_CACHE", "/tmp/traceroof-bench"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def _us(ns: int) -> str:
    """int ns → torch's µs text with 3 decimals."""
    return "%d.%03d" % divmod(ns, 1000)


def _ns(us: float) -> int:
    return round(us * 1000)


# variable slots of an event template
_TS, _EXT, _CORR, _FLOW, _PYID, _PYPARENT, _EVIDX, _STEP = range(8)


class _Tmpl:
    """One source event as a %-format string per layout plus the slots to fill per replica."""

    __slots__ = ("pretty", "compact", "slots")

    def __init__(self, e: dict) -> None:
        self.slots: list[tuple[int, int]] = []
        self.pretty = self._build(e, pretty=True)
        slots = self.slots
        self.slots = []
        self.compact = self._build(e, pretty=False)
        assert slots == self.slots

    def _build(self, e: dict, *, pretty: bool) -> str:
        sep, kv = (", ", ": ") if pretty else (",", ":")

        def val(v: object) -> str:
            return json.dumps(v, separators=(sep, kv), ensure_ascii=False).replace("%", "%%")

        def key(k: str) -> str:
            return val(k) + kv

        head: list[str] = []
        for k, v in e.items():
            if k in ("ts", "dur", "args"):
                continue
            if k == "id" and e.get("cat") in ("ac2g", "async_cpu_to_gpu", "async_gpu"):
                head.append(key(k) + "%s")
                self.slots.append((_FLOW, int(v)))
            elif k == "name" and isinstance(v, str) and v.startswith("ProfilerStep#"):
                head.append(key(k) + '"ProfilerStep#%s"')
                self.slots.append((_STEP, int(v.split("#", 1)[1])))
            else:
                head.append(key(k) + val(v))
        times: list[str] = []
        if "ts" in e:
            times.append(key("ts") + "%s")
            self.slots.append((_TS, _ns(e["ts"])))
        if "dur" in e:
            times.append(key("dur") + _us(_ns(e["dur"])))
        args: list[str] = []
        for k, v in (e.get("args") or {}).items():
            slot = {
                "External id": _EXT, "correlation": _CORR, "Python id": _PYID,
                "Python parent id": _PYPARENT, "Ev Idx": _EVIDX,
            }.get(k)
            if slot is not None and isinstance(v, int) and not isinstance(v, bool):
                args.append(key(k) + "%s")
                self.slots.append((slot, v))
            else:
                args.append(key(k) + val(v))
        if pretty:
            out = "  {\n    " + sep.join(head)
            if times:
                out += ",\n    " + sep.join(times)
            if "args" in e:
                out += ',\n    "args": {\n      ' + sep.join(args) + "\n    }"
            return out + "\n  }"
        parts = head + times
        if "args" in e:
            parts.append('"args":{' + ",".join(args) + "}")
        return "{" + ",".join(parts) + "}"


class _Plan:
    """The source trace split into replicable templates (built once per process)."""

    def __init__(self, nccl: bool = False) -> None:
        src = json.loads(gzip.decompress(SOURCE.read_bytes()))
        evs = src["traceEvents"]
        if nccl:
            evs = evs + _nccl_events(evs)
        self.src = src
        self.once_head = [e for e in evs if e.get("ph") == "M"]
        self.once_tail = [e for e in evs if e.get("cat") == "Trace" or (e.get("ph") == "i" and e.get("s") == "g")]
        skip = {id(e) for e in self.once_head + self.once_tail}
        self.body = [e for e in evs if id(e) not in skip]
        self.tmpls = [_Tmpl(e) for e in self.body]
        t0 = min(_ns(e["ts"]) for e in evs if "ts" in e)
        t1 = max(_ns(e["ts"]) + _ns(e.get("dur", 0)) for e in evs if "ts" in e)
        spans = {
            _TS: (t1 - t0) + 1_000_000,  # one replica = one step; 1 ms apart
            _EXT: 1 + max((e.get("args") or {}).get("External id", 0) for e in evs),
            _CORR: 1 + max([(e.get("args") or {}).get("correlation", 0) for e in evs]
                           + [e["id"] for e in evs if e.get("cat") == "ac2g"]),
            _PYID: 1 + max((e.get("args") or {}).get("Python id", 0) for e in evs),
            _EVIDX: 1 + max((e.get("args") or {}).get("Ev Idx", 0) for e in evs),
            _STEP: 1,
        }
        spans[_FLOW] = spans[_CORR]
        spans[_PYPARENT] = spans[_PYID]
        self.spans = spans

    def replicas(self, events: int) -> int:
        return -(-(events - len(self.once_head) - len(self.once_tail)) // len(self.body))

    def event_count(self, events: int) -> int:
        """Events a trace generated for ``events`` holds (whole replicas: at least ``events``)."""
        return len(self.once_head) + len(self.once_tail) + self.replicas(events) * len(self.body)

    def replica_bytes(self, layout: str) -> int:
        """Bytes of the first replica in ``layout`` (later ones are a little longer: larger ids)."""
        pretty = layout == "pretty"
        esep = ",\n" if pretty else ","
        return len(esep.encode()) + len(esep.join(_fill(t, pretty, 0, self.spans) for t in self.tmpls).encode())


_PLANS: dict[bool, _Plan] = {}


def plan(nccl: bool = False) -> _Plan:
    if nccl not in _PLANS:
        _PLANS[nccl] = _Plan(nccl)
    return _PLANS[nccl]


def _nccl_events(evs: list[dict]) -> list[dict]:
    """One all-reduce per step, in its last millisecond: ``record_param_comms`` cpu_op,
    ``cudaLaunchKernel``, the ``ncclDevKernel_AllReduce`` kernel (with the collective args torch
    ≥ 2.1 records) on its own stream, overlapping the step's last kernels, and the ``ac2g`` flow
    linking launch and kernel."""
    launch = next(e for e in evs if e.get("cat") == "cuda_runtime" and e.get("name") == "cudaLaunchKernel")
    kern = next(e for e in evs if e.get("cat") == "kernel")
    host_step = next(e for e in evs if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#"))
    dev_step = next(e for e in evs if e.get("cat") == "gpu_user_annotation" and e["name"].startswith("ProfilerStep#"))
    host_end = _ns(host_step["ts"]) + _ns(host_step["dur"])
    dev_end = _ns(dev_step["ts"]) + _ns(dev_step["dur"])
    ext = 1 + max((e.get("args") or {}).get("External id", 0) for e in evs)
    corr = 1 + max([(e.get("args") or {}).get("correlation", 0) for e in evs]
                   + [e["id"] for e in evs if e.get("cat") == "ac2g"])
    t_op, t_launch, t_kern = host_end - 2_000_000, host_end - 1_990_000, dev_end - 1_000_000
    ts = lambda ns: ns / 1000  # noqa: E731
    hpid, htid = launch["pid"], launch["tid"]
    dpid = kern["pid"]
    coll = {
        "Collective name": "allreduce", "In msg nelems": 4_194_304, "Out msg nelems": 4_194_304,
        "Group size": 64, "dtype": "BFloat16", "In split size": "[]", "Out split size": "[]",
        "Process Group Name": "0", "Process Group Description": "default_pg",
        "Process Group Ranks": "[" + ", ".join(map(str, range(64))) + "]",
    }
    return [
        {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": hpid, "tid": htid,
         "ts": ts(t_op), "dur": 60.0, "args": {"External id": ext, "Record function id": 0, **coll}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": hpid, "tid": htid,
         "ts": ts(t_launch), "dur": 8.0, "args": {"External id": ext, "cbid": 211, "correlation": corr}},
        {"ph": "s", "id": corr, "pid": hpid, "tid": htid, "ts": ts(t_launch), "cat": "ac2g", "name": "ac2g"},
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
         "pid": dpid, "tid": 99, "ts": ts(t_kern), "dur": 450.0,
         "args": {"External id": ext, "queued": 0, "device": dpid, "context": 1, "stream": 99,
                  "correlation": corr, "registers per thread": 96, "shared memory": 103808,
                  "blocks per SM": 0.24, "warps per SM": 3.9, "grid": [32, 1, 1], "block": [512, 1, 1],
                  "est. achieved occupancy %": 0, **coll}},
        {"ph": "f", "id": corr, "pid": dpid, "tid": 99, "ts": ts(t_kern), "cat": "ac2g", "name": "ac2g", "bp": "e"},
    ]


class _Writer:
    """Text sink over a binary file (plain or gzip) that counts the uncompressed bytes."""

    def __init__(self, path: Path, gz: bool) -> None:
        self.raw = open(path, "wb", buffering=16 << 20)
        self.gz = gzip.GzipFile(filename="", fileobj=self.raw, mode="wb", compresslevel=6, mtime=0) if gz else None
        self.bytes = 0

    def write(self, s: str) -> None:
        b = s.encode("utf-8")
        self.bytes += len(b)
        (self.gz or self.raw).write(b)

    def close(self) -> None:
        if self.gz is not None:
            self.gz.close()
        self.raw.close()


def write_trace(
    path: Path, events: int, layout: str, *, rank: int = 0, world_size: int = 1, nccl: bool = False,
    gz: bool = False, progress: bool = False,
) -> tuple[int, int]:
    """Write a trace of at least ``events`` events to ``path`` (through a temporary name, renamed
    when complete; gzip-compressed when ``gz``); return (events, uncompressed bytes)."""
    pln = plan(nccl)
    src, once_head, once_tail, body, tmpls, spans = pln.src, pln.once_head, pln.once_tail, pln.body, pln.tmpls, pln.spans
    n_rep = pln.replicas(events)
    pretty = layout == "pretty"
    header = {
        "schemaVersion": src["schemaVersion"],
        "deviceProperties": src["deviceProperties"],
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world_size},
        "record_shapes": 1, "with_stack": 1, "profile_memory": 1, "with_flops": 1, "with_modules": 1,
        "cuda_runtime_version": src["cuda_runtime_version"], "cuda_driver_version": src["cuda_driver_version"],
        "cupti_version": src["cupti_version"],
    }
    trailer = {
        "traceName": "traceroof-bench (synthetic: replicated real H100 Qwen1.5-0.5B trace)",
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": src["baseTimeNanoseconds"],
    }
    esep = ",\n" if pretty else ","
    tmp = path.with_suffix(".tmp")
    fh = _Writer(tmp, gz)
    try:
        if pretty:
            fh.write("\n{\n")
            for k, v in header.items():
                fh.write(f"  {json.dumps(k)}: {json.dumps(v, indent=None, separators=(', ', ': '))},\n")
            fh.write('  "traceEvents": [\n')
        else:
            fh.write(json.dumps(header, separators=(",", ":"))[:-1] + ',"traceEvents":[')
        first = [_Tmpl(e) for e in once_head]
        fh.write(esep.join(_fill(t, pretty, 0, spans) for t in first))
        t_start, shown = time.perf_counter(), 0
        for k in range(n_rep):
            fh.write(esep)
            fh.write(esep.join([_fill(t, pretty, k, spans) for t in tmpls]))
            if progress and (k + 1) * 10 // n_rep > shown:
                shown = (k + 1) * 10 // n_rep
                print(f"  {path.name}: {shown * 10}% ({fh.bytes / 1e6:,.0f} MB, "
                      f"{time.perf_counter() - t_start:.0f} s)", file=sys.stderr, flush=True)
        fh.write(esep)
        fh.write(esep.join(_fill(_Tmpl(e), pretty, k, spans) for e, k in (_tail_event(e, n_rep, spans) for e in once_tail)))
        if pretty:
            fh.write("\n  ],\n")
            fh.write(",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in trailer.items()))
            fh.write("\n}\n")
        else:
            fh.write("]," + json.dumps(trailer, separators=(",", ":"))[1:])
    finally:
        fh.close()
    os.replace(tmp, path)
    return len(once_head) + len(once_tail) + n_rep * len(body), fh.bytes


def generate(path: Path, events: int, layout: str) -> int:
    """Write a trace of at least ``events`` events to ``path``; return the event count."""
    return write_trace(path, events, layout)[0]


def _tail_event(e: dict, n_rep: int, spans: dict[int, int]) -> tuple[dict, int]:
    """A recording-window event of the source, as it reads for ``n_rep`` replicas: the
    window opens where the first replica starts (``Iteration Start``, the ``PyTorch Profiler``
    span, which grows to cover every replica) and closes after the last (``Record Window
    End``): (event, replica index to fill it at)."""
    if e.get("name") == "Record Window End":
        return e, n_rep - 1
    if e.get("cat") == "Trace" and "dur" in e:
        return dict(e, dur=round(float(e["dur"]) + (n_rep - 1) * spans[_TS] / 1000, 3)), 0
    return e, 0


def _fill(t: _Tmpl, pretty: bool, k: int, spans: dict[int, int]) -> str:
    vals = []
    for slot, base in t.slots:
        v = base + k * spans[slot]
        vals.append(_us(v) if slot == _TS else v)
    return (t.pretty if pretty else t.compact) % tuple(vals)


def ensure_trace(events: int, layout: str, *, progress: bool = False) -> tuple[Path, int]:
    d = _cache_dir()
    path = d / f"kineto_qwen_x{events}_{layout}_v{GEN_VERSION}.json"
    meta = path.with_suffix(".meta.json")
    if path.is_file() and meta.is_file():
        return path, json.loads(meta.read_text())["events"]
    print(f"generating {path} ({layout}, >= {events:,} events)…", file=sys.stderr, flush=True)
    t = time.perf_counter()
    n = write_trace(path, events, layout, progress=progress)[0]
    meta.write_text(json.dumps({"events": n, "bytes": path.stat().st_size}))
    print(f"  {n:,} events, {path.stat().st_size / 1e6:.0f} MB in {time.perf_counter() - t:.1f} s",
          file=sys.stderr, flush=True)
    return path, n


# --------------------------------------------------------------------------- measuring

_ORJSON_CHILD = r"""
import gzip, json, os, sys, time
t0 = time.perf_counter()
import orjson
path, out = sys.argv[1], sys.argv[2]
data = open(path, "rb").read()
if data[:2] == b"\x1f\x8b":
    data = gzip.decompress(data)
obj = orjson.loads(data)
n = len(obj["traceEvents"])
with open(out, "w") as fh:
    json.dump({"inner_s": time.perf_counter() - t0, "events": n}, fh)
os._exit(0)  # no teardown of the decoded objects: the most favourable timing for orjson
"""

_READ_CHILD = r"""
import json, os, sys, time
t0 = time.perf_counter()
from traceroof.io import read_trace
t = read_trace(sys.argv[1])
with open(sys.argv[2], "w") as fh:
    json.dump({"inner_s": time.perf_counter() - t0, "events": t.meta.stats.get("events"),
               "ops": t.ops.height, "host": t.host.height}, fh)
"""

_HTA_CHILD = r"""
import json, os, sys, time, logging
t0 = time.perf_counter()
from hta.trace_analysis import TraceAnalysis
t1 = time.perf_counter()
a = TraceAnalysis(trace_dir=sys.argv[1])
t2 = time.perf_counter()
df = a.t.get_trace(0)
with open(sys.argv[2], "w") as fh:
    json.dump({"inner_s": t2 - t0, "import_s": t1 - t0, "load_s": t2 - t1, "rows": int(len(df))}, fh)
os._exit(0)
"""


def run_child(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> dict:
    """Run ``cmd`` (stdout → /dev/null, stderr → ``log``); wall s, peak RSS bytes, rc."""
    with open(log, "wb") as err:
        t = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=str(REPO))
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t
        p.returncode = os.waitstatus_to_exitcode(status)
    return {"wall_s": wall, "cpu_s": ru.ru_utime + ru.ru_stime, "rss": ru.ru_maxrss * 1024, "rc": p.returncode}


def _traceroof_cmd() -> list[str]:
    exe = Path(sys.executable).parent / "traceroof"
    return [str(exe)] if exe.is_file() else [sys.executable, "-m", "traceroof.cli"]


def ensure_hta(python: Path) -> bool:
    if python.is_file():
        return True
    venv = python.parent.parent
    print(f"creating HTA venv {venv} (pip install holistictraceanalysis)…", file=sys.stderr, flush=True)
    base = shutil.which("python3") or sys.executable
    try:
        subprocess.run([base, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "holistictraceanalysis"], check=True)
    except (subprocess.CalledProcessError, OSError) as exc:
        print(f"  could not set up HTA: {exc}", file=sys.stderr)
        return False
    return python.is_file()


def measure(name: str, cmd: list[str], work: Path, repeat: int, env: dict[str, str] | None = None) -> dict:
    best: dict | None = None
    for i in range(repeat):
        res_file = work / f"{name}.{i}.result.json"
        c = [res_file if x == "@RESULT" else x for x in cmd]
        r = run_child([str(x) for x in c], work / f"{name}.{i}.log", env)
        if r["rc"] != 0:
            tail = (work / f"{name}.{i}.log").read_text(errors="replace")[-2000:]
            print(f"  {name}: exit code {r['rc']}\n{tail}", file=sys.stderr)
            r["failed"] = True
        if res_file.is_file():
            r.update(json.loads(res_file.read_text()))
        print(f"  {name} run {i + 1}: {r['wall_s']:.2f} s wall, {r['cpu_s']:.2f} s CPU, peak RSS {r['rss'] / 1e9:.2f} GB",
              file=sys.stderr, flush=True)
        if best is None or (not r.get("failed") and r["wall_s"] < best["wall_s"]):
            best = r
    assert best is not None
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=2_000_000)
    ap.add_argument("--formats", default="pretty,compact")
    ap.add_argument("--hta-formats", default="pretty")
    ap.add_argument("--hta-python", type=Path, default=DEFAULT_HTA_VENV / "bin" / "python")
    ap.add_argument("--skip-hta", action="store_true")
    ap.add_argument("--no-read-only", action="store_true", help="skip the parse-only traceroof run")
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args(argv)

    layouts = [f for f in args.formats.split(",") if f]
    hta_ok = not args.skip_hta and ensure_hta(args.hta_python)
    rows = []
    for layout in layouts:
        path, n_events = ensure_trace(args.events, layout)
        size = path.stat().st_size
        work = Path(tempfile.mkdtemp(prefix=f"bench-{layout}-", dir=_cache_dir()))
        print(f"{layout}: {path} ({size / 1e6:.0f} MB, {n_events:,} events)", file=sys.stderr, flush=True)
        res: dict[str, dict] = {}
        res["orjson.loads"] = measure("orjson", [sys.executable, "-c", _ORJSON_CHILD, str(path), "@RESULT"], work, args.repeat)
        res["traceroof analyze"] = measure(
            "analyze", [*_traceroof_cmd(), "analyze", str(path), "--chip", "h100", "--format", "json", "-q"],
            work, args.repeat,
        )
        if not args.no_read_only:
            res["traceroof read_trace"] = measure("read", [sys.executable, "-c", _READ_CHILD, str(path), "@RESULT"], work, args.repeat)
        if hta_ok and layout in args.hta_formats.split(","):
            hdir = work / "hta_trace_dir"
            hdir.mkdir()
            (hdir / path.name).symlink_to(path)
            res["HTA TraceAnalysis"] = measure(
                "hta", [str(args.hta_python), "-c", _HTA_CHILD, str(hdir), "@RESULT"], work, 1,
                env={**os.environ, "PYTHONWARNINGS": "ignore"},
            )
        rows.append((layout, path, size, n_events, res))
        shutil.rmtree(work, ignore_errors=True)

    print()
    print("| trace | tool | wall s | CPU s | events/s | peak RSS GB | RSS / file | speed vs orjson | speed vs HTA |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    verdicts = []
    for layout, path, size, n, res in rows:
        oj = res["orjson.loads"]["wall_s"]
        hta = res.get("HTA TraceAnalysis", {}).get("wall_s")
        for tool, r in res.items():
            w = r["wall_s"]
            fail = " (FAILED)" if r.get("failed") else ""
            print(
                f"| {layout} {size / 1e6:.0f} MB, {n / 1e6:.2f} M ev | {tool}{fail} | {w:.2f} | {r['cpu_s']:.2f} | {n / w:,.0f} | "
                f"{r['rss'] / 1e9:.2f} | {r['rss'] / size:.2f}x | {oj / w:.2f}x | "
                + (f"{hta / w:.1f}x |" if hta else "– |")
            )
        a = res["traceroof analyze"]
        verdicts.append(f"{layout}: analyze {a['wall_s']:.2f} s vs orjson {oj:.2f} s → "
                        + ("OK" if a["wall_s"] <= oj else "MISS"))
        if hta:
            verdicts.append(f"{layout}: analyze {hta / a['wall_s']:.1f}x faster than HTA (target ≥ 5x) → "
                            + ("OK" if hta >= 5 * a["wall_s"] else "MISS"))
        verdicts.append(f"{layout}: analyze peak RSS {a['rss'] / size:.2f}x the file (target ≤ 2x) → "
                        + ("OK" if a["rss"] <= 2 * size else "MISS"))
    print()
    print(f"machine: {os.cpu_count()} CPUs; python {sys.version.split()[0]}; wall = process fork → exit, "
          "peak RSS = wait4 ru_maxrss")
    for v in verdicts:
        print("target:", v)
    return 0


if __name__ == "__main__":
    sys.exit(main())
