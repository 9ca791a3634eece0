"""The fuzz targets: one per reader, plus cheaper lower-level ones.

A :class:`Target` makes an input from a seeded ``random.Random`` (:attr:`Target.make`: the
structured mutators of :mod:`fuzz.json_mutate` / :mod:`fuzz.proto_mutate` applied to the
seeds of :mod:`fuzz.seeds`) and feeds bytes to a reader in process (:attr:`Target.run`).
``run`` raises only what the reader documents (:attr:`Target.allowed`); anything else, a
hang or a memory blow-up is a crash (:mod:`fuzz.harness`). Atheris feeds ``run`` its own
byte mutations of ``make``'s outputs.

File-level targets write the input to a temporary file and call
:func:`traceroof.io.read_trace`; an error there must be a :class:`~traceroof.errors.TraceroofError`
whose exit code is not 70 and whose message is one line naming the file
(:func:`check_error`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import io
import marshal
import os
import random
import shutil
import tarfile
import tempfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from . import json_mutate as J
from . import proto_mutate as P
from . import seeds as S


class BadError(Exception):
    """An allowed exception class raised with a message that breaks the rules."""


@dataclass(frozen=True)
class Target:
    """One fuzz target.

    Attributes:
        name: what ``fuzz/run.py NAME`` runs.
        weight: its share of ``fuzz/run.py all --runs N`` (cheap targets weigh more).
        make: ``make(rng) -> bytes``: one structured input.
        run: ``run(data) -> None``: feed the input to the reader.
        allowed: the exception classes the reader documents for bad input (checked by
            ``run`` itself where the message matters).
        what: one line for the docs and ``--list``.
    """

    name: str
    weight: float
    make: Callable[[random.Random], bytes]
    run: Callable[[bytes], None]
    allowed: tuple[type[BaseException], ...]
    what: str


def check_error(exc: BaseException, path: str) -> None:
    """Raise :class:`BadError` unless ``exc`` is a TraceroofError with a non-70 exit code and a
    one-line message naming ``path``."""
    from traceroof.errors import TraceroofError

    if not isinstance(exc, TraceroofError):
        raise exc
    msg = str(exc)
    if exc.exit_code == 70:
        raise BadError(f"{type(exc).__name__} has exit code 70 (internal): {msg}") from exc
    if "\n" in msg:
        raise BadError(f"{type(exc).__name__} message is not one line: {msg!r}") from exc
    if Path(path).name not in msg:
        raise BadError(f"{type(exc).__name__} message does not name the file {path}: {msg}") from exc


@contextlib.contextmanager
def _decoder_for(data: bytes) -> Iterator[None]:
    """Half the inputs (by the CRC-32 of their bytes, so a replay takes the same path) read
    with ``TRACEROOF_DECODER=native``: a small Kineto file would otherwise always go to msgspec
    (``parsers.kineto._use_native``: below 15 MB of JSON), and the scanner's path inside the
    readers would be fuzzed only once a worker has read 15 MB."""
    from traceroof.parsers.kineto_native import ENV_DECODER

    if zlib.crc32(data) & 1 or ENV_DECODER in os.environ:
        yield
        return
    os.environ[ENV_DECODER] = "native"
    try:
        yield
    finally:
        del os.environ[ENV_DECODER]


def _read_file(data: bytes, name: str) -> None:
    from traceroof.errors import TraceroofError
    from traceroof.io import read_trace

    f = S.workdir() / name
    f.write_bytes(data)
    try:
        with _decoder_for(data):
            read_trace(str(f), jobs=1)
    except TraceroofError as exc:
        check_error(exc, str(f))


# --------------------------------------------------------------------------- makers


def make_kineto(rng: random.Random) -> bytes:
    """A Kineto seed window, mutated (tree, then sometimes bytes)."""
    return J.mutate_doc(rng, J.kineto_window(rng, rng.choice(S.kineto_docs())))


def make_kineto_any(rng: random.Random) -> bytes:
    """:func:`make_kineto`, gzipped (and maybe the gzip damaged) a third of the time."""
    data = make_kineto(rng)
    return gzip_wrap(rng, data) if rng.random() < 0.33 else data


def gzip_wrap(rng: random.Random, data: bytes) -> bytes:
    """``data`` gzipped, then maybe: cut, a byte flipped, two members, garbage after, a bad
    CRC, or an empty member."""
    gz = gzip.compress(data, compresslevel=1, mtime=0)
    r = rng.randrange(8)
    if r == 0:
        return gz[: rng.randrange(len(gz) + 1)]
    if r == 1:
        b = bytearray(gz)
        b[rng.randrange(10, len(b))] ^= 1 << rng.randrange(8)
        return bytes(b)
    if r == 2:
        k = rng.randrange(len(data) + 1)
        return gzip.compress(data[:k], mtime=0) + gzip.compress(data[k:], mtime=0)
    if r == 3:
        return gz + rng.choice((b"\x00" * 7, b"garbage", b"\x1f\x8b", gz[:20]))
    if r == 4:
        return gz[:-8] + bytes(8)
    if r == 5:
        return gzip.compress(b"", mtime=0) + (gz if rng.random() < 0.5 else b"")
    if r == 6:
        return zlib.compress(data)  # zlib, not gzip: no magic
    return gz


def make_tar(rng: random.Random) -> bytes:
    """A tar (maybe gzipped) of 1–3 Kineto members, some gzipped, some not JSON; maybe damaged or cut."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for k in range(rng.randint(1, 3)):
            data = make_kineto(rng)
            name = rng.choice((f"rank{k}.json", f"r/rank-{k}.json.gz", f"rank{k}.txt", "../evil.json"))
            if name.endswith(".gz"):
                data = gzip_wrap(rng, data) if rng.random() < 0.3 else gzip.compress(data, mtime=0)
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    raw = buf.getvalue()
    if rng.random() < 0.5:
        raw = gzip.compress(raw, compresslevel=1, mtime=0)
    if rng.random() < 0.25:
        raw = J.mutate_bytes(rng, raw, 1)
    return raw[: rng.randint(0, len(raw))] if rng.random() < 0.2 else raw  # cut anywhere (a stopped transfer)


def make_xplane(rng: random.Random) -> bytes:
    """An XSpace seed with 1–3 field-aware edits (and sometimes a raw one)."""
    return P.mutate_many(rng, rng.choice(S.xplane_seeds()))


def make_small_xplane(rng: random.Random) -> bytes:
    """:func:`make_xplane` on the two small seeds only (the low-level targets)."""
    return P.mutate_many(rng, rng.choice(S.xplane_seeds()[:2]))


def make_cache(rng: random.Random) -> bytes:
    """A cache edit: the layout (``1`` single cache, ``2`` dataset) then ``m`` + a mutated
    JSON file's index and bytes (``meta.json``, a dataset fragment), ``p`` + a damaged
    Parquet part's index and bytes, or ``d`` + the index of a file to delete."""
    import json

    layout = rng.choice((1, 2))
    root = S.cache_dir(layout)
    files = sorted(p for p in root.rglob("*") if p.is_file())
    docs = [i for i, p in enumerate(files) if p.suffix == ".json"]
    parts = [i for i, p in enumerate(files) if p.suffix == ".parquet"]
    r = rng.randrange(6)
    head = bytes([48 + layout])
    if r < 3:
        i = rng.choice(docs)
        return head + b"m" + bytes([i]) + J.mutate_doc(rng, json.loads(files[i].read_text()), byte_edits=0.15)
    if r < 5:
        i = rng.choice(parts)
        return head + b"p" + bytes([i]) + J.mutate_bytes(rng, files[i].read_bytes(), rng.randint(1, 4))
    return head + b"d" + bytes([rng.randrange(len(files))])


def make_report(rng: random.Random) -> bytes:
    """A saved report (with its op table), mutated."""
    return J.mutate_doc(rng, S.saved_report(), max_tree=3, byte_edits=0.1)


def make_jax_json(rng: random.Random) -> bytes:
    """jax's trace-viewer JSON (process names that are XSpace planes), mutated, gzipped."""
    doc = {"displayTimeUnit": "ns", "metadata": {"highres-ticks": True}, "traceEvents": [
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/device:TPU:0"}},
        {"ph": "M", "pid": 2, "name": "process_name", "args": {"name": "/host:CPU"}},
        {"ph": "X", "pid": 1, "tid": 3, "ts": 10.5, "dur": 2.0, "name": "fusion.1", "args": {"long_name": "x"}},
        {}]}
    data = J.mutate_doc(rng, doc, max_tree=2, byte_edits=0.2)
    return gzip.compress(data, mtime=0) if rng.random() < 0.7 else data


def make_perfetto(rng: random.Random) -> bytes:
    """A Perfetto ``Trace`` (packets with timestamp, sequence id, a track event), mutated."""
    pkt = (P.build([(8, 0, 1000), (10, 0, 1), (11, 2, P.build([(22, 2, b"slice"), (9, 0, 1)]))]))
    trace = P.build([(1, 2, pkt)] * rng.randint(1, 5))
    return P.mutate_many(rng, trace)


# --------------------------------------------------------------------------- runners


def _on_chunk(events: list) -> None:
    for e in events:  # touch what the column builder reads
        (e.ph, e.cat, e.name, e.ts, e.dur, e.args)


def run_kineto_decode(data: bytes) -> None:
    """The Kineto decoder alone (:func:`traceroof.parsers.kineto_decode.decode`)."""
    from traceroof.parsers.kineto_decode import decode

    try:
        decode(data, _on_chunk, path="<fuzz>")
    except ValueError as exc:
        if type(exc) is not ValueError:  # its subclasses (UnicodeDecodeError, ...) are bugs
            raise
        # documented: no traceEvents array


def run_kineto_stream(data: bytes) -> None:
    """The streaming decoder alone, in 1 KiB blocks (many block boundaries); with the native
    scanner built, again on the native path (the worker thread, the helper scanner, the
    read-ahead thread), which must decode as many events with the same statistics."""
    from traceroof.parsers import kineto_native as N
    from traceroof.parsers.kineto_stream import StreamFormatError, decode_stream

    def one(native: bool, mapped: bool = False) -> object:
        n = [0]

        def count(events) -> None:
            if not isinstance(events, N.Columns):
                _on_chunk(events)
            n[0] += len(events)

        try:
            if mapped:  # a plain file: mapped (kineto_blocks.mapped), not read
                with tempfile.TemporaryFile() as f:
                    f.write(data)
                    f.seek(0)
                    d = decode_stream(f, count, path="<fuzz>", block_bytes=1024, native=native)
            else:
                d = decode_stream(io.BytesIO(data), count, path="<fuzz>", block_bytes=1024, native=native)
        except StreamFormatError as exc:
            return ("format", str(exc))
        except ValueError as exc:
            if type(exc) is not ValueError:
                raise
            return ("value", str(exc))
        return (n[0], dataclasses.asdict(d.stats))

    plain = one(False)
    if N.active():
        native = one(True)
        if native != plain:
            raise AssertionError(f"kineto_stream: native path {native!r} != msgspec path {plain!r}")
        mapped = one(True, mapped=True)
        if mapped != plain:
            raise AssertionError(f"kineto_stream: the mapped file {mapped!r} != msgspec path {plain!r}")


def run_kineto(data: bytes) -> None:
    """The Kineto reader in memory (:func:`traceroof.parsers.kineto.read_bytes`), tables built."""
    from traceroof.errors import TraceroofError
    from traceroof.parsers import kineto

    try:
        with _decoder_for(data):
            kineto.read_bytes(data, path="fuzz.json")
    except TraceroofError as exc:
        check_error(exc, "fuzz.json")


def run_kineto_file(data: bytes) -> None:
    """The one door (:func:`traceroof.io.read_trace`) on a ``.json`` / ``.json.gz`` file:
    sniffing, streaming, gzip."""
    _read_file(data, "fuzz.json.gz" if data[:2] == b"\x1f\x8b" else "fuzz.json")


def run_tar(data: bytes) -> None:
    _read_file(data, "fuzz.tar.gz" if data[:2] == b"\x1f\x8b" else "fuzz.tar")


def run_tar_shares(data: bytes) -> None:
    """The parallel read of a tar (``read_trace`` with ``jobs`` > 1) in this process: its two
    shares read as the two processes read them; when the archive reads whole in one share,
    the two hold its members between them, each once, with the same traces, and merge."""
    from traceroof.errors import TraceroofError
    from traceroof.parsers import tar

    f = S.workdir() / ("fuzz.tar.gz" if data[:2] == b"\x1f\x8b" else "fuzz.tar")
    f.write_bytes(data)
    with _decoder_for(data):
        try:
            one, one_notes = tar.read_share(f, 0, 1)
        except TraceroofError as exc:
            check_error(exc, str(f))
            one = None
        parts, notes = [], []
        for k in (0, 1):
            try:
                got, said = tar.read_share(f, k, 2)
                parts, notes = parts + got, notes + said
            except TraceroofError as exc:
                if one is not None:
                    raise AssertionError(f"share {k} of 2 failed where one share read it all: {exc}") from exc
                check_error(exc, str(f))
    if one is None:
        return
    key = sorted((n, p, t.ops.height, t.host.height) for n, p, t in parts)
    if key != sorted((n, p, t.ops.height, t.host.height) for n, p, t in one):
        raise AssertionError(f"two shares {key} != one {[(n, p) for n, p, _ in one]}")
    if sorted(notes) != sorted(one_notes):  # a fault told once, as one share alone tells it
        raise AssertionError(f"two shares said {notes} != one share {one_notes}")
    tar.merge_members(parts, notes)


def make_piped(rng: random.Random) -> bytes:
    """What a pipe may carry: a Kineto trace (maybe gzipped, damaged), a tar of them, or an
    XSpace."""
    r = rng.random()
    return make_kineto_any(rng) if r < 0.7 else make_tar(rng) if r < 0.85 else make_small_xplane(rng)


def run_piped(data: bytes) -> None:
    """The stream door (:func:`traceroof.parsers.piped.read_stream`: stdin, a FIFO): the
    sniff of the first bytes, then the Kineto stream or the spooled copy."""
    from traceroof.errors import TraceroofError
    from traceroof.parsers import piped

    try:
        with _decoder_for(data):
            piped.read_stream(io.BytesIO(data), piped.STDIN_NAME)
    except TraceroofError as exc:
        check_error(exc, piped.STDIN_NAME)


def run_protowire(data: bytes) -> None:
    """The wire-format walkers alone: the sniffer's (:mod:`traceroof.parsers.protowire`) and
    the XSpace structure walker (:func:`~traceroof.parsers.xplane_proto_wire.find_break`)."""
    from traceroof.parsers import protowire as w
    from traceroof.parsers.xplane_proto_wire import find_break

    try:
        for _ in w.fields(data):
            pass
    except ValueError as exc:
        if type(exc) is not ValueError:
            raise
    first = w.first_message(data, len(data))
    if first is not None:
        w.message_fields(data, *first)
    find_break(data, 0, len(data))


def run_xplane_scan(data: bytes) -> None:
    """The XSpace scanner: planes, every line, the vectorised event decoder."""
    from traceroof.parsers import xplane_proto as xp

    space = xp.scan_space(data)
    for plane in space.planes:
        for i in range(len(plane.line_ranges)):
            try:
                line = plane.line(i)
            except xp.WireError:
                continue
            if line.events is not None:
                len(line.events)


def run_xplane_native(data: bytes) -> None:
    """The C event decoder (``_xplane_scan``, when built) against protobuf: every run of
    events it takes, at the first event field of each line of the XSpace and after each run
    it stops, must parse in protobuf, alone, to the same columns (an ``AssertionError``, a
    crash, otherwise); what it hands back (None) is the numpy decoder's, fuzzed above."""
    from traceroof.parsers import xplane_proto as xp
    from traceroof.parsers import xplane_proto_events as xpe

    if not xpe.NATIVE:
        return
    from traceroof.parsers import _xplane_scan
    from traceroof.parsers.xplane_proto_messages import XLine

    buf = memoryview(data)
    for plane in xp.scan_space(data).planes:
        for start, end in plane.line_ranges:
            try:
                runs = [tag for f, _wt, _v, tag, _e in xp.iter_fields(data, start, end) if f == 4]
            except xp.WireError:
                continue
            for at in runs[:8]:
                d = _xplane_scan.events(buf, at, end)
                if d is None:
                    continue
                ref = XLine()
                ref.ParseFromString(data[at:d["stop"]])  # raises (a crash) if protobuf rejects it
                got, want = xpe._native_columns(d), xpe.EventColumns([xpe._part_from_messages(ref.events)])
                for k in ("metadata_id", "offset_ps", "duration_ps", "aggregated", "stat_event",
                          "stat_mid", "stat_kind", "stat_value"):
                    assert (getattr(got, k) == getattr(want, k)).all() and len(getattr(got, k)) == len(getattr(want, k)), k
                assert got.stat_objects == want.stat_objects


def run_xplane(data: bytes) -> None:
    """The XPlane reader (:func:`traceroof.parsers.xplane.read_bytes`), tables built."""
    from traceroof.errors import TraceroofError
    from traceroof.parsers import xplane

    try:
        xplane.read_bytes(data, "fuzz.xplane.pb")
    except TraceroofError as exc:
        check_error(exc, "fuzz.xplane.pb")


def run_xplane_file(data: bytes) -> None:
    _read_file(data, "fuzz.xplane.pb")


def run_cache(data: bytes) -> None:
    """A cache directory (either layout) with one file replaced or deleted, read by ``read_trace``."""
    if len(data) < 3 or data[:1] not in (b"1", b"2"):
        return
    src = S.cache_dir(int(data[:1]))
    d = S.workdir() / "cache"
    if d.exists():
        shutil.rmtree(d)
    shutil.copytree(src, d)
    files = sorted(p for p in d.rglob("*") if p.is_file())
    op, f, payload = data[1:2], files[data[2] % len(files)], data[3:]
    if op == b"d":
        f.unlink()
    elif op in (b"m", b"p"):
        f.write_bytes(payload)
    from traceroof.errors import TraceroofError
    from traceroof.io import read_trace

    try:
        read_trace(str(d), jobs=1)
    except TraceroofError as exc:
        check_error(exc, str(S.workdir()))  # the cache, or the source files its fragments name


def run_report(data: bytes) -> None:
    """A saved report as ``gate`` and ``serve`` load it: the one door
    (:func:`traceroof.analysis.load_report`), the gate's checks against itself and its
    explanation, the dashboard's first view."""
    from traceroof import gate
    from traceroof.analysis import load_report
    from traceroof.errors import TraceroofError

    f = S.workdir() / "fuzz-report.json"
    f.write_bytes(data)
    try:
        report = load_report(str(f))
    except TraceroofError as exc:
        check_error(exc, str(f))
        return
    res = gate.check(report, min_mfu=0.1, min_hfu=0.1, min_efficiency=0.1, baseline=report, max_drop=0.01,
                     max_step_time_increase=0.01, candidate_name="fuzz", baseline_name="fuzz")
    res.to_markdown()
    res.to_json()
    gate.explain(report, report)
    from traceroof.web.app import initial_view

    initial_view(report)


def run_jax_json(data: bytes) -> None:
    _read_file(data, "perfetto_trace.json.gz" if data[:2] == b"\x1f\x8b" else "host.trace.json")


def run_perfetto(data: bytes) -> None:
    _read_file(data, "fuzz.pftrace")


def run_analyze(data: bytes) -> None:
    """Read and analyse (chip given): a damaged trace must still make a report."""
    from traceroof.analysis import analyze
    from traceroof.errors import TraceroofError
    from traceroof.io import read_trace

    f = S.workdir() / ("fuzz-a.json.gz" if data[:2] == b"\x1f\x8b" else "fuzz-a.json")
    f.write_bytes(data)
    try:
        with _decoder_for(data):
            analyze(read_trace(str(f), jobs=1), "h100")
    except TraceroofError as exc:
        check_error(exc, str(f))


def make_event_array(rng: random.Random) -> bytes:
    """A Kineto event array (``[{...}, ...]``: the pieces the decoders hand the native
    scanner), its events mutated as in :func:`make_kineto`, sometimes byte-edited."""
    doc = {"traceEvents": J.kineto_window(rng, rng.choice(S.kineto_docs()))["traceEvents"]}
    d = marshal.loads(marshal.dumps(doc))
    for _ in range(rng.randint(1, 4)):
        rng.choice(J.TREE_MUTATIONS)(rng, d)
    ev = d.get("traceEvents")
    data = J.emit(ev if isinstance(ev, list) else d)
    return J.mutate_bytes(rng, data) if rng.random() < 0.3 else data


def _native() -> Callable[[bytes], None] | None:
    """The target for the native C scanner (:mod:`traceroof.parsers.kineto_native`, its
    entry point ``scan(data) -> Columns | None``, documented never to raise on any input),
    when the module imports and the extension is built. Beyond "no exception", it is checked
    against msgspec: what it accepts, msgspec decodes, with as many events."""
    try:
        from traceroof.parsers import kineto_native as N
    except ImportError:
        return None
    if not getattr(N, "AVAILABLE", False):
        return None
    from traceroof.parsers.kineto_events import EVENTS_DECODER

    def run(data: bytes) -> None:
        cols = N.scan(data)
        if cols is None:
            return
        # a helper's scan absorbed by an owner that saw other strings first decodes to the
        # same strings, column by column
        owner, helper = N.Scanner(), N.Scanner(helper=True)
        owner.scan(b'[{"ph": "X", "name": "owner first", "cat": "x"}]')
        d = helper.scan_raw(data)
        assert d is not None, "kineto_native: a helper did not handle what a scanner handles"
        owner.absorb(helper, [d])
        again = owner.columns(d)
        S, T = cols.scanner.dictionary(), owner.dictionary()
        for f in ("ph", "cat", "name", "pid", "tid"):
            if [S[i] for i in getattr(cols, f)] != [T[i] for i in getattr(again, f)]:
                raise AssertionError(f"kineto_native: the absorbed {f} column differs")
        try:
            n = len(EVENTS_DECODER.decode(data))
        except (ValueError, RecursionError) as exc:  # msgspec.DecodeError is a ValueError
            raise AssertionError(f"kineto_native accepted {cols.n} events that msgspec rejects ({exc})") from exc
        if n != cols.n:
            raise AssertionError(f"kineto_native: {cols.n} events, msgspec {n}")

    return run


def targets() -> dict[str, Target]:
    """Every target, by name (``kineto_native`` only when that module is importable)."""
    from traceroof.errors import TraceroofError

    E = (TraceroofError,)
    out = [
        Target("kineto_decode", 40, make_kineto, run_kineto_decode, (ValueError,),
               "Kineto JSON decoder alone (strict pass, chunks, recovery), in memory"),
        Target("kineto_stream", 20, make_kineto, run_kineto_stream, (ValueError,),
               "Kineto streaming decoder alone, 1 KiB blocks"),
        Target("kineto", 8, make_kineto_any, run_kineto, E, "Kineto reader in memory (read_bytes), tables linked"),
        Target("kineto_file", 5, make_kineto_any, run_kineto_file, E,
               "read_trace on a .json/.json.gz file: sniff, stream, gzip wrappers"),
        Target("tar", 2, make_tar, run_tar, E, "read_trace on a .tar/.tar.gz of Kineto members"),
        Target("tar_shares", 1, make_tar, run_tar_shares, E,
               "a tar's two shares read as the parallel read's processes read them, against one share"),
        Target("piped", 2, make_piped, run_piped, E, "stdin / a FIFO: a Kineto trace, a tar or an XSpace on a stream"),
        Target("protowire", 30, make_small_xplane, run_protowire, (), "protobuf wire walkers alone"),
        Target("xplane_scan", 12, make_small_xplane, run_xplane_scan, (), "XSpace scanner and event decoder"),
        Target("xplane_native", 12, make_small_xplane, run_xplane_native, (),
               "the C event decoder against protobuf, run by run"),
        Target("xplane", 3, make_xplane, run_xplane, E, "XPlane reader (read_bytes), tables built"),
        Target("xplane_file", 1, make_small_xplane, run_xplane_file, E, "read_trace on an .xplane.pb"),
        Target("cache", 1, make_cache, run_cache, E, "a Parquet cache (single or dataset) with a JSON file or a part damaged, or a file deleted"),
        Target("report", 1, make_report, run_report, E, "saved report: load_report, gate, the dashboard's view"),
        Target("jax_json", 2, make_jax_json, run_jax_json, E, "jax trace-viewer / Perfetto JSON export"),
        Target("perfetto", 2, make_perfetto, run_perfetto, E, "Perfetto protobuf trace (rejected clearly)"),
        Target("analyze", 1, make_kineto_any, run_analyze, E, "read_trace + analyze on a damaged Kineto trace"),
    ]
    native = _native()
    if native is not None:
        out.insert(2, Target("kineto_native", 30, make_event_array, native, (),
                             "the native C scanner of Kineto chunks (kineto_native)"))
    return {t.name: t for t in out}
