"""HLO knowledge for the XPlane reader: opcode vocabulary, and per-instruction cost
(FLOPs, bytes) from a serialized ``HloProto``, via jaxlib.

Three parts:

* **Vocabulary** (pure text, no jax): :func:`op_kind` maps an HLO opcode / xprof category /
  fusion contents / custom-call target to the op table's ``kind``; :func:`xla_dtype`,
  :func:`parse_hlo_expression`, :func:`collective_size`, :func:`shape_bytes`.
* **Cost** (needs jax): jax profiles carry the compiled HLO of every module in the
  ``/host:metadata`` plane (stat ``Hlo Proto``), but on CPU (and on the jax GPU profiles we
  have) no per-op FLOPs/bytes stats. XLA's own cost model, ``HloCostAnalysis``, is reachable
  through jaxlib (``_jax.hlo_module_cost_analysis(client, module)``), but only for a whole
  module. So each instruction is wrapped into a one-instruction module -- its operands become
  parameters of the same shapes, the computations it calls (fused computations, reduction
  regions) come along -- and analysed alone. On the project's CPU transformer profile the
  per-instruction FLOPs sum exactly to ``compiled.cost_analysis()["flops"]`` (see
  tests/test_xplane_cpu.py).
* **Attaching** costs to op frames (:class:`Modules`, :func:`attach_hlo_costs`,
  :func:`spread_over_kernels`).

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
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
import polars as pl

from ..schema import KIND

log = logging.getLogger(__name__)

#: Opcodes that never run as an op of their own (no thunk/kernel), so never need a cost.
TRIVIAL_OPCODES = frozenset(
    {"parameter", "constant", "tuple", "get-tuple-element", "bitcast", "after-all",
     "partition-id", "replica-id"}
)


class HloCostUnavailable(RuntimeError):
    """jax/jaxlib (or the private API this module uses) is not available."""


@dataclass
class InstrInfo:
    """One HLO instruction as printed in the module text.

    ``shape``: the result shape text (``f32[2,32]{1,0}`` or a tuple ``(f32[2], s32[])``);
    ``operand_shapes``: the operands' result shapes; ``fused_opcodes``: the opcodes inside a
    fusion's computation (transitively); ``custom_call_target`` for custom calls.
    """

    name: str
    opcode: str
    shape: str
    operand_shapes: list[str]
    computation: str
    in_entry: bool
    text: str
    fusion_kind: str | None = None
    fused_opcodes: frozenset[str] = frozenset()
    custom_call_target: str | None = None
    custom_call_targets_inside: frozenset[str] = frozenset()


@dataclass
class OpCost:
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
    _costs: dict[str, OpCost] = field(default_factory=dict, repr=False)

    def cost(self, name: str) -> OpCost | None:
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


# --- HLO vocabulary: opcodes -> op-table kinds, dtypes, collectives (pure text, no jax) ----

COLLECTIVE_OPCODES = frozenset({
    "all-reduce", "all-gather", "reduce-scatter", "all-to-all", "ragged-all-to-all",
    "collective-permute", "collective-broadcast", "send", "recv",
})
ELEMENTWISE_OPCODES = frozenset({
    "add", "subtract", "multiply", "divide", "maximum", "minimum", "exponential", "log",
    "tanh", "rsqrt", "sqrt", "cbrt", "negate", "abs", "compare", "select", "convert", "power",
    "logistic", "and", "or", "not", "xor", "clamp", "sine", "cosine", "tan", "erf",
    "exponential-minus-one", "log-plus-one", "floor", "ceil", "round-nearest-even",
    "round-nearest-afz", "sign", "remainder", "atan2", "is-finite", "real", "imag", "popcnt",
    "shift-left", "shift-right-logical", "shift-right-arithmetic", "broadcast", "iota",
    "reduce-precision", "bitcast-convert", "stochastic-convert", "transpose", "concatenate",
    "pad", "slice", "reverse", "reshape", "map", "clz",
})
REDUCTION_OPCODES = frozenset({"reduce", "reduce-window", "select-and-scatter"})
MEMCPY_OPCODES = frozenset({"copy", "copy-start", "copy-done"})
#: xprof ``hlo_category`` -> kind, used when the opcode alone does not decide.
CATEGORY_KIND = {
    "convolution": "matmul", "convolution fusion": "matmul", "output fusion": "matmul",
    "loop fusion": "elementwise", "non-fusion elementwise": "elementwise",
    "broadcast": "elementwise", "data formatting": "elementwise", "input fusion": "reduction",
    "reduce": "reduction", "all-reduce": "collective", "all-gather": "collective",
    "reduce-scatter": "collective", "all-to-all": "collective",
    "collective-permute": "collective", "send": "collective", "recv": "collective",
    "copy-start": "memcpy", "copy-done": "memcpy", "copy": "memcpy",
}
ATTENTION_TARGET = re.compile(r"attn|attention|fmha|flash|mha|sdpa", re.I)
GEMM_TARGET = re.compile(r"gemm|matmul|cublas|hipblas|rocblas|triton_gemm", re.I)
CONV_TARGET = re.compile(r"conv", re.I)
#: kernel-name heuristics for kernels without an HLO instruction (TF, copies, fills)
KERNEL_NAME_KIND = [
    (re.compile(r"^Memcpy|copyBuffer|memcpy", re.I), "memcpy"),
    (re.compile(r"^Memset|fillBuffer|memset", re.I), "memset"),
    (re.compile(r"nccl|rccl", re.I), "collective"),
    (re.compile(r"gemm|Cijk_|cutlass|cublas|sm\d+_xmma|_mma_|matmul", re.I), "matmul"),
]
XLA_DTYPES = {
    "f32": "fp32", "bf16": "bf16", "f16": "fp16", "f64": "fp64", "s8": "int8", "u8": "uint8",
    "s16": "int16", "u16": "uint16", "s32": "int32", "u32": "uint32", "s64": "int64",
    "u64": "uint64", "pred": "bool", "s4": "int4", "u4": "uint4", "c64": "complex64",
    "c128": "complex128",
}
_DTYPE_TOKEN = re.compile(r"\b([a-z][a-z0-9]*)\[")
_EXPR = re.compile(r"^%?(?P<name>[^\s=]+) = (?P<rest>.*)$", re.S)
_REPLICA_BRACES = re.compile(r"replica_groups=\{\{([^}]*)\}")
_REPLICA_IOTA = re.compile(r"replica_groups=\[(\d+),(\d+)\]")

def xla_dtype(shape_text: str | None) -> str | None:
    """Schema dtype name (``fp32``, ``bf16``, ``fp8``...) of the first array in an HLO shape."""
    if not shape_text:
        return None
    m = _DTYPE_TOKEN.search(shape_text)
    if not m:
        return None
    t = m.group(1)
    if t.startswith("f8") or t.startswith("f4") or t.startswith("f6"):
        return "fp8" if t.startswith("f8") else t
    return XLA_DTYPES.get(t)


def parse_hlo_expression(expr: str) -> tuple[str | None, str | None, str | None]:
    """``%name = SHAPE opcode(operands), attrs`` -> (opcode, result shape, first operand shape)."""
    m = _EXPR.match(expr.strip())
    if not m:
        return None, None, None
    shape, after = _split_shape(m.group("rest"))
    om = re.match(r"([\w\-]+)\(", after)
    if not om:
        return None, shape, None
    group, _attrs = _operand_group(after)
    inner = group[len(om.group(1)) + 1 : -1]
    operand_shape = None
    sm = re.match(r"\s*(\(?[a-z][a-z0-9]*\[[^\]]*\])", inner)
    if sm:
        operand_shape = sm.group(1)
    return om.group(1), shape, operand_shape


def op_kind(opcode: str | None, category: str | None = None,
            fused: frozenset = frozenset(), targets: frozenset = frozenset(),
            kernel_name: str | None = None) -> str:
    """The op-table ``kind`` of an XLA op from its opcode, xprof category, the opcodes inside
    a fusion, custom-call targets, or (last) its kernel name. See docs/xplane.md."""
    base = (opcode or "").removesuffix("-start").removesuffix("-done")
    for t in targets:
        if ATTENTION_TARGET.search(t):
            return "attention"
    if base in COLLECTIVE_OPCODES:
        return "collective"
    if opcode in MEMCPY_OPCODES:
        return "memcpy"
    if opcode == "dot":
        return "matmul"
    if opcode == "convolution":
        return "conv"
    if opcode == "custom-call":
        t = " ".join(targets)
        if GEMM_TARGET.search(t):
            return "matmul"
        if CONV_TARGET.search(t):
            return "conv"
        return "other"
    if opcode == "fusion":
        if fused:
            if "dot" in fused or any(GEMM_TARGET.search(t) for t in targets):
                return "matmul"
            if "convolution" in fused:
                return "conv"
            if fused & COLLECTIVE_OPCODES:
                return "collective"
            if "reduce" in fused:
                return "norm" if "rsqrt" in fused else "reduction"
            return "elementwise"
        if category and category in CATEGORY_KIND:
            return CATEGORY_KIND[category]
        return "other"
    if opcode in REDUCTION_OPCODES:
        return "reduction"
    if opcode in ELEMENTWISE_OPCODES:
        return "elementwise"
    if category and category in CATEGORY_KIND:
        return CATEGORY_KIND[category]
    if kernel_name:
        for pattern, kind in KERNEL_NAME_KIND:
            if pattern.search(kernel_name):
                return kind
    return "other"


def collective_size(opcode: str | None, expr: str | None) -> tuple[float | None, int | None]:
    """(comm_bytes, group_size) of a collective from its HLO text: the full buffer per
    device (all-reduce/all-gather/all-to-all/permute: the result; reduce-scatter: the result
    times the group), and the replica-group size. ``-done`` halves carry no bytes (the
    ``-start`` does). (None, None) when unknown."""
    if not opcode or not expr or opcode.endswith("-done"):
        return None, None
    base = opcode.removesuffix("-start")
    if base not in COLLECTIVE_OPCODES:
        return None, None
    group = None
    m = _REPLICA_BRACES.search(expr)
    if m:
        group = len([x for x in m.group(1).split(",") if x.strip()])
    else:
        m = _REPLICA_IOTA.search(expr)
        if m:
            group = int(m.group(2))
    _op, shape, _operand = parse_hlo_expression(expr)
    nbytes = None
    if shape:
        if shape.startswith("("):  # async tuple: the largest element is the full buffer
            sizes = [shape_bytes(f"{t}[{d}]") for t, d in _ARRAY.findall(shape)]
            sizes = [s for s in sizes if s is not None]
            nbytes = max(sizes) if sizes else None
        else:
            nbytes = shape_bytes(shape)
    if nbytes is not None and base == "reduce-scatter":
        nbytes = nbytes * group if group else None
    return nbytes, group


# --- wire format of HloProto: field 1 is the HloModuleProto ------------------------------


def hlo_module_bytes(hlo_proto: bytes) -> bytes:
    """The serialized ``HloModuleProto`` (field 1) inside a serialized ``xla.HloProto``."""
    from .xplane_proto import iter_fields

    for fnum, wt, value, _pos, _end in iter_fields(hlo_proto, 0, len(hlo_proto)):
        if fnum == 1 and wt == 2:
            return bytes(hlo_proto[value[0] : value[1]])
    raise ValueError("HloProto has no hlo_module (field 1)")


# --- HLO text ------------------------------------------------------------------------------

_COMP_HEADER = re.compile(r"^(ENTRY )?%?([^\s(]+) .*\{\s*$")
_META = re.compile(r",\s*metadata=\{[^{}]*\}")
_STACK = re.compile(r",\s*stack_frame_id=\d+")
_NAME = re.compile(r"%([\w.\-]+)")
_TARGET = re.compile(r'custom_call_target="([^"]*)"')
_FUSION_KIND = re.compile(r"kind=(k\w+)")
_OPCODE = re.compile(r"([\w\-]+)\(")


def _close_paren(text: str) -> int:
    """Index just past the ``)`` that closes the first ``(`` of ``text``; -1 when it never closes."""
    depth = 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return i + 1
    return -1


def _split_shape(rest: str) -> tuple[str, str]:
    """Split ``SHAPE opcode(...)...`` into the shape text and the remainder."""
    if rest.startswith("("):
        j = _close_paren(rest)
        return (rest[:j], rest[j:].lstrip()) if j > 0 else (rest, "")
    shape, _, after = rest.partition(" ")
    return shape, after


def _operand_group(after: str) -> tuple[str, str]:
    """Split ``opcode(operands), attrs`` into ``opcode(operands)`` and ``, attrs``."""
    j = _close_paren(after)
    return (after[:j], after[j:]) if j > 0 else (after, "")


def parse_hlo_text(text: str) -> tuple[dict, str | None]:
    """Parse HLO module text into ``{computation: {"header", "order", "instrs"}}`` and the
    entry computation's name. ``instrs[name] = (shape, after, is_root)`` where ``after`` is
    the text after the shape (``opcode(operands), attributes``), metadata stripped."""
    comps: dict = {}
    entry = None
    cur = None
    for line in text.split("\n"):
        if not line:
            continue
        if not line.startswith(" "):
            if line.startswith("}"):
                cur = None
                continue
            m = _COMP_HEADER.match(line)
            if m and not line.startswith("HloModule"):
                cur = m.group(2).lstrip("%")
                comps[cur] = {"header": line, "order": [], "instrs": {}}
                if m.group(1):
                    entry = cur
            continue
        if cur is None:
            continue
        body = line.strip()
        root = body.startswith("ROOT ")
        if root:
            body = body[5:]
        name, sep, rest = body.partition(" = ")
        if not sep:
            continue
        shape, after = _split_shape(rest)
        after = _STACK.sub("", _META.sub("", after))
        name = name.lstrip("%")
        comps[cur]["instrs"][name] = (shape, after, root)
        comps[cur]["order"].append(name)
    return comps, entry


def module_info(hlo_proto: bytes, name: str = "") -> ModuleInfo:
    """Parse a serialized ``xla.HloProto`` (as stored in the ``Hlo Proto`` stat) into a
    :class:`ModuleInfo`. Raises :class:`HloCostUnavailable` without jax, ``ValueError`` on
    a proto jaxlib cannot read."""
    _client_, _jax, xc = _client()
    try:
        module = xc.hlo.HloModule.from_serialized_hlo_module_proto(hlo_module_bytes(hlo_proto))
        text = module.to_string()
    except Exception as exc:
        raise ValueError(f"HLO module {name!r} does not load: {exc}") from exc
    return module_info_from_text(text, name or module.name)


def module_info_from_text(text: str, name: str = "") -> ModuleInfo:
    """:class:`ModuleInfo` from HLO module text (``HloModule.to_string()``)."""
    comps, entry = parse_hlo_text(text)
    instructions: dict[str, InstrInfo] = {}
    fused_cache: dict[str, tuple[frozenset, frozenset]] = {}

    def inside(comp: str, seen: set) -> tuple[frozenset, frozenset]:
        if comp in fused_cache:
            return fused_cache[comp]
        ops: set[str] = set()
        targets: set[str] = set()
        seen.add(comp)
        for nm in comps[comp]["order"]:
            _shape, after, _root = comps[comp]["instrs"][nm]
            m = _OPCODE.match(after)
            if m:
                ops.add(m.group(1))
            t = _TARGET.search(after)
            if t:
                targets.add(t.group(1))
            for callee in _callees(comps, after):
                if callee not in seen:
                    o, t2 = inside(callee, seen)
                    ops |= o
                    targets |= t2
        fused_cache[comp] = (frozenset(ops), frozenset(targets))
        return fused_cache[comp]

    for comp, c in comps.items():
        instrs = c["instrs"]
        for nm in c["order"]:
            shape, after, _root = instrs[nm]
            m = _OPCODE.match(after)
            opcode = m.group(1) if m else ""
            group, attrs = _operand_group(after)
            operands = list(dict.fromkeys(_NAME.findall(group)))
            info = InstrInfo(
                name=nm,
                opcode=opcode,
                shape=shape,
                operand_shapes=[instrs[o][0] for o in operands if o in instrs],
                computation=comp,
                in_entry=comp == entry,
                text=f"%{nm} = {shape} {after}",
            )
            t = _TARGET.search(attrs)
            if t:
                info.custom_call_target = t.group(1)
            if opcode == "fusion":
                k = _FUSION_KIND.search(attrs)
                info.fusion_kind = k.group(1) if k else None
                ops: set[str] = set()
                targets: set[str] = set()
                for callee in _callees(comps, attrs):
                    o, tg = inside(callee, set())
                    ops |= o
                    targets |= tg
                info.fused_opcodes = frozenset(ops)
                info.custom_call_targets_inside = frozenset(targets)
            # an instruction name can repeat across computations only in odd modules; the
            # entry computation wins (that is where thunks/kernels come from)
            if nm not in instructions or comp == entry:
                instructions[nm] = info
    return ModuleInfo(name=name, text=text, instructions=instructions, _comps=comps)


def _callees(comps: dict, attrs: str) -> list[str]:
    return [c for c in _NAME.findall(attrs) if c in comps]


def _dependencies(comps: dict, roots: list[str]) -> list[str]:
    """Computations reachable from ``roots``, callees before callers (HLO text order)."""
    out: list[str] = []
    seen: set[str] = set()

    def visit(c: str) -> None:
        if c in seen:
            return
        seen.add(c)
        for nm in comps[c]["order"]:
            for d in _callees(comps, comps[c]["instrs"][nm][1]):
                visit(d)
        out.append(c)

    for r in roots:
        visit(r)
    return out


def _computation_text(comps: dict, c: str) -> str:
    lines = [comps[c]["header"]]
    for nm in comps[c]["order"]:
        shape, after, root = comps[c]["instrs"][nm]
        lines.append(f"  {'ROOT ' if root else ''}%{nm} = {shape} {after}")
    lines.append("}")
    return "\n".join(lines)


def one_instruction_module(module: ModuleInfo, info: InstrInfo) -> str:
    """HLO text of a module whose entry computation is just ``info`` with its operands as
    parameters (same names and shapes), plus every computation it calls."""
    comps = module._comps
    instrs = comps[info.computation]["instrs"]
    shape, after, _root = instrs[info.name]
    group, attrs = _operand_group(after)
    operands = [o for o in dict.fromkeys(_NAME.findall(group)) if o in instrs]
    params = [f"  %{o} = {instrs[o][0]} parameter({k})" for k, o in enumerate(operands)]
    subs = _dependencies(comps, _callees(comps, attrs))
    body = "\n\n".join(_computation_text(comps, c) for c in subs)
    return (
        f"HloModule one_{re.sub(r'[^A-Za-z0-9_]', '_', info.name)}\n\n{body}\n\n"
        "ENTRY %main {\n" + "\n".join(params) + f"\n  ROOT %{info.name} = {shape} {after}\n}}\n"
    )


_GEMM_TARGETS = re.compile(r"gemm|matmul|cublas|hipblas|rocblas", re.I)
_DIMS = re.compile(r"\[([\d,]*)\]")

#: Bytes per element of XLA primitive types (``s4``/``u4`` pack two per byte).
DTYPE_BYTES = {
    "pred": 1, "s2": 0.25, "u2": 0.25, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "s16": 2,
    "u16": 2, "s32": 4, "u32": 4, "s64": 8, "u64": 8, "f16": 2, "bf16": 2, "f32": 4, "f64": 8,
    "c64": 8, "c128": 16, "f8e5m2": 1, "f8e4m3": 1, "f8e4m3fn": 1, "f8e4m3b11fnuz": 1,
    "f8e5m2fnuz": 1, "f8e4m3fnuz": 1, "f8e3m4": 1, "f8e8m0fnu": 1, "f4e2m1fn": 0.5,
    "token": 0,
}
_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([\d,]*)\]")


def shape_bytes(shape: str) -> float | None:
    """Total bytes of an HLO shape text (``f32[2,3]{1,0}``, tuples summed); None when a type
    is unknown. Layout annotations (``{...}``, tiling) are ignored."""
    total = 0.0
    found = False
    for dtype, dims in _ARRAY.findall(shape):
        width = DTYPE_BYTES.get(dtype)
        if width is None:
            return None
        n = 1
        for d in dims.split(",") if dims else []:
            n *= int(d)
        total += n * width
        found = True
    if not found:
        m = re.match(r"^\(?([a-z][a-z0-9]*)\[\]", shape)
        return DTYPE_BYTES.get(m.group(1)) if m else None
    return total


def first_array_shape(shape: str) -> str:
    """The first array of a (possibly tuple) shape: ``(f32[2], s8[64])`` -> ``f32[2]``."""
    m = _ARRAY.search(shape)
    return m.group(0) if m else shape


def _shape_dims(shape: str) -> list[int]:
    m = _DIMS.search(shape)
    if not m or not m.group(1):
        return []
    return [int(x) for x in m.group(1).split(",")]


def _gemm_custom_call_flops(info: InstrInfo) -> float | None:
    """2*M*N*K(*batch) of a GEMM custom call, from the result shape and the lhs contracting
    dimensions in its backend_config (``dot_dimension_numbers``). None when unreadable."""
    m = re.search(r'"lhs_contracting_dimensions":\s*\[([^\]]*)\]', info.text)
    if not m or not info.operand_shapes:
        return None
    lhs = _shape_dims(info.operand_shapes[0])
    try:
        contracting = [int(x.strip().strip('"')) for x in m.group(1).split(",") if x.strip()]
    except ValueError:
        return None
    out = info.shape
    if out.startswith("("):  # (result, workspace)
        out = out[1:]
    out_dims = _shape_dims(out)
    if not lhs or not out_dims or any(c >= len(lhs) for c in contracting):
        return None
    k = 1
    for c in contracting:
        k *= lhs[c]
    n_out = 1
    for d in out_dims:
        n_out *= d
    return 2.0 * n_out * k


def _cost_one(module: ModuleInfo, info: InstrInfo) -> OpCost | None:
    client, _jax, xc = _client()
    text = one_instruction_module(module, info)
    try:
        hm = xc.hlo.hlo_module_from_text(text)
        ca = _jax.hlo_module_cost_analysis(client, hm)
    except Exception as exc:
        log.debug("cost analysis failed for %s: %s", info.name, exc)
        return None
    flops = float(ca.get("flops", 0.0))
    nbytes = ca.get("bytes accessed")
    cost = OpCost(
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
        if info.opcode == "custom-call" and _GEMM_TARGETS.search(info.custom_call_target or ""):
            cost.flops = _gemm_custom_call_flops(info)
            if cost.bytes_accessed is None:  # operands + the result (not the workspace)
                parts = [shape_bytes(s) for s in info.operand_shapes]
                out = shape_bytes(first_array_shape(info.shape))
                if out is not None and all(p is not None for p in parts):
                    cost.bytes_accessed = float(sum(parts) + out)
        else:
            cost.flops = None
    return cost


# --- the HLO modules of a profile, and attaching their costs to op frames -------------------


class Modules:
    """The ``Hlo Proto`` of each program in ``/host:metadata`` (``plane``: that plane as the
    XPlane reader wraps it, or None), parsed on demand into :class:`ModuleInfo`."""

    def __init__(self, plane) -> None:
        self.protos: dict[int, tuple[str, bytes]] = {}
        self.names: dict[int, str] = {}
        self._info: dict[int, Any] = {}
        self.unavailable: str | None = None
        self.failed: list[str] = []
        if plane is None:
            return
        for mid, m in plane.scan.meta.event_metadata.items():
            d = plane.md(mid)
            proto = d.get("Hlo Proto")
            name = d.get("_name", "")
            mm = re.match(r"^(.*)\((\d+)\)$", name)
            pid = d.get("program_id")
            if pid is None and mm:
                pid = int(mm.group(2))
            if pid is None:
                continue
            module_name = mm.group(1) if mm else name
            self.names[int(pid)] = module_name
            if isinstance(proto, bytes):
                self.protos[int(pid)] = (module_name, proto)

    def info(self, program_id: int):
        """hlo_cost.ModuleInfo for ``program_id``, or None (no proto, no jax, unreadable)."""
        if program_id in self._info:
            return self._info[program_id]
        result = None
        entry = self.protos.get(program_id)
        if entry is not None and self.unavailable is None:
            try:
                result = module_info(entry[1], entry[0])
            except HloCostUnavailable as exc:
                self.unavailable = str(exc)
            except ValueError as exc:
                self.failed.append(f"{entry[0]}({program_id}): {exc}")
        self._info[program_id] = result
        return result


def attach_hlo_costs(frame: pl.DataFrame, modules: Modules, stats) -> pl.DataFrame:
    """Fill op/kind/dtype/flops/bytes of op rows that have no trace costs from their HLO
    instruction, spreading an instruction's cost over the kernels of one execution, and set
    ``cost_source`` (``trace`` / ``shapes`` / ``unknown``).

    ``frame`` (one op line) has the columns the XPlane reader builds: name, start_ns, dur_ns,
    device, correlation, program_id, hlo_op, hlo_module, op, kind, dtype, flops, bytes,
    comm_bytes, group_size, long_name, md_cost (trace carried costs), memcpy_bytes, tf_type.
    ``stats`` is a Counter (``xplane.hlo_cost_needed`` is incremented)."""
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
            kind = op_kind(info.opcode, None, info.fused_opcodes, frozenset(targets))
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
