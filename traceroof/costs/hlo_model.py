"""FLOPs and bytes of one HLO instruction, computed from the module text without jax.

The conventions are XLA's ``HloCostAnalysis`` (openxla/xla xla/service/hlo_cost_analysis.cc),
which xprof and ``compiled.cost_analysis()`` report, so the numbers compare one to one:

* elementwise ops: one FLOP per output element; the transcendental ones
  (:data:`TRANSCENDENTAL`) count as transcendentals, not FLOPs;
* ``dot``: ``2 * prod(result dims) * prod(lhs contracting dims)`` (one FMA = 2 FLOPs);
* ``convolution``: ``2 * prod(result dims) * prod(kernel dims) / kernel output features``
  (every kernel tap, padding included: HloCostAnalysis skips taps that fall on padding, so
  a padded convolution is a little above its figure);
* ``reduce``: ``(elements in - elements out) * FLOPs of the reducer``;
  ``reduce-window``: ``elements out * (window elements - 1) * FLOPs of the reducer``;
* data movement (broadcast, transpose, copy, slice, concatenate, gather, ...): no FLOPs;
* ``fusion``: the sum over its fused computation; bytes are what crosses the fusion's
  boundary: its result plus each operand (an operand used only through ``slice`` /
  ``dynamic-slice`` reads only the slices);
* ``while``: one pass of body and condition (as HloCostAnalysis; a trace records every
  iteration's body ops separately, so a loop's container is never costed as an op);
* bytes of any other op: operands plus result (tuple shapes summed, layouts ignored).

Custom calls (``__cublas$gemm``, ``__cudnn$conv*``, Pallas/Mosaic) are costed by
:func:`custom_call_cost`; shapes/dtypes come from :mod:`traceroof.costs.hlo_text`.
"""

from __future__ import annotations

import json
import math
import re
from functools import lru_cache

from .hlo_text import _NAME, _OPCODE, _operand_group, shape_bytes

#: Elementwise opcodes HloCostAnalysis counts as transcendentals (not FLOPs).
TRANSCENDENTAL = frozenset({
    "exponential", "exponential-minus-one", "log", "log-plus-one", "logistic", "power",
    "rsqrt", "sqrt", "cbrt", "tanh", "sine", "cosine", "tan", "atan2", "erf"})

#: Elementwise opcodes (one FLOP, or one transcendental, per result element).
ELEMENTWISE = TRANSCENDENTAL | frozenset({
    "abs", "add", "and", "bitcast-convert", "ceil", "clamp", "compare", "complex", "convert", "count-leading-zeros",
    "divide", "floor", "imag", "is-finite", "maximum", "minimum", "multiply", "negate", "not",
    "or", "popcnt", "real", "reduce-precision", "remainder", "round-nearest-afz",
    "round-nearest-even", "select", "shift-left", "shift-right-arithmetic",
    "shift-right-logical", "sign", "subtract", "xor", "stochastic-convert"})

#: Opcodes that read and write nothing of their own (aliases, bookkeeping).
FREE = frozenset({"parameter", "get-tuple-element", "tuple", "bitcast", "after-all",
                  "partition-id", "replica-id", "constant"})

_DIMS_ATTR = re.compile(r"(lhs_contracting_dims|dimensions|dynamic_slice_sizes)=\{([\d,]*)\}")
_WINDOW_SIZE = re.compile(r"window=\{[^}]*size=([\dx]+)")
_DIM_LABELS = re.compile(r"dim_labels=[^_]+_([^-]+)->")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"')


def elements(shape: str) -> int:
    """Elements of the first array of an HLO shape text (``f32[2,3]`` -> 6; scalar -> 1)."""
    return math.prod(_dims(shape))


def _dims(shape: str) -> list[int]:
    """The dimensions of the first array of an HLO shape text (``f32[2,3]`` -> [2, 3]; scalar -> [])."""
    m = re.search(r"\[([\d,]*)\]", shape)
    return [int(x) for x in m.group(1).split(",")] if m and m.group(1) else []


def _attr_dims(attrs: str, name: str) -> list[int] | None:
    for k, v in _DIMS_ATTR.findall(attrs):
        if k == name:
            return [int(x) for x in v.split(",")] if v else []
    return None


class Instr:
    """One instruction of a parsed computation: name, opcode, shape, operand names, attrs."""

    __slots__ = ("name", "opcode", "shape", "operands", "attrs")

    def __init__(self, name: str, shape: str, after: str) -> None:
        m = _OPCODE.match(after)
        self.name, self.shape = name, shape
        self.opcode = m.group(1) if m else ""
        group, self.attrs = _operand_group(after)
        self.operands = list(_NAME.findall(group))


class CostModel:
    """HloCostAnalysis-style FLOPs/bytes of the instructions of one module
    (``comps``: the :func:`~traceroof.costs.hlo_text.parse_hlo_text` result)."""

    def __init__(self, comps: dict) -> None:
        self.comps = comps
        self._instrs: dict[str, dict[str, Instr]] = {}
        self._flops: dict[str, tuple[float, float]] = {}

    def instrs(self, comp: str) -> dict[str, Instr]:
        """The instructions of computation ``comp`` by name (parsed once)."""
        got = self._instrs.get(comp)
        if got is None:
            c = self.comps[comp]["instrs"]
            got = self._instrs[comp] = {n: Instr(n, c[n][0], c[n][1]) for n in self.comps[comp]["order"]}
        return got

    def callees(self, ins: Instr) -> list[str]:
        """The computations ``ins`` calls (fused computation, reducer, loop body...)."""
        return [c for c in _NAME.findall(ins.attrs) if c in self.comps]

    def computation_flops(self, comp: str) -> tuple[float, float]:
        """(FLOPs, transcendentals) of one pass of computation ``comp``."""
        if comp not in self._flops:
            self._flops[comp] = (0.0, 0.0)  # a recursive call graph counts its cycle once
            f = t = 0.0
            ins = self.instrs(comp)
            for i in ins.values():
                a, b = self.flops(comp, i)
                f, t = f + a, t + b
            self._flops[comp] = (f, t)
        return self._flops[comp]

    def dot_flops(self, comp: str, ins: Instr, _seen: frozenset[str] = frozenset()) -> float:
        """FLOPs of the ``dot`` and ``convolution`` instructions in ``ins`` (itself, or inside
        the computations a fusion or call runs, transitively): the matmul part of a fusion
        that also holds elementwise work, on the formulas of :meth:`flops` (2·M·N·K; the
        convolution's window)."""
        if ins.opcode in ("dot", "convolution"):
            return self.flops(comp, ins)[0]
        if ins.opcode not in ("fusion", "call"):
            return 0.0
        total = 0.0
        for c in self.callees(ins):
            if c not in _seen:
                total += sum(self.dot_flops(c, i, _seen | {c}) for i in self.instrs(c).values())
        return total

    def _operand_shape(self, comp: str, ins: Instr, k: int) -> str | None:
        if k >= len(ins.operands):
            return None
        op = self.comps[comp]["instrs"].get(ins.operands[k])
        return op[0] if op else None

    def flops(self, comp: str, ins: Instr) -> tuple[float, float]:
        """(FLOPs, transcendentals) of instruction ``ins`` of computation ``comp``."""
        op = ins.opcode
        out = elements(ins.shape)
        if op in TRANSCENDENTAL:
            return 0.0, float(out)
        if op in ELEMENTWISE:
            return float(out), 0.0
        if op == "dot":
            lhs = _dims(self._operand_shape(comp, ins, 0) or "")
            k = 1
            for d in _attr_dims(ins.attrs, "lhs_contracting_dims") or []:
                k *= lhs[d] if d < len(lhs) else 1
            return 2.0 * out * k, 0.0
        if op == "convolution":
            return conv_flops(ins.shape, self._operand_shape(comp, ins, 1), ins.attrs) or 0.0, 0.0
        sub = self.callees(ins)
        if op in ("reduce", "reduce-window", "all-reduce", "reduce-scatter", "scatter",
                  "select-and-scatter", "map"):
            f, t = self.computation_flops(sub[0]) if sub else (0.0, 0.0)
            n = _applications(op, ins, self._operand_shape(comp, ins, 0) or ins.shape, out)
            return f * n, t * n
        if op in ("fusion", "call", "while", "async-start"):
            f = t = 0.0
            for c in sub:
                a, b = self.computation_flops(c)
                f, t = f + a, t + b
            return f, t
        if op == "conditional" and sub:
            return max(self.computation_flops(c) for c in sub)
        return 0.0, 0.0

    def bytes(self, comp: str, ins: Instr) -> float | None:
        """Bytes ``ins`` reads and writes: operands plus result, a fusion's boundary traffic
        (see the module docstring); None when a shape's type has no known width."""
        if ins.opcode in FREE:
            return 0.0
        if ins.opcode in ("while", "call", "conditional"):
            parts = [self.bytes(c, i) for c in self.callees(ins) for i in self.instrs(c).values()]
            return None if any(p is None for p in parts) else float(sum(parts))
        out = shape_bytes(ins.shape)
        if out is None:
            return None
        if ins.opcode in ("slice", "dynamic-slice", "dynamic-update-slice") or \
                ins.opcode.endswith("-done"):
            return self._moved_bytes(comp, ins, out)
        reads = 0.0
        fused = self.callees(ins)[0] if ins.opcode == "fusion" and self.callees(ins) else None
        params = self._parameters(fused) if fused else {}
        for k, name in enumerate(ins.operands):
            shape = self._operand_shape(comp, ins, k)
            full = shape_bytes(shape) if shape is not None else None
            if full is None:
                return None
            if fused is not None and k in params:
                full = self._parameter_read_bytes(fused, params[k], full)
            reads += full
        return reads + out

    def _moved_bytes(self, comp: str, ins: Instr, out: float) -> float | None:
        """Slices read and write only the slice (plus their index scalars); an in-place
        ``dynamic-update-slice`` reads and writes the update; a ``*-done`` writes its result."""
        if ins.opcode.endswith("-done"):
            return out
        shapes = [self._operand_shape(comp, ins, k) for k in range(len(ins.operands))]
        sizes = [shape_bytes(s) if s else None for s in shapes]
        if any(x is None for x in sizes):
            return None
        if ins.opcode == "dynamic-update-slice":
            return 2.0 * sizes[1] + sum(sizes[2:]) if len(sizes) >= 2 else None
        return 2.0 * out + sum(sizes[1:]) if ins.opcode == "dynamic-slice" else 2.0 * out

    def _parameters(self, comp: str) -> dict[int, str]:
        out = {}
        for i in self.instrs(comp).values():
            if i.opcode == "parameter":
                m = re.search(r"parameter\((\d+)\)", self.comps[comp]["instrs"][i.name][1])
                if m:
                    out[int(m.group(1))] = i.name
        return out

    def _parameter_read_bytes(self, comp: str, param: str, full: float) -> float:
        """Bytes a fused computation reads of parameter ``param``: the slices when every use
        is a ``slice``/``dynamic-slice``, else all of it."""
        users = [i for i in self.instrs(comp).values() if param in i.operands]
        if users and all(u.opcode in ("slice", "dynamic-slice") and u.operands[0] == param
                         for u in users):
            return float(sum(shape_bytes(u.shape) or 0.0 for u in users))
        return full


def _applications(op: str, ins: Instr, operand_shape: str, out: int) -> int:
    """How many times a reducer-like op applies its computation."""
    if op == "reduce":
        return max(elements(operand_shape) - out, 0)
    if op == "reduce-window":
        m = _WINDOW_SIZE.search(ins.attrs)
        w = 1
        for d in (m.group(1).split("x") if m else []):
            w *= int(d)
        return out * max(w - 1, 0)
    return out


def conv_flops(out_shape: str, kernel_shape: str | None, attrs: str) -> float | None:
    """``2 * prod(result) * prod(kernel) / kernel output features`` of a convolution (or a
    cuDNN convolution custom call whose result is the first tuple element), from
    ``dim_labels`` (the kernel's ``o``); None when the kernel or labels are missing."""
    if not kernel_shape:
        return None
    m = _DIM_LABELS.search(attrs)
    kdims = _dims(kernel_shape)
    if not m or "o" not in m.group(1) or len(m.group(1)) != len(kdims):
        return None
    ko = kdims[m.group(1).index("o")]
    k_elems = 1
    for d in kdims:
        k_elems *= d
    return 2.0 * elements(out_shape) * k_elems / max(ko, 1)


@lru_cache(maxsize=256)
def cost_estimate(backend_config: str) -> tuple[float | None, float | None]:
    """(FLOPs, bytes) of a Pallas / Mosaic custom call's ``cost_estimate`` in its
    backend_config (``{"custom_call_config": {"cost_estimate": {"flops": N,
    "bytes_accessed": N, ...}}}``, numbers or strings); (None, None) when absent."""
    m = re.search(r'"cost_estimate"\s*:\s*(\{[^{}]*\})', backend_config)
    if not m:
        return None, None
    try:
        est = json.loads(m.group(1))
    except ValueError:
        return None, None

    def num(k: str) -> float | None:
        v = est.get(k)
        try:
            return float(v) if v is not None else None
        except (TypeError, ValueError):
            return None

    return num("flops"), num("bytes_accessed")


def trip_count(attrs: str) -> int | None:
    """A ``while``'s ``known_trip_count`` (XLA's backend_config), None when not recorded."""
    m = _TRIP.search(attrs)
    return int(m.group(1)) if m else None
