"""Host↔device copies and host synchronizations on the critical path.

Two claims, disjoint from each other and from every other detector:

* **copies**: ``Memcpy HtoD`` / ``Memcpy DtoH`` device ops (Kineto names them
  ``Memcpy HtoD (Pageable -> Device)``, ``Memcpy DtoH (Device -> Pinned)``, ROCm ``... (Host ->
  Device)``). Their *exposed* time is the union of their intervals minus the union of every
  kernel and collective on the device (copy-only time, when the copy engine is the only thing
  working). Recoverable = exposed copy time.
* **syncs**: the device-idle gaps that contain the return of a host synchronization which
  began before the device ran dry (``cudaDeviceSynchronize``, ``cudaStreamSynchronize``,
  ``cudaEventSynchronize``, a synchronous ``cudaMemcpy``/``hipMemcpyWithStream``, a copy call
  that blocked ≥ 20 µs, a ``cuda_sync`` event): after the host returns, the device waits for
  the host to launch again (:mod:`traceroof.findings._idle`, label ``sync``). Recoverable = those gaps.

See ``docs/findings/host_device_copies.md``.
"""

from __future__ import annotations

from collections import Counter

import polars as pl

from .. import intervals as iv
from . import Finding, FindingContext, register
from ._common import (
    claim,
    device_order,
    end_expr,
    fmt_bytes,
    fmt_ns,
    scope_evidence,
    scope_wall_ns,
    scopes,
    short,
    subtract,
    subtract_sorted,
    total,
    union,
)
from ._idle import OWNER_SYNC, timeline

#: Report when the claim is at least this share of the rank's window ...
MIN_SHARE = 0.005
#: ... and at least this long (ns).
MIN_NS = 5_000

_DIRECTIONS = (
    ("HtoD", r"(?i)HtoD|Host\s*->\s*Device|Pageable\s*->\s*Device|Pinned\s*->\s*Device"),
    ("DtoH", r"(?i)DtoH|Device\s*->\s*Host|Device\s*->\s*Pageable|Device\s*->\s*Pinned"),
)
#: the memcpy rows' columns that say whether their name matches each of :data:`_DIRECTIONS`
_DIRECTION_COLS = ("_is_HtoD", "_is_DtoH")


@register("host_device_copies")
def detect(ctx: FindingContext) -> list[Finding]:
    """Findings for exposed host↔device copies (per direction) and sync stalls, per rank (per
    (rank, device) for a rank driving several devices, :func:`~._common.scopes`)."""
    out: list[Finding] = []
    # the copies are a few rows of the op table: select them before splitting by rank, and
    # name their direction there, once for every rank (:data:`_DIRECTION_COLS`)
    copies = ctx.ops.filter(pl.col("kind") == "memcpy")
    if copies.height:
        copies = copies.with_columns(end_expr(), *(pl.col("name").str.contains(rx).alias(c)
                                                   for c, (_, rx) in zip(_DIRECTION_COLS, _DIRECTIONS)))
    mem = {(r, d): g for r, d, g in scopes(ctx, copies)}
    # what a copy cannot claim, per (rank, device): built once, for every rank holding copies
    kernels = _blockers(ctx, copies) if mem else {}
    # the sync-owned gaps of every rank (device), split once
    sync_gaps = {(r, d): g for r, d, g in scopes(ctx, timeline(ctx).filter(pl.col("owner") == OWNER_SYNC))}
    for key in sorted(mem.keys() | sync_gaps.keys(), key=lambda k: (k[0], k[1] is not None, k[1] or 0)):
        rank, dev = key
        if key in mem:
            out.extend(_copy_findings(ctx, rank, mem[key], kernels, dev))
        f = _sync_finding(ctx, rank, sync_gaps.get(key), dev)
        if f is not None:
            out.append(f)
    return out


def _copy_findings(ctx: FindingContext, rank: int, mem: pl.DataFrame,
                   kernels: dict[tuple[int, int | None], tuple[list[int], list[int]]],
                   on: int | None = None) -> list[Finding]:
    """The copy findings of rank ``rank`` (``mem``: its memcpy ops, with ``end_ns`` and the
    :data:`_DIRECTION_COLS`, all on its device ``on`` when it drives several; ``kernels``:
    :func:`_blockers`).

    The exposed time of each direction is worked out on the copies' rows as Python lists
    (a rank holds few copies); the copies of a direction become a table of their own only
    when they make a finding."""
    wall = scope_wall_ns(ctx, rank, on)
    if mem.height == 0:
        return []
    out = []
    rows = mem.select("device", "start_ns", "end_ns", *_DIRECTION_COLS).rows()
    # per device: kernels and collectives (not claimable), plus what an earlier direction claimed
    # (HtoD and DtoH copy engines can run at once: an instant is claimed once):
    # mine = copies − kernels − claimed, as disjoint sorted interval lists
    claimed: dict[int, list[tuple[int, int]]] = {}
    for at, ((direction, _), col) in enumerate(zip(_DIRECTIONS, _DIRECTION_COLS)):
        on_dev: dict[int | None, list[tuple[int, int]]] = {}
        for r in rows:
            if r[3 + at]:  # a null name matches no direction
                on_dev.setdefault(r[0], []).append((r[1], r[2]))
        if not on_dev:
            continue
        exposed = 0
        for dev, spans in sorted(on_dev.items(), key=lambda kv: str((kv[0],))):  # (as the partitions' keys sorted)
            u_cp = union(spans)
            mine = subtract(subtract_sorted(u_cp, *kernels.get((rank, dev), ([], []))), claimed.get(dev, []))
            exposed += total(mine)
            if mine:
                claimed[dev] = union(claimed.get(dev, []) + mine)
        if exposed < max(MIN_NS, MIN_SHARE * wall):
            continue
        cp = mem.filter(pl.col(col))
        measured = int(cp["dur_ns"].sum())
        nbytes = cp["bytes"].sum() if cp["bytes"].null_count() < cp.height else None
        pageable = cp.filter(pl.col("name").str.contains("(?i)pageable")).height
        bw = (float(nbytes) / measured * 1e9) if nbytes and measured else None
        steps = sorted(s for s in cp["step"].unique().to_list() if s is not None)
        ops_by = cp.group_by(pl.coalesce("op", "name").alias("l")).agg(pl.len()).sort(["len", "l"], descending=[True, False])
        title = ("" if on is None else f"device {on}: ") + (
            f"{direction} copies ×{cp.height:,} ({fmt_bytes(nbytes)}): {fmt_ns(exposed)} with nothing else "
            "running on the device"
        )
        expl = (
            f"{cp.height:,} {direction} copies moved {fmt_bytes(nbytes)} in {fmt_ns(measured)}"
            + (f" ({bw / 1e9:.3g} GB/s)" if bw else "")
            + f"; {fmt_ns(exposed)} of that ran with no kernel beside it, so the device waited on the PCIe/host link. "
            + (f"{pageable} of them are from pageable host memory (synchronous, slow). " if pageable else "")
            + "Fix: pin host buffers (pin_memory=True) and copy with non_blocking=True on a side stream so the copy "
            "overlaps compute; keep data on the device; for DtoH, avoid .cpu()/.item() inside the step or batch them."
        )
        out.append(claim(
            "host_device_copies", title, float(exposed), wall, expl,
            {
                "what": "copies", "direction": direction, "count": cp.height, "bytes": nbytes,
                "measured_ns": measured, "exposed_ns": exposed, "achieved_bytes_per_s": bw,
                "pageable_count": pageable, "steps": steps, "window_ns": wall,
                "by_op": [[short(a, 80), int(b)] for a, b in ops_by.head(5).iter_rows()],
                **scope_evidence(ctx, rank, on),
            },
            rank=rank, device=on,
            steps=steps,
            ops=[short(a, 80) for a, _ in ops_by.head(5).iter_rows()],
            occurrences=cp.height,
        ))
    return out


def _blockers(ctx: FindingContext, copies: pl.DataFrame) -> dict[tuple[int, int | None], tuple[list[int], list[int]]]:
    """Per (rank, device) holding copies (``copies``: the memcpy rows, with ``end_ns``): the
    union of its kernels and collectives (every device op but copies and fills: what a copy
    cannot claim) that overlap one of its copies, as sorted disjoint ``(starts, ends)`` lists,
    ns.

    A copy minus the union of every kernel of its device is the copy minus the union of the
    kernels that overlap it (the others remove nothing from it), so the exposed copy time
    is the same; a device can hold hundreds of thousands of kernels and a few copies. A kernel
    ``[s, e)`` overlaps one when the last union-of-copies interval of its device starting
    before ``e`` ends after ``s`` (the copies' union is disjoint and sorted): one as-of join
    over the device order for every device.
    """
    key = ["rank", "_dev"]
    none = -(2**40)  # a null device matched as a value of its own (as the per-device tables keyed it)
    dev = pl.col("device").cast(pl.Int64).fill_null(none).alias("_dev")
    d = device_order(ctx)
    kind = ctx.ops["kind"]
    if not d["op_row"].is_sorted():  # sorted: the op table is in device order already
        kind = kind.gather(d["op_row"])
    kern = d.filter((kind != "memcpy") & (kind != "memset")).select("rank", dev, "start_ns", "end_ns")
    cu = iv.union(copies.select("rank", dev, "start_ns", "end_ns"), by=key)
    j = (kern.sort("end_ns", maintain_order=True)
         .join_asof(cu.sort("start_ns", maintain_order=True), left_on="end_ns", right_on="start_ns", by=key,
                    strategy="backward", allow_exact_matches=False, check_sortedness=False, suffix="_c"))
    near = j.filter(pl.col("end_ns_c") > pl.col("start_ns")).select(*key, "start_ns", "end_ns")
    spans: dict[tuple[int, int | None], list[tuple[int, int]]] = {}
    for r, dv, a, b in near.rows():
        spans.setdefault((r, None if dv == none else dv), []).append((a, b))
    out = {}
    for k, v in spans.items():
        u = union(v)
        out[k] = ([a for a, _ in u], [b for _, b in u])
    return out


def _sync_finding(ctx: FindingContext, rank: int, g: pl.DataFrame | None, dev: int | None = None) -> Finding | None:
    """The sync-stall finding of rank ``rank`` (``g``: its sync-owned timeline rows, all on its
    device ``dev`` when it drives several; None: none)."""
    wall = scope_wall_ns(ctx, rank, dev)
    if g is None or g.height == 0:
        return None
    gaps, sync_names, stepped = (c.to_list() for c in g.select("gap_ns", "sync_name", "step").get_columns())
    rec = float(sum(v for v in gaps if v is not None))
    if rec < max(MIN_NS, MIN_SHARE * wall):
        return None
    names = Counter(sync_names)
    steps = sorted({s for s in stepped if s is not None})
    big = g.sort("gap_ns", descending=True).row(0, named=True)
    what = ", ".join(f"{n} ×{c}" for n, c in names.most_common(4))
    title = ("" if dev is None else f"device {dev}: ") + f"host synchronizations stall the device: {g.height:,} stalls after {what} ({fmt_ns(rec)} idle)"
    expl = (
        f"{g.height:,} times the host blocked until the device drained ({what}); the device then sat idle until the "
        f"host launched again, {fmt_ns(rec)} in total (largest {fmt_ns(big['gap_ns'])}). Each sync empties the "
        "launch queue the host had built up. Fix: remove .item(), .tolist(), .cpu(), print(tensor) and explicit "
        "torch.cuda.synchronize() from the step (log every N steps instead), use non_blocking copies with events, "
        "and keep control flow on the device."
    )
    return claim(
        "host_device_copies", title, rec, wall, expl,
        {
            "what": "syncs", "stalls": g.height, "idle_after_sync_ns": rec,
            "by_call": dict(names), "largest_gap_ns": int(big["gap_ns"]), "steps": steps,
            "window_ns": wall, **scope_evidence(ctx, rank, dev),
        },
        rank=rank, device=dev,
        steps=steps,
        start_ns=int(big["gap_start_ns"]),
        end_ns=int(big["start_ns"]),
        ops=list(names),
        occurrences=g.height,
    )
