"""A gzip member that inflates to more than one streaming block, followed by trailing bytes:
CPython's zlib leaves those bytes in ``unconsumed_tail`` as well as ``unused_data`` once the
member has ended in a call after an output-limited one, and the stream reader fed the tail to
the finished member forever (a hang the fuzz harness found, ``kineto_blocks.Source._inflate``).
Now the bytes are what follows the member (not gzip: ignored), and a second member after the
first is read once, not twice."""

from __future__ import annotations

import gzip
import io
import json
import signal

from traceroof.parsers import kineto
from traceroof.parsers.kineto_stream import STREAM_BLOCK_BYTES


def _trace_of_exactly(n: int) -> bytes:
    ev = [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1 + i, "dur": 1,
           "args": {"device": 0, "stream": 7, "correlation": i}} for i in range(3)]
    body = json.dumps({"traceEvents": ev}).encode()
    assert len(body) < n
    return body[:-1] + b" " * (n - len(body)) + b"}"  # padded inside the top-level object


def _alarm(*_):
    raise TimeoutError("the gzip stream reader did not finish")


def test_trailing_bytes_after_a_member_longer_than_a_block_are_ignored():
    raw = _trace_of_exactly(STREAM_BLOCK_BYTES + 5)  # 1 MiB + 5: two output-limited calls
    assert len(raw) == STREAM_BLOCK_BYTES + 5
    data = gzip.compress(raw) + b"\x00" * 7
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(20)
    try:
        t = kineto.read_fileobj(io.BytesIO(data), path="tail.json.gz")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    # the three kernels of the member, as the in-memory read of the plain JSON gives them
    want = kineto.read_bytes(raw, path="tail.json")
    assert t.ops.height == 3 == want.ops.height
    assert t.ops["start_ns"].to_list() == want.ops["start_ns"].to_list()


def test_a_second_member_after_a_long_first_one_is_read_once():
    """Two members: the first pads the object open, the second closes it. Joined, the bytes
    are the plain JSON; the stream must inflate each member once (unused_data only)."""
    raw = _trace_of_exactly(STREAM_BLOCK_BYTES + 5)
    cut = len(raw) - 200
    data = gzip.compress(raw[:cut]) + gzip.compress(raw[cut:])
    t = kineto.read_fileobj(io.BytesIO(data), path="two.json.gz")
    assert t.ops.height == 3
