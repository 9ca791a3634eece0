"""The compiled HLO of each program in an XPlane's ``/host:metadata`` plane.

jax writes one event metadata per program with the stat ``Hlo Proto`` (a serialized
``xla.HloProto``) and the name ``module_name(program_id)``. :class:`Modules` finds them and
parses each on demand into a :class:`~traceroof.costs.hlo.ModuleInfo` (costs: jaxlib, see
:mod:`traceroof.costs.hlo`).
"""

from __future__ import annotations

import re
from typing import Any

from ..costs.hlo import HloCostUnavailable, ModuleInfo, module_info_from_proto
from .xplane_proto import iter_fields


def hlo_module_bytes(hlo_proto: bytes) -> bytes:
    """The serialized ``HloModuleProto`` (field 1) inside a serialized ``xla.HloProto``."""
    for fnum, wt, value, _pos, _end in iter_fields(hlo_proto, 0, len(hlo_proto)):
        if fnum == 1 and wt == 2:
            return bytes(hlo_proto[value[0] : value[1]])
    raise ValueError("HloProto has no hlo_module (field 1)")


def module_info(hlo_proto: bytes, name: str = "") -> ModuleInfo:
    """Parse a serialized ``xla.HloProto`` (as stored in the ``Hlo Proto`` stat) into a
    :class:`~traceroof.costs.hlo.ModuleInfo`. Raises
    :class:`~traceroof.costs.hlo.HloCostUnavailable` without jax, ``ValueError`` on a proto
    jaxlib cannot read."""
    return module_info_from_proto(hlo_proto, name, unwrap=hlo_module_bytes)


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
        """The :class:`~traceroof.costs.hlo.ModuleInfo` of ``program_id``, or None (no proto, no jax, unreadable)."""
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


