"""The threaded streaming decode (kineto_stream rounds, kineto_blocks.ReadAhead) equals the
one-thread decode.

Oracles: the same decoder with its threads switched off (``TRACEROOF_SCAN_AHEAD=0``: every
piece scanned in the reading thread by one scanner; ``TRACEROOF_READ_AHEAD=0``: every block
read there), and the msgspec path (``TRACEROOF_DECODER=python``). Equal means: the op and
host tables (schema, every column, every value), the meta, and for the native columns the
string dictionary and every code array, code for code.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import logging
import threading

import numpy as np
import pytest
from conftest import REAL, kineto, real, require_native
from test_kineto_native import kernel, launch
from test_kineto_native_equal import REAL_KINETO, assert_same

from traceroof.parsers import kineto as K
from traceroof.parsers import kineto_blocks as B
from traceroof.parsers import kineto_native as N
from traceroof.parsers import kineto_stream as KS


@pytest.fixture(autouse=True)
def _native_built():
    require_native()


ONE = {KS.ENV_SCAN_AHEAD: "0", B.ENV_READ_AHEAD: "0"}
TWO = {KS.ENV_SCAN_AHEAD: "1", B.ENV_READ_AHEAD: "1"}


def _env(monkeypatch, env: dict[str, str], helper: bool = True) -> None:
    monkeypatch.setenv(N.ENV_DECODER, "native")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    # whether the reading thread scans pieces too depends on the worker's speed: forced here
    # (helper: OWN_PIECES_MAX pieces each round; else none, the worker scans them all)
    monkeypatch.setattr(KS._Stream, "_worker_busy", staticmethod(lambda job: helper))
    monkeypatch.setattr(KS, "MIN_CORES", 0.0)  # never fall back to one thread (tested apart)


def stream(data: bytes, block: int, monkeypatch, env: dict[str, str]):
    """``read_fileobj`` of ``data`` in ``block``-byte pieces under ``env``."""
    _env(monkeypatch, env)
    return K.read_fileobj(io.BytesIO(data), path="t.json", block_bytes=block)


def codes(data: bytes, block: int, monkeypatch, env: dict[str, str], helper: bool = True):
    """Every piece ``decode_stream`` hands on: native pieces as their code arrays, with the
    final dictionary; msgspec pieces as their events."""
    _env(monkeypatch, env, helper)
    got: list = []
    scanners: list = []

    def on_chunk(c):
        if isinstance(c, N.Columns):
            scanners.append(c.scanner)
            got.append(("native", c.n, [c.ph, c.cat, c.name, c.pid, c.tid, c.ts_ns, c.dur_ns, c.ts_state,
                                        c.dur_state] + [a for kv in c.slots for a in kv if a is not None]))
        else:
            got.append(("msgspec", list(c)))

    decoded = KS.decode_stream(io.BytesIO(data), on_chunk, path="t.json", block_bytes=block, native=True)
    assert len({id(s) for s in scanners}) <= 1  # one dictionary for the whole file
    return got, (scanners[0].dictionary() if scanners else None), dataclasses.asdict(decoded.stats)


def assert_codes_equal(a, b) -> None:
    (pa, da, sa), (pb, db, sb) = a, b
    assert da == db  # the dictionary, code for code
    assert sa == sb
    assert len(pa) == len(pb)
    for x, y in zip(pa, pb):
        assert x[0] == y[0] and x[1] == y[1]
        if x[0] == "native":
            assert len(x[2]) == len(y[2])
            for u, v in zip(x[2], y[2]):
                assert u.dtype == v.dtype and np.array_equal(u, v)


def _raw(p) -> bytes:
    data = p.read_bytes()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


@pytest.mark.parametrize("rel", [r for r in REAL_KINETO if not r.endswith(".tar.gz")])
def test_one_and_two_threads_equal_on_every_real_trace(rel, monkeypatch):
    # each file cut in ~64 pieces: ~20 rounds of the worker and the helper scanner
    p = real(rel)
    data = p.read_bytes()
    block = max(4 << 10, len(_raw(p)) // 64)
    assert_same(stream(data, block, monkeypatch, TWO), stream(data, block, monkeypatch, ONE), f"{rel} block {block}")


@pytest.mark.parametrize("helper", ["always", "never"])
@pytest.mark.parametrize("rel", [
    "TraceLens/tests/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
    "kineto/tb_plugin/test/gpu_metrics_input.json",
])
def test_the_merged_dictionary_is_the_one_thread_dictionary_code_for_code(rel, helper, monkeypatch):
    raw = _raw(real(rel))
    block = max(4 << 10, len(raw) // 100)
    roles = _roles(monkeypatch)
    two = codes(raw, block, monkeypatch, TWO, helper == "always")
    whos = {who for who, _ in roles}  # who scanned: the worker, and the helper when asked to
    assert "worker" in whos and ("helper" in whos) == (helper == "always"), whos
    assert two[1] is not None and len(two[0]) >= 9  # native pieces: three rounds at least
    assert_codes_equal(two, codes(raw, block, monkeypatch, ONE))


def _roles(monkeypatch) -> list[tuple[str, bool]]:
    """Each scan as (who, handled): "worker" (the worker thread), "helper" (this thread's
    helper scanner) or "owner" (the owner scanning in this thread)."""
    seen: list = []
    orig = N.Scanner.scan_raw

    def scan_raw(self, d, bare=False):
        r = orig(self, d, bare)
        who = ("worker" if threading.current_thread().name.startswith("traceroof-scan")
               else "helper" if self.helper else "owner")
        seen.append((who, r is not None))
        return r

    monkeypatch.setattr(N.Scanner, "scan_raw", scan_raw)
    return seen


def _events(bad: int, kind: str) -> list[dict]:
    # a new kernel name in every piece: a discarded scan's strings must leave its dictionary
    evs = [kernel(i, name="k" * 150 + str(i)) for i in range(500)] + [launch(i) for i in range(500)]
    if kind == "float id":  # msgspec reads it, the scanner does not
        evs[bad]["args"]["correlation"] = float(bad)
    else:  # boundaries inside strings over ~1.5 pieces: the piece cut in one is extended
        for i in range(bad, bad + 70):
            evs[i]["name"] = 'x"}, {"y' + str(i) + "}, {" * 3
    return evs


@pytest.mark.parametrize("kind", ["float id", "boundary in a string"])
def test_a_piece_not_handled_in_either_thread(kind, monkeypatch):
    # the bad event walks over ~5 consecutive pieces (16 KiB, ~45 events each), so that the
    # piece holding it is scanned by the worker (first or second of its job) or by the
    # helper; every read equals the one-thread read and msgspec's
    failed_in: set[str] = set()
    for bad in range(200, 420, 9):
        doc = kineto(_events(bad, kind))
        roles = _roles(monkeypatch)
        two = stream(doc, 16 << 10, monkeypatch, TWO)
        failed_in |= {who for who, ok in roles if not ok and who != "owner"}
        monkeypatch.undo()  # the recording scan_raw, the environment
        assert_same(two, stream(doc, 16 << 10, monkeypatch, ONE), f"{kind} at {bad}: 1 thread")
        monkeypatch.setenv(N.ENV_DECODER, "python")
        want = K.read_fileobj(io.BytesIO(doc), path="t.json", block_bytes=16 << 10)
        assert_same(two, want, f"{kind} at {bad}: msgspec")
        assert_codes_equal(codes(doc, 16 << 10, monkeypatch, TWO), codes(doc, 16 << 10, monkeypatch, ONE))
        monkeypatch.undo()
    assert failed_in == {"worker", "helper"}, failed_in


def _cut_gz(p, frac: float) -> bytes:
    data = p.read_bytes()
    return data[: int(len(data) * frac)]


@pytest.mark.parametrize("frac", [0.3, 0.71, 0.999])
def test_a_cut_gz_reads_the_same_with_the_threads(frac, monkeypatch):
    p = real("TraceLens/tests/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz")
    cut = _cut_gz(p, frac)
    block = 32 << 10
    two = stream(cut, block, monkeypatch, TWO)
    # the events before the cut were kept, and the cut is said
    assert two.host.height > 0 and any("trace is truncated" in w for w in two.meta.warnings), two.meta.warnings
    assert_same(two, stream(cut, block, monkeypatch, ONE), f"cut at {frac}")


class _Failing(io.RawIOBase):
    """A file object whose reads fail after ``ok`` bytes."""

    def __init__(self, data: bytes, ok: int) -> None:
        self.data, self.ok, self.pos = data, ok, 0

    def read(self, n: int = -1) -> bytes:
        if self.pos >= self.ok:
            raise OSError(5, "Input/output error (test)")
        out = self.data[self.pos : min(self.pos + n, self.ok)]
        self.pos += len(out)
        return out


def test_a_read_error_in_the_read_ahead_thread_is_raised_to_the_reader(monkeypatch):
    raw = _raw(real("TraceLens/tests/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"))
    raised = []
    for env in (TWO, ONE):
        _env(monkeypatch, env)
        with pytest.raises(OSError) as exc:
            K.read_fileobj(_Failing(raw, len(raw) // 2), path="t.json", block_bytes=16 << 10)
        raised.append(str(exc.value))
    assert raised[0] == raised[1] == "[Errno 5] Input/output error (test)"
    assert not [t.name for t in threading.enumerate() if t.name.startswith(("traceroof-read", "traceroof-scan"))]


class _Blocks:
    """A source of ``n`` numbered blocks (the interface ReadAhead wraps)."""

    def __init__(self, n: int) -> None:
        self.block, self.raw_read, self.size, self.gzip_problem = 4, 0, 0, None
        self.n, self.calls = n, 0

    def read(self) -> bytes:
        self.calls += 1
        if self.calls > self.n:
            self.gzip_problem = "ended"
            return b""
        b = b"%04d" % self.calls
        self.raw_read += 4
        self.size += 4
        return b


def test_read_ahead_hands_the_blocks_in_order_and_close_stops_it():
    src = _Blocks(1000)
    ra = B.ReadAhead(src, depth=2)
    assert [ra.read() for _ in range(3)] == [b"0001", b"0002", b"0003"]
    ra.close()  # the thread was blocked on a full queue: it stops, having read a few more
    assert src.calls <= 3 + 2 + 2, src.calls  # 3 handed out + the queue (2) + one in hand (+1 drained)
    assert not [t for t in threading.enumerate() if t.name == "traceroof-read"]
    src = _Blocks(5)
    ra = B.ReadAhead(src)
    got = []
    while (b := ra.read()):
        got.append(b)
    assert got == [b"%04d" % i for i in range(1, 6)] and ra.eof and ra.gzip_problem == "ended"
    assert ra.read() == b"" and src.calls == 6  # not read again after its end
    ra.close()


def test_a_starved_worker_hands_the_rest_of_the_file_to_one_thread(monkeypatch, caplog):
    # a machine whose cores are taken (forced: MIN_CORES beyond reach): after CHECK_JOBS
    # jobs the worker and the read-ahead thread stop; the result is still the one-thread one
    raw = _raw(real("TraceLens/tests/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"))
    block = max(4 << 10, len(raw) // 200)
    roles = _roles(monkeypatch)
    _env(monkeypatch, TWO)
    monkeypatch.setattr(KS, "MIN_CORES", 1e9)
    with caplog.at_level(logging.DEBUG, logger="traceroof.parsers.kineto_stream"):
        two = K.read_fileobj(io.BytesIO(gzip.compress(raw)), path="t.json", block_bytes=block)
    said = [r.getMessage() for r in caplog.records if "one thread from here" in r.getMessage()]
    assert len(said) == 1 and f"over {KS.CHECK_JOBS + 1} jobs" in said[0], said
    worker = sum(who == "worker" for who, _ in roles)
    # the worker scanned its CHECK_JOBS + 1 jobs (two pieces each), the owner the rest
    assert worker == KS.WORKER_PIECES * (KS.CHECK_JOBS + 1) and sum(who == "owner" for who, _ in roles) > 20
    monkeypatch.undo()
    assert_same(two, stream(gzip.compress(raw), block, monkeypatch, ONE), "starved")


def test_read_ahead_stopped_hands_what_it_read_then_reads_directly():
    src = _Blocks(50)
    ra = B.ReadAhead(src, depth=3)
    got = [ra.read(), ra.read()]
    ra.stop()  # the thread's queued and in-hand blocks first, then the caller's own reads
    assert not [t for t in threading.enumerate() if t.name == "traceroof-read"]
    while (b := ra.read()):
        got.append(b)
    assert got == [b"%04d" % i for i in range(1, 51)] and src.calls == 51
    ra.close()


def test_the_corpus_is_there():
    # a missing ../shared makes this FAIL, never skip
    assert REAL.is_dir() and len(REAL_KINETO) == 29
