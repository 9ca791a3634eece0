"""Matching ops across frameworks and chips by what they compute, not by name (docs/diff.md,
"Across frameworks and chips").

An op's **compute signature** is its kind, its dtype, its FLOPs and its bytes (each to
:data:`DIGITS` significant digits). An XLA fusion that holds a dot or convolution and other
ops signs with the dot's own FLOPs (the op table's ``dot_flops``, :mod:`traceroof.costs.hlo`):
the rest of its FLOPs is the fused elementwise work, counted with the leftover
``elementwise`` kind. Both are what the cost formulas derive from the op's
shapes with one meaning on every side (docs/costs.md: a matmul (M×K)·(K×N) is 2·M·N·K FLOPs
and its operands' and result's bytes, whichever framework launched it and whatever its
kernel is called), so two ops with one signature did the same work. Ops without FLOPs match on
bytes; ops with neither (no cost model) are left unmatched and counted.

Per signature, per complete device-step, ``min(count A, count B)`` ops are matched one to one.
A matmul, convolution or attention signature found on one side only is paired with the
signatures of its kind and FLOPs found on the other side only (:data:`FLOP_ONLY_KINDS`: the
same arithmetic in another dtype or with other bytes, as when XLA's CPU backend runs a bf16
dot in f32); such pairs are matched one to one like a signature (``min`` of the counts), their
FLOPs counted in the coverage.
What is left is then matched **by kind, as a group**, when the two sides' remaining FLOPs of
that kind agree within :data:`GROUP_TOLERANCE` (fusion boundaries differ: one XLA fusion may
do the work of several PyTorch kernels). Kinds of one :data:`FAMILIES` entry that did not all
match so are then tried **as one group**: attention's FLOPs are its two matmuls' (Q·Kᵀ and
P·V, docs/costs.md), so a fused attention op on one side and the batched matmuls of a
framework that runs attention unfused on the other are the same work. The group matches only
when both hold, each within :data:`GROUP_TOLERANCE`: the family's FLOPs on the two sides, and
the attention part itself: A's attention FLOPs beyond B's against B's matmul FLOPs beyond A's
(the batched dots that stand for the attention; the reverse when B has the attention). A
total that agrees while the attention does not is a mismatch, never a match.
The rest stays unmatched, listed by kind.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import polars as pl

from .report import Report
from .roofline import group_label_expr

#: significant digits of FLOPs and bytes in a signature
DIGITS = 4
#: two sides' leftover FLOPs of one kind match as a group within this relative difference
GROUP_TOLERANCE = 0.01
#: kinds whose FLOPs mean one work under two names: an attention op's FLOPs are those of its
#: Q·Kᵀ and P·V matmuls (traceroof.costs.attention: ``2·b·h·pairs·(d_qk + d_v)``; the softmax
#: is not counted), which plain jax (or unfused PyTorch) runs as two batched ``dot``s
FAMILIES = (("matmul", "attention"),)
#: kinds whose FLOPs alone say what an op computes (M·N·K of a matmul, a convolution's window,
#: an attention's pairs): a signature of one of them on one side only meets one on the other
#: side only with its FLOPs when dtype or bytes differ (XLA's CPU backend runs a bf16 dot as
#: an f32 one: the same FLOPs, twice the bytes)
FLOP_ONLY_KINDS = frozenset({"matmul", "conv", "attention"})


@dataclass(frozen=True)
class SignatureRow:
    """One compute signature: FLOPs and bytes of one op (A's mean, else B's; the signature
    holds them to :data:`DIGITS` digits), and per step (means over each side's complete
    device-steps) its op count, measured time (ns) and roofline time (ns) on A and B;
    ``matched`` ops per step (min of the counts); the labels it goes by on each side.
    ``dtype_b``, ``bytes_b_per_op``: B's, where B's ops have the FLOPs but another dtype or
    other bytes (paired by FLOPs, :data:`FLOP_ONLY_KINDS`: ``matched`` then says how many pair
    up one to one, and their FLOPs count as matched); None where they are A's."""

    kind: str
    dtype: str | None
    flops_per_op: float | None
    bytes_per_op: float | None
    count_a: float
    count_b: float
    matched: float
    measured_a_ns: float
    measured_b_ns: float
    expected_a_ns: float
    expected_b_ns: float
    labels_a: list[str]
    labels_b: list[str]
    dtype_b: str | None = None
    bytes_b_per_op: float | None = None


@dataclass(frozen=True)
class KindGroup:
    """The leftover ops of one kind after signature matching, per step: FLOPs and time on each
    side, and whether they matched as a group (FLOPs within :data:`GROUP_TOLERANCE`).
    ``family``: the kinds matched together as one group (``"matmul+attention"``, one of
    :data:`FAMILIES`), else the kind itself."""

    kind: str
    flops_a: float
    flops_b: float
    measured_a_ns: float
    measured_b_ns: float
    matched: bool
    family: str = ""


@dataclass
class Matching:
    """Ops of A and B matched by compute signature, then by kind group. ``flops_*``: FLOPs
    per step of each side's costed ops; ``matched_flops_*``: the part matched (one to one
    or as a group); ``coverage_*`` = matched / total (None without FLOPs); ``uncosted_*_ns``:
    time per step of ops with neither FLOPs nor bytes (never matched)."""

    signatures: list[SignatureRow]
    groups: list[KindGroup]
    flops_a: float
    flops_b: float
    matched_flops_a: float
    matched_flops_b: float
    coverage_a: float | None
    coverage_b: float | None
    uncosted_a_ns: float
    uncosted_b_ns: float
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _sig(col: str) -> pl.Expr:
    """``col`` to :data:`DIGITS` significant digits; null when unknown or not positive."""
    c = pl.col(col)
    return pl.when(c > 0).then(c.round_sig_figs(DIGITS)).otherwise(None)


def _sig_table(r: Report) -> tuple[pl.DataFrame, int, bool]:
    """The signature columns of the ops a diff compares (:func:`traceroof.diff.compared_ops`),
    their device-steps, and whether they are a partial step's."""
    from .diff import compared_ops

    ops, n, fallback = compared_ops(r)
    exp = pl.when(pl.col("expected_ns").is_null()).then(pl.col("dur_ns")).otherwise(pl.col("expected_ns"))
    by = (r.filters.group_by if r.filters and r.filters.group_by else "op")
    # an XLA fusion holding a dot (or convolution) and elementwise ops: its dot's own FLOPs
    # are what it matches on; the rest, ``fused_flops``, is elementwise work (costs.hlo)
    dot = pl.col("dot_flops") if "dot_flops" in ops.columns else pl.lit(None, pl.Float64)
    t = ops.select(pl.col("kind").cast(pl.String), "dtype", pl.coalesce(dot, "flops").alias("flops"),
                   (pl.col("flops") - dot).fill_null(0.0).alias("fused_flops"), pl.col("flops").alias("all_flops"),
                   "bytes", "dur_ns", exp.alias("exp_ns"), group_label_expr(by).alias("label"))
    return t.with_columns(_sig("flops").alias("f"), _sig("bytes").alias("b")), n, fallback


def _per_sig(t: pl.DataFrame) -> dict[tuple[Any, ...], dict[str, Any]]:
    costed = t.filter(pl.col("f").is_not_null() | pl.col("b").is_not_null())
    g = costed.group_by("kind", "dtype", "f", "b").agg(
        pl.len().alias("count"), pl.col("dur_ns").sum().alias("sum_dur_ns"), pl.col("exp_ns").sum().alias("sum_exp_ns"),
        pl.col("flops").sum().alias("flops"), pl.col("bytes").sum().alias("bytes"), pl.col("label").unique().sort().alias("labels"))
    return {(r["kind"], r["dtype"], r["f"], r["b"]): r for r in g.iter_rows(named=True)}


def _mean(x: dict[str, Any] | None, y: dict[str, Any] | None, col: str) -> float:
    """The per-op mean of ``col`` on A's side of a signature, else on B's."""
    r = x or y
    assert r is not None
    return float(r[col] or 0.0) / r["count"]


def _pool(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Signature rows of one side summed into one (counts, times, FLOPs, bytes; labels joined)."""
    if len(rows) == 1:
        return rows[0]
    out = {c: sum(float(r[c] or 0.0) for r in rows) for c in ("count", "sum_dur_ns", "sum_exp_ns", "flops", "bytes")}
    out["count"] = int(out["count"])
    out["labels"] = sorted({lab for r in rows for lab in r["labels"]})
    return out


def _units(sa: dict, sb: dict) -> list[tuple[tuple, Any, Any, tuple | None]]:
    """The signatures to match one to one: ``(key, A's row, B's row, B's key)``, B's key None
    where it is the same. The signatures of one kind and FLOPs (to :data:`DIGITS` digits,
    :data:`FLOP_ONLY_KINDS`) found on one side only meet those found on the other side only,
    each side's pooled into one row: the same arithmetic in another dtype or with other bytes."""
    a_only = [k for k in sa if k not in sb]
    b_only = [k for k in sb if k not in sa]
    units, used = [], set()
    for kind_f in sorted({(k[0], k[2]) for k in a_only if k[0] in FLOP_ONLY_KINDS and k[2] is not None}):
        ka = sorted((k for k in a_only if (k[0], k[2]) == kind_f), key=str)
        kb = sorted((k for k in b_only if (k[0], k[2]) == kind_f), key=str)
        if ka and kb:
            units.append((ka[0], _pool([sa[k] for k in ka]), _pool([sb[k] for k in kb]), kb[0]))
            used.update(ka + kb)
    keys = sorted((sa.keys() | sb.keys()) - used, key=lambda k: tuple(str(x) for x in k))
    return [(k, sa.get(k), sb.get(k), None) for k in keys] + units


def _within(fa: float, fb: float) -> bool:
    return fa > 0 and fb > 0 and abs(fa - fb) <= GROUP_TOLERANCE * max(fa, fb)


def _family_matches(first: list[float], second: list[float]) -> bool:
    """Whether the leftovers of a two-kind family (``[FLOPs A, FLOPs B, ...]`` of its first
    kind, e.g. matmul, and of its second, e.g. attention) match as one group: their sums
    within :data:`GROUP_TOLERANCE`, and the second kind's FLOPs one side has beyond the other
    within :data:`GROUP_TOLERANCE` of the first kind's FLOPs the other side has beyond the
    first (A's attention not on B is B's batched dots not on A, and the reverse)."""
    total = _within(first[0] + second[0], first[1] + second[1])
    extra_second = second[0] - second[1]  # > 0: A has attention B lacks
    extra_first = first[1] - first[0]  # > 0: B has matmuls A lacks
    if extra_second < 0:
        extra_second, extra_first = -extra_second, -extra_first
    return total and _within(extra_second, extra_first)


def _groups(left: dict[str, list[float]], mf_a: float, mf_b: float) -> tuple[list[KindGroup], float, float]:
    """The leftover kinds as :class:`KindGroup` (by kind, then by :data:`FAMILIES`), and the
    matched FLOPs per step of A and B with the groups' added."""
    live = {k: v for k, v in left.items() if any(x > 0 for x in v)}
    family = {k: k for k in live}
    for fam in FAMILIES:
        kinds = [k for k in fam if k in live]
        if len(kinds) < 2 or all(_within(live[k][0], live[k][1]) for k in kinds):
            continue
        if _family_matches(live[fam[0]], live[fam[1]]):
            family.update({k: "+".join(kinds) for k in kinds})
    groups = []
    for kind, (fa, fb, da, db) in sorted(live.items()):
        ok = family[kind] != kind or _within(fa, fb)
        if ok:
            mf_a, mf_b = mf_a + fa, mf_b + fb
        groups.append(KindGroup(kind=kind, flops_a=fa, flops_b=fb, measured_a_ns=da, measured_b_ns=db, matched=ok,
                                family=family[kind]))
    return groups, mf_a, mf_b


def match(a: Report, b: Report) -> Matching:
    """Match the ops of ``a`` and ``b`` (see the module docstring).

    Raises:
        UsageError: a report without its op table (from :func:`traceroof.diff.complete_ops`).
    """
    ta, na, fa_ = _sig_table(a)
    tb, nb, fb_ = _sig_table(b)
    notes = [f"{side}: no complete step; its ops in partial steps are matched instead"
             for side, f in (("A", fa_), ("B", fb_)) if f]
    sa, sb = _per_sig(ta), _per_sig(tb)
    rows, left = [], {}
    mf_a = mf_b = 0.0
    for k, x, y, kb in _units(sa, sb):
        ca, cb = (x["count"] / na if x else 0.0), (y["count"] / nb if y else 0.0)
        m = min(ca, cb)
        fa = (x["flops"] or 0.0) / x["count"] if x else 0.0
        fb = (y["flops"] or 0.0) / y["count"] if y else 0.0
        mf_a += m * fa  # one to one, whether by signature or by FLOPs alone (other dtype or bytes)
        mf_b += m * fb
        la = left.setdefault(k[0], [0.0, 0.0, 0.0, 0.0])
        la[0] += (ca - m) * fa
        la[1] += (cb - m) * fb
        la[2] += (ca - m) * (x["sum_dur_ns"] / x["count"] if x else 0.0)
        la[3] += (cb - m) * (y["sum_dur_ns"] / y["count"] if y else 0.0)
        rows.append(SignatureRow(
            kind=k[0], dtype=k[1], flops_per_op=(fa or fb) if k[2] is not None else None,
            bytes_per_op=_mean(x, y, "bytes") if k[3] is not None else None, count_a=ca, count_b=cb, matched=m,
            measured_a_ns=x["sum_dur_ns"] / na if x else 0.0, measured_b_ns=y["sum_dur_ns"] / nb if y else 0.0,
            expected_a_ns=x["sum_exp_ns"] / na if x else 0.0, expected_b_ns=y["sum_exp_ns"] / nb if y else 0.0,
            labels_a=list(x["labels"]) if x else [], labels_b=list(y["labels"]) if y else [],
            dtype_b=kb[1] if kb else None,
            bytes_b_per_op=_mean(y, None, "bytes") if kb and kb[3] is not None else None))
    for i, (t, n) in enumerate(((ta, na), (tb, nb))):  # fused elementwise FLOPs of dot fusions
        fused = float(t["fused_flops"].sum() or 0.0) / n
        if fused:
            left.setdefault("elementwise", [0.0, 0.0, 0.0, 0.0])[i] += fused
    groups, mf_a, mf_b = _groups(left, mf_a, mf_b)
    tot_a = float(ta["all_flops"].sum() or 0.0) / na
    tot_b = float(tb["all_flops"].sum() or 0.0) / nb
    unc = pl.col("f").is_null() & pl.col("b").is_null()
    rows.sort(key=lambda r: -(r.measured_a_ns + r.measured_b_ns))
    return Matching(
        signatures=rows, groups=groups, flops_a=tot_a, flops_b=tot_b, matched_flops_a=mf_a, matched_flops_b=mf_b,
        coverage_a=mf_a / tot_a if tot_a else None, coverage_b=mf_b / tot_b if tot_b else None,
        uncosted_a_ns=float(ta.filter(unc)["dur_ns"].sum() or 0) / na,
        uncosted_b_ns=float(tb.filter(unc)["dur_ns"].sum() or 0) / nb, notes=notes)


__all__ = ["DIGITS", "FAMILIES", "FLOP_ONLY_KINDS", "GROUP_TOLERANCE", "KindGroup", "Matching", "SignatureRow", "match"]
