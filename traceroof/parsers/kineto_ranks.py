"""Several ranks in one Kineto file: SGLang's merged traces, split back into ranks by their pid labels.

SGLang's profile merger (``sglang/srt/utils/profile_merger.py``, ``ProfileMerger``) writes the
per-rank traces ``<profile_id>-TP-<t>[-DP-<d>][-PP-<p>][-EP-<e>].trace.json.gz`` into one file
``merged-<profile_id>.trace.json.gz``: every event of every rank, ``M`` events included, gets its
``pid`` rewritten to ``"[TP00-PP01] <original pid>"`` (a label of two-digit coordinates, in the
order TP, DP, PP, EP); ``tid``, ``correlation`` and ``External id`` are left as they were, so
each rank repeats the others' ids. The header keys are the first file's (its
``distributedInfo`` describes only that rank), ``deviceProperties`` the concatenation of all.

Read as one rank, that file shows one process with several devices and links kernels to
another rank's ops through the repeated ids. :func:`split_by_label` splits the raw columns by
label (the label taken off the pid), so the op and host tables are built one rank at a time:
every link (correlation, ``External id``, nesting) stays within its rank.

Rank numbers: the labels sorted by their coordinates (DP, EP, PP, TP: the merger's own file
order) and numbered 0, 1, …; for a full TP × PP grid that is ``pp · tp_size + tp``, the
global rank SGLang gives the process. The label is kept (``TraceMeta.rank_labels``).
"""

from __future__ import annotations

import re

import polars as pl

from ..schema import HOST_SCHEMA, OP_SCHEMA, empty
from ..trace import TraceMeta

#: ``[TP00-PP01] 1234``: the label (group 1) and the original pid (group 2)
RANK_LABEL_PID = r"^\[((?:[A-Za-z]+\d+)(?:-[A-Za-z]+\d+)*)\] (.*)$"
_COORD = re.compile(r"([A-Za-z]+)(\d+)")
#: sort order of the coordinates (the merger's: DP, EP, PP, TP); any other name sorts after
_ORDER = ("DP", "EP", "PP", "TP")


def label_key(label: str) -> tuple[int, ...]:
    """The sort key of a rank label (``"TP01-PP00"`` → ``(0, 0, 0, 1)``): its DP, EP, PP, TP
    coordinates (0 when absent), then any other coordinate in the order written."""
    coords = {k.upper(): int(v) for k, v in _COORD.findall(label)}
    rest = [v for k, v in coords.items() if k not in _ORDER]
    return (*(coords.get(k, 0) for k in _ORDER), *rest)


def label_from_file_name(name: str) -> str | None:
    """The rank label an SGLang per-rank file name spells (``<id>-TP-1-PP-0.trace.json.gz`` →
    ``"TP01-PP00"``, the merger's form), None for a name without ``TP-<n>`` (the merger's own
    test for a per-rank file)."""
    coords = {k: re.search(rf"(?:^|[-_.]){k}-(\d+)", name) for k in ("TP", "DP", "PP", "EP")}
    if coords["TP"] is None:
        return None
    return "-".join(f"{k}{int(m.group(1)):02d}" for k, m in coords.items() if m is not None)


def has_rank_labels(frames: list[pl.DataFrame | None]) -> bool:
    """True when any row of ``frames`` (raw device/host frames, a String ``pid`` column) has a
    labelled pid (:data:`RANK_LABEL_PID`)."""
    for f in frames:
        if f is not None and f.height and "pid" in f.columns:
            pid = f["pid"]
            # a cheap test first: plain pids ("0", "4242") never start with "["
            if bool(pid.str.starts_with("[").any()) and bool(pid.str.contains(RANK_LABEL_PID).any()):
                return True
    return False


def split_by_label(
    dev: pl.DataFrame | None, host: pl.DataFrame | None
) -> tuple[list[tuple[str, pl.DataFrame | None, pl.DataFrame | None]], dict[str, int]]:
    """Split raw frames by the rank label of their pid (the label taken off the pid).

    Args:
        dev, host: the raw frames of one file (:mod:`.kineto_columns`), each with a String
            ``pid``; None when the file has none.

    Returns:
        ``(parts, unlabelled)``: one ``(label, device rows, host rows)`` per label, in
        :func:`label_key` order (a part's frame is None when it has no such rows; ``pid`` is
        the original pid), and per frame (``"device"``, ``"host"``) the number of rows whose
        pid carries no label (not in any part: the caller counts and reports them).
    """
    labels: set[str] = set()
    split: dict[str, dict[str, pl.DataFrame]] = {"device": {}, "host": {}}
    unlabelled = {"device": 0, "host": 0}
    for what, f in (("device", dev), ("host", host)):
        if f is None or not f.height:
            continue
        f = f.with_columns(
            pl.col("pid").str.extract(RANK_LABEL_PID, 1).alias("_label"),
            pl.col("pid").str.extract(RANK_LABEL_PID, 2).alias("_pid"),
        )
        unlabelled[what] = int(f["_label"].is_null().sum())
        f = f.filter(pl.col("_label").is_not_null()).with_columns(pl.col("_pid").alias("pid"))
        for (label,), part in f.group_by("_label", maintain_order=True):
            split[what][str(label)] = part.drop("_label", "_pid")
            labels.add(str(label))
    parts = [(lb, split["device"].get(lb), split["host"].get(lb)) for lb in sorted(labels, key=lambda s: (label_key(s), s))]
    return parts, unlabelled


def build_labelled(
    dev: pl.DataFrame | None, host: pl.DataFrame | None, meta: TraceMeta, path: str, *,
    header_rank: int | None = None,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The op and host tables of a file whose pids carry rank labels, built rank by rank.

    Each label's rows go through :func:`~.kineto_link.build_tables` alone (so links never
    cross ranks) under rank number = its position in :func:`label_key` order. ``meta`` gets
    ``ranks``, ``rank_labels``, ``origin_ns[r]`` per rank (absolute ns of that rank's
    ``start_ns == 0``; ``origin_ns`` is rank 0's), the ranks' integer stats summed, their
    warnings prefixed with the rank, and one warning saying what was done. Rows without a
    label are left out, counted (``unlabelled_events``) and reported.

    Args:
        dev, host: the raw frames of the file (String ``pid``), None when absent.
        meta: the file's metadata, header already read; updated in place.
        path: the file, for messages.
        header_rank: the header's ``distributedInfo.rank`` (the first merged file's only).

    Returns:
        ``(ops, host)``: every rank's rows, rank by rank, each rank's times relative to its own
        origin (as :func:`traceroof.merge.merge` keeps per-rank files).
    """
    from .kineto_link import build_tables

    parts, unlabelled = split_by_label(dev, host)
    del dev, host
    ops_frames, host_frames, origins = [], [], []
    for r, (label, d, h) in enumerate(parts):
        sub = TraceMeta(format=meta.format, sources=list(meta.sources), record_shapes=meta.record_shapes)
        o, ht = build_tables(d, h, sub, rank=r)
        ops_frames.append(o)
        host_frames.append(ht)
        origins.append(sub.origin_ns)
        meta.stats[f"origin_ns[{r}]"] = sub.origin_ns
        for k, v in sub.stats.items():
            if isinstance(v, int):
                meta.stats[k] = meta.stats.get(k, 0) + v
        for w in sub.warnings:
            meta.warn(f"rank {r} [{label}]: {w}")
        meta.rank_labels[r] = label
    meta.ranks = list(range(len(parts)))
    meta.origin_ns = origins[0] if origins else 0
    _dedupe_devices(meta)
    names = ", ".join(f"{r} = {lb}" for r, lb in meta.rank_labels.items())
    meta.warn(
        f"{path}: {len(parts)} ranks merged in one file (SGLang profile merger: pids labelled "
        f"'[TP00] …'), told apart by their labels ({names}); every kernel is linked within its own rank"
        + (f"; the header's distributedInfo (rank {header_rank}) describes only the first file merged"
           if header_rank is not None else "")
    )
    lost = unlabelled["device"] + unlabelled["host"]
    if lost:
        meta.stats["unlabelled_events"] = lost
        meta.warn(
            f"{path}: {unlabelled['device']} device and {unlabelled['host']} host events carry no rank "
            "label in a file whose other pids do: they belong to no rank and were left out"
        )
    ops = pl.concat(ops_frames, how="vertical_relaxed") if ops_frames else empty(OP_SCHEMA)
    host_tbl = pl.concat(host_frames, how="vertical_relaxed") if host_frames else empty(HOST_SCHEMA)
    return ops, host_tbl


def _dedupe_devices(meta: TraceMeta) -> None:
    """The merger concatenates every rank's ``deviceProperties``: keep each (id, name) once."""
    seen: set[tuple[int | None, str]] = set()
    kept = []
    for d in meta.devices:
        if (d.index, d.name) not in seen:
            seen.add((d.index, d.name))
            kept.append(d)
    meta.devices = kept


__all__ = ["RANK_LABEL_PID", "label_key", "label_from_file_name", "has_rank_labels", "split_by_label", "build_labelled"]
