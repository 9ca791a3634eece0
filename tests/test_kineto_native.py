"""The native Kineto scanner (``parsers/_kineto_scan.c`` via ``kineto_native``) on hand-made input.

Each case is checked twice: the scanner's own answer (the columns it returns, or None =
"not handled", against ``json.loads`` / hand arithmetic as the oracle), and the whole read
(``kineto.read_bytes``) with the native path against the msgspec path (``TRACEROOF_DECODER=
python``), which must be equal on every column whatever the scanner answered.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import logging
from decimal import Decimal

import pytest
from conftest import kineto, require_native

from traceroof.parsers import kineto as K
from traceroof.parsers import kineto_native as N
from traceroof.parsers.kineto_times import raw_us_to_ns

require_native(module_level=True)  # CI builds it and sets TRACEROOF_REQUIRE_NATIVE=1


def cols(text: str | bytes):
    return N.scan(text.encode() if isinstance(text, str) else text)


def strings(c, field: str) -> list:
    d = c.scanner.dictionary()
    return [d[int(k)] for k in getattr(c, field)]


def read(doc: bytes, mode: str, monkeypatch, block: int | None = None):
    monkeypatch.setenv(N.ENV_DECODER, mode)
    if block is not None:
        return K.read_fileobj(io.BytesIO(doc), path="t.json", block_bytes=block)
    return K.read_bytes(doc, path="t.json")


def assert_paths_equal(doc: bytes, monkeypatch, block: int | None = None) -> None:
    """The native read of ``doc`` (in memory, or streamed in ``block``-byte pieces) equals
    the msgspec read on every table, column and meta (or fails with the same error)."""
    try:
        want = read(doc, "python", monkeypatch)
    except Exception as exc:  # noqa: BLE001 - then the native path must fail the same way
        with pytest.raises(type(exc)) as got_exc:
            read(doc, "native", monkeypatch, block)
        assert str(got_exc.value) == str(exc)
        return
    got = read(doc, "native", monkeypatch, block)
    for t in ("ops", "host"):
        a, b = getattr(got, t), getattr(want, t)
        assert a.schema == b.schema, t
        assert a.equals(b), t
    assert dataclasses.asdict(got.meta) == dataclasses.asdict(want.meta)


def kernel(i: int, **kw) -> dict:
    e = {"ph": "X", "cat": "kernel", "name": f"k{i}", "pid": 0, "tid": 7, "ts": 10 * i + 0.5, "dur": 2,
         "args": {"correlation": i, "stream": 7, "device": 0}}
    e.update(kw)
    return e


def launch(i: int) -> dict:
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
            "ts": 10 * i, "dur": 1, "args": {"correlation": i, "External id": 100 + i}}


def cpu_op(i: int, dims: object) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10 * i - 1, "dur": 3,
            "args": {"External id": 100 + i, "Input Dims": dims, "Input type": ["float", "float"]}}


# --------------------------------------------------------------------------- strings
def test_escapes_and_unicode_decode_as_json_does(monkeypatch):
    names = ['a"b\\c/d', "tab\there\nnl", "\u00e9t\u00e9 \u4e2d", "emoji \U0001f600", "nul\u0000x", "plain"]
    raw = json.dumps([{"ph": "X", "name": n, "ts": 1} for n in names])  # escapes every non-ASCII
    c = cols(raw)
    assert c is not None
    assert strings(c, "name") == names  # oracle: the names json.dumps encoded
    raw_utf8 = json.dumps([{"ph": "X", "name": n, "ts": 1} for n in names], ensure_ascii=False)
    assert strings(cols(raw_utf8), "name") == names
    doc = kineto([kernel(i, name=n) for i, n in enumerate(names)] + [launch(i) for i in range(len(names))])
    assert_paths_equal(doc, monkeypatch)
    assert read(doc, "native", monkeypatch).ops["name"].to_list() == names


@pytest.mark.parametrize("bad", [
    b'[{"ph": "X", "name": "a\xffb", "ts": 1}]',            # invalid byte
    b'[{"ph": "X", "name": "a\xc0\xafb", "ts": 1}]',        # overlong '/'
    b'[{"ph": "X", "name": "a\xed\xa0\x80b", "ts": 1}]',    # a UTF-8-encoded surrogate
    b'[{"ph": "X", "name": "a\xe2\x82", "ts": 1}]',         # cut sequence before the quote
    b'[{"ph": "X", "zz": "a\xff", "ts": 1}]',               # in a key no one reads
    b'[{"ph": "X", "name": "\\ud800", "ts": 1}]',            # lone high surrogate
    b'[{"ph": "X", "name": "\\udc00x", "ts": 1}]',           # lone low surrogate
    b'[{"ph": "X", "name": "\\x41", "ts": 1}]',              # not a JSON escape
    b'[{"ph": "X", "name": "a\tb", "ts": 1}]',              # a raw control character
    b'[{"p\\u0068": "X", "ts": 1}]',                          # an escaped key
])
def test_invalid_or_unhandled_strings_are_not_handled(bad, monkeypatch):
    assert cols(bad) is None
    doc = b'{"traceEvents": ' + bad + b"}"
    assert_paths_equal(doc, monkeypatch)  # msgspec (and its recovery) decides, as before


# --------------------------------------------------------------------------- numbers
@pytest.mark.parametrize("ts, ns", [
    ("1708722576381804.130", 1708722576381804130),  # BC-10: 19 digits of ns, not through float64
    ("1.1", 1100), ("1.12", 1120), ("1.123", 1123),
    ("1.1234", 1123), ("1.1235", 1124),               # the 4th decimal rounds half up
    ("1.12349", 1123), ("1.123456789", 1123),         # only the 4th decides
    ("0.0005", 1), ("-0.0005", -1), ("-2.5", -2500), ("-0", 0), ("7", 7000),
    ("1.5e3", 1500000), ("1.5E+3", 1500000), ("25e-4", 2),   # 2.5 ns: half-even → 2
    ("35e-4", 4), ("-2.5e-3", -2), ("1.0005e0", 1000),        # Decimal's half-even
    ("1e-30", 0), ("0e5", 0),
])
def test_ts_conversion_is_exact(ts, ns, monkeypatch):
    c = cols(f'[{{"ph": "X", "ts": {ts}, "dur": {ts}}}]')
    assert c is not None and int(c.ts_ns[0]) == ns and int(c.dur_ns[0]) == ns
    assert c.ts_state[0] == 2
    assert raw_us_to_ns([ts.encode()])[0] == ns  # the pure path's function agrees
    if "e" not in ts.lower():  # hand oracle: trunc to 3 decimals, +1 when the 4th is >= 5
        d = Decimal(ts)
        q = int(abs(d) * 1000) + (1 if (abs(d) * 10000) % 10 >= 5 else 0)
        assert ns == (-q if d < 0 else q)
    doc = kineto([kernel(0, ts="__TS__"), launch(0)]).replace(b'"__TS__"', ts.encode())
    assert_paths_equal(doc, monkeypatch)


@pytest.mark.parametrize("event", [
    '{"ph": "X", "ts": "12.5"}',                  # a quoted ts: not handled (msgspec decodes it)
    '{"ph": "X", "ts": true}',
    '{"ph": "X", "ts": 1e400}',                   # exponent beyond ±300
    '{"ph": "X", "ts": 12345678901234567.5}',     # beyond int64 ns
    '{"ph": "X", "ts": 1.0000000000000000001e3}', # 20 significant digits with an exponent
    '{"ph": "X", "ts": 1, "pid": 1.5}',           # a float where an id is expected
    '{"ph": "X", "ts": 1, "pid": 1234567890123456789}',  # 19 digits
    '{"ph": "X", "ts": 1, "pid": true}',
    '{"ph": "X", "ts": 1, "args": {"correlation": 2.0}}',
    '{"ph": "X", "ts": 1, "args": {"correlation": [2]}}',
    '{"ph": "X", "ts": 1, "id": 1.5}',
    '{"ph": 1, "ts": 1}', '{"ph": "X", "name": {"a": 1}, "ts": 1}',
    '{"ph": "X", "ts": 01}', '{"ph": "X", "ts": NaN}', '{"ph": "X", "ts": 1.}', '{"ph": "X", "ts": -}',
])
def test_unexpected_types_and_numbers_are_not_handled(event, monkeypatch):
    assert cols(f"[{event}]") is None
    assert_paths_equal(b'{"traceEvents": [' + event.encode() + b"]}", monkeypatch)


def test_negative_and_zero_ids_are_their_decimal_text():
    c = cols('[{"ph": "X", "ts": 1, "pid": -3, "tid": -0}, {"ph": "X", "ts": 1, "pid": "stream 7", "tid": 0}]')
    assert strings(c, "pid") == ["-3", "stream 7"]  # str(-3); a string as it is
    assert strings(c, "tid") == ["0", "0"]          # str(int("-0")) == "0"


# --------------------------------------------------------------------------- structure
def test_missing_keys_read_as_absent():
    c = cols("[{}, {\"ph\": \"X\"}]")
    assert c.n == 2
    assert list(c.ph) == [0, 1] and list(c.name) == [0, 0]
    assert list(c.ts_state) == [0, 0] and list(c.dur_state) == [0, 0]
    kinds, _ = c.slots[N.SLOT["correlation::cpu_gpu"]]
    assert list(kinds) == [0, 0]


def test_duplicated_keys_last_wins_as_json_loads(monkeypatch):
    ev = '{"ph": "B", "ph": "X", "ts": 1, "ts": 2.5, "name": "a", "name": "b", "args": {"correlation": 1, "correlation": 9}}'
    c = cols(f"[{ev}]")
    oracle = json.loads(ev)  # Python's json keeps the last duplicate, as msgspec does
    assert strings(c, "ph") == [oracle["ph"]] and strings(c, "name") == [oracle["name"]]
    assert int(c.ts_ns[0]) == 2500
    kinds, vals = c.slots[N.SLOT["correlation::cpu_gpu"]]
    assert (int(kinds[0]), int(vals[0])) == (2, oracle["args"]["correlation"])
    doc = b'{"traceEvents": [' + ev.replace('"ph": "B", ', '"cat": "kernel", ').encode() + b"]}"
    assert_paths_equal(doc, monkeypatch)


def test_spellings_first_present_wins(monkeypatch):
    # NUMBER: the first spelling that is not null; JSON_TEXT: the first present, even null
    ev = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1, "dur": 1,
          "args": {"External id": None, "external id": 5, "Input Dims": None, "Input dims": [[1]]}}
    c = cols(json.dumps([ev]))
    kinds, vals = c.slots[N.SLOT["index::external_id"]]
    assert (int(kinds[0]), int(vals[0])) == (2, 5)
    assert c.slots[N.SLOT["cpu_op::input_dims"]][1][0] == 0  # null → none
    assert_paths_equal(kineto([ev]), monkeypatch)


@pytest.mark.parametrize("args", ["[]", '"x"', "5", "true"])
def test_args_not_an_object_is_not_handled(args, monkeypatch):
    ev = '{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1, "args": ' + args + "}"
    assert cols(f"[{ev}]") is None
    assert_paths_equal(b'{"traceEvents": [' + ev.encode() + b"]}", monkeypatch)


def test_args_null_reads_as_no_args():
    c = cols('[{"ph": "X", "ts": 1, "args": null}]')
    assert c.n == 1 and int(c.slots[N.SLOT["correlation::cpu_gpu"]][0][0]) == 0


def test_nested_input_dims_keep_their_text_without_pretty_printing(monkeypatch):
    dims = [[1, 2], [[3, [4]]], [], "s"]
    flat = json.dumps(dims)              # '[[1, 2], [[3, [4]]], [], "s"]': spaces after commas kept
    pretty = json.dumps(dims, indent=2)  # newlines and their indentation dropped
    c = cols(f'[{{"ph": "X", "ts": 1, "args": {{"Input Dims": {flat}}}}}, '
             f'{{"ph": "X", "ts": 1, "args": {{"Input Dims": {pretty}}}}}]')
    d = c.scanner.dictionary()
    texts = [d[int(k)] for k in c.slots[N.SLOT["cpu_op::input_dims"]][1]]
    assert texts == [flat, pretty.replace("\n", "").replace("  ", "")]
    assert json.loads(texts[1]) == dims
    doc = json.dumps({"traceEvents": [kernel(0), launch(0), cpu_op(0, dims)]}, indent=2).encode()
    assert_paths_equal(doc, monkeypatch)


def test_nesting_is_bounded():
    deep = "[" * 100 + "]" * 100
    assert cols(f'[{{"ph": "X", "ts": 1, "args": {{"zz": {deep}}}}}]') is None
    ok = "[" * 20 + "]" * 20
    assert cols(f'[{{"ph": "X", "ts": 1, "args": {{"zz": {ok}}}}}]').n == 1


@pytest.mark.parametrize("bad", [
    "[{}] x", "[{},]", "[{}", "[1]", '["e"]', "[{} {}]", '[{"a" 1}]', '[{"a": 1,}]', "{}", "",
    '[{"a": tru}]', '[{"a": nul}]',
])
def test_invalid_json_is_not_handled(bad):
    assert cols(bad) is None


def count_paths(monkeypatch) -> tuple[list, list]:
    """Record each native scan's outcome (True: handled; from any thread) and each piece
    given to msgspec by the stream decoder."""
    from traceroof.parsers import kineto_stream as KS

    scans: list = []
    wrapped: list = []
    orig_scan, orig_piece = N.Scanner.scan_raw, KS.decode_piece
    monkeypatch.setattr(N.Scanner, "scan_raw", lambda self, d, bare=False: scans.append(
        (r := orig_scan(self, d, bare)) is not None) or r)
    monkeypatch.setattr(KS, "decode_piece", lambda sc, piece: (sc is None and wrapped.append(bytes(piece)))
                        or orig_piece(sc, piece))
    return scans, wrapped


def test_a_piece_not_handled_is_decoded_by_msgspec_and_the_rest_natively(monkeypatch):
    # streamed in 16 KiB pieces: one piece holds a float correlation the scanner does not
    # handle; the tables still equal the msgspec path's, and the other pieces were native
    evs = [kernel(i, name="k" * 200 + str(i % 7)) for i in range(600)] + [launch(i) for i in range(600)]
    evs[300]["args"]["correlation"] = 300.0
    scans, wrapped = count_paths(monkeypatch)
    assert_paths_equal(kineto(evs), monkeypatch, block=16 << 10)
    # msgspec decoded two pieces: the float one, and the last one's first try (it runs
    # past the array's "]"); every other piece was native
    assert len(wrapped) == 2 and b'"correlation": 300.0' in wrapped[0] and wrapped[1].rstrip().endswith(b"}]")
    assert scans.count(True) > 10


def test_the_decoder_in_use_is_logged_and_can_be_switched_off(monkeypatch, caplog):
    doc = kineto([kernel(0), launch(0)])
    with caplog.at_level(logging.DEBUG, logger="traceroof.parsers.kineto_native"):
        read(doc, "python", monkeypatch)
        read(doc, "native", monkeypatch)
    said = [r.getMessage() for r in caplog.records]
    assert "t.json: Kineto decoder: msgspec (TRACEROOF_DECODER=python)" in said
    assert "t.json: Kineto decoder: native scanner" in said


def test_a_piece_not_handled_leaves_the_dictionary_as_it_was():
    sc = N.Scanner()
    assert sc.scan(b'[{"ph": "X", "name": "kept", "ts": 1}]') is not None
    before = list(sc.dictionary())
    assert sc.scan(b'[{"ph": "X", "name": "new one", "ts": 1}, {"ph": "X", "ts": true}]') is None
    assert sc.dictionary() == before  # "new one" was rolled back
    c = sc.scan(b'[{"ph": "X", "name": "new two", "ts": 1}]')
    assert strings(c, "name") == ["new two"] and len(sc.dictionary()) == len(before) + 1


def test_mutated_real_events_never_crash_and_match_msgspec_when_handled():
    # a 2,000-input smoke of the property the fuzz harness checks at scale: whatever bytes
    # come in, the scanner returns None or exactly what msgspec decodes (strings, ids, times)
    import random

    import msgspec
    from conftest import real

    from traceroof.parsers.kineto_events import EVENTS_DECODER

    doc = msgspec.json.decode(gzip.decompress(real(
        "TraceLens", "tests", "traces", "h100", "gaunernst_bert-small-uncased__1016001.json.gz").read_bytes()))
    evs = doc["traceEvents"]
    base = [msgspec.json.encode(evs[j : j + 10]) for j in range(0, len(evs), 10)]
    toks = [b'"', b"\\", b"{", b"}", b"[", b"]", b",", b":", b"1e999", b"-", b".", b"\xff", b"\xed\xa0\x80",
            b"\\u", b"\\ud800", b"null", b"true", b"9" * 25, b" ", b"\n", b"1.00005", b"2e-3"]
    rnd = random.Random(19)
    handled = 0
    for _ in range(2000):
        b = bytearray(rnd.choice(base))
        for _ in range(rnd.randint(1, 3)):
            p = rnd.randrange(len(b) + 1)
            k = rnd.random()
            if k < 0.3 and p < len(b):
                b[p] = rnd.randrange(256)
            elif k < 0.5:
                del b[p : p + rnd.randint(1, 30)]
            elif k < 0.85:
                b[p:p] = rnd.choice(toks)
            else:
                del b[p:]
        c = N.scan(bytes(b))
        if c is None:
            continue
        handled += 1
        ev = EVENTS_DECODER.decode(bytes(b))  # raises (test fails) if the scanner was laxer
        d = c.scanner.dictionary()
        assert [d[k] for k in c.name] == [e.name for e in ev]
        assert [d[k] for k in c.pid] == [None if e.pid is None else str(e.pid) for e in ev]
        want = raw_us_to_ns([e.ts for e in ev]).to_list()
        assert [None if s != 2 else int(v) for s, v in zip(c.ts_state, c.ts_ns)] == want
    assert handled > 100  # the mutations leave many inputs valid: the comparison ran


@pytest.mark.parametrize("size", [2**40, -(2**35), 2**31])
def test_a_group_size_beyond_int32_is_unknown_on_both_paths(size, monkeypatch):
    # the host frame's coll_group_size is Int32: a value beyond it crashed both paths (a
    # TypeError / InvalidOperationError); it reads as unknown (null) on both now
    ev = {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1, "ts": 1, "dur": 1,
          "args": {"Group size": size, "External id": 1}}
    ok = {**ev, "ts": 3, "args": {"Group size": 8, "External id": 2}}
    doc = kineto([ev, ok])
    assert_paths_equal(doc, monkeypatch)
    host = read(doc, "native", monkeypatch).host.sort("start_ns")
    assert host["coll_group_size"].to_list() == [None, 8]
