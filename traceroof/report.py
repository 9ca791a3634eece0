"""``Report``: everything an analysis produced, and its versioned JSON form.

A report can be saved once (``analyze -o report.json``) and read back by ``gate`` and
``serve`` without re-parsing the trace. The JSON layout is documented in
``docs/report-json.md``; ``schema_version`` changes whenever a field changes meaning.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import polars as pl

from . import __version__
from .errors import InputNotFoundError, ReportVersionError
from .findings import Finding
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

#: 2: a ranking row's ``measured_ns`` covers only its costed ops (accounting rule 7); ``total_ns``
#: and ``costed`` added
SCHEMA_VERSION = 2
#: the older versions :meth:`Report.from_dict` upgrades as it reads them
READABLE_VERSIONS = (1, SCHEMA_VERSION)


def upgrade_v1_ranking(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Version-1 ranking rows in version 2's meaning (accounting rule 7).

    In version 1 a row's ``measured_ns`` was every op's time while ``expected_ns``,
    ``gap_ns`` and ``efficiency`` covered only the costed ops (``efficiency`` = expected /
    costed ops' time). Version 2: ``total_ns`` is every op's time, ``measured_ns`` the costed
    ops' (= expected / efficiency, exact up to float rounding; null when the row has no costed
    op) and ``costed`` = measured / total.
    """
    out = []
    for r in rows:
        r = dict(r)
        total = r.get("measured_ns")
        exp, eff = r.get("expected_ns"), r.get("efficiency")
        if r.get("costed_count") and r.get("costed_count") == r.get("count"):
            measured = total
        elif exp is not None and eff:
            measured = exp / eff
        else:
            measured = None
        r["total_ns"], r["measured_ns"] = total, measured
        r["costed"] = measured / total if measured is not None and total else None
        out.append(r)
    return out


@dataclass
class Report:
    """The result of :func:`traceroof.analyze`: the typed sections of :mod:`traceroof.sections`.

    Attributes:
        trace: what was read (:class:`~traceroof.sections.TraceInfo`).
        chip: the chip used (:class:`~traceroof.sections.ChipInfo`): name, how it was chosen,
            the dense peaks (FLOP/s per dtype), HBM bandwidth (B/s) and their sources; None
            for a trace with no device ops (``{}`` in the JSON).
        coverage: share of device time with a cost model, by source.
        summary: step time (ns), device busy fraction, HFU (and the peak it is taken
            against), roofline efficiency, MFU (:class:`~traceroof.sections.Summary`).
        steps: one row per (rank, step) (``traceroof.steps.STEP_SCHEMA`` + ``hfu``, ``mfu``).
        ranking: ops grouped by framework op (or kernel), sorted by ``gap_ns``.
        ops: the full op table with roofline columns (None when loaded without ops).
        warnings: every tolerable oddity and loss; every output shows them.
        inconsistencies: results that cannot be true (HFU/MFU > 100 %, ops above their
            roof), each naming the suspicious inputs; never printed as results.
        findings: detector results (:class:`~traceroof.findings.Finding`), largest
            recoverable time first.
        filters: the ``--rank``/``--step``/``--group-by`` used (None: ``{}``, no analysis).
        ranks: the cross-rank view (:class:`~traceroof.sections.RanksInfo`) when the analysed
            ops span ≥ 2 ranks; None otherwise (and absent from the JSON). Reports saved
            before this key existed load with None.
        speed_of_light: the step's speed of light and the waterfall down to it
            (:class:`~traceroof.sections.SpeedOfLightInfo`, docs/speed-of-light.md); None
            without a complete step (and absent from the JSON), and in older reports.
    """

    trace: TraceInfo
    chip: ChipInfo | None
    coverage: CoverageInfo
    summary: Summary
    steps: pl.DataFrame
    ranking: pl.DataFrame
    ops: pl.DataFrame | None = None
    warnings: list[str] = field(default_factory=list)
    inconsistencies: list[InconsistencyInfo] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    filters: Filters | None = None
    ranks: RanksInfo | None = None
    speed_of_light: SpeedOfLightInfo | None = None
    created_at: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    traceroof_version: str = __version__
    schema_version: int = SCHEMA_VERSION

    # ------------------------------------------------------------------ notebooks
    @property
    def figures(self) -> Any:
        """The report's plotly figures (:class:`traceroof.render.plots.ReportFigures`):
        ``roofline()``, ``timeline()``, ``steps()``, ``waterfall()``. Needs plotly (the
        ``web`` extra); ``ImportError`` when a figure is built without it."""
        # a face, reached from the report (tests/test_architecture.py LAZY_UP)
        from .render.plots import ReportFigures

        return ReportFigures(self)

    def _repr_html_(self) -> str:
        """What Jupyter shows: the headline and the top 10 ops (:func:`traceroof.render.html.summary_html`)."""
        # a face, reached from the report (tests/test_architecture.py LAZY_UP)
        from .render.html import summary_html

        return summary_html(self, top=10)

    # ------------------------------------------------------------------ JSON
    def to_dict(self, *, include_ops: bool = False, top: int | None = None) -> dict[str, Any]:
        """A JSON-ready dict (docs/report-json.md). ``top`` limits the ranking rows;
        ``include_ops`` adds the op table (column → list of values)."""
        ranking = self.ranking.head(top) if top else self.ranking
        d: dict[str, Any] = {
            "schema_version": self.schema_version,
            "traceroof_version": self.traceroof_version,
            "created_at": self.created_at,
            "filters": self.filters.to_dict() if self.filters else {},
            "trace": self.trace.to_dict(),
            "chip": self.chip.to_dict() if self.chip else {},
            "coverage": self.coverage.to_dict(),
            "summary": self.summary.to_dict(),
            "warnings": self.warnings,
            "inconsistencies": [i.to_dict() for i in self.inconsistencies],
            "findings": [f.to_dict() for f in self.findings],
            "steps": _records(self.steps),
            "ranking": _records(ranking),
        }
        if self.ranks is not None:
            d["ranks"] = self.ranks.to_dict()
        if self.speed_of_light is not None:
            d["speed_of_light"] = self.speed_of_light.to_dict()
        if include_ops and self.ops is not None:
            d["ops"] = _columns(self.ops)
        return _clean(d)

    def to_json(self, *, include_ops: bool = False, top: int | None = None, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(include_ops=include_ops, top=top), indent=indent)

    def save(self, path: str | os.PathLike[str], *, include_ops: bool = True) -> None:
        """Write the report (with the op table, so ``serve`` can use it) as JSON."""
        Path(path).write_text(self.to_json(include_ops=include_ops, indent=None))

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, source: str = "<dict>") -> Report:
        """Rebuild a report from :meth:`to_dict` output, section by section.

        Raises:
            ReportVersionError: unknown ``schema_version``.
        """
        v = d.get("schema_version")
        if v not in READABLE_VERSIONS:
            raise ReportVersionError(
                f"{source}: report schema_version {v!r}; this traceroof reads versions "
                f"{', '.join(map(str, READABLE_VERSIONS))}"
            )
        if v == 1:  # upgraded as read (the sections of version 2 only added keys)
            d = {**d, "ranking": upgrade_v1_ranking(d.get("ranking") or [])}
            v = SCHEMA_VERSION
        from .report_schema import table_types

        types = table_types()  # a column of nulls only must not be polars' Null type
        ops = pl.DataFrame(d["ops"], schema_overrides=_present(types["ops"], d["ops"])) if d.get("ops") else None
        if ops is not None:
            from .schema import KIND

            ops = ops.with_columns(pl.col("kind").cast(KIND))
        steps, ranking = d.get("steps") or [], d.get("ranking") or []
        return cls(
            trace=TraceInfo.from_dict(d["trace"]),
            chip=ChipInfo.from_dict(d["chip"]) if d["chip"] else None,
            coverage=CoverageInfo.from_dict(d["coverage"]), summary=Summary.from_dict(d["summary"]),
            steps=_table(steps, types["steps"]), ranking=_table(ranking, types["ranking"]),
            ops=ops, warnings=d.get("warnings", []),
            inconsistencies=[InconsistencyInfo.from_dict(i) for i in d.get("inconsistencies", [])],
            findings=[Finding.from_dict(f) for f in d.get("findings", [])],
            filters=Filters.from_dict(d["filters"]) if d.get("filters") else None,
            ranks=RanksInfo.from_dict(d["ranks"]) if d.get("ranks") is not None else None,
            speed_of_light=(SpeedOfLightInfo.from_dict(d["speed_of_light"])
                            if d.get("speed_of_light") is not None else None),
            created_at=d.get("created_at", ""), traceroof_version=d.get("traceroof_version", ""),
            schema_version=v,
        )

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Report:
        """Read a report saved by :meth:`save`.

        Raises:
            InputNotFoundError: no such file.
            ReportVersionError: not a traceroof report, or an unknown version.
        """
        p = Path(path)
        if not p.is_file():
            raise InputNotFoundError(f"{p}: no such file")
        try:
            d = json.loads(p.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:  # nested too deep
            raise ReportVersionError(f"{p}: not a traceroof report JSON ({type(exc).__name__}: {exc})") from exc
        if not isinstance(d, dict) or "schema_version" not in d:
            raise ReportVersionError(f"{p}: not a traceroof report (no schema_version)")
        if d["schema_version"] in READABLE_VERSIONS:
            from .report_schema import check_report

            check_report(d, str(p))  # a damaged or hand-edited report: one line, not a traceback
        return cls.from_dict(d, source=str(p))


def is_report(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` looks like a saved traceroof report (cheap sniff of its start)."""
    p = Path(path)
    if not p.is_file() or p.name.endswith(".gz"):
        return False
    with open(p, "rb") as fh:
        head = fh.read(256)
    return head.lstrip().startswith(b'{"schema_version"')


def _table(rows: list[dict[str, Any]], types: dict[str, Any]) -> pl.DataFrame:
    """A saved table (one object per row) with its declared column ``types``; no rows: every
    declared column, empty (as the analysis makes a table of no steps)."""
    if not rows:
        return pl.DataFrame(schema=types)
    return pl.DataFrame(rows, infer_schema_length=None, schema_overrides=_present(types, *rows))


def _present(types: dict[str, Any], *tables: dict[str, Any]) -> dict[str, Any]:
    """``types`` of the columns that one of ``tables`` (column dicts or rows) has; ``kind``
    left to its own cast (an ``Enum``)."""
    names = set().union(*tables) if tables else set()
    return {k: v for k, v in types.items() if k in names and k != "kind"}


def _records(df: pl.DataFrame) -> list[dict[str, Any]]:
    if df.height == 0:
        return []
    return df.with_columns(pl.col(pl.Enum, pl.Categorical).cast(pl.String)).to_dicts()


def _columns(df: pl.DataFrame) -> dict[str, list[Any]]:
    df = df.with_columns(pl.col(pl.Enum, pl.Categorical).cast(pl.String))
    return {c: df[c].to_list() for c in df.columns}


def _clean(x: Any) -> Any:
    if isinstance(x, float):
        return None if (math.isnan(x) or math.isinf(x)) else x
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x
