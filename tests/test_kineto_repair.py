"""The recovery's repair of one event's ``name`` value (unescaped quotes inside it, BC-01) in
linear time.

Found by fuzzing in session 20 (target ``tar``, a damaged member of 238 KB): the repair was
one regex, ``("name"\\s*:\\s*")(.*?)(end)`` with ``re.S``, which the engine tries at every
``"name"`` of the chunk in turn, each scan running to the chunk's end when no ``end``
follows: O(n k) for n bytes and k names, and the recovery calls it on up to 64 ever shorter
heads of the last piece. The read hung (over 10 s, every time). Oracle: that regex itself,
which the new two-step search must equal on every chunk.
"""

from __future__ import annotations

import random
import re

from traceroof.parsers import kineto
from traceroof.parsers.kineto_recover import _fix_name_quotes

#: the repair as it was (the oracle)
_OLD = re.compile(rb'("name"\s*:\s*")(.*?)("\s*,\s*"(?:pid|tid|ts|dur|ph|cat|args|id|s|bp)"\s*:)', re.S)


def _old(chunk: bytes) -> bytes:
    def fix(m: re.Match[bytes]) -> bytes:
        return m.group(1) + re.sub(rb'(?<!\\)"', rb'\\"', m.group(2)) + m.group(3)

    return _OLD.sub(fix, chunk, count=1)


def test_the_repair_equals_the_old_regex_on_random_chunks():
    rng = random.Random(20)
    atoms = [b'"name"', b'"name": "', b'"name":"', b" ", b'"', b"\\", b",", b'"pid":', b'", "pid": 1',
             b'", "ts":', b'"dur"', b"a\"b", b"{", b"}", b"\n", b":", b'"args": {', b"x"]
    for _ in range(5000):
        chunk = b"".join(rng.choice(atoms) for _ in range(rng.randint(0, 24)))
        assert _fix_name_quotes(chunk) == _old(chunk), chunk


def test_a_real_name_with_quotes_is_repaired():
    chunk = b'{"ph": "X", "name": "torch/_dynamo/"eval_frame".py", "pid": 1, "tid": 2, "ts": 3}'
    assert _fix_name_quotes(chunk) == b'{"ph": "X", "name": "torch/_dynamo/\\"eval_frame\\".py", "pid": 1, "tid": 2, "ts": 3}'


def test_many_names_and_no_end_recover_in_linear_time():
    # 4,000 events whose keys after "name" are none the repair knows, cut (no "]"): the last
    # piece is the whole array, and each of its 64 heads tried held 4,000 names without an
    # end (the old repair: ~0.1 s per head at 80 KB, growing with the square)
    events = b", ".join(b'{"name": "k%d", "zz": %d' % (i, i) for i in range(4000))
    data = b'{"traceEvents": [' + events + b"]]]]"
    try:
        kineto.read_bytes(data, path="names.json")
    except Exception as exc:  # noqa: BLE001 - nothing readable is a clean error; a hang is the bug
        assert "names.json" in str(exc)
