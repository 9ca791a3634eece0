"""Kineto decode paths side by side on one input: msgspec, the native scanner, polars NDJSON.

    python benchmarks/bench_decode.py TRACE.json [--ndjson] [--read-only]
    BENCH_DECODE_REPEAT=3 python benchmarks/bench_decode.py ...   # rows alternated, least CPU kept

Each row runs in its own subprocess (so peak RSS is its own) and reports CPU seconds
(user + system, ``resource.getrusage``), wall seconds and peak RSS (``ru_maxrss``):

* ``read_trace (msgspec)`` / ``read_trace (native)``: ``traceroof.io.read_trace(TRACE)`` with
  ``TRACEROOF_DECODER=python`` / the native scanner (decode, column building and linking);
  ``read_trace (native, one thread)``: the same without the scan worker and read-ahead
  threads (``TRACEROOF_SCAN_AHEAD=0 TRACEROOF_READ_AHEAD=0``);
* ``... blocks read``: the same with a plain file read block by block (``TRACEROOF_MMAP=0``)
  instead of mapped (``kineto_blocks.mapped``);
* ``decode: msgspec typed`` (the floor): the event array cut in 1 MiB pieces at event
  boundaries, each decoded by msgspec into the typed ``Event`` structs traceroof uses
  (``kineto_events.EVENTS_DECODER``), nothing else: what the msgspec path costs before any
  column is built;
* ``decode: native scan``: the same pieces through ``kineto_native.Scanner.scan`` (columns
  and the string dictionary included);
* ``decode: polars read_ndjson`` (``--ndjson``; the rejected candidate, measured once): the
  same events written one per line to a temporary file, read by ``polars.read_ndjson`` with
  the fields traceroof uses (the time to write the NDJSON file is not counted).

Ratios are against the floor, measured in the same run; the load average (``uptime``) is
printed beside them, since the machine may be shared. The piece cutting (a regex over the
file) is done before the clock starts in the decode rows.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time

_PIECE = 1 << 20


def _pieces(path: str) -> list[bytes]:
    from traceroof.parsers.kineto_events import BOUNDARY, EVENTS_KEY

    data = open(path, "rb").read()
    m = EVENTS_KEY.search(data)
    if m is None:
        raise SystemExit(f"{path}: no traceEvents array")
    pos, end = m.end(), data.rindex(b"]")
    out = []
    while pos < end:
        b = BOUNDARY.search(data, pos + _PIECE, end)
        stop = b.start() + 1 if b else end
        out.append(b"[" + data[pos:stop] + b"]")
        pos = b.end() - 1 if b else end
    return out


def _one(row: str, path: str) -> dict:
    """Run one row in this process; returns its figures."""
    extra: dict = {}
    if row.startswith("read_trace"):
        os.environ["TRACEROOF_DECODER"] = "python" if "msgspec" in row else "native"
        if "one thread" in row:  # the native path without its worker and read-ahead threads
            os.environ["TRACEROOF_SCAN_AHEAD"] = os.environ["TRACEROOF_READ_AHEAD"] = "0"
        if "blocks read" in row:  # a plain file read block by block, not mapped
            os.environ["TRACEROOF_MMAP"] = "0"
        from traceroof.io import read_trace

        t0, c0 = time.perf_counter(), _cpu()
        tr = read_trace(path, jobs=1)
        extra = {"ops": tr.ops.height, "host": tr.host.height}
    elif row == "decode: msgspec typed":
        from traceroof.parsers.kineto_events import EVENTS_DECODER

        pieces = _pieces(path)
        t0, c0 = time.perf_counter(), _cpu()
        extra = {"events": sum(len(EVENTS_DECODER.decode(p)) for p in pieces)}
    elif row == "decode: native scan":
        from traceroof.parsers.kineto_native import Scanner

        pieces = _pieces(path)
        sc = Scanner()
        t0, c0 = time.perf_counter(), _cpu()
        got = [sc.scan(p) for p in pieces]
        extra = {"events": sum(len(c) for c in got if c is not None),
                 "not_handled": sum(c is None for c in got)}
    elif row == "decode: polars read_ndjson":
        import msgspec
        import polars as pl

        with tempfile.NamedTemporaryFile(suffix=".ndjson", delete=False) as fh:
            for p in _pieces(path):  # one compact line per event (pretty-printing dropped)
                fh.write(b"\n".join(msgspec.json.encode(e) for e in msgspec.json.decode(p)) + b"\n")
            nd = fh.name
        schema = {"ph": pl.String, "cat": pl.String, "name": pl.String, "pid": pl.String,
                  "tid": pl.String, "ts": pl.Float64, "dur": pl.Float64,
                  "args": pl.Struct({"correlation": pl.Int64, "External id": pl.Int64,
                                     "Input Dims": pl.String, "Input type": pl.String})}
        t0, c0 = time.perf_counter(), _cpu()
        try:
            extra = {"events": pl.read_ndjson(nd, schema=schema, ignore_errors=True).height}
        finally:
            os.unlink(nd)
    else:
        raise SystemExit(f"unknown row {row!r}")
    return {"cpu_s": _cpu() - c0, "wall_s": time.perf_counter() - t0,
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, **extra}


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main(argv: list[str]) -> None:
    args = [a for a in argv if not a.startswith("--")]
    if len(args) != 1:
        raise SystemExit(__doc__)
    path = args[0]
    if "--one" in argv:  # child: one row, JSON on stdout
        print(json.dumps(_one(os.environ["BENCH_ROW"], path)))
        return
    rows = ["decode: msgspec typed", "decode: native scan", "read_trace (msgspec)", "read_trace (native, one thread)",
            "read_trace (native)", "read_trace (native, one thread, blocks read)", "read_trace (native, blocks read)"]
    if "--ndjson" in argv:
        rows.append("decode: polars read_ndjson")
    if "--read-only" in argv:  # the read_trace rows of the native path only
        rows = [r for r in rows if r.startswith("read_trace (native")]
    repeat = int(os.environ.get("BENCH_DECODE_REPEAT", "1"))
    print(f"{path} ({os.path.getsize(path) / 1e6:.0f} MB); load: {os.getloadavg()[0]:.2f}")
    results: dict = {}
    for _ in range(repeat):  # the rows alternate; the least CPU of each is kept
        for row in rows:
            out = subprocess.run([sys.executable, __file__, path, "--one"], env={**os.environ, "BENCH_ROW": row},
                                 capture_output=True, text=True, check=True)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            if row not in results or r["cpu_s"] < results[row]["cpu_s"]:
                results[row] = r
    floor = results["decode: msgspec typed"]["cpu_s"] if "decode: msgspec typed" in results else float("nan")
    print(f"{'row':28} {'cpu s':>7} {'wall s':>7} {'peak RSS GB':>12} {'cpu / floor':>12}  extra")
    for row, r in results.items():
        extra = {k: v for k, v in r.items() if k not in ("cpu_s", "wall_s", "peak_rss_bytes")}
        print(f"{row:28} {r['cpu_s']:7.2f} {r['wall_s']:7.2f} {r['peak_rss_bytes'] / 1e9:12.3f} "
              f"{r['cpu_s'] / floor:11.2f}x  {extra}")
    print(f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
