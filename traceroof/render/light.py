"""The speed-of-light headline and the waterfall block, as rows the text renderers print
(docs/speed-of-light.md). Presents :class:`~traceroof.sections.SpeedOfLightInfo`; computes
nothing but running sums of its terms."""

from __future__ import annotations

from .. import units
from ..report import Report

#: the waterfall's columns
COLUMNS = ("term", "per step", "step after", "what-if alone")


def headline(report: Report) -> list[tuple[str, str]]:
    """The ``speed of light`` summary row: measured step, speed of light, their ratio, and the
    model floor when a model was given (none when the report has no speed of light)."""
    s = report.speed_of_light
    if s is None or s.measured_ns is None:
        return []
    line = (f"step {units.ns(s.measured_ns)}; speed of light {units.ns(s.speed_of_light_ns)}: "
            f"{units.pct(s.fraction, 0)} of light")
    if s.model_floor_ns is not None:
        line += f"; model floor {units.ns(s.model_floor_ns)}"
        if s.model_floor_note:
            line += f" ({s.model_floor_note})"
    if s.uncosted_ns:
        line += f"; {units.ns(s.uncosted_ns)} per step has no cost model and counts at its measured time"
    return [("speed of light", line + " (docs/speed-of-light.md)")]


def waterfall_rows(report: Report, top: int = 20) -> tuple[list[list[str]], str | None]:
    """The waterfall as rows (:data:`COLUMNS`), measured first and speed of light last, the
    step time after each term; findings beyond ``top`` are summed in one row that says how
    many (each is in the JSON). Also the note under it (the overlap convention)."""
    s = report.speed_of_light
    if s is None or s.measured_ns is None:
        return [], None
    rows = [["measured step", units.ns(s.measured_ns), units.ns(s.measured_ns), ""]]
    at = float(s.measured_ns)
    found = [t for t in s.waterfall if t.source == "finding"]
    shown, more = found[:top], found[top:]
    for t in shown:
        at -= t.ns
        rows.append([units.short(t.term, 70), ("−" if t.ns else "") + units.ns(t.ns), units.ns(at),
                     units.ns(t.what_if_ns)])
    if more:
        ns = sum(t.ns for t in more)
        at -= ns
        rows.append([f"{len(more)} more findings (--format json lists each)", "−" + units.ns(ns), units.ns(at), ""])
    for t in s.waterfall:
        if t.source != "finding":
            at -= t.ns
            sign = "−" if t.ns >= 0 else "+"
            rows.append([t.term, sign + units.ns(abs(t.ns)), units.ns(at), ""])
    rows.append(["speed of light", units.ns(s.speed_of_light_ns), units.ns(s.speed_of_light_ns), ""])
    note = (f"Per complete step, mean over {units.plural(s.device_steps, 'device-step')}; the terms add up to "
            f"measured − speed of light. Convention: {s.convention}. A finding's what-if is the step time with that "
            "fix alone; it can be below the speed of light when the fix changes the roof (dtype, overlap).")
    return rows, note


__all__ = ["COLUMNS", "headline", "waterfall_rows"]
