"""The format registry: one entry per input format (skeleton; completed by the registry work).

``facts_for(meta.format)`` gives the per-format facts analysis needs, as data, so that no
stage tests ``meta.format == ...``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FormatFacts:
    """What analysis needs to know of a format.

    Attributes:
        chip_from_properties: the device planes carry capability stats but no name (XPlane
            GPU planes), so the chip may be identified by its properties.
        default_group_by: the ranking's default grouping: ``op`` (framework op, else kernel
            name) or ``kernel`` (e.g. the HLO instruction, when ``op`` is only an opcode).
        shapes_hint: the advice printed when no shapes were recorded and none of the device
            time was costed from shapes; None when the format has no such switch.
    """

    chip_from_properties: bool = False
    default_group_by: str = "op"
    shapes_hint: str | None = None


_FACTS = {
    "kineto": FormatFacts(
        shapes_hint="no shapes recorded: re-run torch.profiler with record_shapes=True to get "
        "FLOPs and bytes per op"),
    "xplane": FormatFacts(chip_from_properties=True, default_group_by="kernel"),
}


def facts_for(fmt: str) -> FormatFacts:
    """The facts of format ``fmt`` (``meta.format``); a format without an entry gets the defaults."""
    return _FACTS.get(fmt, FormatFacts())
