"""The per-rank half of the analysis, done by the processes that read the ranks.

A folder of per-rank files is read in ``--jobs`` processes (:func:`traceroof.io.read_trace`).
Two analysis stages are per rank and were the largest part of the work the parent did
alone after the merge: the eager match of the kernels without a launch in the trace
(:mod:`traceroof.unlaunched`: it pairs runs of kernels on one rank with eager runs of the same
rank) and the costing (:mod:`traceroof.costing`: an op is costed from its own rank's host
rows; :meth:`~traceroof.costing.Coverage.merge` adds the coverages of disjoint ranks
exactly). :func:`prepare` does both in the process that read the file, and sends back only
what the merged analysis needs besides the trace itself: the lent ``op`` / ``external_id``
of the matched kernels, the host rows to cost them by, the cost columns and the coverage.
:func:`merge_prepared` puts the ranks' results together in the merge's order, and
:func:`replays_of` / :func:`costs_of` hand them to :func:`traceroof.analysis.analyze`, which
then skips those two stages. The report is the same as when the parent does them: the
tests compare ``--jobs 1`` with ``--jobs 2`` and both with a merged trace analysed afresh.

**When it is not used** (the parent does the stages on the merged trace, as before; the
result is the same, only slower): a file that holds several ranks, or whose ops carry
another rank than its own; any CUDA/HIP graph replay (``graph`` kernels: their attribution
looks across ranks and at capture traces); a rank whose world size differs from the merged
trace's (collectives' group size); a trace whose tables were replaced after reading
(:class:`~traceroof.trace.Trace` drops ``prepared`` then). The segmentation alone
(:func:`segments_of`) is also not used when a rank decided alone what the merged table
decides otherwise (:func:`traceroof.steps.segments_agree`: a rank without step markers
beside ranks with some).

**Cost-group ids.** The eager match gives every matched op instance a negative External id
(:class:`~traceroof.graph_replay.Lending`), counting down from below the smallest id of the
table, run after run, rank after rank (rank order). A rank matched alone counts down from
below its own smallest id; :func:`merge_prepared` shifts each rank's ids to where the merged
table's count would have put them, so the op table is the same to the id.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

import polars as pl

from .chip_table import ChipSpec
from .merge import merge_meta, renumber
from .sections import UnlaunchedInfo
from .trace import StoredCosts, Trace

if TYPE_CHECKING:  # the segmentation's modules are imported where a rank is segmented
    from .steps import RankSegments

ChipArg = Union[str, os.PathLike, ChipSpec, None]


@dataclass(frozen=True)
class Prepared:
    """What the workers did for the analysis of one trace (one rank, or the merge of such).

    Attributes:
        lent: the ``op`` and ``external_id`` columns of the op table once the eager match
            (:func:`traceroof.unlaunched.attribute`) set them on the matched kernels; same
            rows and order as ``trace.ops`` (all a worker sends back of the op table: the
            trace carries the rest).
        ops: ``trace.ops`` with ``lent`` written in; None in what a worker sends back
            (:func:`merge_prepared` fills it in the parent).
        shape_rows: the host rows (HOST_SCHEMA) under the matched instances' negative ids,
            for the costing only.
        unlaunched: the eager match's :class:`~traceroof.sections.UnlaunchedInfo`; None
            when no kernel lacks a launch.
        costs: the costs of ``ops`` (:func:`traceroof.costing.apply_costs` with
            ``shape_rows``), as :class:`~traceroof.trace.StoredCosts`.
        world_size: the world size the costing used (``meta.world_size``), None if unknown.
        base_id: the first id the eager match gave (below the table's smallest id and 0).
        lent_ids: how many ids it gave.
        chip: which chip the segmentation's roofline used (:func:`prepare`'s ``chip``, or the
            one the rank's devices name), as :func:`chip_id` words it (a spec itself does not
            pickle); None when it could not be resolved (then no ``segments``).
        segments: the segmentation of the costed op table under ``chip``'s roofline
            (:func:`traceroof.steps.segment_rank`), one per rank in the merge's order;
            empty when not done, or when they are not the merged table's
            (:func:`_merged_segments`).
    """

    lent: pl.DataFrame
    ops: pl.DataFrame | None
    shape_rows: pl.DataFrame
    unlaunched: UnlaunchedInfo | None
    costs: StoredCosts
    world_size: int | None
    base_id: int
    lent_ids: int
    chip: str | None = None
    segments: tuple[RankSegments, ...] = ()


def _base_id(ops: pl.DataFrame) -> int:
    """The first negative id the eager match gives ``ops`` (``unlaunched.attribute``: below
    the smallest External id and below 0)."""
    ext = ops["external_id"].min() if ops.height else None
    return min(int(ext) if ext is not None else 0, 0) - 1  # type: ignore[arg-type]


def preparable(trace: Trace) -> bool:
    """Whether :func:`prepare` can do this trace's per-rank stages alone: one rank (its
    ``meta.ranks`` one rank, every op of that rank) and no CUDA/HIP graph replay."""
    ranks = trace.meta.ranks
    if len(ranks) != 1:
        return False
    ops = trace.ops
    if ops.height and (ops["rank"].null_count() or ops["rank"].n_unique() != 1 or int(ops["rank"][0]) != ranks[0]):
        return False
    return not bool(ops["graph"].fill_null(False).any()) if ops.height else True


def prepare(trace: Trace, chip: ChipArg = None, *, segment: bool = True) -> Prepared | None:
    """The per-rank stages of one rank's trace (module docstring); None when it is not
    :func:`preparable`, or when a stage fails: never raises, so that a reader's errors and
    the merge's checks (:class:`~traceroof.errors.MixedInputsError`) come first, as without
    it; the parent then runs the stage itself, and raises what it raises there. ``chip``:
    the analysis's (a name, a TOML path, a spec; None: the rank's devices say), for the
    segmentation (:func:`_segment`), which needs the roofline's ``bound``; ``segment=False``:
    no segmentation (the parent segments the merged table)."""
    if not preparable(trace):
        return None
    from .frames import engine_for

    try:
        # the polars engine analyze picks for a table this size (a rank is small: in-memory)
        with engine_for(trace.ops.height + trace.host.height):
            p = _prepare(trace)
            return _segment(p, trace, chip) if segment else p
    except Exception:  # noqa: BLE001 - the parent redoes the stage and reports its error
        return None


def _resolve(trace: Trace, chip: ChipArg) -> ChipSpec | None:
    """The chip ``analysis.resolve_chip`` would take for this rank alone: ``chip`` when given,
    else the one its devices name; None when that fails (the parent then segments itself,
    and says why the chip is unknown)."""
    from .chip_table import get_chip

    try:
        if chip is not None:
            return get_chip(chip)
        if not trace.meta.devices:
            return None
        from .chip_detect import detect_chip
        from .parsers.registry import facts_for

        return detect_chip(trace.meta.devices, allow_property_match=facts_for(trace.meta.format).chip_from_properties)[0]
    except Exception:  # noqa: BLE001 - unknown here: the parent's resolve_chip raises what it raises
        return None


def _segment(p: Prepared, trace: Trace, chip: ChipArg) -> Prepared:
    """``p`` with the segmentation of the rank (:func:`traceroof.steps.segment_rank`) of its
    costed op table under the roofline of ``chip`` (:func:`_resolve`), as
    :func:`traceroof.analysis.analyze` builds that table (``cost_ops``, ``apply_roofline``)."""
    spec = _resolve(trace, chip)
    if spec is None:
        return p
    from .costing import apply_costs_to
    from .roofline import add_roofline
    from .steps import segment_rank

    ops = _with_lent(trace.ops, p.lent)
    costed, _ = apply_costs_to(ops, trace.host, trace.meta, p.costs, p.shape_rows)
    seg = segment_rank(add_roofline(costed, spec), trace.host, trace.meta)
    return dataclasses.replace(p, chip=chip_id(spec), segments=(seg,))


def chip_id(spec: ChipSpec) -> str:
    """What tells two chip specs apart (every field, as ``repr`` writes it): the segmentation
    a worker did is used only under the chip the analysis resolves."""
    return repr(spec)


def _prepare(trace: Trace) -> Prepared:
    from . import graph_replay, unlaunched
    from .costing import COST_COLUMNS, apply_costs, cost_model_id

    # no graph kernel: graph_replay.attribute gives the table back as it is (capture traces
    # are never read), and the eager match is the rank's own
    replays = unlaunched.attribute(graph_replay.attribute(trace.ops, trace.host, list(trace.meta.sources), []),
                                   trace.host)
    # as analysis.cost_ops costs them: with the lent ops' host rows when some were lent
    costed_trace = (Trace(ops=replays.ops, host=pl.concat([trace.host, replays.shape_rows]), meta=trace.meta)
                    if replays.changed else trace)
    costed, coverage = apply_costs(costed_trace)
    base = _base_id(trace.ops)
    lent = replays.ops.filter(pl.col("external_id") <= base)["external_id"]
    n_lent = base - int(lent.min()) + 1 if lent.len() else 0  # type: ignore[arg-type]
    return Prepared(
        lent=replays.ops.select("op", "external_id").rechunk(), ops=None,
        shape_rows=replays.shape_rows.rechunk(), unlaunched=replays.unlaunched,
        costs=StoredCosts(model_id=cost_model_id(), columns=costed.select(COST_COLUMNS).rechunk(),
                          coverage=coverage.to_json()),
        world_size=trace.meta.world_size, base_id=base, lent_ids=n_lent,
    )


def _with_lent(ops: pl.DataFrame, lent: pl.DataFrame) -> pl.DataFrame:
    """``ops`` with the eager match's ``op`` and ``external_id`` (:attr:`Prepared.lent`)."""
    return ops.with_columns(lent.get_columns())


def _shift_ids(df: pl.DataFrame, base: int, new_base: int) -> pl.DataFrame:
    """``external_id`` ≤ ``base`` (the lent ids) moved to count down from ``new_base``."""
    if base == new_base or not df.height:
        return df
    ext = pl.col("external_id")
    return df.with_columns(pl.when(ext <= base).then(ext + (new_base - base)).otherwise(ext).alias("external_id"))


def _merge_unlaunched(infos: list[UnlaunchedInfo | None]) -> UnlaunchedInfo | None:
    """The eager match's summary of the merged table: counts and times add up; the method is
    ``eager_match`` when any kernel was matched (as one match over all ranks says)."""
    have = [i for i in infos if i is not None]
    if not have:
        return None
    matched = sum(i.kernels_matched for i in have)
    return UnlaunchedInfo(kernels=sum(i.kernels for i in have), device_time_ns=sum(i.device_time_ns for i in have),
                          kernels_matched=matched, attributed_ns=sum(i.attributed_ns for i in have),
                          method="eager_match" if matched else "unattributed")


def _why_differs(parts: list) -> bool:
    """Whether two ranks give one uncosted label different reasons: the costing of the merged
    table words a label's reason from all its rows at once, which adding the ranks' coverages
    cannot reproduce (the parent then costs the merged table itself)."""
    seen: dict[str, str] = {}
    for c in parts:
        for label, why in c.uncosted_why.items():
            if seen.setdefault(label, why) != why:
                return True
    return False


def merge_prepared(traces: Sequence[Trace], merged: Trace) -> Prepared | None:
    """The :class:`Prepared` of ``merged`` (:func:`traceroof.merge.merge` of ``traces``), from
    each input's own; None unless every input has one and the world size each was costed
    with is the merged trace's.

    The ranks' tables are renumbered as the merge renumbers them and concatenated in its
    order; the lent ids shifted (module docstring); the coverages added
    (:meth:`~traceroof.costing.Coverage.merge`, in the merge's order).
    """
    from .costing import Coverage

    preps = [t.prepared for t in traces]
    if not preps or any(not isinstance(p, Prepared) for p in preps):
        return None
    if any(p.world_size != merged.meta.world_size for p in preps):
        return None
    if len(traces) == 1:
        return dataclasses.replace(preps[0], ops=_with_lent(traces[0].ops, preps[0].lent))
    _, order, remaps = merge_meta([t.meta for t in traces])
    final_rank = {i: remaps[i].get(traces[i].meta.ranks[0], traces[i].meta.ranks[0]) for i in order}
    top = min(p.base_id for p in preps)  # below every id of the merged table
    start: dict[int, int] = {}
    for i in sorted(order, key=lambda i: final_rank[i]):  # the eager match goes rank by rank
        start[i] = top
        top -= preps[i].lent_ids
    ops, shape_rows = [], []
    for i in order:
        p, t = preps[i], traces[i]
        ops.append(_shift_ids(renumber(_with_lent(t.ops, p.lent), remaps[i], t.meta.ranks), p.base_id, start[i]))
        shape_rows.append(_shift_ids(renumber(p.shape_rows, remaps[i], t.meta.ranks), p.base_id, start[i]))
    if not all(p.costs.model_id == preps[0].costs.model_id for p in preps):
        return None
    parts = [Coverage.from_json(preps[i].costs.coverage) for i in order]
    if _why_differs(parts):
        return None
    coverage = Coverage.merge(parts)
    costs = StoredCosts(model_id=preps[0].costs.model_id,
                        columns=pl.concat([preps[i].costs.columns for i in order], how="vertical_relaxed"),
                        coverage=coverage.to_json())
    return Prepared(
        lent=pl.concat([preps[i].lent for i in order]), ops=pl.concat(ops, how="vertical_relaxed"), shape_rows=pl.concat(shape_rows, how="vertical_relaxed"),
        unlaunched=_merge_unlaunched([preps[i].unlaunched for i in order]), costs=costs,
        world_size=merged.meta.world_size, base_id=max(p.base_id for p in preps), lent_ids=sum(p.lent_ids for p in preps),
        chip=preps[order[0]].chip, segments=_merged_segments([preps[i] for i in order], [remaps[i] for i in order]),
    )


def _merged_segments(preps: list[Prepared], remaps: list[dict[int, int]]) -> tuple[RankSegments, ...]:
    """The ranks' segmentations in the merge's order (:func:`merge_prepared`), when every rank
    has one, under one chip, no rank was renumbered (their tables name the rank read), and
    what each rank decided alone is what the merged table decides
    (:func:`traceroof.steps.segments_agree`: not so for a rank without step markers beside
    ranks with some); else none (the parent segments the merged table)."""
    from .steps import segments_agree

    if any(remaps) or any(len(p.segments) != 1 or p.chip is None or p.chip != preps[0].chip for p in preps):
        return ()
    segs = [p.segments[0] for p in preps]
    return tuple(segs) if segments_agree(segs) else ()


def replays_of(trace: Trace) -> object | None:
    """The :class:`~traceroof.graph_replay.Replays` the workers' eager match gives ``trace``
    (no graph replay, by :func:`preparable`), or None when nothing was prepared (or not
    for this trace's world size): the analysis then runs the stage itself."""
    p = trace.prepared
    if (not isinstance(p, Prepared) or p.ops is None or p.world_size != trace.meta.world_size
            or p.ops.height != trace.ops.height):
        return None
    from .graph_replay import Replays

    return Replays(p.ops, p.shape_rows, [], [], p.unlaunched)


def costs_of(trace: Trace, replays: object) -> StoredCosts | None:
    """The workers' costs for ``replays``' op table, when ``replays`` is the one
    :func:`replays_of` gave for ``trace`` (same table, same lent ids); else None."""
    p = trace.prepared
    if not isinstance(p, Prepared) or getattr(replays, "ops", None) is not p.ops:
        return None
    return p.costs


def segments_of(trace: Trace, spec: ChipSpec, rank: int | None, ops: pl.DataFrame) -> list[RankSegments] | None:
    """The segmentations the workers did for ``trace`` (:attr:`Prepared.segments`), when they
    apply to the analysis of ``ops`` (its op table, costed and under ``spec``'s roofline):
    no ``rank`` filter, the costs and lent ops the workers gave (:func:`replays_of`), the
    same chip, one tag per op; else None (:func:`traceroof.analysis.segment_steps` then
    segments ``ops`` itself)."""
    p = trace.prepared
    if (rank is not None or not isinstance(p, Prepared) or not p.segments or p.chip != chip_id(spec)
            or replays_of(trace) is None or sum(s.tags.height for s in p.segments) != ops.height):
        return None
    return list(p.segments)


def attach(merged: Trace, traces: Sequence[Trace]) -> Trace:
    """``merged`` with ``prepared`` set from ``traces`` (:func:`merge_prepared`); as it is
    when that gives None."""
    p = merge_prepared(traces, merged)
    if p is not None:
        object.__setattr__(merged, "prepared", p)
    return merged


__all__ = ["Prepared", "preparable", "prepare", "merge_prepared", "replays_of", "costs_of", "segments_of", "attach"]
