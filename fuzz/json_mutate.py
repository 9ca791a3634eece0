"""A structured mutator for Kineto JSON (and any JSON document: saved reports, ``meta.json``).

Deterministic: every choice is drawn from the ``random.Random`` passed in, so a seed and an
input index give the same bytes on every machine. Pure Python (no atheris).

A document is mutated as a tree first, then written by :func:`emit` (which can write what
``json.dumps`` cannot: duplicate keys, ``NaN``/``Infinity`` tokens, invalid UTF-8 inside a
string, nesting deeper than Python's recursion limit), then, sometimes, as bytes (cut
anywhere, bytes flipped, ranges deleted or repeated).

Tree mutations (:data:`TREE_MUTATIONS`): keys dropped, renamed, retyped, duplicated; numbers
huge, negative, NaN, ±Infinity, floats where ints are expected, ints past int64; strings with
invalid UTF-8, lone surrogates, raw control characters, stray quotes and backslashes; nesting
deep; events duplicated, shuffled, cut out; the ``traceEvents`` value itself retyped; header
keys moved after the events.
"""

from __future__ import annotations

import copy
import json
import marshal
import math
import random
import re
from typing import Any


class Raw:
    """Bytes written verbatim by :func:`emit` (a token ``json.dumps`` cannot write)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


class Pairs:
    """An object written from ``(key, value)`` pairs: keys may repeat."""

    __slots__ = ("items",)

    def __init__(self, items: Any) -> None:
        self.items = list(items)


#: the keys Kineto events and headers carry that traceroof reads (renamed to, retyped)
KNOWN_KEYS = ("ph", "cat", "name", "pid", "tid", "ts", "dur", "args", "id", "bp", "s",
              "correlation", "External id", "Input Dims", "Input type", "Input Strides",
              "Concrete Inputs", "device", "stream", "context", "Collective name", "Group size",
              "In msg nelems", "Out msg nelems", "dtype", "Ev Idx", "Record function id",
              "deviceProperties", "distributedInfo", "rank", "world_size", "baseTimeNanoseconds",
              "schemaVersion", "displayTimeUnit", "traceEvents", "totalGlobalMem", "numSms",
              "computeMajor", "computeMinor", "flops", "bytes", "queued", "grid", "block")

#: values that break assumptions: huge, negative, NaN, past int64, wrong types
ODD_VALUES: tuple[Any, ...] = (
    0, -1, 1, -(2 ** 63), 2 ** 63 - 1, 2 ** 63, 2 ** 64, 2 ** 64 + 1, -(2 ** 64), 10 ** 30, -(10 ** 30),
    1e308, -1e308, 5e-324, 0.5, -0.5, 1.5, -0.0, 123456789012345.678, 1e16, 3.0,
    Raw(b"NaN"), Raw(b"Infinity"), Raw(b"-Infinity"), Raw(b"1e400"), Raw(b"-1e400"), Raw(b"1E+2"),
    Raw(b"00012"), Raw(b"-"), Raw(b"1.e5"), Raw(b".5"), Raw(b"0x10"),
    "", "0", "-1", "abc", "1e3", "NaN", "kernel", "cpu_op", "X", "[1, 2]", " ", "\x00",
    True, False, None, [], {}, [1, 2, 3], [[1, 2], [3]], {"a": 1}, [None], ["x", 1.5, None],
)

#: string values with bytes and characters a decoder may trip on
ODD_STRINGS: tuple[Raw, ...] = (
    Raw(b'"bad \xff\xfe utf8"'), Raw(b'"cut \xe2\x82"'), Raw(b'"\xc0\xaf overlong"'),
    Raw(b'"lone \\ud800 surrogate"'), Raw(b'"\\udc00"'), Raw(b'"raw\x01\x1f control\ttab\nnewline"'),
    Raw(b'"stray " quote"'), Raw(b'"stray \\ backslash"'), Raw(b'"bad \\x escape"'),
    Raw(b'"\\u12"'), Raw(b'"}, {\\"ph\\": \\"X\\"}, {"'), Raw(b'"}, {"ph": "X"}, {"'),
    Raw(b'"' + b"long" * 5000 + b'"'), Raw(b'"\xf4\x90\x80\x80 past U+10FFFF"'),
)

_INT_KEYS = ("pid", "tid", "ts", "dur", "correlation", "External id", "device", "stream", "id",
             "rank", "world_size", "baseTimeNanoseconds", "numSms", "totalGlobalMem")

_MARK = "\u0000raw%d\u0000"


def emit(obj: Any) -> bytes:
    """``obj`` as JSON bytes: dicts, lists, str, int, float (``nan`` and ``inf`` as the tokens
    ``NaN``/``Infinity``), bool, None, :class:`Pairs` (keys may repeat) and :class:`Raw`
    (verbatim). The standard encoder (C) writes the tree; each Raw or Pairs is written as a
    marker string and replaced by its bytes afterwards."""
    parts: list[bytes] = []

    def default(x: Any) -> str:
        if isinstance(x, Raw):
            parts.append(x.data)
        elif isinstance(x, Pairs):
            parts.append(b"{" + b",".join(json.dumps(str(k)).encode() + b":" + emit(v) for k, v in x.items) + b"}")
        else:
            raise TypeError(f"cannot write {type(x).__name__}")
        return _MARK % (len(parts) - 1)

    text = json.dumps(obj, default=default, separators=(",", ":")).encode()
    if not parts:
        return text
    pieces = re.split(rb'"\\u0000raw(\d+)\\u0000"', text)
    return b"".join(parts[int(p)] if i % 2 else p for i, p in enumerate(pieces))


# --------------------------------------------------------------------------- tree walking


_CONTAINERS: list[Any] = [None, []]  # (document, its containers): computed once per document


def _containers(doc: Any, limit: int = 3000) -> list[Any]:
    """The dicts and lists inside ``doc`` (breadth first, at most ``limit``; cached for the
    document being mutated: containers added by a mutation are not seen by the next)."""
    if _CONTAINERS[0] is doc:
        return _CONTAINERS[1]
    out, i = [doc] if isinstance(doc, (dict, list)) else [], 0
    while i < len(out) and len(out) < limit:
        x = out[i]
        i += 1
        out.extend(v for v in (x.values() if isinstance(x, dict) else x) if isinstance(v, (dict, list)))
    _CONTAINERS[:] = [doc, out[:limit]]
    return _CONTAINERS[1]


def _pick_dict(rng: random.Random, doc: Any) -> dict | None:
    ds = [c for c in _containers(doc) if isinstance(c, dict) and c]
    return rng.choice(ds) if ds else None


def _odd(rng: random.Random) -> Any:
    r = rng.random()
    if r < 0.15:
        return rng.choice(ODD_STRINGS)
    if r < 0.2:
        return _deep(rng)
    return copy.deepcopy(rng.choice(ODD_VALUES))


def _deep(rng: random.Random) -> Raw:
    n = rng.choice((50, 500, 5000, 100_000))
    o, c = rng.choice(((b"[", b"]"), (b'{"a":', b"}")))
    return Raw(o * n + b"1" + c * n) if rng.random() < 0.8 else Raw(o * n)  # sometimes unclosed


def m_drop_key(rng: random.Random, doc: Any) -> None:
    d = _pick_dict(rng, doc)
    if d:
        del d[rng.choice(list(d))]


def m_rename_key(rng: random.Random, doc: Any) -> None:
    d = _pick_dict(rng, doc)
    if not d:
        return
    k = rng.choice(list(d))
    new = rng.choice((k.upper(), k + " ", " " + k, k[:-1], rng.choice(KNOWN_KEYS), "", "\u00e9" + k))
    d[new] = d.pop(k)


def m_retype(rng: random.Random, doc: Any) -> None:
    d = _pick_dict(rng, doc)
    if d:
        d[rng.choice(list(d))] = _odd(rng)


def m_known_key(rng: random.Random, doc: Any) -> None:
    """A key traceroof reads, set to an odd value (or added where it was absent)."""
    d = _pick_dict(rng, doc)
    if d is not None:
        d[rng.choice(KNOWN_KEYS)] = _odd(rng)


def m_float_for_int(rng: random.Random, doc: Any) -> None:
    ds = [c for c in _containers(doc) if isinstance(c, dict) and any(k in c for k in _INT_KEYS)]
    if ds:
        d = rng.choice(ds)
        k = rng.choice([k for k in _INT_KEYS if k in d])
        v = d[k]
        d[k] = (v + rng.choice((0.5, 0.25, 1e-9, -0.999))) if isinstance(v, (int, float)) and not isinstance(v, bool) \
            else rng.choice((1.5, -2.5, 1e20))


def m_number(rng: random.Random, doc: Any) -> None:
    """A number somewhere made huge, negative, NaN or past int64."""
    ds = [c for c in _containers(doc) if isinstance(c, dict)
          and any(isinstance(v, (int, float)) and not isinstance(v, bool) for v in c.values())]
    if ds:
        d = rng.choice(ds)
        k = rng.choice([k for k, v in d.items() if isinstance(v, (int, float)) and not isinstance(v, bool)])
        v = d[k]
        big = int(abs(v)) if math.isfinite(v) else 7
        d[k] = rng.choice((-v, v * 10 ** rng.randint(3, 30), float("nan"), float("inf"), -float("inf"),
                           2 ** 64 + big, -(2 ** 63) - 1, v + 0.5, Raw(b"1e400"), 0))


def m_duplicate_key(rng: random.Random, doc: Any) -> None:
    """An object written with one of its keys twice (the second value odd or the same)."""
    holders = [c for c in _containers(doc) if any(isinstance(v, dict) and v for v in
                                                   (c.values() if isinstance(c, dict) else c))]
    if not holders:
        return
    h = rng.choice(holders)
    keys = [k for k, v in (h.items() if isinstance(h, dict) else enumerate(h)) if isinstance(v, dict) and v]
    k = rng.choice(keys)
    d = h[k]
    dup = rng.choice(list(d))
    pairs = Pairs(d.items())
    pairs.items.insert(rng.randint(0, len(pairs.items)), (dup, _odd(rng) if rng.random() < 0.6 else copy.deepcopy(d[dup])))
    h[k] = pairs


def m_bad_string(rng: random.Random, doc: Any) -> None:
    ds = [c for c in _containers(doc) if isinstance(c, dict) and any(isinstance(v, str) for v in c.values())]
    if ds:
        d = rng.choice(ds)
        d[rng.choice([k for k, v in d.items() if isinstance(v, str)])] = rng.choice(ODD_STRINGS)


def m_deep(rng: random.Random, doc: Any) -> None:
    d = _pick_dict(rng, doc)
    if d is not None:
        d[rng.choice(list(d) or ["args"])] = _deep(rng)


def _events(doc: Any) -> list | None:
    ev = doc.get("traceEvents") if isinstance(doc, dict) else None
    return ev if isinstance(ev, list) else None


def m_events(rng: random.Random, doc: Any) -> None:
    """The event list reordered, cut, repeated, or holding odd items."""
    ev = _events(doc)
    if ev is None or not ev:
        return
    r = rng.randrange(6)
    if r == 0:
        rng.shuffle(ev)
    elif r == 1:
        del ev[rng.randrange(len(ev)):]
    elif r == 2:
        i = rng.randrange(len(ev))
        ev[i:i] = [copy.deepcopy(ev[i]) for _ in range(rng.randint(1, 50))]
    elif r == 3:
        ev.insert(rng.randrange(len(ev) + 1), _odd(rng))
    elif r == 4:
        ev.insert(rng.randrange(len(ev) + 1), {})
    else:
        e = rng.choice(ev)
        if isinstance(e, dict):
            e["ph"] = rng.choice(("X", "B", "E", "i", "I", "C", "M", "s", "f", "t", "b", "e", "n", "P", "", "XX"))
            e["cat"] = rng.choice(("kernel", "gpu_memcpy", "gpu_memset", "cpu_op", "cuda_runtime", "cuda_driver",
                                   "ac2g", "user_annotation", "gpu_user_annotation", "Kernel", "Memcpy", "Runtime",
                                   "python_function", "Trace", "", None, 7))


def m_top(rng: random.Random, doc: Any) -> None:
    """The document's top level changed: traceEvents retyped, header moved after it."""
    if not isinstance(doc, dict):
        return
    r = rng.randrange(4)
    if r == 0 and "traceEvents" in doc:
        doc["traceEvents"] = _odd(rng)
    elif r == 1 and "traceEvents" in doc:
        ev = doc.pop("traceEvents")
        items = list(doc.items())
        doc.clear()
        cut = rng.randint(0, len(items))
        doc.update(items[:cut])
        doc["traceEvents"] = ev
        doc.update(items[cut:])
    elif r == 2:
        doc[rng.choice(("deviceProperties", "distributedInfo", "baseTimeNanoseconds", "schemaVersion",
                        "displayTimeUnit", "traceName"))] = _odd(rng)
    else:
        doc["traceEvents" if rng.random() < 0.3 else rng.choice(KNOWN_KEYS)] = copy.deepcopy(
            _events(doc) or [])


TREE_MUTATIONS = (m_drop_key, m_rename_key, m_retype, m_known_key, m_float_for_int, m_number,
                  m_duplicate_key, m_bad_string, m_deep, m_events, m_top)


# --------------------------------------------------------------------------- bytes


def mutate_bytes(rng: random.Random, data: bytes, n: int | None = None) -> bytes:
    """``data`` with ``n`` (1–3) byte-level edits: cut, flip, insert punctuation, delete,
    repeat a range, a BOM or white space (up to 5,000 bytes) in front, the text re-encoded as
    UTF-16/32."""
    b = bytearray(data)
    for _ in range(n or rng.randint(1, 3)):
        if not b:
            b += rng.choice((b"{", b"[", b'"', b"\x1f\x8b"))
            continue
        i = rng.randrange(len(b) + 1)
        r = rng.randrange(8)
        if r == 0:
            del b[i:]
        elif r == 1 and i < len(b):
            b[i] ^= 1 << rng.randrange(8)
        elif r == 2:
            b[i:i] = rng.choice((b"{", b"}", b"[", b"]", b",", b'"', b":", b"\\", b"\x00", b"\xff", b"},{", b"]}"))
        elif r == 3:
            del b[i:i + rng.randint(1, 64)]
        elif r == 4:
            j = min(len(b), i + rng.randint(1, 256))
            b[j:j] = b[i:j] * rng.randint(1, 4)
        elif r == 5 and rng.random() < 0.1:  # the text re-encoded (the readers name the encoding)
            b = bytearray(bytes(b).decode("utf-8", "replace").encode(rng.choice(("utf-16", "utf-16-be", "utf-32"))))
        elif r == 5:  # (more than the sniff's 4 KiB of white space, too)
            b[:0] = rng.choice((b"\xef\xbb\xbf", b"   \n", b"\x00", b"[", b")]}'\n", b" " * 5000,
                                b"\xef\xbb\xbf" + b"\n\t" * 2100, b"\xef\xbb\xbf\xef\xbb\xbf"))
        elif r == 6 and i < len(b):
            b[i] = rng.randrange(256)
        else:
            del b[i:i + 1]
    return bytes(b)


def mutate_doc(rng: random.Random, doc: Any, *, max_tree: int = 4, byte_edits: float = 0.3) -> bytes:
    """A mutated copy of ``doc`` as JSON bytes: 1–``max_tree`` tree mutations, then (with
    probability ``byte_edits``) byte edits. ``doc`` itself is not changed."""
    d = marshal.loads(marshal.dumps(doc))  # a deep copy, in C
    for _ in range(rng.randint(1, max_tree)):
        rng.choice(TREE_MUTATIONS)(rng, d)
    data = emit(d)
    if len(data) > MAX_DOC_BYTES:  # repeated events of deep nesting: cut (a cut is a mutation too)
        data = data[: rng.randrange(MAX_DOC_BYTES // 2, MAX_DOC_BYTES)]
    if rng.random() < byte_edits:
        data = mutate_bytes(rng, data)
    return data


#: the largest document :func:`mutate_doc` returns (bigger inputs cost seconds, find nothing more)
MAX_DOC_BYTES = 4 << 20


def kineto_window(rng: random.Random, seed: dict[str, Any], max_events: int = 200) -> dict[str, Any]:
    """A small Kineto document from a seed: its header and a random run of up to
    ``max_events`` of its events (a run, so that links between nearby events survive)."""
    ev = seed.get("traceEvents") or []
    n = min(len(ev), rng.randint(1, max_events))
    i = rng.randint(0, max(0, len(ev) - n))
    head = {k: v for k, v in seed.items() if k != "traceEvents"}
    return {**head, "traceEvents": ev[i:i + n]}


__all__ = ["Raw", "Pairs", "emit", "mutate_doc", "mutate_bytes", "kineto_window", "TREE_MUTATIONS"]
