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
import math
import re
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

__all__ = ["READ_OPS_COLUMNS", "RANKING_COLUMNS", "check_report", "report_schema", "table_types", "validate_report"]

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


# --------------------------------------------------------------------------- reading a report

#: the top-level keys :meth:`~traceroof.report.Report.from_dict` cannot do without
NEEDED_KEYS = ("trace", "chip", "coverage", "summary")

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
    "null": (type(None),), "array": (list,), "object": (dict,),
}
_SURROGATE = re.compile("[\ud800-\udfff]")


def _json_type(v: Any) -> str:
    for name in ("null", "boolean", "integer", "number", "string", "array", "object"):
        if isinstance(v, _JSON_TYPES[name]) and not (name in ("integer", "number") and isinstance(v, bool)):
            return name
    return type(v).__name__


def _fits(v: Any, schema: dict[str, Any]) -> str | None:
    """None when the value ``v`` has the schema's type (no recursion), else what was expected."""
    want = schema.get("type")
    if want is None:
        return None
    names = [want] if isinstance(want, str) else list(want)
    got = _json_type(v)
    if got in names or (got == "integer" and "number" in names):
        return None
    return " or ".join(names)


def _problem(v: Any, schema: dict[str, Any], path: str) -> tuple[str, str, Any] | None:
    """The first place where ``v`` breaks ``schema`` (types, items, properties; keys the
    reader tolerates, missing or extra, are not problems): (path, expected, found)."""
    stack: list[tuple[Any, dict[str, Any], str]] = [(v, schema, path)]
    while stack:
        x, s, where = stack.pop()
        if "anyOf" in s:
            if all(_problem(x, alt, where) is not None for alt in s["anyOf"]):
                first = _problem(x, s["anyOf"][0], where)
                return first if _json_type(x) in ("object", "array") and first else (where, _anyof_names(s), x)
            continue
        want = _fits(x, s)
        if want is not None:
            return where, want, x
        if isinstance(x, dict) and len(x) > s.get("maxProperties", len(x)):
            return where, "an empty object" if s["maxProperties"] == 0 else f"at most {s['maxProperties']} keys", x
        if isinstance(x, float) and not math.isfinite(x):
            return where, "a finite number", x
        if isinstance(x, str) and _SURROGATE.search(x):
            return where, "text (a lone UTF-16 surrogate is not text)", x
        if isinstance(x, dict):
            props, extra = s.get("properties", {}), s.get("additionalProperties")
            for k, val in reversed(x.items()):  # pushed last first: the first bad key is found first
                sub = props.get(k, extra if isinstance(extra, dict) else {})
                stack.append((val, sub, f"{where}.{k}"))
        elif isinstance(x, list):
            item = s.get("items", {})
            stack.extend((x[i], item, f"{where}[{i}]") for i in range(len(x) - 1, -1, -1))
    return None


def _anyof_names(s: dict[str, Any]) -> str:
    names = []
    for alt in s["anyOf"]:
        t = alt.get("type", "a section" if "properties" in alt else "anything")
        names += [t] if isinstance(t, str) else list(t)
    return " or ".join(dict.fromkeys(names))


#: op-table columns the analysis adds past :data:`traceroof.schema.OP_SCHEMA` and
#: ``ROOFLINE_SCHEMA`` that ``serve``, ``diff`` and ``gate`` read from a saved report, with their
#: types; ``peak_dtype`` (every analysed op table has it since the first report version) is
#: required, the others are checked where present.
READ_OPS_COLUMNS: dict[str, Any] = {"peak_dtype": pl.String, "bucket": pl.String, "collective": pl.String,
                                    "source_location": pl.String, "label": pl.String}
REQUIRED_EXTRA_OPS_COLUMNS = ("peak_dtype",)


def _ops_problem(ops: Any) -> tuple[str, str, Any] | None:
    """The saved op table: every declared column (when it has rows), of one length, scalar values, the declared
    types of the op-table columns (and of :data:`READ_OPS_COLUMNS`) and a known ``kind``."""
    from .schema import KINDS, OP_SCHEMA, ROOFLINE_SCHEMA

    if not isinstance(ops, dict):
        return "ops", "an object of columns", ops
    lengths = {len(col) for col in ops.values() if isinstance(col, list)}
    if len(lengths) > 1:
        return "ops", "columns of one length", sorted(lengths)
    declared = {**OP_SCHEMA, **ROOFLINE_SCHEMA, **READ_OPS_COLUMNS}
    missing = [c for c in declared if c not in ops and (c not in READ_OPS_COLUMNS or c in REQUIRED_EXTRA_OPS_COLUMNS)]
    if missing and lengths and max(lengths):  # a table of ops has them all: the dashboard reads them
        return f"ops.{missing[0]}", "the op table's column (schema.OP_SCHEMA, ROOFLINE_SCHEMA, peak_dtype)", None
    scalar = {"type": ["string", "number", "boolean", "null"]}
    for name, col in ops.items():
        if not isinstance(col, list):
            return f"ops.{name}", "an array", col
        dtype = declared.get(name)
        want = scalar if dtype is None or name == "kind" else _polars_type(dtype)
        got = _problem(col, {"type": "array", "items": want}, f"ops.{name}")
        if got is not None:
            return got
        got = _one_type(col, f"ops.{name}", dtype)
        if got is not None:
            return got
        if name == "kind":
            bad = next((v for v in col if v is not None and v not in KINDS), None)
            if bad is not None:
                return "ops.kind", f"one of {', '.join(KINDS)}", bad
    return None


_INT64 = (-(2 ** 63), 2 ** 63 - 1)
_INT_RANGES = {pl.Int8: (-(2 ** 7), 2 ** 7 - 1), pl.Int16: (-(2 ** 15), 2 ** 15 - 1), pl.Int32: (-(2 ** 31), 2 ** 31 - 1),
               pl.Int64: _INT64, pl.UInt8: (0, 2 ** 8 - 1), pl.UInt16: (0, 2 ** 16 - 1), pl.UInt32: (0, 2 ** 32 - 1),
               pl.UInt64: (0, 2 ** 64 - 1)}


def _int_range(values: list[Any], dtype: Any, where: str) -> tuple[str, str, Any] | None:
    """The integers of a table column within its integer dtype's range (``pl.Int32``: ±2^31;
    an undeclared column: int64, or uint64 when none is negative (XPlane's ``program_id``
    fingerprints), what a polars column of ints holds; a float column takes any)."""
    if dtype is not None and not dtype.is_integer():
        return None
    if dtype is None:
        ints = [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
        dtype = pl.UInt64 if ints and min(ints) >= 0 else pl.Int64
    lo, hi = next((r for t, r in _INT_RANGES.items() if dtype == t), _INT64)
    bad = next((v for v in values if isinstance(v, int) and not isinstance(v, bool) and not lo <= v <= hi), None)
    if bad is not None:
        return where, f"an integer from {lo} to {hi}", bad
    return None


def _one_type(values: list[Any], where: str, dtype: Any = None) -> tuple[str, str, Any] | None:
    """A table column: scalars of one JSON type (ints among floats allowed), its ints in the
    range of its declared integer ``dtype`` (int64 when it has none: :func:`_int_range`)."""
    kinds = {_json_type(v) for v in values} - {"null"}
    if kinds & {"array", "object"}:
        return where, "a scalar (string, number, boolean or null)", next(v for v in values if isinstance(v, (list, dict)))
    if {"integer", "number"} <= kinds:
        kinds.discard("integer")  # ints among floats: one number column
    if len(kinds) > 1:
        return where, "values of one type", sorted(kinds)
    if kinds == {"integer"}:
        return _int_range(values, dtype, where)
    return None


def _rows_problem(rows: list[Any], table: str, types: dict[str, Any]) -> tuple[str, str, Any] | None:
    """A saved table (``steps``, ``ranking``: one object per row): its columns as
    :func:`_one_type` wants them (``types``: the polars dtypes of its declared columns)."""
    cols: dict[str, list[Any]] = {}
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            return f"{table}[{i}]", "an object (one table row)", row
        for k, v in row.items():
            cols.setdefault(k, []).append(v)
    for k, vals in cols.items():
        got = _one_type(vals, f"{table}.{k}", types.get(k))
        if got is not None:
            return got
    return None


def _positive(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def _chip_problem(chip: Any) -> tuple[str, str, Any] | None:
    """The chip's peaks (FLOP/s per dtype) and HBM bandwidth (B/s): positive where given
    (every chip of :mod:`traceroof.chips` has them so; a roof of zero or less, or a ridge point
    of a negative bandwidth, is no chip)."""
    if not isinstance(chip, dict):
        return None
    for dtype, peak in (chip.get("peak_flops_per_s") or {}).items():
        if not _positive(peak):
            return f"chip.peak_flops_per_s.{dtype}", "a positive number (FLOP/s)", peak
    hbm = chip.get("hbm_bytes_per_s")
    if hbm is not None and not _positive(hbm):
        return "chip.hbm_bytes_per_s", "a positive number (B/s) or null", hbm
    return None


def _light_problem(light: Any) -> tuple[str, str, Any] | None:
    """A speed-of-light section counts at least one complete device-step: the waterfall
    makes none when there is no step (:func:`traceroof.waterfall.build` returns None), and
    its means are per device-step."""
    if not isinstance(light, dict):
        return None
    n = light.get("device_steps")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        return "speed_of_light.device_steps", "an integer ≥ 1 (complete device-steps)", n
    return None


def _value_problem(d: dict[str, Any]) -> tuple[str, str, Any] | None:
    """Values the types do not pin down: the grouping's name, the chip's peaks and bandwidth
    (:func:`_chip_problem`), the speed of light's step count (:func:`_light_problem`), and the
    keys a finding cannot be rebuilt without (its fields without a default)."""
    from .findings import Finding

    got = _chip_problem(d.get("chip")) or _light_problem(d.get("speed_of_light"))
    if got is not None:
        return got
    group_by = (d.get("filters") or {}).get("group_by")
    if group_by not in (None, "op", "kernel"):
        return "filters.group_by", "'op' or 'kernel'", group_by
    needed = [f.name for f in dataclasses.fields(Finding)
              if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    for i, f in enumerate(d.get("findings") or []):
        lacks = [k for k in needed if k not in f]
        if lacks:
            return f"findings[{i}]", f"the key '{lacks[0]}' of a finding", sorted(f)[:5]
    return None


_JSON_TO_POLARS = {"string": pl.String, "integer": pl.Int64, "number": pl.Float64, "boolean": pl.Boolean}


@functools.cache
def table_types() -> dict[str, dict[str, Any]]:
    """The polars dtypes of the declared columns of a saved report's tables: ``steps``
    (:data:`traceroof.steps.STEP_SCHEMA` with ``hfu`` / ``mfu``), ``ranking``
    (:data:`RANKING_COLUMNS`), ``ops`` (:data:`traceroof.schema.OP_SCHEMA`,
    ``ROOFLINE_SCHEMA`` and :data:`READ_OPS_COLUMNS`; ``kind`` as its ``pl.Enum``).
    :meth:`~traceroof.report.Report.from_dict` builds the tables with them, so a column of
    nulls only is not polars' ``Null`` type, which no arithmetic takes."""
    from .schema import OP_SCHEMA, ROOFLINE_SCHEMA
    from .steps import STEP_SCHEMA

    ranking = {}
    for k, v in RANKING_COLUMNS.items():
        t = v["type"]
        ranking[k] = _JSON_TO_POLARS[t if isinstance(t, str) else next(x for x in t if x != "null")]
    return {"steps": {**STEP_SCHEMA, "hfu": pl.Float64, "mfu": pl.Float64}, "ranking": ranking,
            "ops": {**OP_SCHEMA, **ROOFLINE_SCHEMA, **READ_OPS_COLUMNS}}


def check_report(d: dict[str, Any], source: str) -> None:
    """Check a saved report's JSON before it is rebuilt: every value present has the type
    :func:`report_schema` declares (finite numbers, text without lone surrogates, the op
    table's columns as :data:`traceroof.schema.OP_SCHEMA` types them) and the top-level
    sections :data:`NEEDED_KEYS` are there. Keys a newer or older traceroof wrote or left
    out are tolerated (the sections take their defaults). No jsonschema needed.

    Raises:
        ReportVersionError: ``<source>: <key path>: expected <type>, found <value>``.
    """
    from .errors import ReportVersionError

    missing = [k for k in NEEDED_KEYS if k not in d]
    if missing:
        raise ReportVersionError(f"{source}: top level: expected the key '{missing[0]}' of a traceroof report")
    schema = dict(report_schema())
    schema["properties"] = {k: v for k, v in schema["properties"].items() if k not in ("schema_version", "ops")}
    got = _problem(d, schema, "report")
    if got is None:
        got = _value_problem(d)
    for table, declared in table_types().items():
        if got is None and isinstance(d.get(table), list):
            got = _rows_problem(d[table], table, declared)
    if got is None and d.get("ops") is not None:
        got = _ops_problem(d["ops"])
    if got is not None:
        where, want, found = got
        text = repr(found)
        raise ReportVersionError(f"{source}: {where}: expected {want}, found "
                                 f"{text if len(text) <= 60 else text[:57] + '...'}")
