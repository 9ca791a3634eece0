"""The JSON Schema of a saved report, generated from the report's sections.

:func:`report_schema` builds it from the dataclasses of :mod:`traceroof.sections` (and
:class:`~traceroof.findings.Finding`), their type hints and JSON field metadata, plus the
declared column types of the step and ranking tables. So the schema cannot drift from what
:meth:`Report.to_dict` writes: a section field added is a key in the schema.

Section objects are strict (no unknown key; every key the converter always writes is
required); free-form dicts (``trace.stats``, ``finding.evidence``, the cross-rank rows) are
objects of anything. ``docs/report-json.md`` describes the keys.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any, Union

import polars as pl

from .sections import (
    ChipInfo,
    CoverageInfo,
    Filters,
    InconsistencyInfo,
    RanksInfo,
    SpeedOfLightInfo,
    Summary,
    TraceInfo,
)

__all__ = ["RANKING_COLUMNS", "report_schema", "validate_report"]

DRAFT = "https://json-schema.org/draft/2020-12/schema"

#: the ranking rows' columns every renderer reads (rows may carry more), JSON types.
RANKING_COLUMNS: dict[str, Any] = {
    "label": {"type": "string"},
    "kind": {"type": ["string", "null"]},
    "count": {"type": "integer"},
    "total_ns": {"type": "integer"},
    "costed_count": {"type": "integer"},
    "measured_ns": {"type": ["integer", "null"]},
    "expected_ns": {"type": ["number", "null"]},
    "gap_ns": {"type": ["number", "null"]},
    "costed": {"type": ["number", "null"]},
    "efficiency": {"type": ["number", "null"]},
    "bound": {"type": ["string", "null"]},
    "intensity": {"type": ["number", "null"]},
}


def _polars_type(dtype: Any) -> dict[str, Any]:
    """The JSON type of a polars column's values (nulls allowed)."""
    if dtype.is_integer():
        return {"type": ["integer", "null"]}
    if dtype.is_float():
        return {"type": ["number", "null"]}
    if dtype == pl.Boolean:
        return {"type": ["boolean", "null"]}
    return {"type": ["string", "null"]}


def _steps_row() -> dict[str, Any]:
    from .steps import STEP_SCHEMA

    cols = {**STEP_SCHEMA, "hfu": pl.Float64, "mfu": pl.Float64}
    return {"type": "object", "properties": {k: _polars_type(v) for k, v in cols.items()},
            "required": list(cols), "additionalProperties": False}


_SCALARS = {str: "string", bool: "boolean", int: "integer", float: "number"}


def _type(hint: Any) -> dict[str, Any]:
    """The JSON Schema of a type hint (``float | None``, ``list[str]``, a section ...)."""
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        inner = _type(args[0]) if len(args) == 1 else {"anyOf": [_type(a) for a in args]}
        return {"anyOf": [inner, {"type": "null"}]}
    if hint in _SCALARS:
        return {"type": _SCALARS[hint]}
    if origin in (list, tuple):
        args = typing.get_args(hint)
        return {"type": "array", **({"items": _type(args[0])} if args and args[0] is not Any else {})}
    if origin is dict or hint is dict:
        args = typing.get_args(hint)
        return {"type": "object",
                **({"additionalProperties": _type(args[1])} if len(args) == 2 and args[1] is not Any else {})}
    if dataclasses.is_dataclass(hint):
        return _section(hint)
    return {}  # Any


def _fields(cls: type) -> tuple[dict[str, Any], list[str]]:
    """(properties, required keys) of a section, its flattened groups' keys included."""
    hints = typing.get_type_hints(cls)
    props: dict[str, Any] = {}
    required: list[str] = []
    for f in dataclasses.fields(cls):
        if f.metadata.get("flatten"):
            sub, _ = _fields(f.metadata["section"])
            props.update(sub)  # a group's keys are optional: the group may be absent
            continue
        key = f.metadata.get("key") or f.name
        props[key] = _type(hints[f.name])
        if not f.metadata.get("omit_none"):
            required.append(key)
    return props, required


@functools.cache
def _section(cls: type) -> dict[str, Any]:
    props, required = _fields(cls)
    out: dict[str, Any] = {"type": "object", "properties": props, "required": required,
                           "additionalProperties": False}
    groups = {f.metadata["section"]: f for f in dataclasses.fields(cls) if f.metadata.get("flatten")}
    if groups:  # a group present has all its always-written keys
        dep: dict[str, list[str]] = {}
        for g in groups:
            _, req = _fields(g)
            for k in req:
                dep[k] = [x for x in req if x != k]
        out["dependentRequired"] = dep
    return out


@functools.cache
def report_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of :meth:`Report.to_dict` / a saved report."""
    from .findings import Finding
    from .report import SCHEMA_VERSION

    empty = {"type": "object", "maxProperties": 0}
    return {
        "$schema": DRAFT,
        "title": "traceroof report",
        "type": "object",
        "properties": {
            "schema_version": {"const": SCHEMA_VERSION},
            "traceroof_version": {"type": "string"},
            "created_at": {"type": "string"},
            "filters": {"anyOf": [_section(Filters), empty]},
            "trace": _section(TraceInfo),
            "chip": {"anyOf": [_section(ChipInfo), empty]},
            "coverage": _section(CoverageInfo),
            "summary": _section(Summary),
            "warnings": {"type": "array", "items": {"type": "string"}},
            "inconsistencies": {"type": "array", "items": _section(InconsistencyInfo)},
            "findings": {"type": "array", "items": _section(Finding)},
            "steps": {"type": "array", "items": _steps_row()},
            "ranking": {"type": "array", "items": {"type": "object", "properties": RANKING_COLUMNS,
                                                   "required": list(RANKING_COLUMNS)}},
            "ranks": _section(RanksInfo),
            "speed_of_light": _section(SpeedOfLightInfo),
            "ops": {"type": "object", "additionalProperties": {"type": "array"}},
        },
        "required": ["schema_version", "traceroof_version", "created_at", "filters", "trace", "chip",
                     "coverage", "summary", "warnings", "inconsistencies", "findings", "steps", "ranking"],
        "additionalProperties": False,
    }


def validate_report(d: dict[str, Any]) -> None:
    """Check a report dict (:meth:`Report.to_dict`, or a saved report's JSON) against
    :func:`report_schema`.

    Raises:
        jsonschema.ValidationError: the first key of the wrong type, missing or unknown.
        ImportError: the ``jsonschema`` package (test extra) is not installed.
    """
    import jsonschema

    jsonschema.validate(d, report_schema(), cls=jsonschema.Draft202012Validator)
