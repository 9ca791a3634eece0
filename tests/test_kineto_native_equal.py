"""The native Kineto decode path equals the msgspec path on every real trace and fault fixture.

The oracle is the msgspec path itself (``TRACEROOF_DECODER=python``): ``read_trace`` (which
streams the file) and ``kineto.read_bytes`` (in memory) must give the same op and host
tables (schema, every column, every value) and the same meta (warnings, stats, devices) with
the native scanner as without it. When the extension is not built these tests fail under
``TRACEROOF_REQUIRE_NATIVE=1`` (CI) and are skipped otherwise.
"""

from __future__ import annotations

import dataclasses
import gzip
import tarfile

import pytest
from conftest import FIXTURES, REAL, real, require_native
from test_kineto_native import count_paths

from traceroof.io import read_trace
from traceroof.parsers import kineto as K
from traceroof.parsers import kineto_native as N

#: every real Kineto trace (as tests/test_streaming.py enumerates them)
REAL_KINETO = sorted(
    str(p.relative_to(REAL))
    for p in REAL.rglob("*")
    if p.is_file() and p.name.endswith((".json", ".json.gz", ".tar.gz")) and "integration_tests" not in str(p)
)
#: the fault fixtures (generated traces with known defects)
FAULTS = sorted(p.name for p in (FIXTURES / "faults").glob("*.json.gz"))


@pytest.fixture(autouse=True)
def _native_built():
    require_native()


def assert_same(got, want, what: str) -> None:
    for t in ("ops", "host"):
        a, b = getattr(got, t), getattr(want, t)
        assert a.schema == b.schema, (what, t)
        assert a.height == b.height, (what, t)
        assert a.equals(b), (what, t, [c for c in a.columns if not a[c].equals(b[c])])
    assert dataclasses.asdict(got.meta) == dataclasses.asdict(want.meta), what
    # and in the same order (the per-category counts in first-seen order: the report's JSON)
    assert list(got.meta.stats) == list(want.meta.stats), what


def both(monkeypatch, f):
    monkeypatch.setenv(N.ENV_DECODER, "python")
    want = f()
    monkeypatch.setenv(N.ENV_DECODER, "native")
    return f(), want


def test_the_corpus_is_there():
    # a missing ../shared makes this FAIL (never skip); the counts are those of test_streaming
    real("kineto", "tb_plugin", "test", "gpu_metrics_input.json")
    assert len(REAL_KINETO) == 29, REAL_KINETO
    assert len(FAULTS) == 6, FAULTS


@pytest.mark.parametrize("rel", REAL_KINETO)
def test_native_equals_msgspec_on_every_real_trace(rel, monkeypatch):
    p = real(rel)
    got, want = both(monkeypatch, lambda: read_trace(p, jobs=1))
    assert_same(got, want, f"read_trace {rel}")
    if rel.endswith(".tar.gz"):
        with tarfile.open(p) as tf:
            members = [m for m in tf.getmembers() if m.isfile() and m.name.endswith((".json", ".json.gz"))]
            assert members
            for m in members:
                data = tf.extractfile(m).read()
                got, want = both(monkeypatch, lambda: K.read_bytes(data, path=m.name))
                assert_same(got, want, f"read_bytes {rel}:{m.name}")
        return
    data = p.read_bytes()
    got, want = both(monkeypatch, lambda: K.read_bytes(data, path=str(p)))
    assert_same(got, want, f"read_bytes {rel}")
    # and the streaming path cut into many pieces (each a separate scan)
    size = len(gzip.decompress(data)) if data[:2] == b"\x1f\x8b" else len(data)
    block = max(4 << 10, size // 64)
    got, want = both(monkeypatch, lambda: K.read_fileobj(p.open("rb"), path=str(p), block_bytes=block))
    assert_same(got, want, f"read_fileobj {rel} block {block}")


@pytest.mark.parametrize("name", FAULTS)
def test_native_equals_msgspec_on_every_fault_fixture(name, monkeypatch):
    p = FIXTURES / "faults" / name
    got, want = both(monkeypatch, lambda: read_trace(p, jobs=1))
    assert_same(got, want, f"read_trace {name}")
    got, want = both(monkeypatch, lambda: K.read_bytes(p.read_bytes(), path=str(p)))
    assert_same(got, want, f"read_bytes {name}")


def test_the_native_path_really_ran_on_the_real_traces(monkeypatch):
    # the equality above only means something if the scanner handled the pieces: on a real
    # trace every piece but the last one's first try (it runs past the array's "]") is native
    p = real("TraceLens/tests/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz")
    scans, wrapped = count_paths(monkeypatch)
    monkeypatch.setenv(N.ENV_DECODER, "native")
    K.read_fileobj(p.open("rb"), path=str(p), block_bytes=64 << 10)
    assert scans.count(True) > 20 and len(wrapped) == 1
