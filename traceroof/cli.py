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
70    internal error (a bug: please report it, with --debug output)
====  =====================================================

Errors reach the user as one line on stderr (``traceroof: error: …``), never a traceback,
unless ``--debug`` is given.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click

from . import __version__, cli_diff
from .errors import TraceroofError

logger = logging.getLogger("traceroof")

EXIT_INTERNAL = 70


class _State:
    """Process-wide CLI flags set by the eager --debug / --quiet options."""

    debug = False
    quiet = False


def _progress(msg: str) -> None:
    if not _State.quiet:
        click.echo(f"traceroof: {msg}", err=True)


@contextlib.contextmanager
def _stage(doing: str, done: str, *, clock: Callable[[], float] = time.perf_counter,
           timer: Callable[..., Any] = threading.Timer) -> Iterator[None]:
    """Progress for a step with no counts (the analysis): ``doing …`` once it has taken a
    second, and ``done in X s`` at the end if it took more than a second; nothing with -q.
    ``clock`` (seconds) and ``timer`` (``threading.Timer``'s signature) are injectable for tests."""
    if _State.quiet:
        yield
        return
    t0 = clock()
    t = timer(1.0, lambda: _progress(f"{doing} …"))
    t.daemon = True
    t.start()
    try:
        yield
    finally:
        t.cancel()
    dt = clock() - t0
    if dt > 1.0:
        _progress(f"{done} in {dt:.1f} s")


def _progress_bar() -> Any:
    """A :class:`~traceroof.progress.Progress` on stderr, or None with -q."""
    if _State.quiet:
        return None
    from .progress import Progress

    return Progress(sys.stderr)


def jobs_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--jobs", type=click.IntRange(min=1),
        help="Processes reading multi-file traces (directories, globs, several files). "
        "Default: the core count.",
    )(fn)


def _handle_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run a command; turn TraceroofError into one line + its exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except TraceroofError as exc:
            if _State.debug:
                raise
            click.echo(f"traceroof: error: {exc}", err=True)
            sys.exit(exc.exit_code)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise
        except KeyboardInterrupt:
            click.echo("traceroof: interrupted", err=True)
            sys.exit(130)
        except BrokenPipeError:
            # the reader went away (`traceroof analyze … | head`): a normal end, not a bug.
            # stdout is pointed at devnull so that the interpreter's final flush stays quiet.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(0)
        except Exception as exc:  # noqa: BLE001 - the last line of defence for users
            if _State.debug:
                raise
            click.echo(
                f"traceroof: internal error: {type(exc).__name__}: {exc} "
                "(this is a bug; re-run with --debug and report it)",
                err=True,
            )
            sys.exit(EXIT_INTERNAL)

    return wrapper


def debug_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    def cb(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
        if value:
            _State.debug = True
            logging.basicConfig(level=logging.DEBUG)
        return value

    return click.option("--debug", is_flag=True, expose_value=False, callback=cb, is_eager=True,
                        help="Show tracebacks and debug logs.")(fn)


def quiet_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    def cb(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
        _State.quiet = bool(value)
        return value

    return click.option("-q", "--quiet", is_flag=True, expose_value=False, callback=cb,
                        help="No progress messages on stderr.")(fn)


def chip_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--chip", metavar="NAME|FILE.toml",
        help="Chip name or alias (see `traceroof chips`), or a path to a chip TOML. "
        "Default: detected from the trace.",
    )(fn)


def model_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--model/--tokens-per-step/--mode/--model-flops-per-step/--devices, shared by analyze and gate."""
    opts = [
        click.option("--model", "model_path", type=click.Path(dir_okay=False, path_type=str),
                     help="Hugging Face-style config.json of the model, for MFU."),
        click.option("--tokens-per-step", type=click.FloatRange(min=0, min_open=True),
                     help="Tokens processed per step by the whole job (with --model)."),
        click.option("--seq-len", type=click.IntRange(min=1), help="Sequence length for the attention term (with --model)."),
        click.option("--mode", type=click.Choice(["train", "infer"]), default="train", show_default=True,
                     help="6N (train) or 2N (infer) FLOPs per token, plus attention."),
        click.option("--model-flops-per-step", type=click.FloatRange(min=0, min_open=True),
                     help="Model FLOPs per step of the whole job, instead of --model."),
        click.option("--devices", type=click.IntRange(min=1),
                     help="Devices the job ran on, for MFU (default: world size from the trace)."),
    ]
    for o in reversed(opts):
        fn = o(fn)
    return fn


def resolve_model_flops(model_path: str | None, tokens_per_step: float | None, seq_len: int | None,
                        mode: str, model_flops_per_step: float | None) -> tuple[float | None, str | None]:
    """The model FLOPs per step and how they were obtained (or (None, None))."""
    if model_path and model_flops_per_step:
        raise click.UsageError("give --model or --model-flops-per-step, not both")
    if model_flops_per_step:
        return model_flops_per_step, "--model-flops-per-step"
    if not model_path:
        if tokens_per_step:
            raise click.UsageError("--tokens-per-step needs --model")
        return None, None
    if not tokens_per_step:
        raise click.UsageError("--model needs --tokens-per-step")
    from .model import load_model_config, model_flops_breakdown

    cfg = load_model_config(model_path)
    mf = model_flops_breakdown(cfg, tokens_per_step, mode, seq_len=seq_len)  # type: ignore[arg-type]
    return float(mf.total), f"{mf.formula} ({Path(model_path).name})"


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
@model_options
@jobs_option
@quiet_option
@debug_option
@_handle_errors
def analyze(traces: tuple[str, ...], chip: str | None, fmt: str | None, output: str | None, top: int,
            rank: int | None, step: int | None, group_by: str | None, findings_opt: str | None,
            model_path: str | None, tokens_per_step: float | None, seq_len: int | None, mode: str,
            model_flops_per_step: float | None, devices: int | None, jobs: int | None) -> None:
    """Rank the ops of TRACE by the time they lost against the roofline.

    TRACE is a Kineto JSON (.json, .json.gz), a .tar.gz or directory of per-rank traces,
    an XSpace (.xplane.pb) or jax profile directory, a cache or dataset written by
    `traceroof ingest`, or a report saved with -o report.json. Several TRACEs, or a quoted
    glob ('run/rank-*.json.gz'), are read as the ranks of one job, in --jobs processes.
    Progress goes to stderr when reading takes over a second (-q: none).

    \b
    Examples:
      traceroof analyze trace.json.gz --chip h100
      traceroof analyze trace.json.gz --format markdown --top 10
      traceroof analyze run/ --rank 0 --step 12 -o report.json
      traceroof analyze 'run/rank-*.json.gz' --jobs 8
      traceroof analyze trace.json.gz --model config.json --tokens-per-step 16384
    """
    from .analysis import load_report
    from .outputs import check_output_file
    from .render import SUFFIXES, render

    if output:
        check_output_file(output)
    mflops, formula = resolve_model_flops(model_path, tokens_per_step, seq_len, mode, model_flops_per_step)
    names = [n.strip() for n in findings_opt.split(",") if n.strip()] if findings_opt else None

    def trace_only(_report: Any) -> None:
        if chip or rank is not None or step is not None or mflops or names:
            raise click.UsageError("--chip/--rank/--step/--model/--findings need a trace, not a saved report")

    report = load_report(list(traces), chip, jobs=jobs, progress=_progress_bar(), on_saved=trace_only,
                         analyzing=_analyzing, rank=rank, step=step, group_by=group_by,
                         model_flops_per_step=mflops, model_flops_formula=formula, n_devices=devices,
                         findings=names)
    if fmt is None:
        fmt = SUFFIXES.get(Path(output).suffix.lower(), "table") if output else "table"
    if output and fmt == "json":
        report.save(output)
        _progress(f"report written to {output}")
        return
    text = render(report, fmt, top=top)
    if output:
        Path(output).write_text(text)
        _progress(f"{fmt} written to {output}")
    else:
        click.echo(text, nl=not text.endswith("\n"))


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
    click.echo(f"wrote {out} ({d['layout']}): {units.plural(d['rows']['ops'], 'op')}, "
               f"{units.plural(d['rows']['host'], 'host event')}, {units.plural(len(d['ranks']) or 1, 'rank')}, "
               f"{units.plural(len(files), 'file')}, {size / 1e6:.2f} MB "
               f"in {time.perf_counter() - t0:.1f} s")
    shown = 20
    for f in files[:shown]:
        click.echo(f"  {f}")
    if len(files) > shown:
        click.echo(f"  ... and {len(files) - shown} more")


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

    click.echo(render_chips(list_chips(), fmt))


@cli.command()
@click.option("--model", "model_path", required=True, type=click.Path(dir_okay=False, path_type=str),
              help="Hugging Face-style config.json.")
@chip_option
@click.option("--seq", "seq_len", type=click.IntRange(min=1), default=4096, show_default=True, help="Sequence length (tokens).")
@click.option("--batch", type=click.IntRange(min=1), default=1, show_default=True, help="Sequences per batch.")
@click.option("--dtype", default="bf16", show_default=True, help="Weight/compute dtype.")
@click.option("--kv-dtype", help="KV-cache dtype (default: --dtype).")
@click.option("--format", "fmt", type=click.Choice(["table", "markdown", "json"]), default="table", show_default=True)
@debug_option
@_handle_errors
def estimate(model_path: str, chip: str | None, seq_len: int, batch: int, dtype: str,
             kv_dtype: str | None, fmt: str) -> None:
    """First-principles numbers to check a trace against: parameters, FLOPs per token,
    KV cache, decode floor, ridge point, crossover context length.

    \b
    Example:
      traceroof estimate --model config.json --chip h100 --seq 4096 --batch 8
    """
    from .estimate import estimate as run_estimate
    from .model import load_model_config
    from .render.estimate import render_estimate

    if not chip:
        raise click.UsageError("estimate needs --chip NAME (see `traceroof chips`)")
    est = run_estimate(load_model_config(model_path), chip, seq_len=seq_len, batch=batch, dtype=dtype, kv_dtype=kv_dtype)
    click.echo(render_estimate(est, fmt))


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
    click.echo(res.to_json() if fmt == "json" else md)
    if where:
        _progress(f"summary appended to {where}")
    if not res.passed:
        click.echo("traceroof: gate failed", err=True)
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

    load = functools.partial(load_report, jobs=jobs, progress=_progress_bar(), analyzing=_analyzing)
    sys.exit(cli_diff.run(a, b, load, chip, echo=click.echo, **opts))


@cli.command()
@click.argument("trace", type=click.Path(path_type=str))
@chip_option
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. Anything but loopback exposes the trace to the network.")
@click.option("--port", type=click.IntRange(0, 65535), default=8050, show_default=True, help="Port (0: any free port).")
@click.option("--open", "open_browser", is_flag=True, help="Open the dashboard in the default browser.")
@click.option("--compare", "compare_with", metavar="B", help="Show the diff view TRACE → B instead (docs/diff.md).")
@jobs_option
@quiet_option
@debug_option
@_handle_errors
def serve(trace: str, chip: str | None, host: str, port: int, open_browser: bool, compare_with: str | None,
          jobs: int | None) -> None:
    """Open the roofline dashboard of TRACE (or of a report saved with -o report.json).

    Tabs: roofline, ranked ops, timeline, steps, findings. A trace that cannot be read
    still starts the server, which shows the error line this command prints. Needs the
    web extra: pip install 'traceroof[web]'.

    \b
    Examples:
      traceroof serve trace.json.gz
      traceroof serve report.json --port 8080 --open
      traceroof serve trace.json.gz --chip a100 --host 0.0.0.0
    """
    try:
        from .web import app as web
    except ImportError as exc:
        from .errors import UsageError

        raise UsageError(f"serve needs the web extra ({exc.name} is missing): pip install 'traceroof[web]'") from exc

    _progress(f"loading {trace}")
    from .analysis import load_report

    loader = functools.partial(load_report, jobs=jobs, progress=_progress_bar())
    if compare_with:  # the diff view: both inputs must load (errors exit as for `diff`)
        app = cli_diff.compare_app(trace, compare_with, loader, chip)
        return web.run(app, host, port, open_browser=open_browser, echo=click.echo, warn=_progress)
    dash_app, error = web.load_app(trace, chip, loader, reraise=_State.debug)
    if error:
        click.echo(error, err=True)
    web.run(dash_app, host, port, open_browser=open_browser, echo=click.echo, warn=_progress)


#: jemalloc (polars' allocator) settings for the command line and its worker processes:
#: freed memory goes back to the OS within ~100 ms, purged by jemalloc's background thread
#: rather than on the parsing thread. On a 1 GB Kineto trace, `analyze` peaks at 0.94–0.99 GB
#: instead of 1.12–1.15 GB, in the same time (docs/performance.md). A user's own
#: ``_RJEM_MALLOC_CONF`` wins; library users choose their own.
JEMALLOC_CONF = "background_thread:true,dirty_decay_ms:100,muzzy_decay_ms:0"


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if "polars" not in sys.modules:  # read when polars loads; workers inherit it
        os.environ.setdefault("_RJEM_MALLOC_CONF", JEMALLOC_CONF)
    try:
        cli.main(args=argv, prog_name="traceroof", standalone_mode=False)
    except click.exceptions.NoSuchOption as exc:
        exc.show()
        sys.exit(2)
    except click.UsageError as exc:
        exc.show()
        sys.exit(2)
    except click.exceptions.Abort:
        click.echo("traceroof: aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except SystemExit:
        raise


if __name__ == "__main__":
    main()
