"""A cut or damaged tar of ranks keeps what can be read and says what was lost (issue 19,
"unbreakable"; the standard: a damaged trace keeps what can be read and says what was lost,
nothing silently dropped).

Before: a tar cut inside a member (a transfer stopped) failed the whole read with exit 4,
and a damaged header in the middle ended tarfile's iteration without a word, so the members
after it were dropped in silence (a ``.tar.gz`` of 8 ranks with 50 bytes overwritten read 4
ranks, no warning). Oracles: the archive as written here (``tarfile``'s own offsets of each
member, its header and data), the undamaged archive's traces (a member read whole equals it),
and one share against several (the processes of ``read_trace(jobs=N)`` say the same as one).
"""

from __future__ import annotations

import gzip
import io
import json
import tarfile
import zlib
from pathlib import Path

import pytest
from conftest import real
from tracegen import Kernel, TraceBuilder

from traceroof import read_trace
from traceroof.cli import main
from traceroof.errors import TraceFormatError
from traceroof.parsers import kineto
from traceroof.parsers import tar as tar_mod


def _rank(r: int) -> bytes:
    """A one-rank Kineto trace (a few hundred KB of JSON: a cut can fall well inside it)."""
    b = TraceBuilder(rank=r, world_size=4)
    for s in range(2):
        b.begin_step(s)
        for k in range(60):
            b.op("aten::mm", [[64, 128], [128, 256]], ["c10::BFloat16", "c10::BFloat16"],
                 [Kernel("sm90_xmma_gemm_bf16", 5_000 + 37 * r + 11 * k)])
        b.end_step()
    return json.dumps(b.to_json(), indent=1).encode()


@pytest.fixture(scope="module")
def plain() -> tuple[bytes, list[tarfile.TarInfo]]:
    """An uncompressed tar of 4 ranks and a README (no trace) after rank 1, and its members
    as tarfile lists them (offsets of each header and its data)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for r in range(4):
            data = _rank(r)
            info = tarfile.TarInfo(f"run/rank-{r}.json")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
            if r == 1:
                info = tarfile.TarInfo("run/README")
                info.size = 2
                tf.addfile(info, io.BytesIO(b"hi"))
    data = buf.getvalue()
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        return data, tf.getmembers()


def _member(members: list[tarfile.TarInfo], r: int) -> tarfile.TarInfo:
    return next(m for m in members if m.name == f"run/rank-{r}.json")


def _gz_cut_at(data: bytes, tar_offset: int) -> bytes:
    """The shortest prefix of ``data`` gzip-compressed whose inflated bytes reach past
    ``tar_offset`` (a ``.tar.gz`` cut there, as a stopped transfer cuts it), found by
    inflating each prefix."""
    gz = gzip.compress(data, compresslevel=1, mtime=0)
    lo, hi = 20, len(gz)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(zlib.decompressobj(31).decompress(gz[:mid])) > tar_offset:
            hi = mid
        else:
            lo = mid + 1
    return gz[:lo]


def _read_all_ways(f: Path) -> tuple[dict[str, int], list[str]]:
    """Each member read (its name: its op count) and the notes, from one share; asserted equal
    to three shares' union (members and notes), and to ``read_trace`` with one process and
    with three (the notes are warnings there, each once)."""
    one, notes = tar_mod.read_share(f, 0, 1)
    got = {n: t.ops.height for n, _, t in one}
    parts = [tar_mod.read_share(f, k, 3) for k in range(3)]
    assert {n: t.ops.height for members, _ in parts for n, _, t in members} == got
    assert sorted(x for _, said in parts for x in said) == sorted(notes)
    for jobs in (1, 3):
        w = read_trace(f, jobs=jobs).meta.warnings
        assert [x for x in w if x in notes] == notes, jobs
    return got, notes


def _whole(plain) -> dict[str, int]:
    """Each rank's op count, read whole from its own bytes (no archive)."""
    return {f"run/rank-{r}.json": kineto.read_bytes(_rank(r), path=f"rank-{r}.json").ops.height for r in range(4)}


@pytest.mark.parametrize("compressed", [False, True])
def test_an_archive_cut_inside_a_member_keeps_the_members_before_it_and_what_it_holds(plain, tmp_path, compressed):
    data, members = plain
    m = _member(members, 2)
    cut = m.offset_data + m.size // 2
    f = tmp_path / ("run.tar.gz" if compressed else "run.tar")
    f.write_bytes(_gz_cut_at(data, cut) if compressed else data[:cut])
    got, notes = _read_all_ways(f)
    whole = _whole(plain)
    assert set(got) == {"run/rank-0.json", "run/rank-1.json", "run/rank-2.json"}
    assert got["run/rank-0.json"] == whole["run/rank-0.json"] and got["run/rank-1.json"] == whole["run/rank-1.json"]
    assert 0 < got["run/rank-2.json"] < whole["run/rank-2.json"]  # its events up to the cut
    [note] = notes
    assert note.startswith(f"{f}: the archive ends or is damaged inside member run/rank-2.json (")
    assert f"of its {m.size:,} bytes: that rank is what could be read of it" in note
    if not compressed:  # every byte before the cut is kept (the bytes are all in the file)
        assert f"after {cut - m.offset_data:,} of its" in note


def test_an_archive_cut_at_a_member_boundary_says_its_end_marker_is_missing(plain, tmp_path):
    data, members = plain
    f = tmp_path / "run.tar"
    f.write_bytes(data[:_member(members, 3).offset])  # before rank 3's header: no end marker
    got, notes = _read_all_ways(f)
    assert set(got) == {f"run/rank-{r}.json" for r in range(3)}
    assert notes == [f"{f}: the archive ends without its end-of-archive marker (it is probably cut there) after "
                     "member run/rank-2.json: the members after it, if any, are lost"]


def test_an_archive_cut_inside_a_header_names_the_place(plain, tmp_path):
    data, members = plain
    at = _member(members, 3).offset
    f = tmp_path / "run.tar"
    f.write_bytes(data[:at + 100])
    got, notes = _read_all_ways(f)
    assert set(got) == {f"run/rank-{r}.json" for r in range(3)}
    assert notes == [f"{f}: the archive is cut inside the header at tar byte {at:,} after member run/rank-2.json: "
                     "the members after it, if any, are lost"]


@pytest.mark.parametrize("compressed", [False, True])
def test_a_damaged_header_in_the_middle_is_no_longer_a_silent_end(plain, tmp_path, compressed):
    data, members = plain
    readme = next(m for m in members if m.name == "run/README")
    bad = bytearray(data)
    bad[readme.offset:readme.offset + 512] = b"\x5a" * 512  # the README's header overwritten
    f = tmp_path / ("run.tar.gz" if compressed else "run.tar")
    f.write_bytes(gzip.compress(bytes(bad), mtime=0) if compressed else bytes(bad))
    got, notes = _read_all_ways(f)
    assert set(got) == {"run/rank-0.json", "run/rank-1.json"}  # (the old read: these two, no word)
    assert notes == [f"{f}: the archive is damaged at tar byte {readme.offset:,} (not a tar header) after member "
                     "run/rank-1.json: the members after it, if any, are lost"]


def test_a_tar_gz_whose_crc_fails_keeps_its_members_and_says_so(plain, tmp_path):
    data, _ = plain
    gz = bytearray(gzip.compress(data, mtime=0))
    gz[-8:-4] = bytes(4)  # the CRC-32 of the trailer (RFC 1952)
    f = tmp_path / "run.tar.gz"
    f.write_bytes(bytes(gz))
    got, notes = _read_all_ways(f)
    assert got == _whole(plain)
    [note] = notes
    assert note.startswith(f"{f}: the archive's compressed stream fails its check at its end (BadGzipFile: CRC check failed")


@pytest.mark.parametrize("compressed", [False, True])
def test_an_undamaged_archive_has_no_note(plain, tmp_path, compressed):
    data, _ = plain
    f = tmp_path / ("run.tar.gz" if compressed else "run.tar")
    f.write_bytes(gzip.compress(data, mtime=0) if compressed else data)
    got, notes = _read_all_ways(f)
    assert got == _whole(plain) and notes == []


def test_the_real_dlrm_archive_has_no_note():
    f = real("param", "et_replay", "tests", "inputs", "dlrm_kineto.tar.gz")
    members, notes = tar_mod.read_share(f, 0, 1)
    assert len(members) == 8 and notes == []


def test_an_archive_cut_before_anything_of_its_first_trace_fails_in_one_line(plain, tmp_path, capsys):
    data, members = plain
    f = tmp_path / "run.tar"
    f.write_bytes(data[:_member(members, 0).offset_data + 1])  # one byte of rank 0: no event
    with pytest.raises(TraceFormatError) as ex:
        read_trace(f, jobs=1)
    assert str(ex.value).startswith(f"{f}: archive: a readable tar archive (the archive ends or is damaged "
                                    "inside member run/rank-0.json")
    with pytest.raises(SystemExit) as ex:
        main(["analyze", str(f), "--chip", "h100", "-q"])
    err = capsys.readouterr().err
    assert ex.value.code == 4 and err.count("\n") == 1 and "nothing of it could be read" in err


def test_the_command_line_reads_a_cut_archive_and_warns(plain, tmp_path, capsys):
    data, members = plain
    m = _member(members, 2)
    f = tmp_path / "run.tar.gz"
    f.write_bytes(_gz_cut_at(data, m.offset_data + m.size // 2))
    out = tmp_path / "r.json"
    main(["analyze", str(f), "--chip", "h100", "--format", "json", "-o", str(out), "-q"])
    report = json.loads(out.read_text())
    assert len(report["trace"]["sources"]) == 3
    assert sum("the archive ends or is damaged inside member run/rank-2.json" in w for w in report["warnings"]) == 1


@pytest.mark.parametrize("compressed", [False, True])
def test_a_zeroed_header_is_no_longer_read_as_the_end(plain, tmp_path, compressed):
    # a block of zeros is tarfile's end-of-archive marker: a zeroed header (a sector wiped)
    # ended the listing there, and the members after it were dropped without a word
    data, members = plain
    m = _member(members, 2)
    bad = bytearray(data)
    bad[m.offset:m.offset + 512] = bytes(512)
    f = tmp_path / ("run.tar.gz" if compressed else "run.tar")
    f.write_bytes(gzip.compress(bytes(bad), mtime=0) if compressed else bytes(bad))
    got, notes = _read_all_ways(f)
    assert set(got) == {"run/rank-0.json", "run/rank-1.json"}
    # the README lies between rank 1 and rank 2: the last member seen
    assert notes == [f"{f}: the archive has a block of zeros at tar byte {m.offset:,} (read as its end) and more "
                     f"data at tar byte {m.offset + 512:,} (a zeroed header, archives joined end to end, or bytes "
                     "appended) after member run/README: the members after it, if any, are lost"]


def test_two_archives_joined_end_to_end_say_the_second_is_not_read(plain, tmp_path):
    data, _ = plain
    f = tmp_path / "run.tar"
    f.write_bytes(data + data)  # ``cat a.tar b.tar``: tarfile reads the first archive alone
    got, notes = _read_all_ways(f)
    assert got == _whole(plain)
    [note] = notes
    assert f"more data at tar byte {len(data):,}" in note and "after member run/rank-3.json" in note


def test_bytes_after_a_tar_gz_are_told_apart_from_damage(plain, tmp_path):
    data, _ = plain
    f = tmp_path / "run.tar.gz"
    f.write_bytes(gzip.compress(data, mtime=0) + b"x")  # its CRC holds: nothing read is damaged
    got, notes = _read_all_ways(f)
    assert got == _whole(plain)
    assert notes == [f"{f}: the archive's compressed stream is followed by bytes that are not gzip data (left unread)"]
