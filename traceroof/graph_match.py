"""Matching a graph replay's kernels to the launches of a capture, or to an eager run.

Pure functions over plain lists (no tables): :mod:`traceroof.graph_replay` builds the
sequences from the op and host tables and applies the result.

A *sequence* is what one source offers, position by position: the kernel name where it is
known (``None`` where not: a capture records launches, not kernels) and the *lender* (an
index into the source rows: the framework op that launched it, ``None`` for a kernel with no
framework op). A replay is the list of its kernels' names, in device order.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

#: the shortest run of kernel names an eager match accepts (method c): a shorter run (one
#: ``elementwise_kernel`` or a ``memcpy``) matches by chance as often as by identity
MIN_RUN = 4
#: the fewest distinct kernel names such a run must hold: a run of one or two generic kernels
#: repeated (an optimizer's ``add_`` over many tensors, copies) matches ops of other shapes
MIN_DISTINCT = 3
#: eager positions an n-gram is tried at, at most (the first ones in time order)
MAX_STARTS = 64


@dataclass(frozen=True)
class Sequence:
    """One source's launches in order: ``names[i]`` the kernel name (None: unknown),
    ``lenders[i]`` the row index of the framework op that launched it (None: none)."""

    names: list[str | None]
    lenders: list[int | None]


class KernelCounts(Mapping[int, int]):
    """lender → the kernels it launched eagerly, over lenders ``0..n-1`` held as one list of
    counts (0: not a key). A mapping like the dict it replaces, in about an eighth of its
    memory (a dict of 175 k lenders on the 1 GB replicated trace: 10.5 MB of Python objects,
    which the interpreter keeps after they are freed)."""

    __slots__ = ("_counts",)

    def __init__(self, counts: list[int]) -> None:
        self._counts = counts

    def __getitem__(self, lender: int) -> int:
        n = self._counts[lender] if 0 <= lender < len(self._counts) else 0
        if not n:
            raise KeyError(lender)
        return n

    def __iter__(self) -> Iterator[int]:
        return (i for i, n in enumerate(self._counts) if n)

    def __len__(self) -> int:
        return sum(1 for n in self._counts if n)


@dataclass(frozen=True)
class Match:
    """The attribution of one replay's positions: ``lenders[p]`` the framework-op row lent
    to position ``p`` (None: unmatched) and ``groups[p]`` its cost group (positions sharing
    one group are the kernels of one op instance; None: unmatched); ``groups_n`` the number
    of groups."""

    lenders: list[int | None]
    groups: list[int | None]
    groups_n: int

    @property
    def matched(self) -> int:
        """Positions attributed."""
        return sum(g is not None for g in self.groups)


def name_check(replay: list[str], seq: Sequence) -> tuple[int, int]:
    """``(agree, disagree)``: positions whose known name equals the replayed kernel's, and
    those whose known name differs (``seq`` as long as ``replay``)."""
    agree = sum(1 for a, b in zip(replay, seq.names) if b is not None and a == b)
    known = sum(1 for b in seq.names if b is not None)
    return agree, known - agree


def whole(seq: Sequence) -> Match:
    """Every position of a capture of the replay's length: position ``p`` takes launch
    ``p``'s op; one group per distinct lender (one captured op instance)."""
    ids: dict[int, int] = {}
    groups: list[int | None] = []
    for lender in seq.lenders:
        groups.append(None if lender is None else ids.setdefault(lender, len(ids)))
    return Match(list(seq.lenders), groups, len(ids))


def leading_batch(first_dims: list[int | None]) -> int | None:
    """The batch size a run of ops says: the leading dimension of their first inputs
    (``[batch, …]``) that more than half of the ops with a recorded first-input shape share;
    None when none is shared by more than half, or nothing is recorded. ``first_dims``: one
    entry per op instance (None: no shape recorded)."""
    known = [d for d in first_dims if d is not None]
    if not known:
        return None
    top = max(set(known), key=known.count)
    return top if 2 * known.count(top) > len(known) else None


def kind_clash(replay_kinds: list[str | None], seq: Sequence, op_kinds: list[str | None]) -> int | None:
    """The first position ``p`` of a capture of the replay's length whose kernel name the
    capture does not know (``seq.names[p]`` None) and whose replayed kernel's kind
    (``replay_kinds[p]``) and lent op's kind (``op_kinds[p]``) are both known (not None) and
    differ; None when there is none. The lists are as long as ``seq``."""
    for p, (known, kk, ko) in enumerate(zip(seq.names, replay_kinds, op_kinds)):
        if known is None and kk is not None and ko is not None and kk != ko:
            return p
    return None


def eager_runs(replay: list[str], eager: Sequence, op_kernels: Mapping[int, int]) -> Match:
    """Longest exact runs of ``replay``'s kernel names in ``eager`` (greedy, left to right):
    at each position the longest run of equal names (every one with a lender) starting
    there, of at least :data:`MIN_RUN` kernels and :data:`MIN_DISTINCT` distinct names;
    each replayed kernel of a run takes its eager
    twin's op. A group is one eager op instance within one run; a group holding fewer
    kernels than that op launched eagerly (``op_kernels``: lender → kernels) is dropped (its
    cost would be spread over part of its kernels).

    Linear in ``len(replay)`` (at most :data:`MAX_STARTS` candidates per position, the
    search over them stopped once a run reaches the end of the replay or of the eager
    names, as no later one could be longer), the
    eager side indexed once per :class:`Sequence` (:func:`starts_of`): a run's length is
    measured once per diagonal (eager position − replay position) and reused by every later
    start on the same diagonal inside it, and the distinct-name test reads the shortest
    window holding :data:`MIN_DISTINCT` names (:func:`_distinct_reach`) instead of a set of
    the run."""
    n, m = len(replay), len(eager.names)
    index = starts_of(eager)
    names, eager_lenders = eager.names, eager.lenders
    reach = _distinct_reach(replay)
    ends: dict[int, int] = {}  # diagonal j - i → the replay position its last measured run stops at
    lenders: list[int | None] = [None] * n
    groups: list[int | None] = [None] * n
    gid: dict[tuple[int, int], int] = {}
    i, run = 0, 0
    while i <= n - MIN_RUN:
        best_j, best_len = -1, 0
        for j in index.get(tuple(replay[i:i + MIN_RUN]), ()):
            if best_len >= min(n - i, m - j):
                break  # no later start (fewer eager names left) can be strictly longer
            end = ends.get(j - i)
            if end is None or end < i:
                k = 0
                while i + k < n and j + k < m and replay[i + k] == names[j + k] and eager_lenders[j + k] is not None:
                    k += 1
                ends[j - i] = i + k
            else:  # inside a run measured from an earlier start on this diagonal: it stops where that one did
                k = end - i
            if k > best_len:
                best_j, best_len = j, k
        if best_len < MIN_RUN or best_len < reach[i]:
            i += 1
            continue
        for k in range(best_len):
            lender = eager_lenders[best_j + k]
            assert lender is not None
            lenders[i + k] = lender
            groups[i + k] = gid.setdefault((run, lender), len(gid))
        run += 1
        i += best_len
    _drop_partial(lenders, groups, op_kernels)
    return Match(lenders, groups, len(gid))


#: bits per name in the packed integer key of an n-gram (:func:`starts_of`): a sequence with
#: fewer distinct names than ``2 ** GRAM_BITS`` is indexed by one polars query, else by a
#: Python loop
GRAM_BITS = 15


def starts_of(eager: Sequence) -> dict[tuple[str | None, ...], list[int]]:
    """The index :func:`eager_runs` looks runs up in: each :data:`MIN_RUN`-gram of
    ``eager.names`` → its first :data:`MAX_STARTS` positions, ascending. Built once per
    :class:`Sequence` and kept on it (a trace's eager sequence is matched against every
    graph and every run of unlaunched kernels: rebuilding it per call was quadratic).

    Each name gets an integer code (equal names, equal codes); an n-gram is its codes packed
    into one int64 (:data:`GRAM_BITS` each), and a group-by of those keys lists each
    n-gram's positions in ascending order, so only the distinct n-grams are looked at in
    Python. Too many distinct names to pack: the plain loop over every position. The codes
    are those the builder of ``eager`` kept on it (``_codes``, a polars Series: equal names,
    equal codes), else made here."""
    cached = eager.__dict__.get("_starts")
    if cached is not None:
        return cached
    names = eager.names
    given = eager.__dict__.get("_codes")  # the names' codes, where the builder made them (graph_sources)
    if given is not None and given.len() == len(names):
        code: list[int] | Any = given
        distinct = int(given.max() or 0) + 1 if given.len() else 0
    else:
        codes: dict[str | None, int] = {}
        code = [codes.setdefault(x, len(codes)) for x in names]
        distinct = len(codes)
    if distinct < 2 ** GRAM_BITS and MIN_RUN * GRAM_BITS < 63:
        index = _starts_packed(names, code)
    else:
        index = {}
        for j, gram in enumerate(zip(*(names[t:] for t in range(MIN_RUN)), strict=False)):
            starts = index.get(gram)
            if starts is None:
                index[gram] = [j]
            elif len(starts) < MAX_STARTS:
                starts.append(j)
    object.__setattr__(eager, "_starts", index)  # a cache, not a field: the Sequence stays frozen
    return index


def _starts_packed(names: list[str | None], code: Any) -> dict[tuple[str | None, ...], list[int]]:
    """:func:`starts_of`'s index from the names' integer codes (each below ``2 ** GRAM_BITS``),
    grams in packed-key order. One polars query, no numpy (issue 19: a small trace imports
    none): the key is ``sum(code[j + t] * 2 ** (GRAM_BITS * (MIN_RUN - 1 - t)))`` (the codes
    shifted and OR-ed: each is below ``2 ** GRAM_BITS``, the sum below ``2 ** 63``); a group
    by key keeps each gram's positions in row order (ascending)."""
    import polars as pl

    n = len(code) - MIN_RUN + 1
    if n <= 0:
        return {}
    c = code.cast(pl.Int64) if isinstance(code, pl.Series) else pl.Series("c", code, dtype=pl.Int64)
    key = c.slice(0, n) * (1 << (GRAM_BITS * (MIN_RUN - 1)))
    for t in range(1, MIN_RUN):
        key = key + c.slice(t, n) * (1 << (GRAM_BITS * (MIN_RUN - 1 - t)))
    grams = (pl.DataFrame({"key": key}).with_row_index("j").group_by("key")
             .agg(pl.col("j").head(MAX_STARTS)).sort("key"))
    index: dict[tuple[str | None, ...], list[int]] = {}
    for starts in grams["j"].to_list():
        index[tuple(names[starts[0]:starts[0] + MIN_RUN])] = starts
    return index


def _distinct_reach(replay: list[str]) -> list[float]:
    """Per position ``i`` of ``replay``: the length of the shortest window ``replay[i:i+L]``
    holding :data:`MIN_DISTINCT` distinct names (infinity when none does), so that a run
    of ``L`` names from ``i`` holds that many exactly when ``L >= reach[i]``. Two pointers:
    the window's end never moves back."""
    n = len(replay)
    out: list[float] = [float("inf")] * n
    counts: dict[str, int] = {}
    r = 0
    for i in range(n):
        while len(counts) < MIN_DISTINCT and r < n:
            counts[replay[r]] = counts.get(replay[r], 0) + 1
            r += 1
        if len(counts) >= MIN_DISTINCT:
            out[i] = r - i
        c = counts[replay[i]] - 1
        if c:
            counts[replay[i]] = c
        else:
            del counts[replay[i]]
    return out


def _drop_partial(lenders: list[int | None], groups: list[int | None], op_kernels: Mapping[int, int]) -> None:
    """Unmatch (in place) every group with fewer kernels than its lender launched eagerly."""
    size: dict[int, int] = {}
    for g in groups:
        if g is not None:
            size[g] = size.get(g, 0) + 1
    for p, g in enumerate(groups):
        lender = lenders[p]
        if g is not None and lender is not None and size[g] != op_kernels.get(lender, size[g]):
            lenders[p], groups[p] = None, None


__all__ = ["MIN_DISTINCT", "MIN_RUN", "KernelCounts", "Match", "Sequence", "eager_runs", "kind_clash", "leading_batch", "name_check",
           "starts_of", "whole"]
