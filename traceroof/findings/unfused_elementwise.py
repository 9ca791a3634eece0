"""Unfused elementwise chains: back-to-back memory-bound elementwise / norm / reduction / cast /
copy kernels on one stream whose intermediates round-trip HBM.

**Runs.** On each (rank, device, stream), in start order, a run is a maximal sequence of
*eligible* kernels: kind ``elementwise``, ``norm`` or ``reduction`` (casts and copies are
``elementwise``), roofline ``bound`` ``memory`` or ``latency``, known bytes, not a
compiler-fused kernel (``triton_*`` from Inductor, BC-26; XLA ``fusion``). Any other kernel on
the stream ends the run; so does a step change, or an idle gap over
:data:`~traceroof.findings._unfused_chains.RUN_MAX_GAP_NS`
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

The runs and chains, with the run thresholds (``RUN_MAX_GAP_NS``, ``MIN_KERNELS``), are
worked out in :mod:`traceroof.findings._unfused_chains`; this module prices them and reports.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import polars as pl

from ..frames import done, small
from . import Finding, FindingContext, register
from ._common import busy_ns, claim, fmt_bytes, fmt_ns, short, wall_ns
from ._unfused_chains import Part, find_chains

#: Report a chain group when it gives back at least this share of the rank's device busy time ...
MIN_SHARE_OF_BUSY = 0.005
#: ... and at least this long (ns).
MIN_NS = 1_000
#: Chain groups reported per rank (the rest are summed into one finding).
MAX_FINDINGS = 10


@register("unfused_elementwise", heavy=True)
def detect(ctx: FindingContext) -> list[Finding]:
    """One finding per (rank, chain signature) worth reporting."""
    found = find_chains(ctx)
    if found is None:
        return []
    chains, parts, sigs = found
    bw = float(ctx.chip.hbm_bytes_per_s)
    floor = float(ctx.chip.launch_overhead_ns)
    chains = _fused_estimate(chains, bw, floor)
    # one group per (rank, signature) in order of first appearance, each a dict of per-chain
    # lists in chain order (the sums below then add in the same order as chain by chain)
    cols = ("measured", "fused_ns", "fused_bytes", "moved", "rec", "method", "step", "stream", "start", "end", "part")
    groups = chains.group_by("rank", "sig", maintain_order=True).agg(*cols)
    out: list[Finding] = []
    by_rank: dict[int, list] = defaultdict(list)
    for g in groups.iter_rows(named=True):
        by_rank[g["rank"]].append((sigs[g["sig"]], g))
    for rank, items in by_rank.items():
        busy = busy_ns(ctx, rank)
        wall = wall_ns(ctx, rank)
        threshold = max(MIN_NS, MIN_SHARE_OF_BUSY * busy)
        items.sort(key=lambda it: -sum(it[1]["rec"]))
        keep = [it for it in items if sum(it[1]["rec"]) >= threshold]
        rest = [it for it in items if sum(it[1]["rec"]) < threshold] + keep[MAX_FINDINGS:]
        keep = keep[:MAX_FINDINGS]
        for sig, g in keep:
            out.append(_finding(ctx, int(rank), sig, g, parts, busy, wall, bw, floor))
        rest_ns = sum(sum(g["rec"]) for _, g in rest)
        if rest and rest_ns >= threshold:
            n = sum(len(g["rec"]) for _, g in rest)
            out.append(claim(
                "unfused_elementwise",
                f"{len(rest)} more unfused chains ({n:,} runs): {fmt_ns(rest_ns)} recoverable",
                float(rest_ns),
                wall,
                "Smaller unfused elementwise/norm chains, each below the report threshold; the same "
                "fix (torch.compile, a fused kernel) applies.",
                {"groups": len(rest), "runs": n, "recoverable_ns": rest_ns,
                                "measured_ns": sum(sum(g["measured"]) for _, g in rest),
                                "device_busy_ns": busy, "window_ns": wall},
                rank=int(rank),
                ops=[" → ".join(lbl for lbl, _ in sig) for sig, _ in rest[:5]],
                occurrences=n,
            ))
    return out


def _fused_estimate(chains: pl.DataFrame, bw: float, floor: float) -> pl.DataFrame:
    """Add the fused-kernel estimate to :func:`find_chains`' table: ``fused_bytes`` (bytes the
    fused kernel moves: from shapes, else the largest member, never above ``moved``),
    ``method`` (``shapes`` / ``largest_member``), ``fused_ns`` (its roofline time, ns, at ``bw``
    bytes/s and at least ``floor`` ns) and ``rec`` (recoverable ns, ≥ 0).

    ``min``/``max`` are written as ``when(b < a).then(b).otherwise(a)``: Python's ``min(a, b)``
    / ``max(a, b)`` (the first argument unless the second is strictly smaller / larger), so
    every value is the float the per-chain formula gives. The division is by a column of ``bw``:
    polars divides by a scalar by multiplying with its reciprocal, which can differ in the last
    bit from Python's ``b / bw``; column by column it divides.
    """
    has_shapes = pl.col("shapes_bytes").is_not_null()
    fb, moved, rec = pl.col("fused_bytes"), pl.col("moved"), pl.col("rec")
    height = chains.height
    chains = small(chains).with_columns(  # (one lazy plan on a small table, :mod:`traceroof.frames`)
        pl.when(has_shapes).then(pl.col("shapes_bytes")).otherwise(pl.col("largest")).alias("fused_bytes"),
        pl.when(has_shapes).then(pl.lit("shapes")).otherwise(pl.lit("largest_member")).alias("method"),
    ).with_columns(pl.when(moved < fb).then(moved).otherwise(fb).alias("fused_bytes"))
    roof = (fb / pl.col("_bw")) * 1e9
    return done(
        chains.with_columns(pl.repeat(bw, height, dtype=pl.Float64, eager=True).alias("_bw"))
        .with_columns(pl.when(pl.lit(floor) > roof).then(pl.lit(floor)).otherwise(roof).alias("fused_ns"))
        .drop("_bw")
        .with_columns((pl.col("measured") - pl.col("fused_ns")).alias("rec"))
        .with_columns(pl.when(pl.lit(0.0) > rec).then(pl.lit(0.0)).otherwise(rec).alias("rec"))
    )


def _finding(ctx: FindingContext, rank: int, sig: tuple, g: dict[str, Any], parts: list[Part], busy: int,
             wall: int, bw: float, floor: float) -> Finding:
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
    i0 = g["start"].index(min(g["start"]))  # the first chain of the earliest start
    streams = sorted(set(g["stream"]))
    evidence = {
        "chain": labels,
        "kernels_per_chain": k,
        "kernel_names": [short(x, 120) for x in parts[g["part"][i0]].names],
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
    return claim(
        "unfused_elementwise", title, rec, wall, expl,
        evidence, rank=rank, steps=steps,
        stream=streams[0] if len(streams) == 1 else None,
        start_ns=int(g["start"][i0]),
        end_ns=int(g["end"][i0]),
        ops=labels,
        occurrences=n,
    )
