"""HLO text, read without jax: instructions, shapes, dtypes, collective sizes.

The XPlane reader and the HLO cost model (:mod:`traceroof.costs.hlo`) read the compiled HLO
of a jax program as the text ``HloModule.to_string()`` prints (xla/hlo/ir/hlo_instruction.cc
``ToString``): ``%name = SHAPE opcode(operands), attrs``. Shapes are XLA ``PrimitiveType``
names with dimensions (``f32[2,32]{1,0}``, tuples ``(f32[2], s32[])``); their dtypes and
widths are in :mod:`traceroof.dtypes`. Op kinds from opcodes are in
:func:`traceroof.costs.kinds.kind_of_hlo`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..dtypes import XLA_DTYPES, XLA_ITEMSIZE
from .kinds import COLLECTIVE_OPCODES

#: Opcodes that never run as an op of their own (no thunk/kernel), so never need a cost.
TRIVIAL_OPCODES = frozenset(
    {"parameter", "constant", "tuple", "get-tuple-element", "bitcast", "after-all",
     "partition-id", "replica-id"}
)



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


def parse_instructions(comps: dict, entry: str | None) -> dict[str, InstrInfo]:
    """Every instruction of a :func:`parse_hlo_text` result by name, with its operands' shapes,
    custom-call target and (fusions) the opcodes and targets it contains. A name that repeats
    across computations (odd modules) is the entry computation's."""
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
    return instructions


def _callees(comps: dict, attrs: str) -> list[str]:
    return [c for c in _NAME.findall(attrs) if c in comps]


_DIMS = re.compile(r"\[([\d,]*)\]")

_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([\d,]*)\]")


def shape_bytes(shape: str) -> float | None:
    """Total bytes of an HLO shape text (``f32[2,3]{1,0}``, tuples summed); None when a type
    is unknown. Layout annotations (``{...}``, tiling) are ignored."""
    total = 0.0
    found = False
    for dtype, dims in _ARRAY.findall(shape):
        width = XLA_ITEMSIZE.get(dtype)
        if width is None:
            return None
        n = 1
        for d in dims.split(",") if dims else []:
            n *= int(d)
        total += n * width
        found = True
    if not found:
        m = re.match(r"^\(?([a-z][a-z0-9]*)\[\]", shape)
        return XLA_ITEMSIZE.get(m.group(1)) if m else None
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


def gemm_custom_call_flops(info: InstrInfo) -> float | None:
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


