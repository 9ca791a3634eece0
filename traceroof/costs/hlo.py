"""Per-instruction cost (FLOPs, bytes) of XLA programs, from their compiled HLO, and attaching
it to the XPlane reader's op frames. No jax needed: the HLO comes as text (from the trace's
``Hlo Proto``, decoded by :mod:`traceroof.parsers.hlo_modules` with the project's own wire
reader) and is costed by :mod:`traceroof.costs.hlo_model`, which follows XLA's
``HloCostAnalysis`` conventions (on the project's CPU transformer profile the per-instruction
FLOPs sum exactly to ``compiled.cost_analysis()["flops"]``: tests/test_xplane_cpu.py).

HLO text parsing is in :mod:`traceroof.costs.hlo_text`, opcode -> kind rules in
:func:`traceroof.costs.kinds.kind_of_hlo`.

Custom calls: GEMMs (``__cublas$gemm``, cuBLASLt) are ``2*M*N*K`` per batch from their
``dot_dimension_numbers``; cuDNN convolutions (``__cudnn$conv*``) the convolution's FLOPs
from the window and ``dim_labels`` (:func:`custom_call_cost`); Pallas / Mosaic calls their
``cost_estimate`` where the backend_config carries one; any other custom call has unknown
FLOPs (None) and its operands plus result as bytes. Control flow (``while``, ``call``,
``conditional``) is one pass of its body: a trace records each iteration's body ops, and the
reader keeps the loop container out of the op table (docs/xplane.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from ..schema import KIND
from .attention import attention_flops, attention_pairs
from .hlo_model import CostModel, conv_flops, cost_estimate, trip_count
from .hlo_text import (
    InstrInfo,
    collective_size,
    first_array_shape,
    gemm_custom_call_flops,
    parse_hlo_text,
    parse_instructions,
    shape_bytes,
    xla_dtype,
)
from .kinds import GEMM_TARGET, kind_of_hlo

#: TransformerEngine's fused-attention FFI custom calls (jax ``transformer_engine.jax``).
TE_ATTENTION = re.compile(r"^te_fused_attn_(forward|backward)")
_MLIR_INT = re.compile(r"(\w+) = (-?\d+) : i64")

#: cuDNN convolution custom-call targets (forward, fused forward, the two backward passes).
CUDNN_CONV = re.compile(r"^__cudnn\$conv")


@dataclass
class HloOpCost:
    """Cost of one HLO instruction: FLOPs, bytes accessed (result + operands read), and
    transcendentals, per execution. ``flops`` is None when there is no FLOP model for it
    (custom calls other than GEMMs, cuDNN convolutions and Pallas calls with a cost estimate)."""

    flops: float | None
    bytes_accessed: float | None
    transcendentals: float | None = None
    #: a fusion (or call) holding a dot or convolution and other ops: the dots' and
    #: convolutions' own FLOPs (:meth:`CostModel.dot_flops`), the rest of ``flops`` being the
    #: fused elementwise work; None for any other instruction
    dot_flops: float | None = None


@dataclass
class ModuleInfo:
    """An HLO module: its instructions by name, and (lazily) their costs."""

    name: str
    text: str
    instructions: dict[str, InstrInfo]
    _comps: dict = field(default_factory=dict, repr=False)
    _costs: dict[str, HloOpCost] = field(default_factory=dict, repr=False)
    _model: CostModel | None = field(default=None, repr=False)

    def cost(self, name: str) -> HloOpCost | None:
        """Cost of instruction ``name`` (None when the module has no such instruction).
        Results are cached."""
        if name in self._costs:
            return self._costs[name]
        info = self.instructions.get(name)
        if info is not None and self._model is None:
            self._model = CostModel(self._comps)
        result = None if info is None else _cost_one(self._model, info)
        self._costs[name] = result
        return result


def module_info_from_text(text: str, name: str = "") -> ModuleInfo:
    """:class:`ModuleInfo` from HLO module text (``HloModule.to_string()``, or the text
    :func:`traceroof.parsers.hlo_modules.module_text` decodes from an ``HloModuleProto``)."""
    comps, entry = parse_hlo_text(text)
    return ModuleInfo(name=name, text=text, instructions=parse_instructions(comps, entry), _comps=comps)


def _cost_one(model: CostModel, info: InstrInfo) -> HloOpCost | None:
    ins = model.instrs(info.computation).get(info.name)
    if ins is None:
        return None
    flops, trans = model.flops(info.computation, ins)
    cost = HloOpCost(flops=flops, bytes_accessed=model.bytes(info.computation, ins),
                     transcendentals=trans)
    if info.opcode in ("fusion", "call"):
        cost.dot_flops = model.dot_flops(info.computation, ins) or None
    if info.opcode == "while":  # one pass of body + condition, times the trip count
        trip = trip_count(info.text)
        cost.flops = None if trip is None else cost.flops * trip
        cost.transcendentals = None if trip is None else cost.transcendentals * trip
        cost.bytes_accessed = (None if trip is None or cost.bytes_accessed is None
                               else cost.bytes_accessed * trip)
    targets = set(info.custom_call_targets_inside)
    if info.custom_call_target:
        targets.add(info.custom_call_target)
    if targets:  # HloCostAnalysis has no FLOP model for custom calls
        cost.flops, nbytes = custom_call_cost(info)
        if nbytes is not None:
            cost.bytes_accessed = nbytes
    return cost


def custom_call_cost(info: InstrInfo) -> tuple[float | None, float | None]:
    """(FLOPs, bytes) of a custom call (or of a fusion holding one; then FLOPs are unknown).

    * GEMM targets (:data:`~traceroof.costs.kinds.GEMM_TARGET`): ``2*M*N*K`` per batch
      (:func:`~traceroof.costs.hlo_text.gemm_custom_call_flops`);
    * cuDNN convolutions (``__cudnn$convForward``, ``...BiasActivationForward``,
      ``...BackwardInput``, ``...BackwardFilter``): the forward convolution's
      ``2 * prod(y) * prod(w) / w[o]`` (the dimension numbers are the forward
      convolution's: xla/service/gpu/cudnn_conv_runner.cc), where the filter ``w`` is operand
      1 (forward, backward-input) or the result (backward-filter) and ``y`` the result,
      operand 0 or operand 1 respectively;
    * TransformerEngine fused attention (``te_fused_attn_forward_ffi`` / ``..._backward_ffi``):
      :func:`te_attention_flops` of its backend_config;
    * Pallas / Mosaic: the ``cost_estimate`` of the backend_config, when present.

    Bytes: the operands plus the first result array (not the workspace), unless a cost
    estimate says otherwise; None when a width is unknown."""
    target = info.custom_call_target or ""
    parts = [shape_bytes(s) for s in info.operand_shapes]
    out = shape_bytes(first_array_shape(info.shape))
    nbytes = float(sum(parts) + out) if out is not None and all(
        p is not None for p in parts) else None
    if info.opcode != "custom-call":  # a fusion holding one: its boundary bytes stand
        return None, None
    if GEMM_TARGET.search(target):
        return gemm_custom_call_flops(info), nbytes
    if CUDNN_CONV.search(target):
        return _cudnn_conv_flops(info, target), nbytes
    if TE_ATTENTION.search(target):
        return te_attention_flops(info.text, "backward" in target), nbytes
    flops, est_bytes = cost_estimate(info.text)
    return flops, est_bytes if est_bytes is not None else nbytes


def te_attention_flops(text: str, backward: bool) -> float | None:
    """FLOPs of a TransformerEngine fused-attention call from the attributes its
    backend_config records (``input_batch``, ``attn_heads``, ``q_max_seqlen``,
    ``kv_max_seqlen``, ``qk_head_dim``, ``v_head_dim``, ``mask_type``, ``window_size_*``):
    :func:`traceroof.costs.attention.attention_flops` over
    :func:`~traceroof.costs.attention.attention_pairs` (forward ``2·b·h·P·(d_qk + d_v)``,
    backward 2.5x). ``mask_type`` is TE's ``NVTE_Mask_Type``: 2/3 causal (top-left),
    4/5 causal bottom-right, else no causal mask. Max sequence lengths are used, so padded
    or packed batches count their padding. None when an attribute is missing."""
    v = {k: int(n) for k, n in _MLIR_INT.findall(text)}
    need = ("input_batch", "attn_heads", "q_max_seqlen", "kv_max_seqlen", "qk_head_dim")
    if any(k not in v for k in need):
        return None
    mask = v.get("mask_type", 0)
    pairs = attention_pairs(v["q_max_seqlen"], v["kv_max_seqlen"], causal=mask in (2, 3, 4, 5),
                            bottom_right=mask in (4, 5), window_left=v.get("window_size_left"),
                            window_right=v.get("window_size_right"))
    return float(attention_flops(v["input_batch"], v["attn_heads"], pairs, v["qk_head_dim"],
                                 v.get("v_head_dim", v["qk_head_dim"]), backward))


def _cudnn_conv_flops(info: InstrInfo, target: str) -> float | None:
    ops = info.operand_shapes
    result = first_array_shape(info.shape)
    if len(ops) < 2:
        return None
    if "BackwardFilter" in target:
        return conv_flops(ops[1], result, info.text)
    if "BackwardInput" in target:
        return conv_flops(ops[0], ops[1], info.text)
    return conv_flops(result, ops[1], info.text)


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
                "h_dot": cost.dot_flops if cost and cost.flops is not None else None,
                "h_bytes": cost.bytes_accessed if cost else None,
                "h_comm": comm, "h_group": group, "h_long": info.text[:2000],
                "h_module": minfo.name,
            })
    has_trace = pl.col("md_cost").fill_null(False)
    is_copy = pl.col("memcpy_bytes").is_not_null()
    if hlo_rows:
        schema = {"program_id": pl.UInt64, "hlo_op": pl.String, "h_op": pl.String,
                  "h_kind": KIND, "h_dtype": pl.String, "h_flops": pl.Float64, "h_dot": pl.Float64,
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
            pl.when(has_trace | is_copy).then(None).otherwise(pl.col("h_dot_share")).alias("dot_flops"),
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
            pl.lit(None, pl.Float64).alias("dot_flops"),
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
        (pl.col("h_dot") * pl.Series(share)).alias("h_dot_share"),
        (pl.col("h_bytes") * pl.Series(share)).alias("h_bytes_share"),
    )
