"""XPlane assembly: the files of one profile (one per host) into one :class:`Trace`, their
clocks aligned, launches linked to ops, columns in the op/host schema.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from ..schema import HOST_SCHEMA, OP_SCHEMA
from ..trace import Trace, TraceMeta
from .xplane_planes import Parts, aligned, masked, nulls

EXTRA_COLUMNS = {
    "host": pl.String,  # hostname (XSpace.hostnames or the file name)
    "hlo_op": pl.String,  # HLO instruction name
    "hlo_module": pl.String,  # HLO module name
    "program_id": pl.UInt64,  # XLA program id of the module
    "hlo_category": pl.String,  # xprof category (TPU), e.g. "convolution fusion"
    "long_name": pl.String,  # HLO expression with shapes, when the trace or HLO has it
    "dot_flops": pl.Float64,  # a fusion's dot/convolution FLOPs (the rest of flops: fused elementwise): costs.hlo
    "hlo_op_name": pl.String,  # jax name stack of the HLO op (OpMetadata.op_name): .xplane_source
    "source_location": pl.String,  # "file:line" in the user's code that made it: .xplane_source
}


def assemble(all_parts: list[Parts], sources: list[str]) -> Trace:
    """The files' :class:`~.xplane_planes.Parts` (one per host, ranks in order) as one
    :class:`Trace` of format ``xplane``: clocks aligned through ``profile_start_time``, times
    relative to the earliest event (``meta.origin_ns``), launches linked, op and host
    columns in their schemas (plus :data:`EXTRA_COLUMNS`)."""
    meta = TraceMeta(format="xplane", sources=list(sources))
    starts = [p.profile_start_ns for p in all_parts]
    base = min(s for s in starts if s is not None) if any(s is not None for s in starts) else None
    if base is not None and any(s is None for s in starts) and len(all_parts) > 1:
        meta.warn("some profiles lack profile_start_time: their clocks are not aligned")
    ops_frames, host_frames = [], []
    for part in all_parts:
        shift = (part.profile_start_ns - base) if (base is not None and
                                                  part.profile_start_ns is not None) else 0
        for f in part.ops:
            ops_frames.append(f.with_columns(pl.col("start_ns") + shift))
        for f in part.host:
            host_frames.append(f.with_columns(pl.col("start_ns") + shift))
        meta.devices.extend(part.devices)
        meta.versions.update(part.versions)
        for w in part.warnings:
            meta.warn(w)
        for k, v in part.stats.items():
            meta.count(k, v)
    ops = _drop_negative(pl.concat(ops_frames, how="diagonal_relaxed") if ops_frames else pl.DataFrame(),
                         meta, "device ops")
    host = _drop_negative(pl.concat(host_frames, how="diagonal_relaxed") if host_frames else pl.DataFrame(),
                          meta, "host events")
    mins = [int(x) for x in (ops["start_ns"].min() if ops.height else None,
                             host["start_ns"].min() if host.height else None) if x is not None]
    origin = min(mins) if mins else 0
    if ops.height:
        ops = ops.with_columns(pl.col("start_ns") - origin)
        ops = _link_launches(ops, host, origin)
    if host.height:
        host = host.with_columns(pl.col("start_ns") - origin)
    meta.origin_ns = origin
    meta.base_time_ns = base
    meta.ranks = sorted({int(r) for r in ops["rank"].unique().to_list()}) if ops.height else [0]
    meta.world_size = len(all_parts) if len(all_parts) > 1 else None
    meta.count("xplane.hosts", len(all_parts))
    if ops.height == 0:
        meta.warn("no device ops found in the XSpace (no GPU/TPU op lines, no XLA CPU ops)")
    ops = _finish_ops(ops)
    host = _finish_host(host)
    unknown = int(ops.filter(pl.col("cost_source") == "unknown").height) if ops.height else 0
    if unknown:
        meta.count("xplane.ops_cost_unknown", unknown)
    return Trace(ops=ops, host=host, meta=meta)


def _link_launches(ops: pl.DataFrame, host: pl.DataFrame, origin: int) -> pl.DataFrame:
    """``launch_start_ns``/``launch_dur_ns`` of each op from the host launch call with the
    same (rank, correlation id); the first such call wins."""
    if not host.height or "correlation" not in host.columns:
        return ops
    launches = host.filter((pl.col("cat") == "runtime") & pl.col("correlation").is_not_null())
    if not launches.height or ops["correlation"].null_count() == ops.height:
        return ops
    n = ops.height
    l_start = np.full(n, 0, np.int64)
    l_dur = np.full(n, 0, np.int64)
    found = np.zeros(n, np.bool_)
    o_rank = ops["rank"].to_numpy()
    o_corr = ops["correlation"].fill_null(-1).to_numpy()
    o_has = ops["correlation"].is_not_null().to_numpy()
    h_rank = launches["rank"].to_numpy()
    one_rank = len(o_rank) and o_rank.min() == o_rank.max()
    ranks = [int(o_rank[0])] if one_rank else np.unique(o_rank[o_has]).tolist()
    for r in ranks:
        hm = h_rank == r
        if not hm.any():
            continue
        hc = launches["correlation"].to_numpy()[hm]
        hs = launches["start_ns"].to_numpy()[hm]
        hd = launches["dur_ns"].to_numpy()[hm]
        order = np.argsort(hc, kind="stable")
        hc, hs, hd = hc[order], hs[order], hd[order]
        sel = np.flatnonzero(o_has) if one_rank else np.flatnonzero((o_rank == r) & o_has)
        oc = o_corr[sel]
        lo, hi = int(hc[0]), int(hc[-1])
        if lo >= 0 and hi < 4 * (len(hc) + len(sel)) + (1 << 16):
            # small ids: a direct lookup table (first launch of each id) instead of a search
            first = np.ones(len(hc), np.bool_)
            first[1:] = hc[1:] != hc[:-1]
            lut = np.full(hi + 2, -1, np.int64)
            lut[hc[first]] = np.flatnonzero(first)
            k = lut[np.clip(oc, -1, hi + 1)]
            ok = k >= 0
        else:
            k = np.searchsorted(hc, oc)
            ok = k < len(hc)
            ok[ok] = hc[k[ok]] == oc[ok]
        l_start[sel[ok]] = hs[k[ok]] - origin
        l_dur[sel[ok]] = hd[k[ok]]
        found[sel[ok]] = True
    return ops.with_columns(
        aligned(ops, masked(l_start, found, pl.Int64).alias("launch_start_ns")),
        aligned(ops, masked(l_dur, found, pl.Int64).alias("launch_dur_ns")))


def _drop_negative(df: pl.DataFrame, meta: TraceMeta, what: str) -> pl.DataFrame:
    """``df`` without its rows of negative ``dur_ns`` (a ``duration_ps`` past 2^63 ps, read
    as signed, or an ``offset_ps + duration_ps`` that overflows int64: a damaged event, never
    a time), counted in ``meta.stats['xplane.negative_duration_<what>']`` and a warning."""
    if not df.height or "dur_ns" not in df.columns:
        return df
    bad = df["dur_ns"] < 0
    n = int(bad.sum())
    if not n:
        return df
    key = "xplane.negative_duration_" + what.replace(" ", "_")
    meta.count(key, n)
    meta.warn(f"{n} {what} with a negative duration (damaged duration_ps/offset_ps) left out")
    return df.filter(~bad)


def _finish_ops(ops: pl.DataFrame) -> pl.DataFrame:
    if ops.height == 0:
        return pl.DataFrame(schema={**dict(OP_SCHEMA.items()), **EXTRA_COLUMNS})
    cols = []
    for name, dtype in {**dict(OP_SCHEMA.items()), **EXTRA_COLUMNS}.items():
        if name in ops.columns:
            cols.append(pl.col(name).cast(dtype))
        else:
            cols.append(aligned(ops, nulls(name, ops.height, dtype)))
    ops = ops.select(cols)  # kind and cost_source are set on every row by the readers
    return ops


def _finish_host(host: pl.DataFrame) -> pl.DataFrame:
    if host.height == 0:
        return pl.DataFrame(schema=HOST_SCHEMA)
    cols = [pl.col(n).cast(t) if n in host.columns else pl.lit(None, t).alias(n)
            for n, t in HOST_SCHEMA.items()]
    extra = [c for c in ("annotation",) if c in host.columns]
    return host.select(cols + extra).sort(["rank", "start_ns"], maintain_order=True)
