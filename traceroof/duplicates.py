"""Inputs that hold the same device ops: a folder with per-rank files *and* their merged copy.

A profiler run often leaves its traces twice in one folder: SGLang writes
``merged-<id>.trace.json.gz`` beside the per-rank files it merged, a user copies ``rank-0``
into a second folder, a ``.json`` sits beside its ``.json.gz``. Read together, every op of
those ranks would be counted twice. :func:`find_copies` finds them before the inputs are
merged (:func:`traceroof.merge.merge`).

**Identity of a device op.** ``(rank, device, stream, name, absolute start ns, dur_ns)``, the
absolute start being ``start_ns`` plus the rank's origin (``origin_ns[rank]``, else
``origin_ns``): two recordings of one op agree on all six; two ranks never share a rank. A
rank with a label (``TraceMeta.rank_labels``: an SGLang merged trace's ``TP01-PP00``, or the
same label spelt by a per-rank file's name) is matched both ways, by its number and by its
label: the merged copy numbers its ranks itself, the per-rank files by ``distributedInfo``
(which restarts at 0 in each data-parallel replica), and a renamed per-rank file has no label.

**Rule.** An input *part* (its ops of one rank) is *covered* by another input when every one of
its ops is among that input's ops. An input whose every part is covered by the inputs kept is a
copy and is skipped, with a warning naming it and what covers it. Copies are looked for first
among the inputs holding several ranks (a merged copy: the per-rank files are kept, they carry
each rank's own header), then among the rest from the last by source path (so the choice does
not depend on the order the inputs are given in). Inputs that still
share ops once the copies are skipped (an overlap neither holds whole) are refused: no rule
tells which recording of those ops to keep.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import polars as pl

from .errors import MixedInputsError
from .trace import Trace, TraceMeta

T = TypeVar("T")

_KEY = ("_view", "_who", "device", "stream", "name", "_abs", "dur_ns")


def op_identities(t: Trace, i: int) -> pl.DataFrame:
    """``input`` (``i``), ``rank``, ``view`` and ``_h`` (UInt64 hash of the identity: module
    docstring) of every device op of ``t``, twice: view 0 names the rank by its number, view 1
    by its label (its number when it has none). Duplicates within the input are kept once."""
    ops = t.ops
    if ops.height == 0:
        return pl.DataFrame(schema={"input": pl.Int32, "rank": pl.Int32, "view": pl.Int8, "_h": pl.UInt64})
    ranks = ops["rank"].unique().to_list()
    origin = {r: t.meta.stats.get(f"origin_ns[{r}]", t.meta.origin_ns) for r in ranks}
    org = pl.col("rank").replace_strict(origin, default=t.meta.origin_ns, return_dtype=pl.Int64)
    views = []
    for view, who in enumerate(({r: f"rank {r}" for r in ranks},
                                {r: t.meta.rank_labels.get(r, f"rank {r}") for r in ranks})):
        keyed = ops.select(
            "rank", pl.lit(view, dtype=pl.Int8).alias("_view"),
            pl.col("rank").replace_strict(who, default=None, return_dtype=pl.String).alias("_who"),
            *[c for c in _KEY if c not in ("_abs", "_who", "_view")], (pl.col("start_ns") + org).alias("_abs"),
        )
        views.append(keyed.select(
            pl.lit(i, dtype=pl.Int32).alias("input"), "rank", pl.col("_view").alias("view"),
            pl.struct(list(_KEY)).hash(seed=0).alias("_h"),
        ).unique(maintain_order=True))
    return pl.concat(views)


def _label(t: Trace, i: int) -> str:
    return t.meta.sources[0] if t.meta.sources else f"input {i}"


@dataclass(frozen=True)
class Copies:
    """What :func:`find_copies` found.

    Attributes:
        skip: indices of the inputs to leave out (sorted).
        warnings: one per skipped input: it, the inputs holding its ops, how many ops.
        device_ops: the device ops of the skipped inputs.
    """

    skip: list[int] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    device_ops: int = 0

    def keep(self, items: Sequence[T]) -> list[T]:
        """``items`` (one per input) without the skipped inputs'."""
        return [x for i, x in enumerate(items) if i not in self.skip]

    def note(self, meta: TraceMeta) -> None:
        """Say it in the merged trace's ``meta``: the warnings, and ``stats``
        ``duplicate_inputs_skipped`` / ``duplicate_device_ops_skipped`` (only when any)."""
        if not self.skip:
            return
        meta.stats["duplicate_inputs_skipped"] = len(self.skip)
        meta.stats["duplicate_device_ops_skipped"] = self.device_ops
        for w in self.warnings:
            meta.warn(w)


def find_copies(traces: Sequence[Trace], identities: Sequence[pl.DataFrame | None] | None = None) -> Copies:
    """The inputs among ``traces`` that are copies of others (module docstring), to skip.

    Args:
        traces: the inputs of one analysis, each as read (before :func:`~traceroof.merge.merge`).
        identities: per input, its :func:`op_identities` computed as input 0 (by the worker
            process that read it, :func:`traceroof.io.read_trace`), or None: computed here.

    Raises:
        MixedInputsError: two inputs kept share device ops without one holding the other's
            (exit code 4); the message names both, the shared count, and asks to leave one out.
    """
    if len(traces) < 2:
        return Copies()
    given = list(identities) if identities is not None else [None] * len(traces)
    ids = pl.concat([op_identities(t, i) if given[i] is None
                     else given[i].with_columns(pl.lit(i, dtype=pl.Int32).alias("input"))  # type: ignore[union-attr]
                     for i, t in enumerate(traces)])
    shared = ids.filter(pl.col("input").n_unique().over("_h") > 1)
    if shared.height == 0:
        return Copies()
    sizes = {(int(i), int(r)): int(n) for i, r, n in
             ids.filter(pl.col("view") == 0).group_by("input", "rank").len().iter_rows()}
    # per (input, rank, other input, view): how many of the part's ops the other input holds
    pairs = shared.join(shared.select(pl.col("input").alias("other"), "_h"), on="_h").filter(
        pl.col("input") != pl.col("other"))
    held = {(int(i), int(r), int(o), int(v)): int(n)
            for i, r, o, v, n in pairs.group_by("input", "rank", "other", "view").len().iter_rows()}
    ranks_of = {i: sorted(r for (j, r) in sizes if j == i) for i in range(len(traces))}
    # multi-rank inputs first, then by source, last first: the same choice in any input order
    order = sorted(range(len(traces)), key=lambda i: (len(ranks_of[i]), _label(traces[i], i)), reverse=True)
    skip: set[int] = set()
    warnings = []
    for i in order:
        if not ranks_of[i]:
            continue
        covers: dict[int, int] = {}
        for r in ranks_of[i]:
            by = [o for o in range(len(traces)) if o != i and o not in skip
                  and max(held.get((i, r, o, v), 0) for v in (0, 1)) == sizes[(i, r)]]
            if not by:
                break
            covers[r] = by[0]
        else:
            skip.add(i)
            n = sum(sizes[(i, r)] for r in ranks_of[i])
            holders = ", ".join(dict.fromkeys(_label(traces[o], o) for o in covers.values()))
            warnings.append(
                f"{_label(traces[i], i)}: skipped, a copy: its {n} device ops "
                f"(rank{'s' if len(covers) > 1 else ''} {', '.join(map(str, covers))}) are all in {holders}; "
                "each op is counted once"
            )
    _refuse_overlaps(traces, held, skip)
    return Copies(sorted(skip), warnings, sum(traces[i].ops.height for i in skip))


def _refuse_overlaps(traces: Sequence[Trace], held: dict[tuple[int, int, int, int], int], skip: set[int]) -> None:
    """Raise when two kept inputs still share ops, by either view (see :func:`find_copies`)."""
    by_view: dict[tuple[int, int, int], int] = {}
    for (i, _r, o, v), n in held.items():
        if i not in skip and o not in skip and i < o:
            by_view[(i, o, v)] = by_view.get((i, o, v), 0) + n
    left: dict[tuple[int, int], int] = {}
    for (i, o, _v), n in by_view.items():
        left[(i, o)] = max(left.get((i, o), 0), n)
    if not left:
        return
    (i, o), n = max(left.items(), key=lambda kv: (kv[1], -kv[0][0]))
    raise MixedInputsError(
        f"{_label(traces[i], i)} and {_label(traces[o], o)} share {n} device ops (same rank, device, stream, "
        "kernel, start and duration) but neither holds the other's: they would be counted twice; "
        "leave one of them out (or analyze them one at a time)"
    )


__all__ = ["Copies", "find_copies", "op_identities"]
