"""graph_match.eager_runs (linear: one index per eager sequence, run lengths reused along a
diagonal, the distinct-name test by a two-pointer reach) against the old, straightforward
formulation, kept here as the oracle: on random sequences built to hold repeats, long runs
of few names, unknown lenders and ties, the matches must be equal position by position."""

from __future__ import annotations

import random

from traceroof.graph_match import (
    MAX_STARTS,
    MIN_DISTINCT,
    MIN_RUN,
    Sequence,
    _distinct_reach,
    eager_runs,
    starts_of,
)


def _old_eager_runs(replay, eager, op_kernels):
    """The quadratic formulation eager_runs had (commit fa36e88), verbatim in substance:
    the index rebuilt per call, every run re-measured, the distinct test by a set."""
    n, m = len(replay), len(eager.names)
    index = {}
    for j in range(m - MIN_RUN + 1):
        starts = index.setdefault(tuple(eager.names[j:j + MIN_RUN]), [])
        if len(starts) < MAX_STARTS:
            starts.append(j)
    lenders, groups, gid = [None] * n, [None] * n, {}
    i, run = 0, 0
    while i <= n - MIN_RUN:
        best_j, best_len = -1, 0
        for j in index.get(tuple(replay[i:i + MIN_RUN]), ()):
            k = 0
            while i + k < n and j + k < m and replay[i + k] == eager.names[j + k] and eager.lenders[j + k] is not None:
                k += 1
            if k > best_len:
                best_j, best_len = j, k
        if best_len < MIN_RUN or len(set(replay[i:i + best_len])) < MIN_DISTINCT:
            i += 1
            continue
        for k in range(best_len):
            lenders[i + k] = eager.lenders[best_j + k]
            groups[i + k] = gid.setdefault((run, lenders[i + k]), len(gid))
        run += 1
        i += best_len
    size = {}
    for g in groups:
        if g is not None:
            size[g] = size.get(g, 0) + 1
    for p, g in enumerate(groups):
        if g is not None and size[g] != op_kernels.get(lenders[p], size[g]):
            lenders[p], groups[p] = None, None
    return lenders, groups, len(gid)


def _random_case(rng: random.Random):
    """An eager sequence made of a few repeated 'iterations' (so runs are long and starts
    many), with some names unknown, some lenders missing, and a replay cut from it with
    edits; lenders shared by 1–3 consecutive kernels (an op launching several)."""
    alphabet = [f"k{x}" for x in range(rng.choice([2, 3, 5, 12]))]
    body = [rng.choice(alphabet) for _ in range(rng.randint(4, 40))]
    names = body * rng.randint(1, 80)
    names += [rng.choice(alphabet) for _ in range(rng.randint(0, 30))]
    lenders, op = [], 0
    p = 0
    while p < len(names):
        width = rng.choice([1, 1, 2, 3])
        for _ in range(width):
            if p < len(names):
                lenders.append(None if rng.random() < 0.03 else op)
                p += 1
        op += 1
    names = [None if rng.random() < 0.01 else x for x in names]
    a = rng.randint(0, len(names))
    replay = [x or "" for x in names[a:a + rng.randint(0, 600)]]
    for _ in range(rng.randint(0, 5)):
        if replay:
            replay[rng.randrange(len(replay))] = rng.choice(alphabet)
    op_kernels = {}
    for x in lenders:
        if x is not None:
            op_kernels[x] = op_kernels.get(x, 0) + 1
    return replay, Sequence(names, lenders), op_kernels


def test_eager_runs_equals_the_old_formulation_on_random_sequences():
    rng = random.Random(19)
    matched_total = 0
    for _ in range(400):
        replay, seq, op_kernels = _random_case(rng)
        # twice on one Sequence: the second call reads the cached index
        for _ in range(2):
            m = eager_runs(replay, seq, op_kernels)
            assert (m.lenders, m.groups, m.groups_n) == _old_eager_runs(replay, seq, op_kernels)
        matched_total += m.matched
    assert matched_total > 10_000  # the cases do match (not 400 empty results compared)


def test_eager_runs_long_runs_of_two_names_then_a_third():
    """The case the old formulation was quadratic on: a long stretch of two alternating
    names (every run found there is refused for too few distinct names) ending in a third;
    only the run that reaches the third name is taken."""
    eager_names = ["a", "b"] * 300 + ["c", "d"]
    seq = Sequence(eager_names, list(range(len(eager_names))))
    replay = ["a", "b"] * 300 + ["c", "d"]
    m = eager_runs(replay, seq, {})
    assert (m.lenders, m.groups, m.groups_n) == _old_eager_runs(replay, seq, {})
    # the whole replay is one run at its eager twin: 602 positions, each its own op
    assert m.matched == 602 and m.lenders == list(range(602))


def test_starts_of_is_built_once_and_holds_the_first_starts():
    names = ["a", "b", "c", "d"] * 100
    seq = Sequence(names, list(range(400)))
    idx = starts_of(seq)
    assert starts_of(seq) is idx
    # "a b c d" starts at 0, 4, 8, …: 100 of them, the first MAX_STARTS (64) kept
    assert idx[("a", "b", "c", "d")] == list(range(0, 4 * MAX_STARTS, 4))
    assert idx[("b", "c", "d", "a")][:2] == [1, 5]
    assert len(idx) == 4  # four rotations, nothing else


def test_distinct_reach_against_sets():
    rng = random.Random(3)
    for _ in range(200):
        xs = [rng.choice("abcd"[:rng.randint(1, 4)]) for _ in range(rng.randint(0, 50))]
        want = []
        for i in range(len(xs)):
            lengths = [n for n in range(1, len(xs) - i + 1) if len(set(xs[i:i + n])) >= MIN_DISTINCT]
            want.append(lengths[0] if lengths else float("inf"))
        assert _distinct_reach(xs) == want


def test_starts_of_packed_and_plain_agree(monkeypatch):
    """The packed index (names packed into one integer per 4-gram, one polars query) against the plain loop,
    forced by a vocabulary too large to pack (GRAM_BITS 1: at most one name packs)."""
    import traceroof.graph_match as gm

    rng = random.Random(11)
    for _ in range(50):
        names = [rng.choice(["a", "b", "c", None, "d"]) for _ in range(rng.randint(0, 500))]
        packed = starts_of(Sequence(names, list(range(len(names)))))
        monkeypatch.setattr(gm, "GRAM_BITS", 1)
        plain = starts_of(Sequence(names, list(range(len(names)))))
        monkeypatch.undo()
        assert packed == plain
        # the oracle: every position of each 4-gram, the first MAX_STARTS kept
        want: dict = {}
        for j in range(len(names) - MIN_RUN + 1):
            want.setdefault(tuple(names[j:j + MIN_RUN]), []).append(j)
        assert plain == {k: v[:MAX_STARTS] for k, v in want.items()}
