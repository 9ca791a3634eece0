"""A tar of per-rank traces is read as a folder of them is: its members in parallel processes
(``--jobs``), the archive decompressed once (issue 19, item 4: ranks in parallel for real).

Oracles: the same rank files as a folder (read by the folder path, which the tar path must
equal but for the names), ``--jobs 1`` (the archive read in this process), and for the one
pass the byte count of the decompressed stream against the tar's own size (``tarfile``'s
uncompressed archive written here).
"""

from __future__ import annotations

import gzip
import io
import json
import tarfile
import zlib
from pathlib import Path

import pytest
from test_many_ranks import write_ranks
from tracegen import Kernel, TraceBuilder

from traceroof import analyze, read_trace
from traceroof.errors import TraceFormatError
from traceroof.parallel import (
    SMALL_MEMBER_BYTES,
    TAR_GUESS,
    first_member_bytes,
    likely_files,
    tar_processes,
)
from traceroof.parsers import kineto
from traceroof.parsers import tar as tar_mod


def _report(trace) -> dict:
    """The report with its op table, ``created_at`` left out and each input named by its place
    in ``sources`` (a member is named ``ARCHIVE!MEMBER``, a folder's file by its path)."""
    text = analyze(trace, "h100").to_json(include_ops=True)
    for i, name in enumerate(trace.meta.sources):
        text = text.replace(json.dumps(name)[1:-1], f"<input {i}>")
    d = json.loads(text)
    d.pop("created_at", None)
    return d


def tracegen_bytes(rank: int, *, ops: int) -> bytes:
    """A one-rank Kineto trace of ``ops`` matmuls, as JSON bytes."""
    b = TraceBuilder(rank=rank, world_size=8)
    b.begin_step(0)
    for k in range(ops):
        b.op("aten::mm", [[64, 128], [128, 256]], ["c10::BFloat16", "c10::BFloat16"],
             [Kernel("sm90_xmma_gemm_bf16", 5_000 + k)])
    b.end_step()
    return json.dumps(b.to_json()).encode()


def _archive(tmp_path: Path, files: list[Path], name: str, mode: str, *, plain: bool = True) -> Path:
    """``files`` archived in reverse name order (the last rank first), as ``*.json`` members
    when ``plain`` (decompressed here), else as they are (``*.json.gz``), plus a README
    member that is no trace."""
    out = tmp_path / name
    with tarfile.open(out, mode) as tf:
        for f in sorted(files, reverse=True):
            data = gzip.decompress(f.read_bytes()) if plain else f.read_bytes()
            info = tarfile.TarInfo(f"run/{f.name[:-3] if plain else f.name}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        info = tarfile.TarInfo("run/README")
        info.size = 2
        tf.addfile(info, io.BytesIO(b"hi"))
    return out


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> tuple[Path, list[Path]]:
    d = tmp_path_factory.mktemp("ranks")
    return d, write_ranks(d / "run", 4)


@pytest.mark.parametrize("mode,plain,jobs", [("w:gz", True, 2), ("w:gz", True, 3), ("w:gz", False, 3),
                                             ("w", True, 2), ("w", False, 2)])
def test_a_tar_read_in_parallel_equals_the_folder_and_jobs_1(ranks, tmp_path, mode, plain, jobs):
    folder, files = ranks
    archive = _archive(tmp_path, files, "run.tar.gz" if mode == "w:gz" else "run.tar", mode, plain=plain)
    want = _report(read_trace(folder / "run", jobs=1))
    # (2 processes share an uncompressed tar and a compressed one of small .json members, 3
    # a compressed one of .json.gz members: tar_processes)
    two = read_trace(archive, jobs=jobs, prepare=True)
    assert two.prepared is not None  # read by the processes (one reading alone prepares nothing)
    assert two.meta.ranks == [0, 1, 2, 3]
    # the members in name order (rank 0 first), whatever their order in the archive
    suffix = ".json" if plain else ".json.gz"
    assert two.meta.sources == [f"{archive}!run/rank-{r}{suffix}" for r in range(4)]
    assert _report(two) == want
    assert _report(read_trace(archive, jobs=1)) == want


def test_the_shares_split_the_members_once_by_bytes_as_the_headers_come(tmp_path):
    # members of 5, 1, 1, 1, 3, 2 units in archive order, 3 shares; the oracle: each member
    # to the share holding the fewest bytes so far, the lowest on a tie, worked out here
    # from tarfile's own list
    sizes = [5, 1, 1, 1, 3, 2]
    out = tmp_path / "mixed.tar.gz"
    with tarfile.open(out, "w:gz") as tf:
        for i, n in enumerate(sizes):
            b = tracegen_bytes(i, ops=4 * n)
            info = tarfile.TarInfo(f"r/rank-{i}.json")
            info.size = len(b)
            tf.addfile(info, io.BytesIO(b))
    with tarfile.open(out) as tf:
        listed = [m for m in tf.getmembers() if m.name.endswith(".json")]
    held, want = [0, 0, 0], {0: [], 1: [], 2: []}
    for place, m in enumerate(listed):
        to = held.index(min(held))
        held[to] += m.size
        want[to].append((m.name, place))
    got = {k: [(name, place) for name, place, _ in tar_mod.read_share(out, k, 3)[0]] for k in range(3)}
    assert got == want
    assert sum(len(v) for v in got.values()) == len(sizes) and all(got.values())


def _counting_inflate(monkeypatch) -> list[int]:
    """Every byte zlib inflates from here on, counted (tarfile's and gzip's streams both
    inflate through ``zlib.decompressobj``)."""
    total = [0]
    real = zlib.decompressobj

    class Counted:
        def __init__(self, *a, **k):
            self._d = real(*a, **k)

        def decompress(self, data, *a):
            out = self._d.decompress(data, *a)
            total[0] += len(out)
            return out

        def __getattr__(self, name):
            return getattr(self._d, name)

    monkeypatch.setattr(zlib, "decompressobj", Counted)
    return total


@pytest.mark.parametrize("share", [None, 0, 1])
def test_a_tar_gz_is_decompressed_once_whatever_the_order_of_its_members(ranks, tmp_path, monkeypatch, share):
    _, files = ranks
    archive = _archive(tmp_path, files, "run.tar.gz", "w:gz")
    size = len(gzip.decompress(archive.read_bytes()))  # the uncompressed tar's bytes
    total = _counting_inflate(monkeypatch)
    if share is None:
        tar_mod.read(archive)
    else:
        assert len(tar_mod.read_share(archive, share, 2)[0]) == 2
    # one pass: at most the tar itself (the members were written last rank first, so reading
    # them in name order by seeking inflated the archive again from its start for each one)
    assert 0.5 * size < total[0] <= size


def test_a_share_of_an_uncompressed_tar_reads_its_own_members_alone(ranks, tmp_path, monkeypatch):
    _, files = ranks
    archive = _archive(tmp_path, files, "run.tar", "w")
    read = [0]
    real_open = tarfile.bltn_open

    class Counted(io.FileIO):
        def read(self, n=-1):
            b = super().read(n)
            read[0] += len(b)
            return b

        def readinto(self, buf):
            n = super().readinto(buf)
            read[0] += n or 0
            return n

    monkeypatch.setattr(tarfile, "bltn_open", lambda name, mode="rb", *a, **k: Counted(name, "r"))
    got, notes = tar_mod.read_share(archive, 1, 2)
    monkeypatch.setattr(tarfile, "bltn_open", real_open)
    # 4 members of about the same size: share 1 holds 2 of them, and reads their bytes and
    # the headers, not the others'
    assert len(got) == 2 and notes == []
    theirs = sum(m.size for m in tarfile.open(archive).getmembers() if f"{archive}!{m.name}" not in
                 {t.meta.sources[0] for _, _, t in got} and m.name.endswith(".json"))
    assert read[0] <= archive.stat().st_size - theirs


def test_a_member_that_is_no_trace_fails_the_parallel_read_naming_it(ranks, tmp_path):
    _, files = ranks
    bad = tmp_path / "bad.tar.gz"
    with tarfile.open(bad, "w:gz") as tf:
        for f in files[:2]:
            tf.add(f, arcname=f.name)
        info = tarfile.TarInfo("rank-9.json")
        info.size = 9
        tf.addfile(info, io.BytesIO(b"not json!"))
    said = _error_either_way(bad)
    assert f"{bad}!rank-9.json" in said and "\n" not in said


def _error_either_way(archive: Path) -> str:
    """The error reading ``archive`` gives, the same read by one process and by three."""
    said = []
    for jobs in (1, 3):
        with pytest.raises(TraceFormatError) as ex:
            read_trace(archive, jobs=jobs)
        said.append(str(ex.value))
    assert said[0] == said[1]
    return said[0]


def test_an_archive_without_a_trace_is_the_same_error_read_either_way(tmp_path):
    out = tmp_path / "none.tar.gz"
    with tarfile.open(out, "w:gz") as tf:
        info = tarfile.TarInfo("README")
        info.size = 2
        tf.addfile(info, io.BytesIO(b"hi"))
    assert "a tar holding *.json or *.json.gz Kineto traces" in _error_either_way(out)


def test_a_compressed_tar_is_shared_from_three_processes_or_two_for_small_json_members():
    assert [tar_processes(j, compressed=False) for j in (1, 2, 3, 8)] == [1, 2, 3, 8]
    assert [tar_processes(j, compressed=True) for j in (1, 2, 3, 8)] == [1, 1, 3, 8]
    small, big = SMALL_MEMBER_BYTES - 1, SMALL_MEMBER_BYTES
    assert [tar_processes(j, True, small) for j in (1, 2, 3, 8)] == [1, 2, 3, 8]
    assert [tar_processes(j, True, big) for j in (1, 2, 3, 8)] == [1, 1, 3, 8]
    # the line is the Kineto reader's: below it a member is decoded by msgspec in one thread
    assert SMALL_MEMBER_BYTES == kineto.NATIVE_MIN_BYTES


def _tar_of(out: Path, members: list[tuple[str, bytes]], mode: str = "w:gz") -> Path:
    with tarfile.open(out, mode) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if name.endswith("/"):
                info.type = tarfile.DIRTYPE
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return out


def test_the_first_member_is_found_from_the_headers(tmp_path):
    rank = tracegen_bytes(0, ops=2)
    # a folder entry and a file that is no trace before it: passed over (the dlrm archive
    # starts with its folder)
    f = _tar_of(tmp_path / "a.tar.gz", [("run/", b""), ("run/README", b"hi"), ("run/rank-0.json", rank)])
    assert first_member_bytes(f) == len(rank)
    assert first_member_bytes(_tar_of(tmp_path / "b.tar", [("rank-0.json", rank)], "w")) == len(rank)
    # a gzipped member: its decompressed size is not in the header (None: not known small)
    assert first_member_bytes(_tar_of(tmp_path / "c.tar.gz", [("r.json.gz", gzip.compress(rank))])) is None
    # no trace member in the first MiB: not looked for further
    assert first_member_bytes(_tar_of(tmp_path / "d.tar.gz", [("big.bin", bytes(2 << 20)), ("r.json", rank)])) is None
    cut = tmp_path / "e.tar.gz"
    cut.write_bytes(f.read_bytes()[:60])  # its first headers cut: None, the read says what is wrong
    assert first_member_bytes(cut) is None
    assert first_member_bytes(tmp_path / "missing.tar") is None


def test_with_two_processes_a_tar_gz_of_json_gz_members_is_read_by_one(ranks, tmp_path):
    _, files = ranks
    t = read_trace(_archive(tmp_path, files, "run.tar.gz", "w:gz", plain=False), jobs=2, prepare=True)
    assert t.prepared is None and t.meta.ranks == [0, 1, 2, 3]


def test_a_tar_of_big_json_members_is_read_by_one_of_two_processes(tmp_path):
    big = b'{"traceEvents": []' + b" " * SMALL_MEMBER_BYTES + b"}"
    f = _tar_of(tmp_path / "big.tar.gz", [("rank-0.json", big)])
    assert first_member_bytes(f) == len(big) and likely_files([str(f)], 2) == 1


def test_a_tar_is_guessed_to_hold_several_files_for_the_early_workers(tmp_path):
    names = ("a.tar", "b.tar.gz", "c.tgz", "d.json.gz")
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    assert [likely_files([str(tmp_path / n)], 2) for n in names] == [TAR_GUESS, 1, 1, 1]
    assert [likely_files([str(tmp_path / n)], 3) for n in names] == [TAR_GUESS, TAR_GUESS, TAR_GUESS, 1]
    small = _tar_of(tmp_path / "small.tar.gz", [("rank-0.json", tracegen_bytes(0, ops=2))])
    assert likely_files([str(small)], 2) == TAR_GUESS and likely_files([str(small)], 1) == 1
