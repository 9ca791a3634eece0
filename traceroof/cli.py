"""The ``traceroof`` command line: a thin click layer over the library.

Exit codes (DESIGN §9; also in ``docs/cli.md``):

====  =====================================================
0     ok
1     gate failed
2     usage error (bad option value or combination)
3     input not found
4     invalid or unsupported trace / report; inputs of different formats or devices (never merged)
5     unknown or ambiguous chip
6-8   capture: no server / empty capture / timeout
9     an output (-o) that cannot be written (missing folder, no permission, in the way)
10-13 capture: not a profiler server / profiler busy / target exited / xprof missing
70    internal error (a bug: please report it, with --debug output)
====  =====================================================

Errors reach the user as one line on stderr (``traceroof: error: …``), never a traceback,
unless ``--debug`` is given. A closed pipe on stdout or stderr (``… | head``) is no error:
the output is dropped and the command exits with its own status (``cli_common.echo``).
"""

from __future__ import annotations

if __name__ == "__main__":
    # `python -m traceroof.cli`: run the module as imported (on its group cli_live registers),
    # without executing this body a second time as __main__ (~3 ms of click decorators)
    from traceroof.cli_entry import entry as _entry

    _entry()

import functools
import gc
import os
import sys
import time
from pathlib import Path
from typing import Any

import click

from . import __version__, cli_diff
from .cli_common import (  # noqa: F401  (re-exported: cli_live and tests reach them here)
    EXIT_INTERNAL,
    _handle_errors,
    _progress,
    _progress_bar,
    _reader_gone,
    _stage,
    _State,
    chip_option,
    debug_option,
    early_workers,
    echo,
    jobs_option,
    logger,
    model_options,
    quiet_option,
    resolve_model_flops,
)
from .cli_estimate import estimate_options


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="traceroof")
def cli() -> None:
    """Rank the ops of a profiler trace against the roofline of the chip they ran on.

    \b
    Example:
      traceroof analyze trace.json.gz --chip h100
      traceroof chips
    """


def _analyzing(trace: Any) -> Any:
    """Progress for the analysis of ``trace`` (:func:`_stage`)."""
    n = f"{trace.ops.height:,} device ops"
    return _stage(f"analyzing {n}", f"analyzed {n}")


class _RendererChoice(click.Choice):
    """``--format``'s choices: the names in :data:`traceroof.render.RENDERERS`, looked up when
    click first needs them (parsing the option, ``--help``). So a new renderer is one module
    plus its registry entry, and the command line starts without importing the renderers."""

    def __init__(self) -> None:
        super().__init__((), case_sensitive=True)

    @property  # type: ignore[override]
    def choices(self) -> tuple[str, ...]:
        from .render import RENDERERS

        return tuple(RENDERERS)

    @choices.setter
    def choices(self, value: Any) -> None:  # click.Choice.__init__ assigns it
        pass


@cli.command()
@click.argument("traces", metavar="TRACE...", nargs=-1, required=True, type=click.Path(path_type=str))
@chip_option
@click.option("--format", "fmt", type=_RendererChoice(),
              help="Output format (default: from -o's suffix, else table).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=str),
              help="Write to FILE. A .json FILE gets the full report (with the op table) for gate/serve.")
@click.option("--top", type=click.IntRange(min=1), default=20, show_default=True, help="Rows of the ranking to show.")
@click.option("--rank", type=int, help="Only this rank.")
@click.option("--step", type=int, help="Only this step (ProfilerStep#N).")
@click.option("--group-by", type=click.Choice(["op", "kernel"]),
              help="Rank by framework op (falling back to kernel name) or by kernel name. "
              "Default: op for Kineto, kernel (HLO instruction) for XPlane.")
@click.option("--findings", "findings_opt", metavar="NAME,...",
              help="Only these detectors (comma-separated; default: all).")
@click.option("--capture-trace", "capture_traces", metavar="PATH", multiple=True, type=click.Path(path_type=str),
              help="A CUDA-graph capture trace (file or folder; repeatable) to attribute graph replays from. "
              "Default: the capture_traces/ or graph_capture_profile/ folder beside TRACE (none beside - : give it); "
              "'none': no capture trace.")
@click.option("--perfetto", "perfetto_out", metavar="OUT.json.gz", type=click.Path(dir_okay=False, path_type=str),
              help="Also write the device ops (with their roofline), findings and steps as a Perfetto/Chrome "
              "trace (gzip when it ends in .gz); see docs/sharing.md.")
@model_options
@jobs_option
@quiet_option
@debug_option
@_handle_errors
def analyze(traces: tuple[str, ...], chip: str | None, fmt: str | None, output: str | None, top: int,
            rank: int | None, step: int | None, group_by: str | None, findings_opt: str | None,
            capture_traces: tuple[str, ...],
            model_path: str | None, tokens_per_step: float | None, seq_len: int | None, mode: str,
            model_flops_per_step: float | None, devices: int | None, jobs: int | None,
            perfetto_out: str | None = None) -> None:
    """Rank the ops of TRACE by the time they lost against the roofline.

    TRACE is a Kineto JSON (.json, .json.gz), a .tar.gz or directory of per-rank traces,
    an XSpace (.xplane.pb) or jax profile directory, a cache or dataset written by
    `traceroof ingest`, a report saved with -o report.json, or - (a trace piped into stdin,
    e.g. `ssh host cat t.json.gz | traceroof analyze -`). Several TRACEs, or a quoted
    glob ('run/rank-*.json.gz'), are read as the ranks of one job, in --jobs processes.
    Progress goes to stderr when reading takes over a second (-q: none).

    \b
    Examples:
      traceroof analyze trace.json.gz --chip h100
      traceroof analyze trace.json.gz --format markdown --top 10
      traceroof analyze run/ --rank 0 --step 12 -o report.json
      traceroof analyze 'run/rank-*.json.gz' --jobs 8
      traceroof analyze trace.json.gz --model config.json --tokens-per-step 16384
      traceroof analyze decode.json.gz --capture-trace run/capture_traces/
      traceroof analyze trace.json.gz -o report.html --perfetto trace.roofline.json.gz
    """
    from .parsers.piped import check_read_once

    check_read_once(("TRACE", traces), ("--capture-trace", capture_traces))
    with early_workers(traces, jobs):  # before the imports below: the workers' start overlaps them
        from .analysis import load_report
        from .outputs import check_output_file
        from .render import SUFFIXES, render

        if output:
            check_output_file(output)
        if perfetto_out:
            from . import cli_perfetto

            cli_perfetto.check_path(perfetto_out)
        mflops, formula = resolve_model_flops(model_path, tokens_per_step, seq_len, mode, model_flops_per_step)
        names = [n.strip() for n in findings_opt.split(",") if n.strip()] if findings_opt else None

        captures = None if not capture_traces else [] if list(capture_traces) == ["none"] else list(capture_traces)

        def trace_only(_report: Any) -> None:
            if chip or rank is not None or step is not None or mflops or names or capture_traces:
                raise click.UsageError("--chip/--rank/--step/--model/--findings/--capture-trace need a trace, "
                                       "not a saved report")

        report = load_report(list(traces), chip, jobs=jobs, progress=_progress_bar(), on_saved=trace_only,
                             analyzing=_analyzing, rank=rank, step=step, group_by=group_by,
                             model_flops_per_step=mflops, model_flops_formula=formula, n_devices=devices,
                             findings=names, capture_traces=captures)
        if perfetto_out:
            from . import cli_perfetto

            cli_perfetto.write(report, perfetto_out, _progress)
        if fmt is None:
            fmt = SUFFIXES.get(Path(output).suffix.lower(), "table") if output else "table"
        if output and fmt == "json":
            report.save(output)
            _progress(f"report written to {output}")
            return
        text = render(report, fmt, top=top)
        if mflops and fmt in ("table", "markdown"):
            from .cli_estimate import with_model_floor

            text = with_model_floor(text, report, model_path, mode, tokens_per_step, fmt)
        if output:
            Path(output).write_text(text)
            _progress(f"{fmt} written to {output}")
        else:
            echo(text, nl=not text.endswith("\n"))


@cli.command()
@click.argument("traces", metavar="TRACE...", nargs=-1, required=True, type=click.Path(path_type=str))
@click.option("-o", "--output", "out_dir", required=True, type=click.Path(file_okay=False, path_type=str),
              help="Cache directory to write (new, empty, or an earlier cache, which is replaced).")
@jobs_option
@quiet_option
@debug_option
@_handle_errors
def ingest(traces: tuple[str, ...], out_dir: str, jobs: int | None) -> None:
    """Parse TRACE once and write a columnar cache that analyze, gate and serve read directly.

    One trace (a file, .tar.gz or jax profile directory) becomes a single cache: the op and
    host tables in Parquet, partitioned by rank (DIR/ops/rank=N/part.parquet), the metadata
    in DIR/meta.json. Several per-rank files (several TRACEs, a directory of them, or a
    quoted glob) become a dataset: --jobs processes each write one file's partitions
    (DIR/ops/rank=N/part-<file>.parquet) and metadata (DIR/meta/<file>.json), then
    DIR/meta.json lists them. See docs/cache.md and docs/distributed.md.

    \b
    Examples:
      traceroof ingest trace.json.gz -o trace.cache
      traceroof ingest 'run/rank-*.json.gz' -o run.cache --jobs 16
      traceroof analyze trace.cache --chip h100
    """
    from . import units
    from .cache import describe
    from .parsers.piped import check_read_once

    check_read_once(("TRACE", traces))
    from .ingest import ingest_files, write_cache
    from .io import read_trace, resolve_inputs
    from .outputs import check_output_dir

    check_output_dir(out_dir)
    t0 = time.perf_counter()
    inputs = resolve_inputs(list(traces))
    if len(inputs) == 1:
        trace = read_trace(inputs[0], jobs=jobs, progress=_progress_bar())
        out = write_cache(trace, out_dir, source_paths=list(traces))
    else:
        out = ingest_files(inputs, out_dir, jobs=jobs, progress=_progress_bar(), source_paths=list(traces))
    d = describe(out)
    files = d["files"]
    size = sum((out / f).stat().st_size for f in files)
    echo(f"wrote {out} ({d['layout']}): {units.plural(d['rows']['ops'], 'op')}, "
               f"{units.plural(d['rows']['host'], 'host event')}, {units.plural(len(d['ranks']) or 1, 'rank')}, "
               f"{units.plural(len(files), 'file')}, {size / 1e6:.2f} MB "
               f"in {time.perf_counter() - t0:.1f} s")
    shown = 20
    for f in files[:shown]:
        echo(f"  {f}")
    if len(files) > shown:
        echo(f"  ... and {len(files) - shown} more")


@cli.command()
@click.option("--format", "fmt", type=click.Choice(["table", "json", "markdown"]), default="table", show_default=True)
@debug_option
@_handle_errors
def chips(fmt: str) -> None:
    """List the chip database: dense peaks, HBM bandwidth, ridge points, sources.

    \b
    Example:
      traceroof chips
      traceroof chips --format json
    """
    from .chips import list_chips
    from .render.chips import render_chips

    echo(render_chips(list_chips(), fmt))


@cli.command()
@estimate_options
@quiet_option
@debug_option
@_handle_errors
def estimate(model_path: str, chip: str | None, fmt: str, plot: str | None, kv_budget_gb: float | None,
             tpot_ms: float | None, price: float | None, **opts: Any) -> None:
    """First-principles numbers for a model on a chip, before any trace: parameters, FLOPs
    per token, KV cache, decode floor, ridge point; training totals, memory, parallel
    layouts and serving when asked.

    \b
    Examples:
      traceroof estimate --model config.json --chip h100 --seq 4096 --batch 8
      traceroof estimate --model 70b.json --chip tpu-v5p --tokens 15e12 --chips 8960 --mfu 0.4
      traceroof estimate --model 70b.json --chip h100 --tp 8 --pp 4 --fsdp 32 --global-batch-tokens 4e6
      traceroof estimate --model 7b.json --chip h100 --serve --tpot-ms 20 --price-per-chip-hour 2.5
    """
    from .estimate_plan import plan_estimate
    from .model import load_model_config
    from .render.estimate import render_estimate

    if not chip:
        raise click.UsageError("estimate needs --chip NAME (see `traceroof chips`)")
    if plot:
        from .errors import OutputError
        from .outputs import check_output_file

        try:
            check_output_file(plot)
        except OutputError as e:
            raise OutputError(str(e).replace("-o ", "--plot ", 1)) from None
    layout = {k: opts.pop(k) for k in ("tp", "pp", "dp", "fsdp", "ep", "cp", "micro_batch")}
    plan = plan_estimate(
        load_model_config(model_path), chip, layout=layout, price_per_chip_hour_usd=price,
        kv_budget_bytes=None if kv_budget_gb is None else kv_budget_gb * 1e9,
        tpot_target_s=None if tpot_ms is None else tpot_ms / 1e3, serve=opts.pop("serve") or bool(plot),
        **opts)
    if plot:
        from .render.estimate_plot import write_sweep_html

        write_sweep_html(plan, plot)
        _progress(f"latency-throughput chart written to {plot}")
    echo(render_estimate(plan, fmt), nl=False)


@cli.command()
@click.argument("trace", type=click.Path(path_type=str))
@chip_option
@click.option("--min-mfu", type=click.FloatRange(0, 1), help="Fail below this MFU (fraction, 0.40 = 40 %).")
@click.option("--min-hfu", type=click.FloatRange(0, 1), help="Fail below this HFU (fraction).")
@click.option("--min-efficiency", type=click.FloatRange(0, 1), help="Fail below this roofline efficiency (fraction).")
@click.option("--baseline", type=click.Path(dir_okay=False, path_type=str), help="Baseline report (or trace) to compare with.")
@click.option("--max-drop", type=click.FloatRange(0, 1), help="Largest allowed drop of MFU/HFU/efficiency vs the baseline (fraction: 0.02 = 2 points).")
@click.option("--max-step-time-increase", type=click.FloatRange(0), help="Largest allowed relative step-time increase vs the baseline (0.05 = 5 %).")
@click.option("--format", "fmt", type=click.Choice(["markdown", "json"]), default="markdown", show_default=True)
@model_options
@jobs_option
@quiet_option
@debug_option
@_handle_errors
def gate(trace: str, chip: str | None, min_mfu: float | None, min_hfu: float | None, min_efficiency: float | None,
         baseline: str | None, max_drop: float | None, max_step_time_increase: float | None, fmt: str,
         model_path: str | None, tokens_per_step: float | None, seq_len: int | None, mode: str,
         model_flops_per_step: float | None, devices: int | None, jobs: int | None) -> None:
    """CI check: exit 1 when MFU, HFU, roofline efficiency or step time regresses.

    TRACE and --baseline are traces or reports saved with `analyze -o report.json`.
    Prints a markdown summary (appended to $GITHUB_STEP_SUMMARY when set), or JSON.

    \b
    Examples:
      traceroof gate trace.json.gz --min-hfu 0.40
      traceroof gate new.json --baseline main.json --max-drop 0.02 --max-step-time-increase 0.05
    """
    from .analysis import load_report
    from .gate import check, write_step_summary
    from .outputs import check_output_file
    from .parsers.piped import check_read_once

    check_read_once(("TRACE", trace), ("--baseline", baseline))

    if os.environ.get("GITHUB_STEP_SUMMARY"):  # appended to at the end: checked before any parsing (exit 9)
        check_output_file(os.environ["GITHUB_STEP_SUMMARY"], "$GITHUB_STEP_SUMMARY")
    mflops, formula = resolve_model_flops(model_path, tokens_per_step, seq_len, mode, model_flops_per_step)

    def _load(path: str) -> Any:
        return load_report(path, chip, jobs=jobs, progress=_progress_bar(), analyzing=_analyzing,
                           model_flops_per_step=mflops, model_flops_formula=formula, n_devices=devices)

    cand = _load(trace)
    base = _load(baseline) if baseline else None
    res = check(cand, min_mfu=min_mfu, min_hfu=min_hfu, min_efficiency=min_efficiency, baseline=base,
                max_drop=max_drop, max_step_time_increase=max_step_time_increase,
                candidate_name=trace, baseline_name=baseline)
    md = res.to_markdown()
    where = write_step_summary(md)
    echo(res.to_json() if fmt == "json" else md)
    if where:
        _progress(f"summary appended to {where}")
    if not res.passed:
        echo("traceroof: gate failed", err=True)
        sys.exit(1)


@cli.command(help=cli_diff.HELP)
@click.argument("a", type=click.Path(path_type=str))
@click.argument("b", type=click.Path(path_type=str))
@chip_option
@cli_diff.options
@jobs_option
@quiet_option
@debug_option
@_handle_errors
def diff(a: str, b: str, chip: str | None, jobs: int | None, **opts: Any) -> None:
    from .analysis import load_report
    from .parsers.piped import check_read_once

    check_read_once(("A", a), ("B", b))
    load = functools.partial(load_report, jobs=jobs, progress=_progress_bar(), analyzing=_analyzing)
    sys.exit(cli_diff.run(a, b, load, chip, echo=echo, **opts))


@cli.command()
@click.argument("trace", type=click.Path(path_type=str), required=False)
@chip_option
@click.option("--live", "live_address", metavar="HOST:PORT",
              help="Instead of TRACE: capture the jax program at HOST:PORT again and again and "
              "refresh the dashboard (docs/capture.md).")
@click.option("--watch", "watch_dir", metavar="DIR", type=click.Path(path_type=str),
              help="Instead of TRACE: show each trace that lands in DIR (docs/watch.md).")
@click.option("--every", "every_s", type=click.FloatRange(min=0), default=5.0, show_default=True,
              help="With --live: seconds between captures; with --watch: between looks at DIR.")
@click.option("--duration", "duration_s", type=click.FloatRange(min=0, min_open=True), default=2.0,
              show_default=True, help="With --live: capture window, seconds.")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. Anything but loopback exposes the trace to the network.")
@click.option("--port", type=click.IntRange(0, 65535), default=8050, show_default=True, help="Port (0: any free port).")
@click.option("--open", "open_browser", is_flag=True, help="Open the dashboard in the default browser.")
@click.option("--compare", "compare_with", metavar="B", help="Show the diff view TRACE → B instead (docs/diff.md).")
@jobs_option
@quiet_option
@debug_option
@_handle_errors
def serve(trace: str | None, chip: str | None, live_address: str | None, watch_dir: str | None,
          every_s: float, duration_s: float, host: str, port: int, open_browser: bool, compare_with: str | None,
          jobs: int | None) -> None:
    """Open the roofline dashboard of TRACE (or of a report saved with -o report.json), or,
    with --live HOST:PORT, the live dashboard of a running jax program; with --compare B, the
    diff view TRACE → B.

    Tabs: roofline, ranked ops, timeline, steps, findings. A trace that cannot be read
    still starts the server, which shows the error line this command prints. Needs the
    web extra: pip install 'traceroof[web]'.

    \b
    Examples:
      traceroof serve trace.json.gz
      traceroof serve report.json --port 8080 --open
      traceroof serve trace.json.gz --chip a100 --host 0.0.0.0
      traceroof serve --live localhost:9999 --every 5 --chip h100
      traceroof serve --watch ./log --chip h100
      traceroof serve before.json.gz --compare after.json.gz
    """
    if sum(x is not None for x in (trace, live_address, watch_dir)) != 1:
        raise click.UsageError("give one of TRACE, --live HOST:PORT, --watch DIR")
    if compare_with is not None and trace is None:
        raise click.UsageError("--compare B needs a TRACE to compare it with")
    from .parsers.piped import check_read_once

    check_read_once(("TRACE", trace), ("--compare", compare_with))
    try:
        from .web import app as web
    except ImportError as exc:
        from .errors import UsageError

        raise UsageError(f"serve needs the web extra ({exc.name} is missing): pip install 'traceroof[web]'") from exc

    if live_address is not None or watch_dir is not None:
        return cli_live.serve_live(live_address, watch_dir, chip, every_s, duration_s, host, port,
                                   open_browser)
    _progress(f"loading {trace}")
    from .analysis import load_report

    loader = functools.partial(load_report, jobs=jobs, progress=_progress_bar())
    if compare_with:  # the diff view: both inputs must load (errors exit as for `diff`)
        app = cli_diff.compare_app(trace, compare_with, loader, chip)
        return web.run(app, host, port, open_browser=open_browser, echo=echo, warn=_progress)
    dash_app, error = web.load_app(trace, chip, loader, reraise=_State.debug)
    if error:
        echo(error, err=True)
    web.run(dash_app, host, port, open_browser=open_browser, echo=echo, warn=_progress)


@cli.command()
@debug_option
@_handle_errors
def mcp() -> None:
    """Serve traceroof to agents over the Model Context Protocol (stdio).

    Tools: analyze_trace, diff_reports, explain_finding, list_chips, estimate_model; each
    returns versioned JSON. Started by an MCP client, not by hand (see docs/agents.md).
    Needs the mcp extra: pip install 'traceroof[mcp]'.

    \b
    Example (Claude Code):
      claude mcp add traceroof -- traceroof mcp
    """
    try:
        from .mcp_server import serve
    except ImportError as exc:  # pragma: no cover - the module itself imports only traceroof
        raise click.UsageError(str(exc)) from exc
    try:
        import mcp as _sdk  # noqa: F401
    except ImportError as exc:
        from .errors import UsageError

        raise UsageError(f"mcp needs the mcp extra ({exc.name} is missing): pip install 'traceroof[mcp]'") from exc
    serve()


from . import cli_live  # noqa: E402  (the live commands: capture, watch)

# jemalloc (polars' allocator) settings for the command line and its worker processes
# (traceroof._allocator sets them on import; a user's own _RJEM_MALLOC_CONF wins)
from ._allocator import JEMALLOC_CONF  # noqa: E402

cli_live.register(cli)


#: commands that end by themselves: Python's cyclic garbage collector runs rarely while they
#: run (:func:`main`); serve, watch, mcp and capture wait on the outside world and keep it
ONE_SHOT_COMMANDS = frozenset({"analyze", "chips", "diff", "estimate", "gate", "ingest"})


#: the collector's thresholds while a one-shot command runs (:func:`main`): a generation-0
#: collection every 100,000 container allocations instead of 700
ONE_SHOT_GC_THRESHOLDS = (100_000, 50, 100)


def _one_shot(argv: list[str] | None) -> bool:
    """Whether the command line names a :data:`ONE_SHOT_COMMANDS` command (the group's own
    options are all flags, so the command is the first argument not starting with ``-``)."""
    args = sys.argv[1:] if argv is None else argv
    return next((a for a in args if not a.startswith("-")), None) in ONE_SHOT_COMMANDS


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point.

    A one-shot command (:data:`ONE_SHOT_COMMANDS`) runs with the cyclic garbage collector's
    first threshold at :data:`ONE_SHOT_GC_THRESHOLDS` (700 by default; put back when it
    returns or raises): its imports and the Python objects of a read create hundreds of
    thousands of container objects that the collector would scan again and again and free
    almost none of (reference counting frees everything but cycles). Not off: a cycle that
    holds a file's bytes (as an XPlane read's planes and line feed did, ~9 MB per 3 MB file)
    is still freed. Measured (CPU, bert, 5 runs each, load 0.3; docs/performance.md, "Small
    traces (session 9)"): median 0.700 s at the default thresholds, 0.649 s with these,
    0.655 s with the collector off."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if "polars" not in sys.modules:  # read when polars loads; workers inherit it
        os.environ.setdefault("_RJEM_MALLOC_CONF", JEMALLOC_CONF)
    before = gc.get_threshold() if _one_shot(argv) else None
    if before is not None:
        gc.set_threshold(*ONE_SHOT_GC_THRESHOLDS)
    try:
        _run(argv)
    finally:
        if before is not None:
            gc.set_threshold(*before)


def _run(argv: list[str] | None) -> None:
    """:func:`main`'s call of the click group, click's own exits turned into exit codes."""
    try:
        cli.main(args=argv, prog_name="traceroof", standalone_mode=False)
    except click.exceptions.NoSuchOption as exc:
        exc.show()
        sys.exit(2)
    except click.UsageError as exc:
        exc.show()
        sys.exit(2)
    except click.exceptions.Abort:
        echo("traceroof: aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except SystemExit as exc:
        # click ends a write to a closed pipe outside the commands (--help, --version) with
        # exit 1, having wrapped stdout in its PacifyFlushWrapper: that is a normal end too (0)
        if exc.code == 1 and type(sys.stdout).__name__.endswith("PacifyFlushWrapper"):
            _reader_gone(False)
            sys.exit(0)
        raise

