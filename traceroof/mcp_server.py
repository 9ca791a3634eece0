"""``traceroof mcp``: the library served over the Model Context Protocol (stdio).

An agent (Claude Desktop, Claude Code, any MCP client) starts ``traceroof mcp`` as a
subprocess and calls its tools; each returns versioned JSON (``docs/agents.md``):

==================  ==========================================================================
``analyze_trace``   the report of a trace or saved report (``docs/report-json.md``,
                    ``schema_version``), without the op table, ``top`` ranking rows
``diff_reports``    a minimal diff of two reports: headline numbers and per-label device
                    time (``diff_schema_version``; issue 16's full diff is not built)
``explain_finding`` one finding of a report with the ranking rows of the ops it names, its
                    detector's description and its doc page (``schema_version``)
``list_chips``      the chip database: dense peaks, HBM bandwidth, sources
                    (``chips_schema_version``)
``estimate_model``  first-principles numbers of a model on a chip (``estimate_schema_version``)
==================  ==========================================================================

The server writes nothing but the protocol on stdout; a bad input is a tool error carrying
the CLI's one line (``TraceroofError``), never a traceback. Reports are cached per (path,
chip, options, file modification time), four at most, so ``explain_finding`` after
``analyze_trace`` does not parse the trace again. Needs the ``mcp`` extra
(``pip install 'traceroof[mcp]'``: the official MCP Python SDK, 1.x ``FastMCP`` or 2.x
``MCPServer``).
"""

from __future__ import annotations

import json
import os
import stat
from collections import OrderedDict
from pathlib import Path
from typing import Any

from . import __version__
from .errors import TraceroofError, path_text

#: bump when a field of the diff changes meaning
DIFF_SCHEMA_VERSION = 1
#: bump when a field of list_chips' answer changes meaning
CHIPS_SCHEMA_VERSION = 1
#: reports kept in memory (most recently used)
CACHE_SIZE = 4
_CACHE: OrderedDict[tuple[Any, ...], Any] = OrderedDict()

INSTRUCTIONS = (
    "traceroof ranks the device ops of a profiler trace (torch.profiler/Kineto JSON, jax .xplane.pb, "
    "a traceroof cache or saved report) against the roofline of the chip they ran on. Start with "
    "analyze_trace; its findings say why time was lost and how much a fix gives back; explain_finding "
    "details one. All times are ns, rates FLOP/s and B/s, shares fractions of 1; null means unknown."
)


def _report(path: str, chip: str | None = None, *, rank: int | None = None, step: int | None = None,
            group_by: str | None = None) -> Any:
    """The report of ``path`` (cached). Raises TraceroofError for bad input."""
    from .analysis import load_report

    if not str(path).strip():
        from .errors import UsageError

        raise UsageError("path: a trace, cache or saved report file, found an empty string")
    p = Path(path).expanduser()
    try:
        st = p.stat()
    except OSError:
        st = None
    _refuse_stream(str(path), st)
    if st is None or stat.S_ISDIR(st.st_mode):
        _refuse_streams_inside(p)
    mtime = st.st_mtime_ns if st is not None else None
    key = (str(p.resolve()), chip, rank, step, group_by, mtime)
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    def trace_only(_saved: Any) -> None:  # as the CLI: these options need a trace, not a saved report
        if chip or rank is not None or step is not None or group_by:
            from .errors import UsageError

            raise UsageError(f"{path} is a saved report: chip, rank, step and group_by need a trace")

    report = load_report([path_text(p)], chip, rank=rank, step=step, group_by=group_by, jobs=1, on_saved=trace_only)
    _CACHE[key] = report
    while len(_CACHE) > CACHE_SIZE:
        _CACHE.popitem(last=False)
    return report


def _refuse_stream(path: str, st: os.stat_result | None) -> None:
    """Refuse ``-`` and a path that is a stream (FIFO, device, socket): the server's stdin is
    the MCP protocol stream, and reading a stream would block the server (or eat the protocol).

    Raises:
        UsageError: with the one line naming the path and what is expected.
    """
    from .errors import UsageError, file_kind

    if path == "-":
        raise UsageError("path '-': stdin is the MCP protocol stream here, not a trace; give a trace "
                         "file, folder, cache or saved report (a file named '-': './-')")
    if st is not None and not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
        raise UsageError(f"{path}: {file_kind(st.st_mode)}: the MCP server reads trace files, folders, caches or "
                         "saved reports, not streams (pipe a stream into `traceroof analyze -` instead)")


def _refuse_streams_inside(p: Path) -> None:
    """Refuse a folder or a glob that reaches a stream (a FIFO, device or socket, also behind
    a symlink): read as one of its ranks it would block the server as the path itself would.

    Raises:
        UsageError: naming the first such file (the expansion's order).
        InputNotFoundError: the folder holds no trace, the glob matches nothing
            (:func:`traceroof.io.resolve_inputs`).
    """
    from .io import resolve_inputs

    for f in resolve_inputs(str(p)):
        try:
            st = os.stat(f)
        except OSError:
            continue  # (gone since: the read says so)
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
            _refuse_stream(f, st)


def analyze_trace(path: str, chip: str | None = None, top: int = 20, rank: int | None = None,
                  step: int | None = None, group_by: str | None = None) -> dict[str, Any]:
    """Analyze a profiler trace (or a report saved with ``analyze -o report.json``).

    Args:
        path: a Kineto JSON (.json/.json.gz), .xplane.pb or jax profile directory, a folder or
            .tar.gz of per-rank traces, a traceroof cache, or a saved report; not ``-`` nor a
            FIFO or device (stdin is the protocol stream): a ``UsageError`` says so.
        chip: chip name or alias (``list_chips``); default: detected from the trace.
        top: ranking rows returned (ops by time lost against the roofline, largest first).
        rank, step: only this rank / step (``ProfilerStep#N``).
        group_by: ``op`` (framework op) or ``kernel`` (kernel / HLO instruction name).

    Returns:
        The report JSON (``docs/report-json.md``, ``schema_version``) without the op table.
    """
    return _report(path, chip, rank=rank, step=step, group_by=group_by).to_dict(top=top)


def _headline(r: Any) -> dict[str, Any]:
    s = r.summary
    return {
        "chip": r.chip.name if r.chip else None,
        "device_ops": r.trace.device_ops, "device_time_ns": r.trace.device_time_ns,
        "step_time_ns": s.step.step_time_ns if s.step else None,
        "busy_fraction": s.step.busy_fraction if s.step else None,
        "hfu": s.hfu.value if s.hfu else None,
        "mfu": s.mfu.value if s.mfu else None,
        "roofline_efficiency": s.roofline.efficiency if s.roofline else None,
        "costed_share": r.coverage.costed_share,
        "findings": len(r.findings),
        "recoverable_ns": sum(f.recoverable_ns for f in r.findings),
    }


def _delta(a: Any, b: Any) -> Any:
    return b - a if isinstance(a, (int, float)) and isinstance(b, (int, float)) else None


def diff_reports(baseline: str, candidate: str, chip: str | None = None, top: int = 20) -> dict[str, Any]:
    """Compare two traces or saved reports: a minimal diff (issue 16's full diff is not built).

    Args:
        baseline, candidate: traces or saved reports (as ``analyze_trace``'s ``path``).
        chip: for both traces (default: detected from each).
        top: per-label rows returned, largest absolute change first.

    Returns:
        ``diff_schema_version``; ``headline``: for each headline number (``step_time_ns``,
        ``hfu``, ``roofline_efficiency``, ...) the baseline, candidate and candidate − baseline
        (null where either is unknown); ``labels``: per ranking label (framework op or kernel)
        its total device time (ns, all its ops) in each and the change; ``labels_only_in``:
        counts of labels found in one report only. A label present in one report only has
        null on the other side, never 0.
    """
    a, b = _report(baseline, chip), _report(candidate, chip)
    ha, hb = _headline(a), _headline(b)
    time_a = {r["label"]: r["total_ns"] for r in a.ranking.select("label", "total_ns").to_dicts()}
    time_b = {r["label"]: r["total_ns"] for r in b.ranking.select("label", "total_ns").to_dicts()}
    rows = [{"label": k, "baseline_ns": time_a.get(k), "candidate_ns": time_b.get(k),
             "delta_ns": _delta(time_a.get(k, 0), time_b.get(k, 0))} for k in set(time_a) | set(time_b)]
    rows.sort(key=lambda r: (-abs(r["delta_ns"] or 0), r["label"]))
    return {
        "diff_schema_version": DIFF_SCHEMA_VERSION, "traceroof_version": __version__,
        "kind": "headline numbers and per-label device time (a minimal diff: no op matching, no attribution)",
        "baseline": baseline, "candidate": candidate,
        "headline": {k: {"baseline": ha[k], "candidate": hb[k], "delta": _delta(ha[k], hb[k])} for k in ha},
        "labels": rows[:top], "labels_total": len(rows),
        "labels_only_in": {"baseline": len(set(time_a) - set(time_b)), "candidate": len(set(time_b) - set(time_a))},
    }


def _doc_page(kind: str) -> tuple[str, str | None]:
    """(path, text) of a detector's doc page; text None when the docs are not beside the package."""
    rel = f"docs/findings/{kind}.md"
    p = Path(__file__).resolve().parent.parent / rel
    return rel, (p.read_text() if p.is_file() else None)


def explain_finding(path: str, finding: int = 1, chip: str | None = None) -> dict[str, Any]:
    """Explain one finding of a trace's report.

    Args:
        path: the trace or saved report (as ``analyze_trace``'s ``path``).
        finding: its number in the report (1 = the largest recoverable time).
        chip: as ``analyze_trace``.

    Returns:
        ``schema_version``; ``finding`` (the report's finding JSON: title, severity,
        recoverable_ns, explanation, evidence, where); ``ops``: the ranking rows of the ops it
        names (labels not in the ranking are listed in ``ops_not_ranked``); ``detector``: the
        detector's description; ``doc_page`` and ``doc`` (its page's text, null when the
        docs are not installed beside the package).

    Raises:
        ValueError: no such finding (the message gives the count).
    """
    from .findings import DETECTORS

    r = _report(path, chip)
    if not 1 <= finding <= len(r.findings):
        raise ValueError(f"{path}: finding {finding} does not exist; the report has {len(r.findings)} "
                         f"finding{'s' if len(r.findings) != 1 else ''} (numbered from 1)")
    f = r.findings[finding - 1]
    rows = [x for x in r.to_dict()["ranking"] if x["label"] in set(f.ops)]
    page, text = _doc_page(f.kind)
    fn = DETECTORS.get(f.kind)
    return {
        "schema_version": r.schema_version, "traceroof_version": __version__, "number": finding,
        "of": len(r.findings), "finding": f.to_dict(), "ops": rows,
        "ops_not_ranked": [x for x in f.ops if x not in {row["label"] for row in rows}],
        "detector": (fn.__doc__ or "").strip() if fn else None, "doc_page": page, "doc": text,
    }


def list_chips() -> dict[str, Any]:
    """The chip database: for each chip its key, aliases, dense peak FLOP/s per dtype, HBM
    bytes and bandwidth (B/s), interconnects and the source of every number."""
    from .chips import list_chips as chips
    from .render.chips import render_chips

    return {"chips_schema_version": CHIPS_SCHEMA_VERSION, "traceroof_version": __version__,
            "chips": json.loads(render_chips(chips(), "json"))}


def estimate_model(config: str, chip: str, seq_len: int = 4096, batch: int = 1, dtype: str = "bf16",
                   kv_dtype: str | None = None) -> dict[str, Any]:
    """First-principles numbers of a model on a chip: parameters, FLOPs per token, KV cache,
    decode floor, ridge point, crossover context length (``traceroof estimate``).

    Args:
        config: a Hugging Face-style ``config.json``.
        chip: chip name or alias (``list_chips``).
        seq_len: sequence length (tokens); batch: sequences per batch.
        dtype: weight/compute dtype; kv_dtype: KV-cache dtype (default: ``dtype``).

    Returns:
        The estimate JSON (``estimate_schema_version``).
    """
    from .estimate import estimate
    from .model import load_model_config
    from .render.estimate import render_estimate

    est = estimate(load_model_config(config), chip, seq_len=seq_len, batch=batch, dtype=dtype, kv_dtype=kv_dtype)
    return json.loads(render_estimate(est, "json"))


TOOLS = (analyze_trace, diff_reports, explain_finding, list_chips, estimate_model)


def _tool(fn: Any, tool_error: type[Exception]) -> Any:
    """``fn`` with a bad input (TraceroofError, ValueError) raised as the SDK's ``ToolError``
    carrying its one line (the line the CLI prints): the client gets an ``is_error`` result
    with it. Anything else is a bug, which the SDK answers without its text."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (TraceroofError, ValueError) as exc:
            raise tool_error(f"traceroof: error: {exc}") from exc

    return wrapper


def build_server() -> Any:
    """The MCP server with :data:`TOOLS` registered (SDK 2.x ``MCPServer``, else 1.x ``FastMCP``).

    Raises:
        ImportError: the ``mcp`` package is not installed.
    """
    try:
        from mcp.server.mcpserver import MCPServer as Server
        from mcp.server.mcpserver.exceptions import ToolError
    except ImportError:  # SDK 1.x
        from mcp.server.fastmcp import FastMCP as Server
        from mcp.server.fastmcp.exceptions import ToolError
    server = Server("traceroof", instructions=INSTRUCTIONS)
    for fn in TOOLS:
        server.tool(name=fn.__name__, description=(fn.__doc__ or "").strip())(_tool(fn, ToolError))
    return server


def serve() -> None:
    """Serve :func:`build_server` over stdio until the client closes it."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    build_server().run("stdio")
