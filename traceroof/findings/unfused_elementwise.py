"""Unfused elementwise chains: back-to-back memory-bound elementwise / norm / reduction / cast /
copy kernels on one stream whose intermediates round-trip HBM.

**Runs.** On each (rank, device, stream), in start order, a run is a maximal sequence of
*eligible* kernels: kind ``elementwise``, ``norm`` or ``reduction`` (casts and copies are
``elementwise``), roofline ``bound`` ``memory`` or ``latency``, known bytes, not a
compiler-fused kernel (``triton_*`` from Inductor, BC-26; XLA ``fusion``). Any other kernel on
the stream ends the run; so does a step change, or an idle gap over :data:`RUN_MAX_GAP_NS`
between two kernels of different framework ops (kernels of one framework op always stay
together). A run needs at least two kernels.

**Fused kernel.** The run's *members* are its framework ops (consecutive kernels with one
``External id``). With recorded shapes (``record_shapes=True``) the fused kernel moves

    reads of the first member (its cost formula's ``bytes_read``)
    + every later member's input tensor whose size in bytes matches no tensor already
      seen in the run (not an output of an earlier member, not an input already read)
    + writes of the last member (its ``bytes_written``).

A tensor of a size already seen is assumed to be that tensor (an intermediate, or the same
external input read again). That undercounts a *different* external input of exactly the
same size entering mid-run (a residual); the fused estimate is then low and the claim high.
Without shapes the fused kernel is taken to move what the run's largest member moves. The
fused estimate never exceeds what the run moved. Its roofline time is
``max(fused_bytes / HBM bandwidth, chip launch floor)``: one fused kernel still costs a
kernel.

**Recoverable** per run = measured time of its kernels − fused roofline time (≥ 0). Runs
with the same member sequence (across layers and steps) form one finding. See
``docs/findings/unfused_elementwise.md``.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import polars as pl

from .. import costs
from ..costing import shape_keys
from . import Finding, FindingContext, register
from ._common import busy_ns, fmt_bytes, fmt_ns, kind_str, plain, severity, short, wall_ns

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
#: Report a chain group when it gives back at least this share of the rank's device busy time ...
MIN_SHARE_OF_BUSY = 0.005
#: ... and at least this long (ns).
MIN_NS = 1_000
#: Chain groups reported per rank (the rest are summed into one finding).
MAX_FINDINGS = 10


@register("unfused_elementwise")
def detect(ctx: FindingContext) -> list[Finding]:
    """One finding per (rank, chain signature) worth reporting."""
    runs = find_runs(ctx)
    if not runs:
        return []
    bw = float(ctx.chip.hbm_bytes_per_s)
    floor = float(ctx.chip.launch_overhead_ns)
    groups: dict[tuple, dict[str, Any]] = defaultdict(lambda: defaultdict(list))
    # Runs of one structure (same kernels, framework ops and shapes: every layer of every step)
    # split into the same parts with the same fused estimate; that is worked out once per
    # structure, and only the times and bytes are summed per run.
    structures: dict[tuple, list[_Part]] = {}
    for whole in runs:
        key = (tuple(whole["name"]), tuple(whole["op"]), tuple(whole["skey"]), tuple(whole["new_member"]))
        parts = structures.get(key)
        if parts is None:
            parts = structures[key] = _parts(whole)
        dur, nbytes, start, end = whole["dur_ns"], whole["bytes"], whole["start_ns"], whole["end_ns"]
        for part in parts:
            member_bytes = [sum(b or 0.0 for b in nbytes[lo:hi]) for lo, hi in part.members]
            moved = float(sum(member_bytes))
            measured = float(sum(dur[part.lo : part.hi]))
            if part.shapes_bytes is not None:
                fused_bytes, method = part.shapes_bytes, "shapes"
            else:
                fused_bytes, method = float(max(member_bytes)), "largest_member"
            fused_bytes = min(fused_bytes, moved)
            fused_ns = max(fused_bytes / bw * 1e9, floor)
            g = groups[(whole["rank"], part.sig)]
            g["measured"].append(measured)
            g["fused_ns"].append(fused_ns)
            g["fused_bytes"].append(fused_bytes)
            g["moved"].append(moved)
            g["rec"].append(max(measured - fused_ns, 0.0))
            g["method"].append(method)
            g["step"].append(whole["step"])
            g["stream"].append(whole["stream"])
            g["start"].append(start[part.lo])
            g["end"].append(max(end[part.lo : part.hi]))
            g["names"].append(part.names)
    out: list[Finding] = []
    by_rank: dict[int, list] = defaultdict(list)
    for (rank, sig), g in groups.items():
        by_rank[rank].append((sig, g))
    for rank, items in by_rank.items():
        busy = busy_ns(ctx, rank)
        wall = wall_ns(ctx, rank)
        threshold = max(MIN_NS, MIN_SHARE_OF_BUSY * busy)
        items.sort(key=lambda it: -sum(it[1]["rec"]))
        keep = [it for it in items if sum(it[1]["rec"]) >= threshold]
        rest = [it for it in items if sum(it[1]["rec"]) < threshold] + keep[MAX_FINDINGS:]
        keep = keep[:MAX_FINDINGS]
        for sig, g in keep:
            out.append(_finding(ctx, int(rank), sig, g, busy, wall, bw, floor))
        rest_ns = sum(sum(g["rec"]) for _, g in rest)
        if rest and rest_ns >= threshold:
            n = sum(len(g["rec"]) for _, g in rest)
            out.append(Finding(
                kind="unfused_elementwise",
                title=f"{len(rest)} more unfused chains ({n:,} runs): {fmt_ns(rest_ns)} recoverable",
                severity=severity(rest_ns, wall),
                recoverable_ns=float(rest_ns),
                explanation="Smaller unfused elementwise/norm chains, each below the report threshold; the same "
                "fix (torch.compile, a fused kernel) applies.",
                evidence=plain({"groups": len(rest), "runs": n, "recoverable_ns": rest_ns,
                                "measured_ns": sum(sum(g["measured"]) for _, g in rest),
                                "device_busy_ns": busy, "window_ns": wall}),
                rank=int(rank),
                ops=[" → ".join(lbl for lbl, _ in sig) for sig, _ in rest[:5]],
                occurrences=n,
                docs="docs/findings/unfused_elementwise.md",
            ))
    return out


def eligible_expr() -> pl.Expr:
    """Eligibility of one device op as a run member (see the module docstring)."""
    fused = pl.col("name").fill_null("").str.contains(FUSED_RE) | pl.col("op").fill_null("").str.contains(FUSED_RE)
    return (
        kind_str().is_in(list(KINDS))
        & pl.col("bound").is_in(list(BOUNDS))
        & (pl.col("bytes").fill_null(0.0) > 0)
        & (pl.col("dur_ns") > 0)
        & ~fused
        & ~pl.col("graph").fill_null(False)
    )


def find_runs(ctx: FindingContext) -> list[dict[str, Any]]:
    """All runs of ≥ :data:`MIN_KERNELS` eligible kernels, each as a dict of parallel lists.

    Per kernel: ``name``, ``op``, ``external_id``, ``dur_ns``, ``bytes``, ``start_ns``,
    ``end_ns``, ``new_member`` (the kernel starts a new framework-op member: its External id
    is unknown or differs from the previous kernel's) and ``skey``, an index into
    ``shape_keys`` (the recorded ``(input_dims, input_types, concrete_inputs)`` of its
    framework op); per run: ``rank``, ``device``, ``stream``, ``step``.
    """
    g = ["rank", "device", "stream"]
    # runs are found on the numeric columns (the sort moves no text); the text of the few
    # eligible kernels is gathered afterwards by row index
    lf = (
        ctx.ops.lazy()
        .with_row_index("_i")
        .select("_i", "rank", "device", "stream", "dur_ns", "start_ns", "step", "external_id",
                (pl.col("start_ns") + pl.col("dur_ns")).alias("end_ns"), eligible_expr().alias("elig"))
        .sort(*g, "start_ns", maintain_order=True)
    )
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
    el = (
        lf.with_columns(brk.alias("_brk"))
        .with_columns(pl.col("_brk").cast(pl.Int64).cum_sum().alias("run"),
                      (pl.col("_brk") | ~same_ext).alias("new_member"))
        .filter("elig")
        .filter(pl.len().over("run") >= MIN_KERNELS)
        .collect()
    )
    if el.height == 0:
        return []
    text = ctx.ops.select("name", "op", "bytes")[el["_i"]]
    el = pl.concat([el, text], how="horizontal")
    ids, keys = shape_keys(ctx.host)
    el = el.join(ids.rename({"_skey": "skey"}), on=["rank", "external_id"], how="left", maintain_order="left")
    used = el["skey"].drop_nulls().unique()
    texts = {k: (d, t, c) for k, d, t, c in keys.filter(pl.col("_skey").is_in(used.implode())).iter_rows()}
    # flat columns once (fast), then each run is a set of list slices (no nested-list rows)
    cols = ("name", "op", "external_id", "dur_ns", "bytes", "skey", "new_member", "start_ns", "end_ns")
    flat = {c: el[c].to_list() for c in cols}
    bounds = el.with_row_index("_k").group_by("run", maintain_order=True).agg(
        pl.col("_k").first().alias("lo"), pl.len().alias("n"),
        pl.col("rank").first(), pl.col("device").first(), pl.col("stream").first(), pl.col("step").first(),
    )
    runs = []
    for _, lo, n, rank, device, stream, step in bounds.iter_rows():
        hi = lo + n
        r = {c: v[lo:hi] for c, v in flat.items()}
        r.update(rank=rank, device=device, stream=stream, step=step, shape_keys=texts)
        runs.append(r)
    return runs


def _label(op: str | None, name: str | None) -> str:
    return op if op else short(name, 60)


def _members(run: dict[str, Any]) -> list[dict[str, Any]]:
    """Group a run's kernels into framework-op members (consecutive kernels of one External id)."""
    out: list[dict[str, Any]] = []
    keys = run["shape_keys"]
    none3 = (None, None, None)
    for i in range(len(run["name"])):
        if run["new_member"][i] or not out:
            sk = run["skey"][i]
            dims, types, conc = none3 if sk is None else keys[sk]
            m = {"op": run["op"][i], "label": _label(run["op"][i], run["name"][i]),
                 "dims": dims, "types": types, "conc": conc, "dur": [], "bytes": [], "names": [], "lo": i}
            out.append(m)
        m["dur"].append(run["dur_ns"][i])
        m["bytes"].append(run["bytes"][i] or 0.0)
        m["names"].append(run["name"][i])
    return out


@dataclass(frozen=True)
class _Part:
    """A chain of a run's structure: its kernels ``[lo, hi)``, its members' kernel ranges,
    its signature (labels, kernels per member), its first kernel names and the fused bytes
    from recorded shapes (None: fall back to the largest member's bytes)."""

    lo: int
    hi: int
    members: tuple[tuple[int, int], ...]
    sig: tuple[tuple[str, int], ...]
    names: list[str]
    shapes_bytes: float | None


def _parts(run: dict[str, Any]) -> list[_Part]:
    """The chains of a run (:func:`_split_by_dataflow` of its members), by kernel index."""
    out = []
    for p in _split_by_dataflow(_members(run)):
        ranges = tuple((m["lo"], m["lo"] + len(m["dur"])) for m in p)
        shapes = _from_shapes(p) if all(m["op"] and m["dims"] for m in p) else None
        out.append(_Part(
            lo=ranges[0][0], hi=ranges[-1][1], members=ranges,
            sig=tuple((m["label"], len(m["dur"])) for m in p),
            names=[m["names"][0] for m in p], shapes_bytes=shapes,
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
    return [p for p in parts if sum(len(m["dur"]) for m in p) >= MIN_KERNELS]


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


def _finding(ctx: FindingContext, rank: int, sig: tuple, g: dict[str, Any], busy: int, wall: int,
             bw: float, floor: float) -> Finding:
    n = len(g["rec"])
    rec = float(sum(g["rec"]))
    measured = float(sum(g["measured"]))
    k = sum(c for _, c in sig)
    labels = [lbl for lbl, _ in sig]
    names = [short(x.replace("aten::", ""), 28) for x in labels]
    if len(names) > 6:
        names = names[:3] + [f"… {len(names) - 5} more …"] + names[-2:]
    chain = " → ".join(names)
    steps = sorted({s for s in g["step"] if s is not None})
    per_step = n / len(steps) if steps else float(n)
    fused_b = sum(g["fused_bytes"]) / n
    moved = sum(g["moved"]) / n
    fused_ns = sum(g["fused_ns"]) / n
    methods = sorted(set(g["method"]))
    when = f"runs {per_step:.3g}× per step" if steps else f"runs {n:,}×"
    title = f"unfused {k}-kernel chain ({chain}) {when}: {fmt_ns(rec)} recoverable"
    expl = (
        f"These {k} memory-bound kernels run back to back on one stream and each reads its input from HBM and "
        f"writes its result back: one chain moves {fmt_bytes(moved)} and takes {fmt_ns(measured / n)}, while one "
        f"fused kernel reading the chain's external inputs once and writing its final output once would move "
        f"{fmt_bytes(fused_b)} (≥ {fmt_ns(fused_ns)} at {bw / 1e12:.3g} TB/s, one kernel floor {fmt_ns(floor)}). "
        f"Over {n:,} occurrences that is {fmt_ns(rec)}. Fix: let a compiler fuse them (torch.compile, XLA/jax.jit), "
        "or call the fused op (torch.nn.functional.rms_norm / layer_norm, fused optimizers with fused=True, "
        "Apex/Liger/vLLM fused kernels)."
    )
    i0 = min(range(n), key=lambda i: g["start"][i])
    streams = sorted(set(g["stream"]))
    evidence = {
        "chain": labels,
        "kernels_per_chain": k,
        "kernel_names": [short(x, 120) for x in g["names"][i0]],
        "occurrences": n,
        "steps": steps,
        "per_step": per_step,
        "measured_ns": measured,
        "measured_per_chain_ns": measured / n,
        "bytes_moved_per_chain": moved,
        "fused_bytes_per_chain": fused_b,
        "fused_roofline_per_chain_ns": fused_ns,
        "fused_roofline_ns": float(sum(g["fused_ns"])),
        "recoverable_ns": rec,
        "recoverable_per_step_ns": rec / len(steps) if steps else None,
        "fused_bytes_method": methods[0] if len(methods) == 1 else methods,
        "hbm_bytes_per_s": bw,
        "kernel_floor_ns": floor,
        "streams": streams,
        "device_busy_ns": busy,
        "window_ns": wall,
    }
    return Finding(
        kind="unfused_elementwise",
        title=title,
        severity=severity(rec, wall),
        recoverable_ns=rec,
        explanation=expl,
        evidence=plain(evidence),
        rank=rank,
        step=steps[0] if len(steps) == 1 else None,
        stream=streams[0] if len(streams) == 1 else None,
        start_ns=int(g["start"][i0]),
        end_ns=int(g["end"][i0]),
        ops=labels,
        occurrences=n,
        docs="docs/findings/unfused_elementwise.md",
    )
