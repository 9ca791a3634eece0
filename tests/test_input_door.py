"""Inputs that used to break the door (issue 19 items 6-7; Standards: bad input): a UTF-8
byte-order mark, more than 4 KiB of leading white space, text in UTF-16/32, stdin (``-``)
and FIFOs, devices and sockets. docs/cli.md ("Inputs") says what is accepted.

The oracle of every read is the count of device events (``kernel``, ``gpu_memcpy``,
``gpu_memset``) in the raw JSON, counted here with ``json``, and the op table of the same
trace read from its plain file.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import socket
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import pytest
from conftest import FIXTURES, REPO, real

from traceroof.errors import (
    InputNotFoundError,
    MixedInputsError,
    TraceFormatError,
    UsageError,
)
from traceroof.io import read_trace
from traceroof.parsers import kineto, piped, registry, text_head

BERT = ("TraceLens", "tests", "traces", "h100", "gaunernst_bert-small-uncased__1016001.json.gz")
XSPACE = FIXTURES / "jax_cpu" / "train_step.xplane.pb"
DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
BOM = b"\xef\xbb\xbf"
TIMEOUT_S = 120


@pytest.fixture(scope="module")
def bert() -> bytes:
    """The bert trace's JSON text."""
    return gzip.decompress(real(*BERT).read_bytes())


@pytest.fixture(scope="module")
def device_events(bert: bytes) -> int:
    """The oracle: device events in the raw JSON (each one op-table row)."""
    return sum(1 for e in json.loads(bert)["traceEvents"] if e.get("ph") == "X" and e.get("cat") in DEVICE_CATS)


@pytest.fixture(scope="module")
def plain_ops(bert: bytes, tmp_path_factory: pytest.TempPathFactory):
    p = tmp_path_factory.mktemp("plain") / "bert.json"
    p.write_bytes(bert)
    return read_trace(p).ops


def _same(trace, plain_ops, device_events: int) -> None:
    assert trace.ops.height == device_events  # counted from the raw JSON
    assert trace.ops.equals(plain_ops)


# --------------------------------------------------------------------------- BOM, white space

#: the read paths a Kineto file can take (docs/performance.md): the native scanner mapped,
#: read block by block, in one thread; msgspec
PATHS = {
    "native-mapped": {"TRACEROOF_DECODER": "native"},
    "native-read": {"TRACEROOF_DECODER": "native", "TRACEROOF_MMAP": "0"},
    "native-one-thread": {"TRACEROOF_DECODER": "native", "TRACEROOF_READ_AHEAD": "0", "TRACEROOF_SCAN_AHEAD": "0"},
    "msgspec": {"TRACEROOF_DECODER": "python"},
}
#: what goes before the JSON: a BOM, 5,000 spaces (past the 4,096-byte sniff), both, and
#: 3 MiB of new lines and tabs (past the sniff's 1 MiB steps and a stream block)
LEADS = {"bom": BOM, "ws5000": b" " * 5000, "bom+ws": BOM + b"\n" * 5000, "ws3MiB": b"\n\t" * (3 << 19)}


@pytest.mark.parametrize("path_env", list(PATHS))
@pytest.mark.parametrize("lead", list(LEADS))
def test_lead_plain_and_gzip(lead, path_env, bert, device_events, plain_ops, tmp_path, monkeypatch):
    for k, v in PATHS[path_env].items():
        monkeypatch.setenv(k, v)
    data = LEADS[lead] + bert
    plain = tmp_path / "t.json"
    plain.write_bytes(data)
    gz = tmp_path / "t.json.gz"
    gz.write_bytes(gzip.compress(data, 1))
    for p in (plain, gz):
        _same(read_trace(p), plain_ops, device_events)


@pytest.mark.parametrize("lead", list(LEADS))
def test_lead_in_memory_tar_and_folder(lead, bert, device_events, plain_ops, tmp_path):
    data = LEADS[lead] + bert
    _same(kineto.read_bytes(data), plain_ops, device_events)
    _same(kineto.read_bytes(gzip.compress(data, 1)), plain_ops, device_events)
    tar = tmp_path / "ranks.tar.gz"
    with tarfile.open(tar, "w:gz") as tf:
        for name, body in (("a/rank0.json", data), ("a/rank1.json.gz", gzip.compress(data, 1))):
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tf.addfile(info, io.BytesIO(body))
    t = read_trace(tar)
    assert sorted(t.ops["rank"].unique().to_list()) == [0, 1]
    assert t.ops.height == 2 * device_events  # the two members, each every device event
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "rank0.json").write_bytes(data)
    (folder / "rank1.json.gz").write_bytes(gzip.compress(data, 1))
    t = read_trace(folder, jobs=1)
    assert t.ops.height == 2 * device_events


def test_bom_before_a_damaged_file_says_the_same_bytes_streamed_and_in_memory():
    # a header that is not JSON (the stream decodes a small file in memory) and one event
    # that does not decode: the dropped event's offset counts the BOM (byte 2825 = 3 + the
    # offset of its "{" in the text below), on both paths
    evs = [json.dumps({"ph": "X", "cat": "kernel", "name": f"k{i}", "pid": 1, "tid": 7, "ts": i * 10, "dur": 1,
                       "args": {"correlation": i, "device": 0, "stream": 7}}) for i in range(50)]
    evs[20] = '{"ph": "X", "cat": "kernel", "name": "bad" "ts": 5}'
    text = ('{"schemaVersion": 1, "oops": [1, 2,, "traceEvents": [' + ",".join(evs) + "]}").encode()
    at = len(BOM) + text.index(b'{"ph": "X", "cat": "kernel", "name": "bad"')
    data = BOM + text
    streamed = kineto.read_fileobj(io.BytesIO(data), path="p.json", block_bytes=1024)
    in_memory = kineto.read_bytes(data, path="p.json")
    assert streamed.ops.height == in_memory.ops.height == 49
    assert f"p.json: not valid JSON; recovered 49 events (0 repaired, 1 dropped at byte {at})" in streamed.meta.warnings
    assert streamed.meta.warnings == in_memory.meta.warnings


def test_white_space_past_the_limit_is_one_line(bert, tmp_path, monkeypatch):
    monkeypatch.setattr(text_head, "MAX_LEADING_WS_BYTES", 1 << 20)
    data = b" " * (2 << 20) + bert
    p = tmp_path / "t.json"
    p.write_bytes(data)
    for target in (p, None):
        with pytest.raises(TraceFormatError, match=r"only white space in the first 1,048,576 bytes"):
            read_trace(p) if target else kineto.read_bytes(data)
    # the stream reader's own check (a tar member, a pipe): the same words
    with pytest.raises(TraceFormatError, match=r"only white space in the first 1,048,576 bytes"):
        kineto.read_fileobj(io.BytesIO(data), path="x")


@pytest.mark.parametrize("encoding,named", [("utf-16", "UTF-16 LE"), ("utf-16-be", "UTF-16 BE"),
                                            ("utf-32", "UTF-32 LE"), ("utf-32-be", "UTF-32 BE")])
def test_utf16_and_utf32_are_named(encoding, named, tmp_path):
    # utf-16 / utf-32 (Python) write a BOM; the -be ones do not: told by the zero bytes
    text = '{"traceEvents": []}'.encode(encoding)
    for name, body in (("t.json", text), ("t.json.gz", gzip.compress(text))):
        p = tmp_path / name
        p.write_bytes(body)
        with pytest.raises(TraceFormatError, match=f"found text encoded as {named}; convert it"):
            read_trace(p)
    with pytest.raises(TraceFormatError, match=f"found text encoded as {named}"):
        kineto.read_bytes(text)
    with pytest.raises(TraceFormatError, match=f"found text encoded as {named}"):
        kineto.read_fileobj(io.BytesIO(text), path="member")


def test_utf16_cli_is_one_line_exit_4(tmp_path):
    p = tmp_path / "t.json"
    p.write_bytes('{"traceEvents": []}'.encode("utf-16"))
    r = _cli(["analyze", str(p)])
    assert r.returncode == 4
    assert r.stderr.decode().splitlines() == [
        f"traceroof: error: {p}: byte 0: a UTF-8 JSON trace, found text encoded as UTF-16 LE; "
        "convert it first (iconv -f UTF-16LE -t UTF-8 IN > OUT)"]


# --------------------------------------------------------------------------- stdin, FIFOs

def _cli(args: list[str], stdin: bytes | None = None, **kw) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="120")
    return subprocess.run([sys.executable, "-m", "traceroof.cli", *args], input=stdin, capture_output=True,
                          cwd=REPO, env=env, timeout=TIMEOUT_S, **kw)


@pytest.mark.parametrize("gz", [False, True])
def test_stdin_dash_reads_the_trace(gz, bert, device_events, tmp_path):
    out = tmp_path / "r.json"
    body = gzip.compress(BOM + bert, 1) if gz else bert
    r = _cli(["analyze", "-", "--chip", "h100", "-o", str(out)], stdin=body)
    assert r.returncode == 0, r.stderr
    report = json.loads(out.read_text())
    assert report["trace"]["sources"] == ["<stdin>"]
    assert len(report["ops"]["name"]) == device_events  # the saved op table, one row per device event


def test_stream_of_another_format_is_spooled(bert, device_events):
    # an XSpace piped in: read from a temporary copy, named as the stream
    direct = read_trace(XSPACE)
    t = piped.read_stream(io.BytesIO(XSPACE.read_bytes()), "<stdin>")
    assert t.meta.format == "xplane" and t.meta.sources == ["<stdin>"]
    assert t.ops.equals(direct.ops)
    # a tar of Kineto traces piped in
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        info = tarfile.TarInfo("r/rank0.json")
        info.size = len(bert)
        tf.addfile(info, io.BytesIO(bert))
    t = piped.read_stream(io.BytesIO(buf.getvalue()), "<stdin>")
    assert t.meta.sources == ["<stdin>!r/rank0.json"]
    assert t.ops.height == device_events


def test_error_of_a_spooled_stream_names_the_stream(bert):
    # fuzz (session 10, target piped): a tar piped in whose members are of two devices raised
    # MixedInputsError naming the temporary copy, not the stream
    doc = json.loads(bert)
    doc["deviceProperties"][0]["name"] = "AMD Instinct MI300X"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, body in (("rank0.json", bert), ("rank1.json", json.dumps(doc).encode())):
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tf.addfile(info, io.BytesIO(body))
    with pytest.raises(MixedInputsError) as exc:
        piped.read_stream(io.BytesIO(buf.getvalue()), "<stdin>")
    assert str(exc.value).startswith("<stdin>!rank0.json and <stdin>!rank1.json are not traces of one job "
                                     "(device 'NVIDIA H100 80GB HBM3' vs 'AMD Instinct MI300X')")


def test_stream_that_is_not_a_trace_names_it():
    with pytest.raises(TraceFormatError, match=r"^<stdin>: byte 0: not a trace: expected"):
        piped.read_stream(io.BytesIO(b"\x00" * 10000), "<stdin>")
    with pytest.raises(TraceFormatError, match=r"^<stdin>: byte 0: a trace, found an empty file"):
        piped.read_stream(io.BytesIO(b""), "<stdin>")


def test_fifo_is_read_as_a_stream(bert, device_events, plain_ops, tmp_path):
    fifo = tmp_path / "trace.json.gz"
    os.mkfifo(fifo)
    body = gzip.compress(bert, 1)

    def write() -> None:
        with open(fifo, "wb") as fh:
            fh.write(body)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    t = read_trace(fifo)
    writer.join(10)
    _same(t, plain_ops, device_events)
    assert t.meta.sources == [str(fifo)]


def test_stdin_alone_and_not_a_terminal(monkeypatch):
    with pytest.raises(UsageError, match="read alone"):
        read_trace(["-", "other.json"])

    class Tty(io.BytesIO):
        closed = False

        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stdin", Tty())
    with pytest.raises(InputNotFoundError, match="stdin is a terminal"):
        read_trace("-")


# --------------------------------------------------------------------------- special files

@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom", "/dev/null"])
def test_devices_are_refused_at_once(device):
    r = _cli(["analyze", device])
    assert r.returncode == 4
    assert r.stderr.decode().splitlines() == [
        f"traceroof: error: {device}: file: a trace file, a folder, a FIFO or '-' (stdin), found a character device"]


def test_socket_is_refused(tmp_path):
    path = tmp_path / "s"
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(path))
        with pytest.raises(TraceFormatError, match="found a socket"):
            read_trace(path)
    finally:
        s.close()


def test_random_bytes_on_stdin_end_at_the_sniff():
    # 1 MB of bytes of no format, piped: "not a trace" from the head alone, no hang
    r = _cli(["analyze", "-"], stdin=bytes(range(256)) * 4096)
    assert r.returncode == 4
    assert r.stderr.decode().startswith("traceroof: error: <stdin>: byte 0: not a trace")


def test_sniff_reads_more_only_past_white_space(bert):
    # a BOM and a little white space: the head alone; a head of white space: more, in steps
    calls: list[int] = []

    def more(n: int) -> bytes:
        calls.append(n)
        return b""

    h = registry.head_of(Path("x"), (BOM + b"  " + bert)[: registry.HEAD_BYTES], more, None)
    assert (h.text_at, h.text[:1], calls) == (5, b"{", [])
    rest = io.BytesIO(b" " * 10_000 + bert)
    h = registry.head_of(Path("x"), b" " * registry.HEAD_BYTES, rest.read, None)
    assert h.text_at == registry.HEAD_BYTES + 10_000 and h.text == bert[: registry.HEAD_BYTES]
