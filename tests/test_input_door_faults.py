"""Faults a reviewer found in the input door (session 10's merge), each with the test that
failed before its fix: stdin has no folder (no capture traces beside it); UTF-16/32 text
without a byte-order mark named on every path; ``detect_format(path, head)`` reads only the
head; a killed spooled read leaves nothing in ``$TMPDIR``; stdin named twice is a usage
error; a cut ``.xplane.pb`` that keeps no line is one line, exit 4; ``./-`` is the file.
docs/cli.md ("Inputs") and docs/xplane.md ("Bad and damaged input") say the rules.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from conftest import FIXTURES, REPO

import traceroof
from traceroof.analysis import analyze
from traceroof.errors import TraceFormatError, UsageError
from traceroof.graph_sources import capture_traces_beside
from traceroof.io import read_trace
from traceroof.parsers import kineto, piped, registry, text_head, xplane
from traceroof.parsers import xplane_proto as xp

REPLAY = FIXTURES / "graph_replay" / "replay_only"
XSPACE = FIXTURES / "jax_twins" / "bert.xplane.pb"
TIMEOUT_S = 120
TEXT = '{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 2}]}'


def _cli(args: list[str], stdin: bytes | None = None, cwd: Path = REPO, **kw) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="120")
    return subprocess.run([sys.executable, "-m", "traceroof.cli", *args], input=stdin, capture_output=True,
                          cwd=cwd, env=env, timeout=TIMEOUT_S, **kw)


def _replays_line(out: bytes) -> str:
    return next(x for x in out.decode().splitlines() if x.startswith("graph replays"))


# --------------------------------------------------------------------------- 1. stdin has no folder

def test_stdin_takes_no_capture_traces_from_the_current_directory(tmp_path):
    body = (REPLAY / "trace.json.gz").read_bytes()
    # the oracle: read by its path, the trace finds capture_traces/ beside it; piped from the
    # folder that holds capture_traces/, it must not (nothing is beside stdin)
    by_path = _cli(["analyze", "trace.json.gz", "--chip", "h100"], cwd=REPLAY)
    assert "1 graph (1 by capture trace)" in _replays_line(by_path.stdout)
    piped_in = _cli(["analyze", "-", "--chip", "h100"], stdin=body, cwd=REPLAY)
    assert piped_in.returncode == 0, piped_in.stderr
    assert "1 graph (1 unattributed)" in _replays_line(piped_in.stdout)
    given = _cli(["analyze", "-", "--chip", "h100", "--capture-trace", "capture_traces"], stdin=body, cwd=REPLAY)
    assert "1 graph (1 by capture trace)" in _replays_line(given.stdout)
    # a cache ingested from stdin keeps '<stdin>' as its source: still nothing beside it
    cache = tmp_path / "c.cache"
    assert _cli(["ingest", "-", "-o", str(cache), "-q"], stdin=body, cwd=REPLAY).returncode == 0
    t = read_trace(cache)
    assert t.meta.sources == ["<stdin>"]
    os.chdir(REPLAY)
    try:
        r = analyze(t, "h100")
    finally:
        os.chdir(REPO)
    assert [g.method for g in r.coverage.graphs] == ["unattributed"]


def test_capture_traces_beside_a_fifo_but_not_beside_stdin(monkeypatch):
    monkeypatch.chdir(REPLAY)
    cap = sorted(str(p) for p in (REPLAY / "capture_traces").glob("*.json.gz"))  # the folder's files
    assert capture_traces_beside(["<stdin>"]) == []
    assert capture_traces_beside(["<stdin>!r/rank0.json"]) == []  # a tar piped in
    assert capture_traces_beside([str(REPLAY / "fifo")]) == cap  # a FIFO (or a file) there: beside it


# --------------------------------------------------------------------------- 2. UTF-16/32 named

CODECS = [("utf-16-le", "UTF-16 LE"), ("utf-16-be", "UTF-16 BE"), ("utf-32-le", "UTF-32 LE"),
          ("utf-32-be", "UTF-32 BE")]  # (Python's -le/-be codecs write no byte-order mark)


def _tar(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, body in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tf.addfile(info, io.BytesIO(body))
    return buf.getvalue()


@pytest.mark.parametrize("lead", ["", "\n", " \r\n\t"])
@pytest.mark.parametrize("codec,named", CODECS)
def test_utf16_and_utf32_without_a_bom_are_named_on_every_path(codec, named, lead, tmp_path):
    text = (lead + TEXT).encode(codec)
    words = re.escape(f"found text encoded as {named}; convert it first (iconv -f {named.replace(' ', '')} -t UTF-8")
    p = tmp_path / "t.json"
    p.write_bytes(text)
    g = tmp_path / "t.json.gz"
    g.write_bytes(gzip.compress(text))
    tar = tmp_path / "t.tar.gz"
    tar.write_bytes(_tar({"rank0.json": text}))
    for path, where in ((p, "t.json: byte 0"), (g, "t.json.gz: gzip stream, byte 0"),
                        (tar, "t.tar.gz!rank0.json: byte 0")):
        with pytest.raises(TraceFormatError, match=f"{re.escape(where)}: a UTF-8 JSON trace, {words}"):
            read_trace(path)
    with pytest.raises(TraceFormatError, match=f"^<bytes>: byte 0: a UTF-8 JSON trace, {words}"):
        kineto.read_bytes(text)
    with pytest.raises(TraceFormatError, match=f"^member: byte 0: a UTF-8 JSON trace, {words}"):
        kineto.read_fileobj(io.BytesIO(text), path="member")
    for body in (text, _tar({"rank0.json": text})):  # stdin: plain, and a tar spooled from it
        with pytest.raises(TraceFormatError, match=f"^<stdin>.*: byte 0: a UTF-8 JSON trace, {words}"):
            piped.read_stream(io.BytesIO(body), "<stdin>")


def test_utf16_le_after_a_new_line_on_stdin_is_one_line_exit_4():
    # the reviewer's w16.json: read as an XSpace before (exit 0, an empty report)
    r = _cli(["analyze", "-"], stdin=("\n" + TEXT).encode("utf-16-le"))
    assert r.returncode == 4
    assert r.stderr.decode().splitlines() == [
        "traceroof: error: <stdin>: byte 0: a UTF-8 JSON trace, found text encoded as UTF-16 LE; "
        "convert it first (iconv -f UTF-16LE -t UTF-8 IN > OUT)"]


def test_binary_heads_with_zero_bytes_are_not_taken_for_text(tmp_path):
    # a tar whose first member is named '{' (7b 00 00 00 ...: the zeros of UTF-32 LE, but
    # a NUL after the '{'), and XSpaces of empty planes (0a 00 0a 00: UTF-16 LE's zeros)
    tar = tmp_path / "a.tar"
    with tarfile.open(tar, "w") as tf:
        info = tarfile.TarInfo("{")
        tf.addfile(info, io.BytesIO(b""))
    assert tar.read_bytes()[:4] == b"{\x00\x00\x00"
    assert text_head.other_encoding(tar.read_bytes()) is None
    empty_planes = tmp_path / "e.xplane.pb"
    empty_planes.write_bytes(b"\x0a\x00" * 8)
    assert registry.detect(empty_planes).name == "xplane"


# --------------------------------------------------------------------------- 3. detect_format's head

def test_detect_format_with_a_head_reads_only_the_head(tmp_path):
    # the reviewer's call: a member's name that is no file
    assert traceroof.detect_format("member/rank0.json", b'{"schemaVersion":1,"traceEvents":[') == "kineto"
    assert traceroof.detect_format("member/r.json.gz", gzip.compress(b'{"traceEvents":[]}')) == "kineto"
    # a real file of another format: the head given wins, so the file was not read
    assert traceroof.detect_format(XSPACE, b'{"traceEvents":[') == "kineto"
    # a head of white space only: the file is read on when it can be
    p = tmp_path / "ws.json"
    p.write_bytes(b" " * 5000 + TEXT.encode())
    assert traceroof.detect_format(p, p.read_bytes()[:4096]) == "kineto"
    with pytest.raises(TraceFormatError, match="only white space"):
        traceroof.detect_format(tmp_path / "no.json", b" " * 4096)
    with pytest.raises(FileNotFoundError):  # no head: the file must exist (OSError, documented)
        traceroof.detect_format(tmp_path / "no.json")


# --------------------------------------------------------------------------- 4. a killed spool

def _held_in(pid: int, folder: Path) -> bool:
    """The process holds a file of ``folder`` open, or something is in ``folder``."""
    if any(folder.iterdir()):
        return True
    try:
        return any(os.readlink(f"/proc/{pid}/fd/{fd}").startswith(str(folder)) for fd in os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return False


@pytest.mark.parametrize("sig,proc_fd", [(signal.SIGTERM, True), (signal.SIGHUP, True), (signal.SIGKILL, True),
                                         (signal.SIGTERM, False), (signal.SIGHUP, False)])
def test_a_spooled_read_killed_midway_leaves_nothing(sig, proc_fd, tmp_path):
    # proc_fd False: the fallback where /proc/self/fd is missing (signal handlers; a SIGKILL
    # there leaves the folder: piped._spool says so)
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env = dict(os.environ, PYTHONPATH=str(REPO), TMPDIR=str(tmpdir))
    # the signal's default disposition, as in a terminal: a run under nohup (or a CI runner
    # that ignores SIGHUP) hands its children SIG_IGN, which they rightly keep
    reset = f"import signal; signal.signal({int(sig)}, signal.SIG_DFL)\n" if sig != signal.SIGKILL else ""
    code = (reset + "import sys, traceroof.parsers.piped as p\n"
            + ("" if proc_fd else "p.PROC_FD = None\n")
            + "from traceroof.cli import main\nmain(['analyze', '-', '-q'])\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env=env, cwd=REPO)
    try:
        proc.stdin.write(XSPACE.read_bytes())  # an XSpace: spooled; stdin kept open, so the copy waits
        proc.stdin.flush()
        deadline = time.monotonic() + TIMEOUT_S
        while not _held_in(proc.pid, tmpdir):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.05)
        proc.send_signal(sig)
        if not proc_fd:
            time.sleep(0.2)
            proc.stdin.close()  # the handler runs once the blocked read returns (another thread may take the signal)
        rc = proc.wait(TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
        if not proc.stdin.closed:
            proc.stdin.close()
    assert rc in (-sig, 128 + sig)  # killed by it, or (the handler) exit 128 + signal
    assert list(tmpdir.iterdir()) == []


# --------------------------------------------------------------------------- 5. stdin twice

@pytest.mark.parametrize("args,where", [
    (["diff", "-", "-"], "A, B"),
    (["analyze", "-", "--capture-trace", "-"], "TRACE, --capture-trace"),
    (["analyze", "-", "-"], "TRACE, TRACE"),
    (["gate", "-", "--baseline", "-"], "TRACE, --baseline"),
    (["serve", "-", "--compare", "-"], "TRACE, --compare"),
    (["ingest", "-", "-", "-o", "unused.cache"], "TRACE, TRACE"),
])
def test_stdin_named_twice_is_a_usage_error(args, where, tmp_path):
    r = _cli(args, stdin=(REPLAY / "trace.json.gz").read_bytes(), cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.decode().splitlines() == [
        f"traceroof: error: '-' (stdin) is given 2 times ({where}): stdin can be read once in a command; "
        "save the trace to a file to name it twice"]
    assert list(tmp_path.iterdir()) == []  # refused before anything was read or written


def test_stdin_read_twice_in_one_process_is_refused(monkeypatch):
    class Stdin:
        closed = False
        buffer = io.BytesIO((REPLAY / "trace.json.gz").read_bytes())

        def isatty(self) -> bool:
            return False

    monkeypatch.setattr(sys, "stdin", Stdin())
    t = read_trace("-")
    assert t.meta.sources == ["<stdin>"] and t.ops.height == read_trace(REPLAY / "trace.json.gz").ops.height
    with pytest.raises(UsageError, match=r"^'-' \(stdin\) was read already"):
        read_trace("-")


# --------------------------------------------------------------------------- 6. a cut that keeps no line

def _planes(data: bytes) -> list[tuple[int, int, int]]:
    """(tag, start, end) of each XSpace plane, read from the file's wire format."""
    return [(t, s, e) for n, _wt, (s, e), t, _end in xp.iter_fields(memoryview(data), 0, len(data)) if n == 1]


def test_cut_that_keeps_no_line_is_one_line_exit_4(tmp_path):
    data = XSPACE.read_bytes()
    (t0, s0, e0), (t1, s1, e1) = _planes(data)[:2]
    lines_of = [[v for n, _wt, v, _t, _e in xp.iter_fields(memoryview(data), s, e) if n == 3]
                for _t, s, e in _planes(data)[:2]]
    assert lines_of[0] == [] and lines_of[1]  # oracle: plane 1 (/host:metadata) has no line, plane 2 has
    ls, le = lines_of[1][0]
    event_ends = [end for n, _wt, _v, _t, end in xp.iter_fields(memoryview(data), ls, le) if n == 4]  # XLine.events
    # cuts where no line and no event is complete: in plane 1 (its name kept: the reviewer's
    # 30 bytes), in plane 2 before its first line (plane 1 whole, plane 2 named), and inside
    # plane 2's first line before its first event ends
    for cut in (30, 1000, e0 - 1, s1 + 20, ls + 2, event_ends[0] - 1):
        with pytest.raises(TraceFormatError, match=rf"byte {cut:,}: an XSpace with a complete line of events, "
                                                   r"found a file that ends inside plane '/host:\w+' at byte "):
            xplane.read_bytes(data[:cut], "cut.xplane.pb")
    # one complete event: read, with the truncation warning
    t = xplane.read_bytes(data[:event_ends[0] + 1], "cut.xplane.pb")
    assert any(w.startswith(f"cut.xplane.pb: trace is truncated at byte {event_ends[0] + 1:,}")
               and "the complete events of the line the cut is in" in w for w in t.meta.warnings)
    p = tmp_path / "c.pb"
    p.write_bytes(data[:30])
    r = _cli(["analyze", str(p), "--chip", "h100"])
    assert r.returncode == 4 and len(r.stderr.decode().splitlines()) == 1, r.stderr


# --------------------------------------------------------------------------- 7. a file named '-'

def test_a_file_named_dash_is_read_as_dot_slash_dash(tmp_path):
    body = (REPLAY / "trace.json.gz").read_bytes()
    (tmp_path / "-").write_bytes(body)
    out = tmp_path / "r.json"
    r = _cli(["analyze", "./-", "--chip", "h100", "-o", str(out)], stdin=b"", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    report = json.loads(out.read_text())
    # the file as the user named it: './-' ('-' would read as stdin; Path('./-') prints '-')
    assert report["trace"]["sources"] == ["./-"]
    assert len(report["ops"]["name"]) == read_trace(REPLAY / "trace.json.gz").ops.height
    r = _cli(["analyze", "-", "--chip", "h100"], stdin=b"", cwd=tmp_path)  # '-' alone: stdin, empty
    assert r.returncode == 4 and "<stdin>: byte 0: a trace, found an empty file" in r.stderr.decode()
