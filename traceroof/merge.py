"""Merging per-rank traces into one :class:`Trace` (ordered by rank, ranks renumbered when seen twice).

Below :mod:`traceroof.io` and :mod:`traceroof.cache`: both the readers (a folder of per-rank
files, a tar) and the cache's dataset reader merge through it, so their results agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import polars as pl

from .errors import InputNotFoundError, MixedInputsError
from .trace import Trace, TraceMeta


def event_count(t: Trace) -> int:
    """The trace events a reader decoded for ``t`` (``meta.stats['events']``; 0 when not counted)."""
    return int(t.meta.stats.get("events", 0) or 0)


def _rank_key(m: TraceMeta, i: int) -> tuple[Any, ...]:
    return (min(m.ranks) if m.ranks else i, list(m.sources), i)


def _label(m: TraceMeta, i: int) -> str:
    return m.sources[0] if m.sources else f"trace {i}"


def _device_names(m: TraceMeta) -> tuple[str, ...]:
    return tuple(sorted({d.name for d in m.devices if d.name}))


def check_mergeable(metas: Sequence[TraceMeta]) -> None:
    """Raise unless ``metas`` can be merged as the per-rank traces of one job: one format,
    and the same device names wherever a trace names its devices (a trace naming none is
    not compared). Never merges traces of different chips under one chip's peaks.

    Raises:
        MixedInputsError: two inputs differ in format or device names (exit code 4); the
            message names both inputs, what differs, and asks to analyze them one at a time.
    """
    for i, m in enumerate(metas[1:], start=1):
        a, b = metas[0], m
        what = None
        if a.format != b.format:
            what = f"format {a.format} vs {b.format}"
        elif _device_names(a) and _device_names(b) and _device_names(a) != _device_names(b):
            what = f"device {', '.join(_device_names(a))!r} vs {', '.join(_device_names(b))!r}"
        if what:
            raise MixedInputsError(
                f"{_label(a, 0)} and {_label(b, i)} are not traces of one job ({what}): "
                "they are not merged; analyze them one at a time (one traceroof analyze each) "
                "and compare the reports"
            )


def merge_meta(metas: Sequence[TraceMeta]) -> tuple[TraceMeta, list[int], list[dict[int, int]]]:
    """The metadata half of :func:`merge`, without the tables.

    Returns the merged :class:`TraceMeta`, the order the inputs are concatenated in (indices
    into ``metas``: by first rank, then sources), and for each input the renumbering of its
    ranks (``{old: new}``, empty when none of its ranks was seen before). The cache's dataset
    reader and ``finalize`` use it so that their metadata is exactly what :func:`merge` gives.

    Raises:
        InputNotFoundError: ``metas`` is empty.
        MixedInputsError: the inputs differ in format or device (:func:`check_mergeable`).
    """
    if not metas:
        raise InputNotFoundError("no traces to merge")
    check_mergeable(metas)
    order = sorted(range(len(metas)), key=lambda i: _rank_key(metas[i], i))
    first = metas[order[0]]
    meta = TraceMeta(format=first.format)
    declared = {r for m in metas for r in m.ranks}
    seen_ranks: set[int] = set()
    remaps: list[dict[int, int]] = [{} for _ in metas]
    for i in order:
        m = metas[i]
        ranks = list(m.ranks) or [i]
        remap = remaps[i]
        for r in ranks:
            if r in seen_ranks:
                new = max(declared | seen_ranks) + 1
                meta.warn(f"{_label(m, i)}: rank {r} already seen; renumbered as rank {new}")
                remap[r] = new
                r = new
            seen_ranks.add(r)
        meta.sources.extend(m.sources)
        for r, lb in m.rank_labels.items():
            meta.rank_labels[remap.get(r, r)] = lb
        if len(ranks) == 1:
            meta.stats[f"origin_ns[{remap.get(ranks[0], ranks[0])}]"] = m.origin_ns
        for k, v in m.stats.items():
            if isinstance(v, int):
                meta.stats[k] = meta.stats.get(k, 0) + v
        for w in m.warnings:
            meta.warn(w)
        if not meta.devices:
            meta.devices = m.devices
        meta.world_size = meta.world_size or m.world_size
        meta.versions.update(m.versions)
        meta.synthetic = meta.synthetic or m.synthetic
        if meta.base_time_ns is None:
            meta.base_time_ns = m.base_time_ns
        meta.record_shapes = meta.record_shapes or m.record_shapes
    meta.ranks = sorted(seen_ranks)
    meta.origin_ns = first.origin_ns
    return meta, order, remaps


def renumber(df: pl.DataFrame, remap: dict[int, int], ranks: Sequence[int]) -> pl.DataFrame:
    """Apply a :func:`merge_meta` renumbering to a table's ``rank`` column."""
    if not remap:
        return df
    if len(ranks) <= 1:
        # a one-rank trace: every row gets the new rank (rows without a rank too)
        return df.with_columns(pl.lit(next(iter(remap.values())), dtype=pl.Int32).alias("rank"))
    return df.with_columns(pl.col("rank").replace(remap).cast(pl.Int32))


def merge(traces: list[Trace]) -> Trace:
    """Concatenate per-rank traces into one, ordered by rank (ranks must differ; times stay per-rank).

    The result does not depend on the order of ``traces``: they are sorted by (first rank,
    sources). A rank seen twice is renumbered past the largest rank present (a warning says
    so). Each rank keeps its own time origin (``start_ns`` relative to its first event); the
    per-rank absolute origins are in ``meta.stats['origin_ns[rank]']``; integer stats add up.
    One trace is returned as it is.

    Raises:
        InputNotFoundError: ``traces`` is empty.
        MixedInputsError: the traces differ in format or device (:func:`check_mergeable`):
            traces of different chips are never costed under one chip's peaks.
    """
    if len(traces) == 1:
        return traces[0]
    meta, order, remaps = merge_meta([t.meta for t in traces])
    ops_frames = [renumber(traces[i].ops, remaps[i], traces[i].meta.ranks) for i in order]
    host_frames = [renumber(traces[i].host, remaps[i], traces[i].meta.ranks) for i in order]
    return Trace(
        ops=pl.concat(ops_frames, how="vertical_relaxed"),
        host=pl.concat(host_frames, how="vertical_relaxed"),
        meta=meta,
    )


__all__ = ["check_mergeable", "event_count", "merge", "merge_meta", "renumber"]
