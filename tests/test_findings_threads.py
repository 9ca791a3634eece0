"""The detectors run in threads (traceroof/findings/__init__.py: ``run_detectors(threads=)``,
``Shared.once``): the same findings and warnings as one after the other, each shared result
computed once however many threads ask for it, the heavy detectors started first, and a
detector's error raised as it would be without threads.

Real traces are read in place from ../shared/fixtures/real (a missing fixture fails); the
4-rank set with a late rank is tests/test_ranks.py's.
"""

from __future__ import annotations

import threading
import time

import pytest
from conftest import real
from test_ranks import LATE_NS, _build, _read
from tracegen import write_ranks

import traceroof.findings as F
from traceroof import analyze, read_trace
from traceroof.findings import FindingContext, Shared, run_detectors

BERT = "TraceLens/tests/traces/h100/gaunernst_bert-small-uncased__1016001.json.gz"
NCCL_DATA = "HolisticTraceAnalysis/tests/data/nccl_parser_config/nccl_data.json.gz"
SGLANG = "TraceLens/tests/traces/inference/sglang_decode/sglang_Qwen3-8B_decode.json.gz"
B200 = "TraceLens/tests/traces/b200/eager_trace.json.gz"


def _caught(trace, chip) -> FindingContext:
    """The FindingContext ``analyze`` hands to ``run_detectors`` (caught, not run)."""
    seen: list[FindingContext] = []
    real_run = F.run_detectors

    def spy(ctx, names=None):
        seen.append(ctx)
        return real_run(ctx, names, threads=1)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(F, "run_detectors", spy)
        analyze(trace, chip)
    assert len(seen) == 1
    return seen[0]


def _fresh(ctx: FindingContext) -> FindingContext:
    """A new context on the same inputs, nothing computed yet."""
    return FindingContext(ops=ctx.ops, host=ctx.host, steps=ctx.steps, chip=ctx.chip, meta=ctx.meta,
                          ranks=ctx.ranks, rank_comparison=ctx.rank_comparison, captures=ctx.captures)


def _run(ctx: FindingContext, threads: int) -> tuple[list[dict], list[str]]:
    c = _fresh(ctx)
    return [f.to_dict() for f in run_detectors(c, threads=threads)], list(c.warnings)


@pytest.fixture(scope="module")
def late_ranks(tmp_path_factory):
    """4 ranks, rank 3 late at every all-reduce: the straggler, exposed communication and the
    idle detectors all have something to say."""
    bs, _ = _build(late={3: LATE_NS})
    d = tmp_path_factory.mktemp("threads_ranks")
    write_ranks(bs, d)
    return _read(d)


@pytest.mark.parametrize("rel", [BERT, NCCL_DATA, SGLANG, B200])
def test_threads_find_what_one_thread_finds_on_real_traces(rel):
    ctx = _caught(read_trace(real(rel)), None)
    one = _run(ctx, 1)
    assert one[0], f"{rel}: no finding: nothing to compare"
    for threads in (2, 4):
        assert _run(ctx, threads) == one, f"{rel}: {threads} threads"


def test_threads_find_what_one_thread_finds_across_ranks(late_ranks):
    ctx = _caught(late_ranks, "h100")
    one = _run(ctx, 1)
    kinds = {f["kind"] for f in one[0]}
    assert "straggler" in kinds, kinds  # the shared rank view and claimed waits are in play
    assert _run(ctx, 2) == one


def test_analyze_default_is_threaded_and_equal(late_ranks, monkeypatch):
    """``analyze`` runs the detectors in DETECTOR_THREADS threads; one thread gives the same report."""
    threaded = analyze(late_ranks, "h100")
    monkeypatch.setattr(F, "DETECTOR_THREADS", 1)
    serial = analyze(late_ranks, "h100")
    assert [f.to_dict() for f in threaded.findings] == [f.to_dict() for f in serial.findings]
    assert threaded.warnings == serial.warnings


def test_shared_once_computes_once_under_contention():
    shared = Shared()
    calls: list[int] = []
    gate = threading.Barrier(8)
    got: list[object] = []

    def compute():
        calls.append(1)
        time.sleep(0.05)  # long enough for every other thread to arrive while it runs
        return {0: (1, 2)}

    def ask():
        gate.wait()
        got.append(shared.once("windows", compute))

    ts = [threading.Thread(target=ask) for _ in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(calls) == 1
    assert len(got) == 8 and all(g is got[0] for g in got)
    assert shared.windows is got[0]


def test_shared_once_nests_without_deadlock():
    """A field computed from another (the timeline from the windows) in one thread while a
    second thread asks for the inner one: both finish, each field computed once."""
    shared = Shared()
    calls = {"windows": 0, "timeline": 0}

    def windows():
        calls["windows"] += 1
        time.sleep(0.02)
        return {0: (0, 1)}

    def timeline():
        calls["timeline"] += 1
        shared.once("windows", windows)
        return "tl"

    ts = [threading.Thread(target=lambda: shared.once("timeline", timeline)),
          threading.Thread(target=lambda: shared.once("windows", windows))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(5)
    assert not any(t.is_alive() for t in ts)
    assert calls == {"windows": 1, "timeline": 1}


def _fake_detectors(monkeypatch, delays: dict[str, float], heavy: set[str], started: list[str],
                    fail: set[str] = frozenset(), waits: dict[str, threading.Event] | None = None,
                    sets: dict[str, threading.Event] | None = None):
    """Replace the registry with detectors that record their start, sleep, write one warning
    and return one finding each (or raise). A name in ``waits`` blocks until its event is set
    (and fails the test after 5 s: it ran alone); a name in ``sets`` sets its event."""
    lock = threading.Lock()
    waits, sets = waits or {}, sets or {}

    def make(name):
        def detect(ctx):
            with lock:
                started.append(name)
            time.sleep(delays[name])
            if name in sets:
                sets[name].set()
            if name in waits:
                assert waits[name].wait(5), f"{name} waited 5 s for a detector that never ran beside it"
            if name in fail:
                raise RuntimeError(f"{name} failed")
            ctx.warnings.append(f"{name}: warned")
            return [F.Finding(kind=name, title=name, severity="low", recoverable_ns=float(len(name)),
                              explanation="")]
        return detect

    monkeypatch.setattr(F, "DETECTORS", {n: make(n) for n in delays})
    monkeypatch.setattr(F, "HEAVY", set(heavy))
    monkeypatch.setattr(F, "_load_builtin", lambda: None)


def _ctx(late_ranks) -> FindingContext:
    return _fresh(_caught(late_ranks, "h100"))


def test_heavy_detectors_start_first_and_warnings_keep_the_order(late_ranks, monkeypatch):
    started: list[str] = []
    # "zz" is last in the registry's order: without HEAVY it would start last. It finishes only
    # once "c", the last of the others, has run: one after the other, it would never finish.
    delays = {"a": 0.0, "b": 0.0, "c": 0.0, "zz": 0.0}
    others_ran = threading.Event()
    ctx = _ctx(late_ranks)
    _fake_detectors(monkeypatch, delays, {"zz"}, started, waits={"zz": others_ran}, sets={"c": others_ran})
    found = run_detectors(ctx, threads=2)
    assert started.index("zz") < started.index("c"), started
    # warnings in the registry's order, not in the order the threads finished ("zz" last)
    assert ctx.warnings == [f"{n}: warned" for n in delays]
    assert sorted(f.kind for f in found) == sorted(delays)


def test_a_detectors_error_is_raised_as_without_threads(late_ranks, monkeypatch):
    started: list[str] = []
    delays = {"a": 0.05, "b": 0.0, "c": 0.0}
    ctxs = [_ctx(late_ranks) for _ in range(2)]
    _fake_detectors(monkeypatch, delays, set(), started, fail={"a", "c"})
    for threads, ctx in zip((1, 2), ctxs):
        # "c" fails first in time (a sleeps), "a" first in the registry's order: "a" is raised
        with pytest.raises(RuntimeError, match="^a failed$"):
            run_detectors(ctx, threads=threads)
