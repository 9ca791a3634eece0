"""The runs and chains of the ``unfused_elementwise`` detector: which kernels form a run,
how a run splits into chains by data flow, and what each chain measured and would move fused.

The rules are in :mod:`traceroof.findings.unfused_elementwise`'s docstring and
``docs/findings/unfused_elementwise.md``; the detector turns :func:`find_chains`' table into
findings. A private module (its name starts with ``_``): not a detector of its own.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass, replace
from typing import Any

import polars as pl

from .. import costs
from ..frames import done, small
from . import FindingContext
from ._common import short

#: Kinds a run is made of.
KINDS = ("elementwise", "norm", "reduction")
#: Roofline verdicts a run member may have.
BOUNDS = ("memory", "latency")
#: Compiler-fused kernels (Inductor/Triton, XLA fusions): already fused, never flagged.
FUSED_RE = r"(?i)^triton_|triton_(poi|red|per)_|(^|[^a-z])fusion"
#: Largest idle gap (ns) between kernels of different framework ops inside one run.
RUN_MAX_GAP_NS = 100_000
#: A run has at least this many kernels.
MIN_KERNELS = 2


def eligible_expr(fused: pl.Expr) -> pl.Expr:
    """Eligibility of one device op as a run member (see the detector's docstring); ``fused``: the
    op is a compiler-fused kernel (:func:`_kernel_codes`); with ``pl.lit(False)``, every
    condition but that name check."""
    return (
        # ``kind`` is an Enum: ``is_in`` compares categories, without making a string per row
        pl.col("kind").is_in(list(KINDS))
        & pl.col("bound").is_in(list(BOUNDS))
        & (pl.col("bytes").fill_null(0.0) > 0)
        & (pl.col("dur_ns") > 0)
        & ~fused
        & ~pl.col("graph").fill_null(False)
    )


def _codes(df: pl.DataFrame) -> tuple[pl.Series, pl.DataFrame]:
    """Dictionary-encode the rows of ``df``: ``(codes, distinct)``, ``codes[i]`` (UInt32) being
    the row of ``distinct`` equal to row ``i`` of ``df`` (nulls compare equal).

    One hash pass over ``df``; anything computed per distinct row then reaches every row by a
    gather on ``codes``, so long strings (kernel names) are looked at once per distinct value.
    """
    cols = df.columns
    g = df.lazy().with_row_index("_i").group_by(cols).agg("_i").with_row_index("_c").collect()
    # every row is in exactly one group: its code, in row order, is the exploded rows sorted
    # by row (what a scatter of the codes into a zeroed column gave, in one query fewer)
    codes = g.lazy().select("_c", "_i").explode("_i").sort("_i").collect()["_c"]
    return codes, g.select(cols)


def _kernel_codes(ops: pl.DataFrame) -> tuple[pl.Series, pl.Series, pl.Series, pl.Series, pl.Series]:
    """Per op (row of ``ops``): the codes (:func:`_codes`) of its kernel ``name`` and framework
    ``op``, and whether either matches :data:`FUSED_RE` (a compiler-fused kernel):
    ``(name_codes, names, op_codes, op_names, fused)``, ``names`` / ``op_names`` being the
    distinct values. The regex runs once per distinct value."""
    def matches(values: pl.Series) -> pl.Series:
        return values.fill_null("").str.contains(FUSED_RE)

    name_c, names = _codes(ops.select("name"))
    op_c, op_names = _codes(ops.select("op"))
    names, op_names = names.to_series(), op_names.to_series()
    fused = matches(names).gather(name_c) | matches(op_names).gather(op_c)
    return name_c, names, op_c, op_names, fused


def _pair_key(el: pl.DataFrame) -> pl.Expr | None:
    """An Int64 expression packing ``(rank, external_id)`` into one integer ordered as the pair,
    for pairs whose External id is one of ``el``'s and rank within ``el``'s range (null where
    either is null); None when ``el`` has no such pair.

    ``(rank − r0) · span + (External id − e0)`` with ``span`` the External ids' range, or, when
    that could overflow, the rank of the External id among ``el``'s distinct ids instead of its
    offset. Distinct pairs give distinct integers.
    """
    lo = el.select(pl.col("rank").min().alias("r0"), pl.col("external_id").min().alias("e0"),
                   pl.col("rank").max().alias("r1"), pl.col("external_id").max().alias("e1")).row(0, named=True)
    if lo["e0"] is None or lo["r0"] is None:
        return None
    span = lo["e1"] - lo["e0"] + 1
    ext = pl.col("external_id") - lo["e0"]
    if (lo["r1"] - lo["r0"] + 1) * span >= 1 << 62:
        ids = el["external_id"].drop_nulls().unique().sort()
        span, ext = ids.len(), pl.lit(ids).search_sorted(pl.col("external_id")).cast(pl.Int64)
    return (pl.col("rank").cast(pl.Int64) - lo["r0"]) * span + ext


def _shape_keys_of(host: pl.DataFrame, el: pl.DataFrame) -> tuple[pl.Series, pl.DataFrame]:
    """The recorded shapes of the framework op of each row of ``el`` (``rank``,
    ``external_id``): ``(skey, keys)``, ``skey`` (UInt32, null: none recorded) a row of the key
    table ``keys`` = ``(_skey, input_dims, input_types, concrete_inputs)``, one row per distinct
    shape, as :func:`traceroof.costing.shape_keys` gives them (numbered differently).

    A framework op is the ``cpu_op`` event with that ``(rank, External id)``; of several, the
    one that started last, the innermost (:func:`traceroof.host.innermost_cpu_ops`). Only the
    host events of ``el``'s External ids are looked at, integer tests first (the ``cat`` text
    is compared on those rows only); sorted by ``(pair key, start)`` (:func:`_pair_key`), each
    key's innermost event is its last, and ``el`` finds its key by binary search. The text is
    taken with one boolean filter over ``host`` (cheaper than a gather on its chunked text
    columns) and compared once per event (:func:`_codes`).
    """
    text_cols = ["input_dims", "input_types", "concrete_inputs"]
    key = _pair_key(el)
    if key is None:
        keys = host.select(text_cols).clear().with_row_index("_skey")
        return pl.Series("skey", [None] * el.height, dtype=pl.UInt32), keys
    r0, r1 = el["rank"].min(), el["rank"].max()
    ev = (  # one lazy query, one collect
        host.lazy().select(pl.int_range(pl.len(), dtype=pl.UInt32).alias("_row"), "rank", "external_id", "start_ns", "cat")
        .filter(pl.col("external_id").is_in(el["external_id"].drop_nulls().unique().implode()))
        .filter(pl.col("cat") == "cpu_op", pl.col("rank").is_between(r0, r1))
        .select("_row", key.alias("_key"), "start_ns")
        .sort("_key", "start_ns", maintain_order=True)
        .filter(pl.col("_key") != pl.col("_key").shift(-1).fill_null(-1))
        .collect()
    )
    picked = pl.zeros(host.height, dtype=pl.Boolean, eager=True).scatter(ev["_row"], True)
    # the filtered rows are in host order: the codes go back to ev's (key) order by its rows' ranks
    codes, keys = _codes(host.select(text_cols).filter(picked))
    codes = pl.zeros(ev.height, dtype=pl.UInt32, eager=True).scatter(ev["_row"].arg_sort(), codes)
    q = el.select(key.alias("_key"))["_key"]
    pos = ev["_key"].search_sorted(q).clip(upper_bound=max(ev.height - 1, 0))
    hit = (ev["_key"].gather(pos) == q).fill_null(False) if ev.height else pl.repeat(False, el.height, eager=True)
    skey = pl.select(pl.when(pl.lit(hit)).then(pl.lit(codes).gather(pl.lit(pos)))).to_series().alias("skey")
    return skey, keys.with_row_index("_skey")


@dataclass(frozen=True)
class Runs:
    """The eligible kernels of every run (:func:`find_runs`).

    ``kernels``: one row per kernel, runs consecutive (``run`` = 0, 1, 2 ...) and each in start
    order, with ``rank``, ``stream``, ``step``, ``dur_ns``, ``bytes``, ``start_ns``, ``end_ns``
    (ns), ``new_member`` (the kernel starts a new framework-op member: its External id is
    unknown or differs from the previous kernel's), ``name_c`` / ``op_c`` (codes of its kernel
    name and framework op: rows of ``names`` / ``op_names``) and ``skey`` (the ``_skey`` of
    the row of ``shape_keys`` with the recorded ``input_dims``, ``input_types``,
    ``concrete_inputs`` of its framework op, :func:`_shape_keys_of`; null if none).
    """

    kernels: pl.DataFrame
    names: pl.Series
    op_names: pl.Series
    shape_keys: pl.DataFrame


def find_runs(ctx: FindingContext) -> Runs | None:
    """All runs of ≥ :data:`MIN_KERNELS` eligible kernels (None: no run)."""
    if ctx.ops.height == 0:
        return None
    n = ctx.ops.height
    # candidates: ops eligible but for the name check (integer and enum predicates); the kernel
    # names and framework ops, long strings, are encoded on these rows only
    cand = ctx.ops.select(eligible_expr(pl.lit(False))).to_series().arg_true()
    if cand.len() == 0:
        return None
    name_c, names, op_c, op_names, fused = _kernel_codes(ctx.ops.select("name", "op")[cand])
    elig = pl.zeros(n, dtype=pl.Boolean, eager=True).scatter(cand.filter(~fused), True)
    # per op row (0 where not a candidate: such an op is in no run)
    name_c = pl.zeros(n, dtype=pl.UInt32, eager=True).scatter(cand, name_c)
    op_c = pl.zeros(n, dtype=pl.UInt32, eager=True).scatter(cand, op_c)
    g = ["rank", "device", "stream"]
    # runs are found on a narrow numeric frame (the sort moves no text); the codes and bytes of
    # the kernels in runs are gathered afterwards by row index. Eager steps on a large table:
    # the streaming engine is slower on this chain of order-dependent steps (sort, shift,
    # cum_sum); one lazy plan on the in-memory engine on a small one (:mod:`traceroof.frames`)
    ops = small(ctx.ops).select(
        pl.int_range(pl.len(), dtype=pl.UInt32).alias("_i"), "rank", "device", "stream", "dur_ns", "start_ns",
        "step", "external_id", (pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns"), pl.lit(elig).alias("elig"),
    ).sort(*g, "start_ns", maintain_order=True)
    # sorted by (rank, device, stream): the previous row is the previous kernel of the stream
    # unless the stream changes there
    prev = lambda c: pl.col(c).shift(1)  # noqa: E731
    first = pl.any_horizontal([pl.col(c).ne_missing(prev(c)) for c in g]).fill_null(True)
    same_ext = pl.col("external_id").is_not_null() & (pl.col("external_id") == prev("external_id")).fill_null(False)
    brk = (
        first
        | ~pl.col("elig")
        | ~prev("elig").fill_null(False)
        | (~same_ext & ((pl.col("start_ns") - prev("end_ns")) > RUN_MAX_GAP_NS).fill_null(True))
        | pl.col("step").ne_missing(prev("step"))
    )
    el = done(
        ops.with_columns(brk.alias("_brk"))
        .with_columns(pl.col("_brk").cast(pl.Int64).cum_sum().alias("run"),
                      (pl.col("_brk") | ~same_ext).alias("new_member"))
        .filter("elig")
        # runs are consecutive: a kernel's run length is its rle group's
        .filter(pl.col("run").rle().struct.field("len").gather(pl.col("run").rle_id()) >= MIN_KERNELS)
        # the kept runs are consecutive: number them 0, 1, 2 ...
        .select(pl.col("run").rle_id(), "rank", "stream", "step", "dur_ns", "start_ns", "end_ns",
                "external_id", "new_member", "_i")
    )
    if el.height == 0:
        return None
    skey, keys = _shape_keys_of(ctx.host, el)
    el = el.select(pl.exclude("_i", "external_id"), skey, ctx.ops["bytes"].gather(el["_i"]),
                   name_c.gather(el["_i"]).alias("name_c"), op_c.gather(el["_i"]).alias("op_c"))
    return Runs(el, names, op_names, keys)


def _token(k: pl.DataFrame, runs: Runs) -> pl.Series:
    """Per kernel of ``k`` (:attr:`Runs.kernels`): one integer that is equal for two kernels
    exactly when their ``(name_c, op_c, skey, new_member)`` are: the four packed by mixed radix
    (UInt64; ``skey`` + 1, 0 for null), or their :func:`_codes` where that could overflow."""
    radix = [runs.names.len(), runs.op_names.len(), runs.shape_keys.height + 1, 2]
    if radix[0] * radix[1] * radix[2] * radix[3] >= 1 << 63:
        return _codes(k.select("name_c", "op_c", "skey", "new_member"))[0]
    digits = [pl.col("name_c"), pl.col("op_c"), (pl.col("skey").cast(pl.UInt64) + 1).fill_null(0),
              pl.col("new_member")]
    tok = pl.lit(0, dtype=pl.UInt64)
    for d, r in zip(digits, radix):
        tok = tok * r + d.cast(pl.UInt64)
    return k.select(tok).to_series()


def find_chains(ctx: FindingContext) -> tuple[pl.DataFrame, list[Part], list[tuple]] | None:
    """Every chain (a :class:`Part` of a run) with what it measured: ``(chains, parts, sigs)``.

    ``chains``: one row per chain, in run order then chain order: ``rank``, ``stream``,
    ``step``, ``part`` (index into ``parts``: the chain's place in its run's structure),
    ``sig`` (index into ``sigs``: its signature), ``measured`` (ns, its kernels' summed
    durations), ``moved`` (bytes its kernels moved), ``largest`` (bytes of its largest member),
    ``shapes_bytes`` (the fused bytes from recorded shapes, null without), ``start`` / ``end``
    (ns: first kernel's start, latest kernel end). None: no chain.

    Runs of one structure (same kernels, framework ops, shapes and member boundaries: every
    layer of every step) split into the same parts with the same fused estimate; that is
    worked out once per structure, and only times and bytes are summed per run.
    """
    runs = find_runs(ctx)
    if runs is None:
        return None
    k = runs.kernels
    per_run = done(
        small(k).with_columns(_token(k, runs).alias("_tok"))
        .group_by("run", maintain_order=True)
        .agg(pl.col("rank", "stream", "step").first(), pl.len().alias("n"), pl.col("_tok"))
    )
    struct, _ = _codes(per_run.select("_tok"))
    # a run's structure: the sequence of its kernels' (name, op, shapes, new member) codes
    per_run = per_run.select(pl.exclude("_tok"), struct.alias("struct"), (pl.col("n").cum_sum() - pl.col("n")).alias("lo"))
    parts, sigs, flat_part, flat_member, offsets = _structures(runs, per_run)
    if not parts:
        return None
    # each kernel's place in its structure, as an index into the flat per-structure tables
    run_base = pl.Series(offsets, dtype=pl.Int64).gather(per_run["struct"]) - per_run["lo"]
    flat = pl.int_range(pl.len(), dtype=pl.Int64) + pl.lit(run_base).gather(pl.col("run"))
    kern = done(
        small(k).select("run", "dur_ns", "bytes", "start_ns", "end_ns", flat.alias("_f"))
        .with_columns(pl.lit(pl.Series(flat_part, dtype=pl.Int64)).gather(pl.col("_f")).alias("part"),
                      pl.lit(pl.Series(flat_member, dtype=pl.Int64)).gather(pl.col("_f")).alias("member"))
        .filter(pl.col("part").is_not_null())
        .with_columns(pl.struct("run", "part").rle_id().alias("_ch"))
        .with_columns(pl.struct("_ch", "member").rle_id().alias("_mem"))
    )
    chains = kern.group_by("_ch", maintain_order=True).agg(
        pl.col("run", "part").first(),
        pl.col("dur_ns").sum().cast(pl.Float64).alias("measured"),
        pl.col("start_ns").first().alias("start"),
        pl.col("end_ns").max().alias("end"),
    )
    part_sig = pl.Series([p.sig_id for p in parts], dtype=pl.Int64)
    part_shapes = pl.Series([p.shapes_bytes for p in parts], dtype=pl.Float64)
    moved, largest = _moved(kern, part_shapes.gather(chains["part"]).is_null().to_list())
    chains = chains.select(
        per_run["rank"].gather(chains["run"]), per_run["stream"].gather(chains["run"]),
        per_run["step"].gather(chains["run"]), "part", part_sig.gather(chains["part"]).alias("sig"),
        "measured", moved.alias("moved"), largest.cast(pl.Float64).alias("largest"),
        part_shapes.gather(chains["part"]).alias("shapes_bytes"), "start", "end",
    )
    return chains, parts, sigs


def _moved(kern: pl.DataFrame, need_largest: list[bool]) -> tuple[pl.Series, pl.Series]:
    """Per chain (``_ch`` 0, 1, 2 ... of ``kern``, one row per kernel in order): bytes its
    kernels moved (Float64), and bytes of its largest member (``_mem``: consecutive kernels of
    one framework op) where ``need_largest`` (else null).

    Summed as Python's ``sum`` adds the same values in the same order as the per-chain
    formula (a member's kernels, then the chain's members: :func:`_sums_in_order`), so the
    floats are the same; polars' sums may add in another order (pairwise). A maximum is the
    same in any order (run members' bytes are positive: no NaN).
    """
    mem_n = kern["_mem"].rle().struct.field("len")
    mem_lo = mem_n.cum_sum() - mem_n
    member_bytes = _sums_in_order(kern["bytes"], mem_lo, mem_n)
    ch = kern["_ch"].gather(mem_lo)
    members = ch.rle().struct.field("len")
    moved = _sums_in_order(member_bytes, members.cum_sum() - members, members)
    largest = pl.DataFrame({"ch": ch, "b": member_bytes}).group_by("ch", maintain_order=True).agg(pl.col("b").max())
    need = pl.Series(need_largest, dtype=pl.Boolean)
    return moved, pl.select(pl.when(pl.lit(need)).then(pl.lit(largest["b"]))).to_series()


def _sums_in_order(values: pl.Series, lo: pl.Series, n: pl.Series) -> pl.Series:
    """Per segment ``[lo, lo + n)`` of ``values`` (Float64, no nulls, n ≥ 1): the sum
    ``sum(values[lo:lo + n])`` gives, as a Float64 Series.

    Python's float ``sum`` adds left to right from 0.0 before CPython 3.12 (compensated from
    3.12 on). Before 3.12 the same additions are made on whole columns, position by
    position: the running sums start as ``0.0 + values[lo]``, then the segments longer than
    ``j`` add their value at ``lo + j`` (each an IEEE addition of the same two floats, in the
    same order: the same result), so the cost is one gather per position, not one Python
    ``sum`` per segment (session 9: those were 0.2 s on a 1 GB trace). From 3.12: ``sum``.
    """
    lo, n = lo.cast(pl.Int64), n.cast(pl.Int64)
    if sys.version_info >= (3, 12):
        v = values.to_list()
        return pl.Series([sum(v[a : a + k]) for a, k in zip(lo.to_list(), n.to_list())], dtype=pl.Float64)
    acc = 0.0 + values.gather(lo)
    active = (n > 1).arg_true()
    j = 1
    while active.len():
        at = lo.gather(active)
        acc = acc.scatter(active, acc.gather(active) + values.gather(at + j))
        j += 1
        active = active.filter(n.gather(active) > j)
    return acc


def _structures(runs: Runs, per_run: pl.DataFrame) -> tuple[list[Part], list[tuple], list, list, list[int]]:
    """The chains of every distinct run structure (``per_run["struct"]``), worked out on its
    first run: ``(parts, sigs, flat_part, flat_member, offsets)``.

    ``parts``: every structure's :class:`Part` s; ``sigs``: the distinct signatures
    (``Part.sig_id`` indexes it). Kernel ``pos`` of a run of structure ``s`` is in part
    ``flat_part[offsets[s] + pos]`` (None: in no part), as its member number
    ``flat_member[offsets[s] + pos]`` (0, 1 ... within the part).
    """
    ex = per_run.filter(pl.col("struct").is_first_distinct()).select("struct", "lo", "n")
    rows = [i for _, lo, n in ex.iter_rows() for i in range(lo, lo + n)]
    kk = runs.kernels.select("name_c", "op_c", "skey", "new_member")[rows]
    name = runs.names.gather(kk["name_c"]).to_list()
    op = runs.op_names.gather(kk["op_c"]).to_list()
    skey, new_member = kk["skey"].to_list(), kk["new_member"].to_list()
    used = kk["skey"].drop_nulls().unique()
    keys = runs.shape_keys.filter(pl.col("_skey").is_in(used.implode()))
    texts = {k: (d, t, c) for k, d, t, c in keys.iter_rows()}
    parts: list[Part] = []
    sig_ids: dict[tuple, int] = {}
    flat_part: list[int | None] = []
    flat_member: list[int | None] = []
    offsets = [0] * ex.height
    at = 0
    for s, _, n in ex.iter_rows():
        sl = slice(at, at + n)
        at += n
        members = _members(name[sl], op[sl], skey[sl], new_member[sl], texts)
        offsets[s] = len(flat_part)
        fp: list[int | None] = [None] * n
        fm: list[int | None] = [None] * n
        for p in _parts(members):
            for j, (a, b) in enumerate(p.members):
                fp[a:b] = [len(parts)] * (b - a)
                fm[a:b] = [j] * (b - a)
            parts.append(replace(p, sig_id=sig_ids.setdefault(p.sig, len(sig_ids))))
        flat_part += fp
        flat_member += fm
    return parts, list(sig_ids), flat_part, flat_member, offsets


def _label(op: str | None, name: str | None) -> str:
    return op if op else short(name, 60)


def _members(name: list, op: list, skey: list, new_member: list, keys: dict) -> list[dict[str, Any]]:
    """Group a run's kernels (parallel lists) into framework-op members (consecutive kernels of
    one External id); ``keys``: shape key -> ``(input_dims, input_types, concrete_inputs)``."""
    out: list[dict[str, Any]] = []
    none3 = (None, None, None)
    for i in range(len(name)):
        if new_member[i] or not out:
            sk = skey[i]
            dims, types, conc = none3 if sk is None else keys[sk]
            m = {"op": op[i], "label": _label(op[i], name[i]), "dims": dims, "types": types, "conc": conc,
                 "n": 0, "name": name[i], "lo": i}
            out.append(m)
        m["n"] += 1
    return out


@dataclass(frozen=True)
class Part:
    """A chain of a run's structure: its kernels ``[lo, hi)``, its members' kernel ranges,
    its signature (labels, kernels per member) and its id among the distinct signatures, its
    members' first kernel names and the fused bytes from recorded shapes (None: fall back to
    the largest member's bytes)."""

    lo: int
    hi: int
    members: tuple[tuple[int, int], ...]
    sig: tuple[tuple[str, int], ...]
    names: list[str]
    shapes_bytes: float | None
    sig_id: int = -1


def _parts(members: list[dict[str, Any]]) -> list[Part]:
    """The chains of a run (:func:`_split_by_dataflow` of its members), by kernel index."""
    out = []
    for p in _split_by_dataflow(members):
        ranges = tuple((m["lo"], m["lo"] + m["n"]) for m in p)
        shapes = _from_shapes(p) if all(m["op"] and m["dims"] for m in p) else None
        out.append(Part(
            lo=ranges[0][0], hi=ranges[-1][1], members=ranges,
            sig=tuple((m["label"], m["n"]) for m in p),
            names=[m["name"] for m in p], shapes_bytes=shapes,
        ))
    return out


@functools.lru_cache(maxsize=65536)
def _io_of(op: str, dims: str, types: str | None, conc: str | None) -> tuple[tuple[float, ...], float, float] | None:
    c = costs.cost_of(op, dims, types, conc)
    if c is None or c.bytes_read is None or c.bytes_written is None:
        return None
    args = costs.OpArgs(op, dims, types, conc)
    return tuple(t.nbytes for _, t in args.tensors() if t.nbytes), float(c.bytes_read), float(c.bytes_written)


def _io_sizes(m: dict[str, Any]) -> tuple[tuple[float, ...], float] | None:
    """(input tensor sizes in bytes, bytes written) of a member, from its recorded shapes."""
    if not (m["op"] and m["dims"]):
        return None
    io = _io_of(m["op"], m["dims"], m["types"], m["conc"])
    return None if io is None else (io[0], io[2])


def _reads(m: dict[str, Any]) -> float:
    io = _io_of(m["op"], m["dims"], m["types"], m["conc"])
    return io[1] if io is not None else 0.0


def _split_by_dataflow(members: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Split a run's members where a member reads nothing an earlier member of the run wrote.

    Only decided when both sides have recorded shapes (sizes in bytes are compared); without
    shapes the run stays whole. Parts keep at least :data:`MIN_KERNELS` kernels (shorter
    ones are dropped).
    """
    parts: list[list[dict[str, Any]]] = [[members[0]]]
    io0 = _io_sizes(members[0])
    written: set[float] | None = {io0[1]} if io0 else None
    for m in members[1:]:
        io = _io_sizes(m)
        if io is not None and written is not None and not (set(io[0]) & written):
            parts.append([m])
            written = {io[1]}
            continue
        parts[-1].append(m)
        written = (written | {io[1]}) if (io is not None and written is not None) else None
    return [p for p in parts if sum(m["n"] for m in p) >= MIN_KERNELS]


def _from_shapes(members: list[dict[str, Any]]) -> float | None:
    seen: set[float] = set()
    total = 0.0
    for i, m in enumerate(members):
        io = _io_sizes(m)
        if io is None:
            return None
        sizes, written = io
        if i == 0:
            total += _reads(m)
            seen.update(sizes)
        else:
            for s in sizes:
                if s not in seen:
                    total += s
                    seen.add(s)
        seen.add(written)
        if i == len(members) - 1:
            total += written
    return total
