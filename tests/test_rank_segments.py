"""The timeline partition, the step tables and the speed of light's sums done per rank by the
processes that read the ranks (issue 19 item 4, session 11: ``traceroof.steps.segment_rank``
in ``traceroof.rank_prep``; the parent joins them, ``traceroof.steps.join_segments``).

The oracle is the analysis segmenting the merged trace itself (``read_trace(...,
prepare=False)``: the path of a single file holding every rank): the report must be equal
whole, and ``--jobs 1`` must equal ``--jobs 2``. The ranks here differ in what the partition
says about them (steps per rank, a partial last step on one rank, ops outside the recording on
two), so a join that lost a rank's rows, kept the first rank's, or said a warning per rank
instead of once for all would differ; the figures are counted by hand from the layout. A spy on
``steps.join_segments`` (the parent's join, fixture ``joined``) says which path each analysis
took: one part per rank (the readers' segmentations) or one (the whole table).

The partition decides one input over the whole table (whether it has a step marker at all,
``steps.segments_agree``): the last test mixes ranks whose markers are of every kind (host and
device, host only, device only, none, a rank without device ops) and compares folder
``--jobs 1``, ``--jobs 2``, the same files in a tar and the whole table on every field.

The readers segment only when at least ``io.SEGMENT_MIN_PROCESSES`` processes share the
reading (session 13: with two the merged table's one segmentation is cheaper); these tests
lower it to two (fixture ``readers_segment_from_two``), so that ``--jobs 2`` takes the per-rank
path, except the last, which checks the default.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from make_multirank import OPS, write_doc
from test_rank_prep import cli_json, report_json
from tracegen import Kernel, TraceBuilder

from traceroof import io, read_trace
from traceroof.rank_prep import Prepared

#: steps per rank (rank r issues 3 + r ops per step, :data:`make_multirank.OPS`)
STEPS = {0: 2, 1: 3, 2: 4}
#: ranks with one warm-up kernel (5 µs, no launch) before their recording window
STRAY = (0, 2)
STRAY_NS = 5_000


def _rank_doc(r: int) -> dict:
    b = TraceBuilder(pid=5000 + r, tid=5000 + r, rank=r)
    b.host_t = 1_000_000  # the recording window opens at 0.5 ms, the steps start at 1 ms
    for s in range(STEPS[r]):
        b.begin_step(s)
        for i in range(3 + r):
            name, dims, types, kname, dur = OPS[i % len(OPS)]
            b.op(name, dims, types, [Kernel(kname, dur)])
        b.end_step()
    b.recording_window(500_000, b.host_t + 1_000_000)
    if r in STRAY:
        b.stray_kernel("warmup_kernel", 100_000, STRAY_NS)  # launched (started) before the window
    doc = b.to_json()
    if r == 1:  # the last step's last kernel lost: its launch has no device op (a partial step)
        last = max(i for i, e in enumerate(doc["traceEvents"]) if e.get("cat") == "kernel")
        del doc["traceEvents"][last]
    return doc


#: ``io.SEGMENT_MIN_PROCESSES`` as the module sets it
DEFAULT_SEGMENT_MIN = io.SEGMENT_MIN_PROCESSES


@pytest.fixture(autouse=True)
def readers_segment_from_two(monkeypatch) -> None:
    """``--jobs 2`` segments in the readers (the path under test), whatever the default."""
    monkeypatch.setattr(io, "SEGMENT_MIN_PROCESSES", 2)


@pytest.fixture
def joined(monkeypatch) -> list[int]:
    """How many parts each segmentation the parent joined had (``steps.join_segments``, which
    only the analysis calls): one per rank when the readers' per-rank segmentations were
    used, one when the parent segmented the whole table itself."""
    from traceroof import steps

    seen: list[int] = []
    real = steps.join_segments

    def spy(ops, parts, meta, step):
        seen.append(len(parts))
        return real(ops, parts, meta, step)

    monkeypatch.setattr(steps, "join_segments", spy)
    return seen


@pytest.fixture(scope="module")
def ranks_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("segments") / "run"
    d.mkdir()
    for r in STEPS:
        write_doc(_rank_doc(r), d / f"rank-{r}.json.gz")
    return d


def test_ranks_segmented_apart_give_the_report_of_the_merged_trace(ranks_dir, joined):
    prepared = read_trace(ranks_dir, jobs=2, prepare=True, chip="h100")
    assert isinstance(prepared.prepared, Prepared)
    # the segmentation was done per rank, by the readers: one part per rank, in rank order
    parts = prepared.prepared.segments
    assert [p.steps.steps["rank"].unique().to_list() for p in parts] == [[0], [1], [2]]
    fresh = read_trace(ranks_dir, jobs=1)
    assert fresh.prepared is None
    want = report_json(fresh)
    assert joined == [1]  # the whole table, segmented by the parent
    assert report_json(prepared) == want
    one = cli_json(ranks_dir, 1)
    assert cli_json(ranks_dir, 2) == one
    assert one == want
    # the readers' per-rank segmentations, joined; with --jobs 1 (one process reads every
    # rank) the readers do not segment: the parent segments the merged table once
    assert joined == [1, 3, 1, 3]
    # by hand: 2 + 3 + 4 step rows, each rank's own count; only rank 1's last step is partial
    steps = [(s["rank"], s["step"], s["partial"]) for s in want["steps"]]
    assert [(r, st) for r, st, _ in steps] == [(r, s) for r in STEPS for s in range(STEPS[r])]
    assert [(r, st) for r, st, p in steps if p] == [(1, 2)]
    partial = [w for w in want["warnings"] if "is partial" in w]
    assert partial == ["rank 1 step 2 is partial (1 launches without a device op in the trace window): "
                       "it is excluded from per-step averages"]
    # the ops outside the recording of ranks 0 and 2 are said once, counted together
    outside = [w for w in want["warnings"] if "outside the recorded timeline" in w]
    assert len(outside) == 1 and outside[0].startswith("2 device ops (10 µs of device time)"), outside
    assert want["trace"]["stats"]["ops_outside_recording"] == 2
    buckets = {(b["rank"], b["bucket"]): b["ops"] for b in want["summary"]["timeline"]["buckets"]}
    assert [r for (r, b) in buckets if b == "outside_recording"] == list(STRAY)


def test_the_per_rank_sums_of_the_speed_of_light_are_the_merged_ones(ranks_dir, joined):
    prepared = read_trace(ranks_dir, jobs=2, prepare=True, chip="h100")
    fresh = read_trace(ranks_dir, jobs=1)
    a, b = report_json(prepared), report_json(fresh)
    assert joined == [3, 1]
    assert a["speed_of_light"] == b["speed_of_light"] and a["speed_of_light"] is not None
    # every rank's complete steps are in it: 2 + 2 (rank 1's last is partial) + 4
    assert a["speed_of_light"]["device_steps"] == 2 + 2 + 4


def test_another_chip_than_the_workers_makes_the_parent_segment(ranks_dir, joined):
    # segmented under h100's roofline by the readers, analysed under a100's: not used
    from traceroof import analyze
    from traceroof.rank_prep import segments_of

    t = read_trace(ranks_dir, jobs=2, prepare=True, chip="h100")
    from traceroof.chips import get_chip

    assert segments_of(t, get_chip("a100"), None, t.ops) is None
    assert segments_of(t, get_chip("h100"), 0, t.ops) is None  # --rank: the parent segments its rank
    fresh = read_trace(ranks_dir, jobs=1)
    assert json.loads(analyze(t, "a100").to_json(include_ops=True)).get("steps") == \
        json.loads(analyze(fresh, "a100").to_json(include_ops=True)).get("steps")
    assert joined == [1, 1]


# --------------------------------------------------------------------------- ranks that differ in their markers


def _marked_doc(r: int, kind: str) -> dict:
    """Rank ``r`` with step markers of ``kind``: ``both`` (host- and device-side), ``host``
    (host-side only), ``device`` (device-side only), ``none`` (no marker: its ops launched in
    no step), ``nodev`` (both, but no device op: every kernel lost). Steps start at ``10 * r``
    (each rank numbers its own)."""
    b = TraceBuilder(pid=5000 + r, tid=5000 + r, rank=r, device_markers=kind in ("both", "device", "nodev"))
    b.host_t = 1_000_000
    for s in range(2):
        if kind != "none":
            b.begin_step(10 * r + s)
        for i in range(3):
            name, dims, types, kname, dur = OPS[(i + r) % len(OPS)]
            b.op(name, dims, types, [Kernel(kname, dur)])
        if kind != "none":
            b.end_step()
    b.recording_window(500_000, b.host_t + 1_000_000)
    doc = b.to_json()
    drop = {"device": ("user_annotation",), "nodev": ("kernel", "gpu_user_annotation")}.get(kind, ())
    doc["traceEvents"] = [e for e in doc["traceEvents"]
                          if not (e.get("cat") in drop and (e.get("cat") != "user_annotation"
                                                             or str(e.get("name")).startswith("ProfilerStep")))]
    return doc


def _folder(root: Path, kinds: dict[int, str]) -> tuple[Path, Path]:
    """The ranks ``kinds`` as a folder of per-rank files, and the same files in one tar."""
    import tarfile

    d = root / "run"
    d.mkdir()
    for r, kind in kinds.items():
        write_doc(_marked_doc(r, kind), d / f"rank-{r}.json.gz")
    tar = root / "run.tar.gz"
    with tarfile.open(tar, "w:gz") as tf:
        for r in kinds:
            tf.add(d / f"rank-{r}.json.gz", arcname=f"rank-{r}.json.gz")
    return d, tar


def _as_folder(report: dict, tar: Path, folder: Path) -> dict:
    """A report of the tar with its members named as the folder's files."""
    return json.loads(json.dumps(report).replace(f"{tar}!", f"{folder}/"))


@pytest.mark.parametrize("kinds, per_rank", [
    # markers of every kind, and a rank without device ops: each rank's own decides alone
    ({0: "both", 1: "host", 2: "device", 3: "nodev"}, True),
    # a rank without markers beside ranks with some (main, 7e884c2: its time is before the
    # first step; segmented alone it was one unsegmented step, complete): the parent segments
    ({0: "both", 1: "none", 2: "host", 3: "nodev"}, False),
    ({0: "none", 1: "nodev"}, False),  # the only markers are on a rank without device ops
    ({0: "none", 1: "none"}, True),  # no markers at all: one unsegmented step per rank
])
def test_ranks_with_other_markers_give_the_report_of_the_merged_trace(tmp_path, joined, kinds, per_rank):
    folder, tar = _folder(tmp_path, kinds)
    want = report_json(read_trace(folder, jobs=1))  # the whole table, segmented at once
    assert joined == [1]
    assert _as_folder(report_json(read_trace(tar)), tar, folder) == want
    assert _as_folder(cli_json(tar, 1), tar, folder) == want
    assert cli_json(folder, 1) == want
    assert cli_json(folder, 2) == want
    # the readers' per-rank segmentations joined only where they are the whole table's
    assert joined == [1, 1, 1, 1] + [len(kinds) if per_rank else 1]
    # by hand: a rank with markers has its own two steps; one without is before the first
    # step when another rank has markers, else one unsegmented step
    any_marks = any(k != "none" for k in kinds.values())
    steps = [(s["rank"], s["step"]) for s in want["steps"]]
    assert steps == [(r, st) for r, k in kinds.items() if k not in ("none", "nodev") for st in (10 * r, 10 * r + 1)] + \
        ([] if any_marks else [(r, None) for r in kinds])
    buckets = {(b["rank"], b["bucket"]) for b in want["summary"]["timeline"]["buckets"]}
    for r, k in kinds.items():
        if k == "none":
            assert {b for rr, b in buckets if rr == r} == ({"before_first_step"} if any_marks else {"step"})


def test_one_reading_process_leaves_the_segmentation_to_the_parent(ranks_dir):
    # with --jobs 1 every rank is read here: segmenting them one by one would be the merged
    # table's segmentation again, rank by rank (more queries, the same result), so the
    # readers leave it to analyze; with two processes they segment (the parts are used)
    one = read_trace(ranks_dir, jobs=1, prepare=True, chip="h100")
    two = read_trace(ranks_dir, jobs=2, prepare=True, chip="h100")
    assert isinstance(one.prepared, Prepared) and one.prepared.segments == ()
    assert len(two.prepared.segments) == len(STEPS)
    assert report_json(one) == report_json(two)


def test_the_readers_segment_from_three_processes(ranks_dir, joined, monkeypatch):
    # with two processes a rank segmented alone (~93 small queries, mostly fixed cost) costs
    # the readers more than the merged table's one segmentation costs the parent: the readers
    # segment only from three (docs/performance.md, "Ranks in parallel: where `--jobs 2`
    # costs more than half of `--jobs 1` (session 13)")
    monkeypatch.setattr(io, "SEGMENT_MIN_PROCESSES", DEFAULT_SEGMENT_MIN)
    assert DEFAULT_SEGMENT_MIN == 3
    two = read_trace(ranks_dir, jobs=2, prepare=True, chip="h100")
    three = read_trace(ranks_dir, jobs=3, prepare=True, chip="h100")
    assert isinstance(two.prepared, Prepared) and two.prepared.segments == ()
    assert [p.steps.steps["rank"].unique().to_list() for p in three.prepared.segments] == [[0], [1], [2]]
    want = report_json(read_trace(ranks_dir, jobs=1))
    assert report_json(two) == want and report_json(three) == want
    assert joined == [1, 1, 3]  # the whole tables of jobs 1 and 2 segmented by the parent; three's ranks joined
