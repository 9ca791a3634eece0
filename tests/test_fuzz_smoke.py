"""A 10^3-input smoke of the fuzz harness (fuzz/, docs/fuzzing.md): the structured mutator
across every reader, in process, deterministic (seed 0), asserting no crash: no undocumented
exception, no exit-70 error, no multi-line or file-less message, no hang over 10 s, no memory
over 2 × input + 200 MB. The harness's own crash detection is tested first, on targets that
misbehave on purpose, so that "no crash" means something.
"""

from __future__ import annotations

import random
import sys
import time

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO))

from fuzz import harness, json_mutate, proto_mutate  # noqa: E402
from fuzz.run import plan  # noqa: E402
from fuzz.targets import Target, check_error, targets  # noqa: E402
from traceroof.errors import SchemaError, TraceFormatError  # noqa: E402

SMOKE_INPUTS = 1000


def _fake(run, allowed=()) -> Target:
    return Target("fake", 1, lambda rng: bytes([rng.randrange(256)]), run, allowed, "a test target")


def test_harness_reports_an_undocumented_exception_with_its_reproducer(tmp_path):
    def run(data: bytes) -> None:
        if data[0] % 2:
            raise KeyError("boom")

    res = harness.fuzz(_fake(run), 0, 0, 40, tmp_path)
    odd = [i for i in range(40) if harness.make_input(_fake(run), 0, i)[0] % 2]
    assert [c.index for c in res.crashes] == odd  # exactly the inputs that raise, counted from the bytes
    assert res.crashes[0].signature.startswith("KeyError@")
    saved = sorted(tmp_path.glob("fake-*.bin"))
    assert len(saved) == 3  # at most 3 reproducers per signature
    assert saved[0].read_bytes()[0] % 2 == 1


def test_harness_allows_only_documented_errors_with_one_line_naming_the_file():
    assert harness.run_one(_fake(lambda d: None), b"x") is None
    ok = TraceFormatError("/tmp/x/fuzz.json", "byte 3", "a JSON object")
    check_error(ok, "/tmp/x/fuzz.json")  # the rule passes a good message
    with pytest.raises(Exception, match="not one line"):
        check_error(TraceFormatError("/tmp/x/fuzz.json", "byte 3", "a\nb"), "/tmp/x/fuzz.json")
    with pytest.raises(Exception, match="exit code 70"):
        check_error(SchemaError("op table: negative dur_ns"), "fuzz.json")
    with pytest.raises(Exception, match="does not name the file"):
        check_error(TraceFormatError("other.json", "byte 0", "x"), "/tmp/x/fuzz.json")


def test_harness_stops_a_hang(monkeypatch):
    monkeypatch.setattr(harness, "HANG_S", 0.2)
    t0 = time.monotonic()
    got = harness.run_one(_fake(lambda d: time.sleep(5)), b"x")
    assert got is not None and got[0] == "hang"
    assert time.monotonic() - t0 < 2


def test_harness_flags_memory_over_twice_the_input_plus_200_mb():
    def hog(data: bytes) -> None:
        block = bytearray(300 << 20)  # 300 MB, touched: above 2 x 1 byte + 200 MB
        block[:: 4096] = b"\x01" * len(block[:: 4096])

    got = harness.run_one(_fake(hog), b"x")
    assert got is not None and got[0] == "memory", got


def test_inputs_are_made_again_from_their_index():
    t = targets()["kineto"]
    assert harness.make_input(t, 7, 123) == harness.make_input(t, 7, 123)
    assert harness.make_input(t, 7, 123) != harness.make_input(t, 7, 124)


def test_emit_writes_what_json_dumps_cannot():
    doc = {"a": [1, json_mutate.Raw(b"NaN")], "p": json_mutate.Pairs([("k", 1), ("k", 2)]), "f": float("inf")}
    assert json_mutate.emit(doc) == b'{"a":[1,NaN],"p":{"k":1,"k":2},"f":Infinity}'


def test_proto_mutation_keeps_the_message_walkable():
    # the field-aware edit rewrites the enclosing lengths: the result still parses as fields
    from traceroof.parsers.protowire import fields

    seed = proto_mutate.build([(1, 2, proto_mutate.build([(1, 0, 5), (2, 2, b"name")])), (4, 2, b"host")])
    ok = 0
    for i in range(200):
        out = proto_mutate.mutate(random.Random(i), seed)
        try:
            list(fields(out))
            ok += 1
        except ValueError:
            pass
    assert ok >= 150  # edits of wire types may break it on purpose, most do not


def test_smoke_1000_inputs_across_every_reader_no_crash(tmp_path):
    ts = targets()
    chunks = plan(list(ts), {n: t.weight for n, t in ts.items()}, SMOKE_INPUTS, 1)
    assert {n for n, _, _ in chunks} == set(ts)  # every target gets inputs
    done, crashes = 0, []
    for name, start, count in chunks:
        res = harness.fuzz(ts[name], 0, start, count, tmp_path)
        done += res.inputs
        crashes += res.crashes
    assert done == sum(c for _, _, c in chunks) >= SMOKE_INPUTS - len(ts)
    assert not crashes, "\n\n".join(f"{c.target}#{c.index} {c.kind} {c.signature}\n{c.text[-1500:]}"
                                    for c in crashes[:5])


@pytest.mark.parametrize("runs", [1_000_000, 60_881, 1_000])
def test_plan_runs_exactly_the_inputs_asked_for(runs):
    # every target's chunks are contiguous from 0 and the totals add up to --runs (rounding
    # each share alone made 999,998 of 10^6); each share is within 1 of runs × weight / total
    ts = targets()
    names = list(ts)
    weights = {n: ts[n].weight for n in names}
    chunks = plan(names, weights, runs, jobs=2)
    assert sum(c[2] for c in chunks) == runs
    total_w = sum(weights.values())
    for n in names:
        mine = sorted((s, c) for t, s, c in chunks if t == n)
        assert mine[0][0] == 0 and all(a[0] + a[1] == b[0] for a, b in zip(mine, mine[1:]))
        assert abs(sum(c for _, c in mine) - runs * weights[n] / total_w) < 1


def test_half_the_reader_inputs_force_the_native_scanner(monkeypatch):
    # small Kineto inputs go to msgspec by size (parsers.kineto._use_native): the targets
    # force TRACEROOF_DECODER=native for the inputs of even CRC-32, and leave it unset after
    import os
    import zlib

    from fuzz.targets import _decoder_for
    monkeypatch.delenv("TRACEROOF_DECODER", raising=False)
    seen = {}
    for i in range(64):
        data = b"input %d" % i
        with _decoder_for(data):
            seen[data] = os.environ.get("TRACEROOF_DECODER")
        assert "TRACEROOF_DECODER" not in os.environ
    assert all((v == "native") == (zlib.crc32(d) % 2 == 0) for d, v in seen.items())
    assert 16 < sum(v == "native" for v in seen.values()) < 48


def test_the_native_xplane_target_catches_a_wrong_column(monkeypatch):
    """The differential target (C event decoder against protobuf) passes on a seed and fails
    when one column of the C decoder's is off by one: its "no crash" means something."""
    from conftest import require_xplane_native

    require_xplane_native()
    from fuzz import seeds
    from traceroof.parsers import xplane_proto_events as xpe

    t = targets()["xplane_native"]
    data = seeds.xplane_seeds()[0]
    t.run(data)
    real = xpe._native_columns

    def off_by_one(d):
        cols = real(d)
        cols.duration_ps = cols.duration_ps + 1
        return cols

    monkeypatch.setattr(xpe, "_native_columns", off_by_one)
    with pytest.raises(AssertionError):
        t.run(data)
