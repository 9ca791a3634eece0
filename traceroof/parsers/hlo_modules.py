"""The compiled HLO of each program in an XPlane's ``/host:metadata`` plane, read without jax.

jax writes one event metadata per program with the stat ``Hlo Proto`` (a serialized
``xla.HloProto``) and the name ``module_name(program_id)``. :class:`Modules` finds them and
decodes each on demand, with the project's own protobuf wire reader
(:mod:`.xplane_proto_wire`), into HLO text (:func:`module_text`) and then a
:class:`~traceroof.costs.hlo.ModuleInfo`, costed by :mod:`traceroof.costs.hlo_model`.
"""

from __future__ import annotations

import re
from typing import Any

from ..costs.hlo import ModuleInfo, module_info_from_text
from .protowire import LEN, VARINT
from .xplane_proto import iter_fields
from .xplane_proto_wire import WireError, read_varint


def hlo_module_bytes(hlo_proto: bytes) -> bytes:
    """The serialized ``HloModuleProto`` (field 1) inside a serialized ``xla.HloProto``.
    Raises ``ValueError`` when there is none."""
    for fnum, wt, value, _pos, _end in iter_fields(hlo_proto, 0, len(hlo_proto)):
        if fnum == 1 and wt == 2:
            return bytes(hlo_proto[value[0] : value[1]])
    raise ValueError("HloProto has no hlo_module (field 1)")


def module_info(hlo_proto: bytes, name: str = "") -> ModuleInfo:
    """Decode a serialized ``xla.HloProto`` (as stored in the ``Hlo Proto`` stat) into a
    :class:`~traceroof.costs.hlo.ModuleInfo` (no jax). Raises ``ValueError`` (a
    :class:`~.xplane_proto_wire.WireError` among them) on bytes that are not one."""
    module_name, text = module_text(hlo_module_bytes(hlo_proto))
    return module_info_from_text(text, name or module_name)


class Modules:
    """The ``Hlo Proto`` of each program in ``/host:metadata`` (``plane``: that plane as the
    XPlane reader wraps it, or None), parsed on demand into :class:`ModuleInfo`."""

    def __init__(self, plane) -> None:
        self.protos: dict[int, tuple[str, bytes]] = {}
        self.names: dict[int, str] = {}
        self._info: dict[int, Any] = {}
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
        """The :class:`~traceroof.costs.hlo.ModuleInfo` of ``program_id``, or None (no proto, or unreadable: listed in ``failed``)."""
        if program_id in self._info:
            return self._info[program_id]
        result = None
        entry = self.protos.get(program_id)
        if entry is not None:
            try:
                result = module_info(entry[1], entry[0])
            except (ValueError, IndexError, KeyError) as exc:
                self.failed.append(f"{entry[0]}({program_id}): {exc}")
        self._info[program_id] = result
        return result


# --- HloModuleProto -> HLO text, with the project's own wire reader (no jax) ----------------
# Field numbers are facts of the format (openxla/xla xla/service/hlo.proto, xla/xla_data.proto):
# HloModuleProto: name 1, entry_computation_name 2, computations 3, entry_computation_id 6.
# HloComputationProto: name 1, instructions 2, id 5, root_id 6.
# HloInstructionProto: name 1, opcode 2, shape 3, parameter_number 9, fusion_kind 11,
# tuple_index 13, dimensions 14, window 15, convolution_dimension_numbers 16,
# custom_call_target 28, dot_dimension_numbers 30, id 35, operand_ids 36,
# called_computation_ids 38, backend_config 43, replica_groups 49, feature_group_count 50.
# ShapeProto: element_type 2, dimensions 3, tuple_shapes 4, layout 5 (minor_to_major 1).

#: xla.PrimitiveType numbers -> the HLO text type names (xla/xla_data.proto)
PRIMITIVE_TYPES = {
    1: "pred", 2: "s8", 3: "s16", 4: "s32", 5: "s64", 6: "u8", 7: "u16", 8: "u32", 9: "u64",
    10: "f16", 11: "f32", 12: "f64", 13: "tuple", 14: "opaque", 15: "c64", 16: "bf16",
    17: "token", 18: "c128", 19: "f8e5m2", 20: "f8e4m3fn", 21: "s4", 22: "u4",
    23: "f8e4m3b11fnuz", 24: "f8e5m2fnuz", 25: "f8e4m3fnuz", 26: "s2", 27: "u2",
    28: "f8e4m3", 29: "f8e3m4", 30: "f4e2m1fn", 31: "f8e8m0fnu", 32: "s1", 33: "u1",
}


#: how deep tuple shapes may nest (XLA's own tuples nest a few levels; a damaged proto nests a
#: message in itself until the stack runs out)
MAX_TUPLE_DEPTH = 64


def _packed(buf, wt: int, value, tag_pos: int = 0) -> list[int]:
    """A repeated int64 field's values (packed, or one unpacked value). Raises
    :class:`~.xplane_proto_wire.WireError` on a fixed-width wire type (not an int64's)."""
    if wt == VARINT:
        return [int(value)]
    if wt != LEN:
        raise WireError(tag_pos, f"an int field with wire type {wt}, expected varint or packed")
    out, pos = [], value[0]
    while pos < value[1]:
        v, pos = read_varint(buf, pos, value[1])
        out.append(v - (1 << 64) if v >= 1 << 63 else v)
    return out


def _fields(buf, rng) -> dict[int, list]:
    """``{field number: [(wire type, value, tag offset), ...]}`` of the message in ``buf[rng[0]:rng[1]]``
    (``value`` as :func:`~.xplane_proto_wire.iter_fields` gives it). Read it with the typed
    accessors (:func:`_str`, :func:`_int`, :func:`_ints`, :func:`_msg`, :func:`_msgs`): a field of
    the wrong wire type is a :class:`~.xplane_proto_wire.WireError`, not a ``TypeError``."""
    got: dict[int, list] = {}
    for fnum, wt, value, tag_pos, _e in iter_fields(buf, rng[0], rng[1]):
        got.setdefault(fnum, []).append((wt, value, tag_pos))
    return got


def _wrong(num: int, wt: int, tag_pos: int, want: str) -> WireError:
    return WireError(tag_pos, f"field {num} has wire type {wt}, expected {want}")


def _msgs(f: dict, num: int) -> list[tuple[int, int]]:
    """The byte ranges of every value of the message (or string) field ``num``."""
    out = []
    for wt, value, tag_pos in f.get(num, []):
        if wt != LEN:
            raise _wrong(num, wt, tag_pos, "length-delimited")
        out.append(value)
    return out


def _msg(f: dict, num: int) -> tuple[int, int] | None:
    """The byte range of the last value of the message field ``num``, None when absent."""
    got = _msgs(f, num)
    return got[-1] if got else None


def _int(f: dict, num: int, default: Any = 0) -> Any:
    """The last value of the varint field ``num`` (unsigned, as on the wire), ``default`` when absent."""
    if num not in f:
        return default
    wt, value, tag_pos = f[num][-1]
    if wt != VARINT:
        raise _wrong(num, wt, tag_pos, "varint")
    return value


def _ints(buf, f: dict, num: int) -> list[int]:
    return [v for wt, value, tag_pos in f.get(num, []) for v in _packed(buf, wt, value, tag_pos)]


def _str(buf, f: dict, num: int) -> str:
    rng = _msg(f, num)
    return "" if rng is None else bytes(buf[rng[0]:rng[1]]).decode("utf-8", "replace")


def shape_text(buf, rng, depth: int = 0) -> str:
    """HLO text of a ``ShapeProto`` (``f32[2,3]{1,0}``, tuples ``(f32[2]{0}, s32[])``; the
    layout's minor-to-major order, not its tiling). Raises
    :class:`~.xplane_proto_wire.WireError` on tuples nested deeper than
    :data:`MAX_TUPLE_DEPTH`."""
    if depth > MAX_TUPLE_DEPTH:
        raise WireError(rng[0], f"tuple shapes nested deeper than {MAX_TUPLE_DEPTH}")
    f = _fields(buf, rng)
    etype = PRIMITIVE_TYPES.get(_int(f, 2), "opaque")
    if etype == "tuple":
        return "(" + _join([shape_text(buf, v, depth + 1) for v in _msgs(f, 4)]) + ")"
    if etype in ("token", "opaque"):
        return f"{etype}[]"
    text = f"{etype}[{','.join(str(d) for d in _ints(buf, f, 3))}]"
    layout = _msg(f, 5)
    if layout is not None and 3 in f:  # LayoutProto.minor_to_major (field 1), as HLO text prints it
        order = _ints(buf, _fields(buf, layout), 1)
        text += "{" + ",".join(str(d) for d in order) + "}"
    return text


def _join(items: list[str]) -> str:
    """``a, b, ...`` with XLA's ``/*index=5*/`` marks before every fifth item."""
    return ", ".join(f"/*index={k}*/{x}" if k and k % 5 == 0 else x for k, x in enumerate(items))


def _dims(name: str, values: list[int]) -> str:
    return f"{name}={{{','.join(str(v) for v in values)}}}"


def _window(buf, rng) -> str:
    """``window={size=3x3 stride=1x1 pad=1_1x1_1 lhs_dilate=.. rhs_dilate=..}`` of a ``Window``."""
    dims = [_fields(buf, v) for v in _msgs(_fields(buf, rng), 1)]
    one = _int
    parts = [f"size={'x'.join(str(one(d, 1, 1)) for d in dims)}",
             f"stride={'x'.join(str(one(d, 2, 1)) for d in dims)}",
             f"pad={'x'.join(f'{_signed(one(d, 3, 0))}_{_signed(one(d, 4, 0))}' for d in dims)}",
             f"lhs_dilate={'x'.join(str(one(d, 6, 1)) for d in dims)}",
             f"rhs_dilate={'x'.join(str(one(d, 5, 1)) for d in dims)}"]
    return "window={" + " ".join(parts) + "}"


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _dim_labels(buf, rng) -> str:
    """``dim_labels=b01f_01io->b01f`` of ``ConvolutionDimensionNumbers``."""
    f = _fields(buf, rng)

    def labels(fixed: dict[int, str], spatial: list[int]) -> str:
        n = len(spatial) + len(fixed)
        out = ["?"] * n
        for pos, ch in fixed.items():
            if 0 <= pos < n:
                out[pos] = ch
        for i, pos in enumerate(spatial):
            if 0 <= pos < n:
                out[pos] = str(i)
        return "".join(out)

    g = lambda k: _int(f, k)  # noqa: E731
    lhs = labels({g(7): "b", g(8): "f"}, _ints(buf, f, 11))
    rhs = labels({g(3): "i", g(4): "o"}, _ints(buf, f, 6))
    out = labels({g(9): "b", g(10): "f"}, _ints(buf, f, 12))
    return f"dim_labels={lhs}_{rhs}->{out}"


def _attrs(buf, f: dict, opcode: str, comp_names: dict[int, str]) -> list[str]:
    """The attributes the cost model and the kind rules read, in HLO text syntax."""
    attrs: list[str] = []
    if 11 in f:
        attrs.append(f"kind={_str(buf, f, 11)}")
    if 13 in f:
        attrs.append(f"index={_int(f, 13)}")
    if 14 in f:
        attrs.append(_dims("dimensions", _ints(buf, f, 14)))
    if 30 in f:
        d = _fields(buf, _msg(f, 30))
        for k, nm in ((3, "lhs_batch_dims"), (1, "lhs_contracting_dims"),
                      (4, "rhs_batch_dims"), (2, "rhs_contracting_dims")):
            if k in d:
                attrs.append(_dims(nm, _ints(buf, d, k)))
    if 15 in f:
        attrs.append(_window(buf, _msg(f, 15)))
    if 16 in f:
        attrs.append(_dim_labels(buf, _msg(f, 16)))
    if _int(f, 50) > 1:
        attrs.append(f"feature_group_count={_int(f, 50)}")
    callees = [comp_names.get(i, f"computation.{i}") for i in _ints(buf, f, 38)]
    if opcode == "while" and len(callees) == 2:  # HloInstruction::CreateFromProto: body, cond
        attrs.append(f"condition=%{callees[1]}, body=%{callees[0]}")
    elif opcode == "fusion" and callees:
        attrs.append(f"calls=%{callees[0]}")
    elif opcode == "conditional" and callees:
        attrs.append("branch_computations={" + ", ".join(f"%{c}" for c in callees) + "}")
    elif callees:
        attrs.append(("to_apply=%" if len(callees) == 1 else "called_computations=%")
                     + ", %".join(callees))
    if 49 in f:
        groups = [_ints(buf, _fields(buf, v), 1) for v in _msgs(f, 49)]
        attrs.append("replica_groups={" + ",".join(
            "{" + ",".join(str(x) for x in g) + "}" for g in groups) + "}")
    if 28 in f:
        attrs.append(f'custom_call_target="{_str(buf, f, 28)}"')
    if 43 in f:
        cfg = _str(buf, f, 43)
        attrs.append(f"backend_config={cfg}" if cfg.startswith("{") else
                     f'backend_config="{cfg}"')
    return attrs


def module_text(hlo_module: bytes) -> tuple[str, str]:
    """(module name, HLO text) of a serialized ``HloModuleProto``, read with the project's own
    wire reader: every computation with its instructions as ``%name = SHAPE opcode(%operands),
    attrs`` (the attributes the cost model reads; no metadata), the entry
    computation marked ``ENTRY``. Raises :class:`~.xplane_proto_wire.WireError` (a
    ``ValueError``) on bytes that are not wire format."""
    buf = memoryview(hlo_module)
    mod = _fields(buf, (0, len(buf)))
    name = _str(buf, mod, 1)
    entry_name = _str(buf, mod, 2)
    entry_id = _int(mod, 6, None)
    comps = [_fields(buf, v) for v in _msgs(mod, 3)]
    comp_names = {_int(c, 5, -1): _str(buf, c, 1) for c in comps}
    lines = [f"HloModule {name}", ""]
    for c in comps:
        cname = _str(buf, c, 1)
        cid = _int(c, 5, -1)
        root = _int(c, 6, None)
        instrs = [_fields(buf, v) for v in _msgs(c, 2)]
        names = {_int(i, 35, -1): _str(buf, i, 1) for i in instrs}
        is_entry = cid == entry_id if entry_id is not None else cname == entry_name
        lines.append(f"{'ENTRY ' if is_entry else ''}%{cname} {{")
        for i in instrs:
            opcode = _str(buf, i, 2)
            iid = _int(i, 35, -1)
            shape_rng = _msg(i, 3)
            shape = shape_text(buf, shape_rng) if shape_rng is not None else "()"
            if opcode == "parameter":
                operands = str(_int(i, 9))
            else:
                operands = _join([f"%{names.get(o, o)}" for o in _ints(buf, i, 36)])
            text = f"%{_str(buf, i, 1)} = {shape} {opcode}({operands})"
            attrs = _attrs(buf, i, opcode, comp_names)
            if attrs:
                text += ", " + ", ".join(attrs)
            lines.append(f"  {'ROOT ' if iid == root else ''}{text}")
        lines.append("}")
        lines.append("")
    return name, "\n".join(lines)
