"""Where in the user's code each HLO op came from: the ``OpMetadata`` of its instruction in
the program's ``Hlo Proto``, as two op-table columns of XPlane traces.

* ``hlo_op_name``: ``OpMetadata.op_name``, jax's name stack (``jit(train_step)/dot_general``);
* ``source_location``: ``file:line`` of ``OpMetadata.source_file``/``source_line``, or, where
  jax writes a stack-frame id instead (jax >= 0.4.36), of that frame in the module's
  ``stack_frame_index``.

Null where the instruction has no metadata (parameters, copies XLA added) or the module has no
HLO proto; never guessed. Field numbers are facts of the format (openxla/xla
``xla/xla_data.proto``: OpMetadata op_name 2, source_file 3, source_line 4, stack_frame_id 15;
``xla/service/hlo.proto``: HloInstructionProto name 1, metadata 7; HloModuleProto
computations 3, stack_frame_index 17; StackFrameIndexProto file_names 1, file_locations 3,
stack_frames 4; FileLocation file_name_id 1, line 3; StackFrame file_location_id 1 -- ids
are 1-based).
"""

from __future__ import annotations

import polars as pl

from .hlo_modules import Modules, _fields, _int, _msg, _msgs, _str, hlo_module_bytes

COLUMNS = {"hlo_op_name": pl.String, "source_location": pl.String}


def instruction_sources(hlo_proto: bytes) -> dict[str, tuple[str | None, str | None]]:
    """``{instruction name: (op_name, "file:line")}`` of a serialized ``xla.HloProto``, for
    every instruction with metadata (either may be None). Raises ``ValueError`` on bytes
    that are not one."""
    buf = memoryview(hlo_module_bytes(hlo_proto))
    mod = _fields(buf, (0, len(buf)))
    frames = _frames(buf, mod)
    out: dict[str, tuple[str | None, str | None]] = {}
    for crng in _msgs(mod, 3):
        for irng in _msgs(_fields(buf, crng), 2):
            ins = _fields(buf, irng)
            md_rng = _msg(ins, 7)
            if md_rng is None:
                continue
            md = _fields(buf, md_rng)
            op_name = _str(buf, md, 2) or None
            file, line = _str(buf, md, 3), _int(md, 4)
            where = f"{file}:{line}" if file else frames.get(_int(md, 15))
            if op_name or where:
                out[_str(buf, ins, 1)] = (op_name, where)
    return out


def _frames(buf, mod: dict) -> dict[int, str]:
    """``{stack frame id: "file:line"}`` of the module's ``stack_frame_index`` (field 17)."""
    idx_rng = _msg(mod, 17)
    if idx_rng is None:
        return {}
    idx = _fields(buf, idx_rng)
    files = [bytes(buf[a:b]).decode("utf-8", "replace") for a, b in _msgs(idx, 1)]
    locations = []
    for rng in _msgs(idx, 3):
        loc = _fields(buf, rng)
        locations.append((_int(loc, 1), _int(loc, 3)))
    out = {}
    for k, rng in enumerate(_msgs(idx, 4), start=1):
        loc_id = _int(_fields(buf, rng), 1)
        if 1 <= loc_id <= len(locations):
            file_id, line = locations[loc_id - 1]
            if 1 <= file_id <= len(files):
                out[k] = f"{files[file_id - 1]}:{line}"
    return out


def with_sources(ops: pl.DataFrame, modules: Modules) -> pl.DataFrame:
    """``ops`` (one op frame: ``program_id`` and ``hlo_op`` columns) with the
    :data:`COLUMNS`, from the modules' HLO protos; a module that does not decode leaves its
    ops' columns null (its failure is already in ``modules.failed`` when it was costed)."""
    if not {"program_id", "hlo_op"} <= set(ops.columns) or not modules.protos:
        return ops
    rows: dict[str, list] = {"program_id": [], "hlo_op": [], **{c: [] for c in COLUMNS}}
    cache = modules.__dict__.setdefault("_sources", {})  # decoded once per program and file
    for pid in ops["program_id"].drop_nulls().unique().to_list():
        if int(pid) not in cache:
            cache[int(pid)] = _decode(modules, int(pid))
        for name, (op_name, where) in cache[int(pid)].items():
            rows["program_id"].append(int(pid))
            rows["hlo_op"].append(name)
            rows["hlo_op_name"].append(op_name)
            rows["source_location"].append(where)
    table = pl.DataFrame(rows, schema={"program_id": ops.schema["program_id"],
                                       "hlo_op": pl.String, **COLUMNS})
    return ops.join(table, on=["program_id", "hlo_op"], how="left", maintain_order="left")


def _decode(modules: Modules, pid: int) -> dict[str, tuple[str | None, str | None]]:
    entry = modules.protos.get(pid)
    if entry is None:
        return {}
    try:
        return instruction_sources(entry[1])
    except (ValueError, IndexError, KeyError):
        return {}
