"""Per-instruction cost (FLOPs, bytes) of XLA programs, from their compiled HLO via jaxlib,
and attaching it to the XPlane reader's op frames.

jax profiles carry the compiled HLO of every module in the ``/host:metadata`` plane (stat
``Hlo Proto``), but on CPU (and on the jax GPU profiles we have) no per-op FLOPs/bytes stats.
XLA's own cost model, ``HloCostAnalysis``, is reachable through jaxlib
(``_jax.hlo_module_cost_analysis(client, module)``), but only for a whole module. So each
instruction is wrapped into a one-instruction module -- its operands become parameters of the
same shapes, the computations it calls (fused computations, reduction regions) come along --
and analysed alone. On the project's CPU transformer profile the per-instruction FLOPs sum
exactly to ``compiled.cost_analysis()["flops"]`` (see tests/test_xplane_cpu.py).

HLO text parsing is in :mod:`traceroof.costs.hlo_text`, opcode -> kind rules in
:func:`traceroof.costs.kinds.kind_of_hlo`; finding the ``Hlo Proto`` of each program in an
XPlane is the reader's (:mod:`traceroof.parsers.hlo_modules`).

jax/jaxlib (private APIs: ``jax._src.lib``) are imported lazily, only when a profile needs
them, and :func:`available` says whether they work. A standalone CPU PjRt client is used, so
analysing never initialises (or grabs memory on) a GPU/TPU backend.

Caveats (documented in docs/xplane.md):
* ``custom-call`` instructions (fused attention, FFI calls) have no FLOP model in
  HloCostAnalysis; their FLOPs are reported as unknown (None), except GEMM custom calls whose
  ``dot_dimension_numbers`` we can read (2*M*N*K per batch).
* Control flow (``while``, ``call``, ``conditional``) is costed as one pass of its body.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
import polars as pl

from ..schema import KIND
from .hlo_text import (
    InstrInfo,
    collective_size,
    first_array_shape,
    gemm_custom_call_flops,
    one_instruction_module,
    parse_hlo_text,
    parse_instructions,
    shape_bytes,
    xla_dtype,
)
from .kinds import GEMM_TARGET, kind_of_hlo

log = logging.getLogger(__name__)


class HloCostUnavailable(RuntimeError):
    """jax/jaxlib (or the private API this module uses) is not available."""


@dataclass
class HloOpCost:
    """XLA HloCostAnalysis of one instruction: FLOPs, bytes accessed, transcendentals.
    ``flops`` is None when the cost model has no FLOP count for it (custom calls)."""

    flops: float | None
    bytes_accessed: float | None
    transcendentals: float | None = None


@dataclass
class ModuleInfo:
    """An HLO module: its instructions by name, and (lazily) their costs."""

    name: str
    text: str
    instructions: dict[str, InstrInfo]
    _comps: dict = field(default_factory=dict, repr=False)
    _costs: dict[str, HloOpCost] = field(default_factory=dict, repr=False)

    def cost(self, name: str) -> HloOpCost | None:
        """Cost of instruction ``name`` (None when the module has no such instruction or it
        cannot be analysed). Results are cached."""
        if name in self._costs:
            return self._costs[name]
        info = self.instructions.get(name)
        result = None if info is None else _cost_one(self, info)
        self._costs[name] = result
        return result


def available() -> bool:
    """True when jax/jaxlib with the needed (private) API can be imported."""
    try:
        _client()
    except HloCostUnavailable:
        return False
    return True


@lru_cache(maxsize=1)
def _client():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    try:
        from jax._src.lib import _jax, xla_client  # type: ignore[attr-defined]

        client = xla_client.make_cpu_client()
        _jax.hlo_module_cost_analysis  # noqa: B018 (presence check)
        xla_client.hlo.hlo_module_from_text  # noqa: B018
    except Exception as exc:  # ImportError, AttributeError across jax versions
        raise HloCostUnavailable(f"jax/jaxlib HLO cost analysis unavailable: {exc}") from exc
    return client, _jax, xla_client


def module_info_from_proto(proto: bytes, name: str = "", *,
                           unwrap: Callable[[bytes], bytes] | None = None) -> ModuleInfo:
    """Parse a serialized ``xla.HloModuleProto`` into a :class:`ModuleInfo`; with ``unwrap``,
    ``proto`` is a message that holds one and ``unwrap(proto)`` returns it (``xla.HloProto``).

    Raises :class:`HloCostUnavailable` without jax, ``ValueError`` on a proto that does not
    unwrap or that jaxlib cannot read."""
    _client_, _jax, xc = _client()
    try:
        module_proto = unwrap(proto) if unwrap is not None else proto
        module = xc.hlo.HloModule.from_serialized_hlo_module_proto(module_proto)
        text = module.to_string()
    except Exception as exc:
        raise ValueError(f"HLO module {name!r} does not load: {exc}") from exc
    return module_info_from_text(text, name or module.name)


def module_info_from_text(text: str, name: str = "") -> ModuleInfo:
    """:class:`ModuleInfo` from HLO module text (``HloModule.to_string()``)."""
    comps, entry = parse_hlo_text(text)
    return ModuleInfo(name=name, text=text, instructions=parse_instructions(comps, entry), _comps=comps)


def _cost_one(module: ModuleInfo, info: InstrInfo) -> HloOpCost | None:
    client, _jax, xc = _client()
    text = one_instruction_module(module._comps, info)
    try:
        hm = xc.hlo.hlo_module_from_text(text)
        ca = _jax.hlo_module_cost_analysis(client, hm)
    except Exception as exc:
        log.debug("cost analysis failed for %s: %s", info.name, exc)
        return None
    flops = float(ca.get("flops", 0.0))
    nbytes = ca.get("bytes accessed")
    cost = HloOpCost(
        flops=flops,
        bytes_accessed=None if nbytes is None else float(nbytes),
        transcendentals=float(ca.get("transcendentals", 0.0)),
    )
    targets = set(info.custom_call_targets_inside)
    if info.custom_call_target:
        targets.add(info.custom_call_target)
    if cost.bytes_accessed is not None and cost.bytes_accessed < 0:
        cost.bytes_accessed = None  # HloCostAnalysis says "unknown" with -1
    if targets:  # HloCostAnalysis has no FLOP model for custom calls
        if info.opcode == "custom-call" and GEMM_TARGET.search(info.custom_call_target or ""):
            cost.flops = gemm_custom_call_flops(info)
            if cost.bytes_accessed is None:  # operands + the result (not the workspace)
                parts = [shape_bytes(s) for s in info.operand_shapes]
                out = shape_bytes(first_array_shape(info.shape))
                if out is not None and all(p is not None for p in parts):
                    cost.bytes_accessed = float(sum(parts) + out)
        else:
            cost.flops = None
    return cost


def attach_hlo_costs(frame: pl.DataFrame, modules: Any, stats) -> pl.DataFrame:
    """Fill op/kind/dtype/flops/bytes of op rows that have no trace costs from their HLO
    instruction, spreading an instruction's cost over the kernels of one execution, and set
    ``cost_source`` (``trace`` / ``shapes`` / ``unknown``).

    ``frame`` (one op line) has the columns the XPlane reader builds: name, start_ns, dur_ns,
    device, correlation, program_id, hlo_op, hlo_module, op, kind, dtype, flops, bytes,
    comm_bytes, group_size, long_name, md_cost (trace carried costs), memcpy_bytes, tf_type.
    ``modules`` answers ``info(program_id) -> ModuleInfo | None`` (the XPlane reader's
    ``Modules``); ``stats`` is a Counter (``xplane.hlo_cost_needed`` is incremented)."""
    for c, t in (("memcpy_bytes", pl.Float64), ("tf_type", pl.String)):
        if c not in frame.columns:
            frame = frame.with_columns(pl.lit(None, t).alias(c))
    need = frame.filter(~pl.col("md_cost").fill_null(False) & pl.col("hlo_op").is_not_null()
                        & pl.col("program_id").is_not_null())
    hlo_rows: list[dict] = []
    if need.height:
        stats["xplane.hlo_cost_needed"] += need.height
        for pid, op in need.select("program_id", "hlo_op").unique().iter_rows():
            minfo = modules.info(int(pid))
            info = minfo.instructions.get(op) if minfo else None
            if info is None:
                continue
            cost = minfo.cost(op)
            targets = info.custom_call_targets_inside | (
                {info.custom_call_target} if info.custom_call_target else set())
            kind = kind_of_hlo(info.opcode, None, info.fused_opcodes, frozenset(targets))
            operand = info.operand_shapes[0] if info.operand_shapes else None
            comm, group = collective_size(info.opcode, info.text)
            hlo_rows.append({
                "program_id": int(pid), "hlo_op": op, "h_op": info.opcode, "h_kind": kind,
                "h_dtype": xla_dtype(operand if kind in ("matmul", "conv", "attention")
                                     and operand else info.shape),
                "h_flops": cost.flops if cost else None,
                "h_bytes": cost.bytes_accessed if cost else None,
                "h_comm": comm, "h_group": group, "h_long": info.text[:2000],
                "h_module": minfo.name,
            })
    has_trace = pl.col("md_cost").fill_null(False)
    is_copy = pl.col("memcpy_bytes").is_not_null()
    if hlo_rows:
        schema = {"program_id": pl.UInt64, "hlo_op": pl.String, "h_op": pl.String,
                  "h_kind": KIND, "h_dtype": pl.String, "h_flops": pl.Float64,
                  "h_bytes": pl.Float64, "h_comm": pl.Float64, "h_group": pl.Int32,
                  "h_long": pl.String, "h_module": pl.String}
        hdf = pl.DataFrame(hlo_rows, schema=schema, orient="row")
        frame = frame.join(hdf, on=["program_id", "hlo_op"], how="left", maintain_order="left")
        frame = spread_over_kernels(frame)
        frame = frame.with_columns(
            pl.coalesce("h_op", "op", "tf_type").alias("op"),
            pl.coalesce("h_kind", "kind").alias("kind"),
            pl.coalesce("dtype", "h_dtype").alias("dtype"),
            pl.when(has_trace).then(pl.col("flops")).when(is_copy).then(pl.lit(0.0))
            .otherwise(pl.col("h_flops_share")).alias("flops"),
            pl.when(has_trace).then(pl.col("bytes")).when(is_copy).then(pl.col("memcpy_bytes"))
            .otherwise(pl.col("h_bytes_share")).alias("bytes"),
            pl.coalesce("comm_bytes", "h_comm").alias("comm_bytes"),
            pl.coalesce("group_size", "h_group").alias("group_size"),
            pl.coalesce("long_name", "h_long").alias("long_name"),
            pl.coalesce("hlo_module", "h_module").alias("hlo_module"),
        )
    else:
        frame = frame.with_columns(
            pl.coalesce("op", "tf_type").alias("op"),
            pl.when(has_trace).then(pl.col("flops")).when(is_copy).then(pl.lit(0.0))
            .otherwise(None).alias("flops"),
            pl.when(has_trace).then(pl.col("bytes")).when(is_copy).then(pl.col("memcpy_bytes"))
            .otherwise(None).alias("bytes"),
        )
    frame = frame.with_columns(
        pl.when(has_trace | is_copy).then(pl.lit("trace"))
        .when(pl.col("flops").is_not_null() | pl.col("bytes").is_not_null()).then(pl.lit("shapes"))
        .otherwise(pl.lit("unknown")).alias("cost_source"))
    drop = [c for c in frame.columns if c.startswith("h_")]
    return frame.drop(drop + ["md_cost", "metadata_id", "memcpy_bytes", "tf_type"], strict=False)


def spread_over_kernels(frame: pl.DataFrame) -> pl.DataFrame:
    """Split each HLO instruction's per-execution cost over the kernels of that execution.

    Kernels of one execution are consecutive launches (by correlation id, else start time)
    on a device with the same (program, instruction); a run of such launches that repeats
    the same kernel-name sequence k times is k executions (the smallest period of the names).
    Shares are proportional to kernel duration (equal when all durations are 0).
    """
    n = frame.height
    has = (frame["h_flops"].is_not_null() | frame["h_bytes"].is_not_null()).to_numpy()
    rows = np.flatnonzero(has)
    share = np.ones(n)
    if len(rows) > 1:
        sub = frame[rows]
        device = sub["device"].to_numpy()
        order_val = sub.select(pl.coalesce("correlation", "start_ns")).to_series().to_numpy()
        key = sub.select(pl.concat_str([pl.col("program_id").cast(pl.String), pl.col("hlo_op")],
                                       separator="\x00").cast(pl.Categorical).to_physical()
                         ).to_series().to_numpy().astype(np.int64)
        order = np.lexsort((np.arange(len(rows)), order_val, device))
        k_s, d_s = key[order], device[order]
        new_run = np.ones(len(order), np.bool_)
        new_run[1:] = (k_s[1:] != k_s[:-1]) | (d_s[1:] != d_s[:-1])
        run_start = np.flatnonzero(new_run)
        run_len = np.diff(np.append(run_start, len(order)))
        exec_id = np.arange(len(order))
        names = sub["name"].to_numpy()[order]
        for start, length in zip(run_start[run_len > 1].tolist(), run_len[run_len > 1].tolist()):
            seq = names[start : start + length].tolist()
            period = length
            for p in range(1, length):
                if length % p == 0 and all(seq[i] == seq[i % p] for i in range(p, length)):
                    period = p
                    break
            exec_id[start : start + length] = start + (np.arange(length) // period) * period
        dur = sub["dur_ns"].to_numpy()[order].astype(np.float64)
        total = np.bincount(exec_id, weights=dur, minlength=len(order))[exec_id]
        count = np.bincount(exec_id, minlength=len(order))[exec_id]
        sub_share = np.where(total > 0, dur / np.where(total > 0, total, 1), 1.0 / count)
        share[rows[order]] = sub_share
    return frame.with_columns(
        (pl.col("h_flops") * pl.Series(share)).alias("h_flops_share"),
        (pl.col("h_bytes") * pl.Series(share)).alias("h_bytes_share"),
    )
