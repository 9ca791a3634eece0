"""The ``traceroof`` command line: a thin click layer over the library.

Exit codes (DESIGN §9; also in ``docs/cli.md``):

====  =====================================================
0     ok
1     gate failed
2     usage error (bad option value or combination)
3     input not found
4     invalid or unsupported trace / report
5     unknown or ambiguous chip
6-8   capture: no server / empty capture / timeout
70    internal error (a bug: please report it, with --debug output)
====  =====================================================

Errors reach the user as one line on stderr (``traceroof: error: …``), never a traceback,
unless ``--debug`` is given.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from . import __version__
from .errors import TraceroofError

logger = logging.getLogger("traceroof")

EXIT_INTERNAL = 70


class _State:
    debug = False


def _progress(msg: str) -> None:
    if not _State.quiet:
        click.echo(f"traceroof: {msg}", err=True)


_State.quiet = False  # type: ignore[attr-defined]


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
        _State.quiet = bool(value)  # type: ignore[attr-defined]
        return value

    return click.option("-q", "--quiet", is_flag=True, expose_value=False, callback=cb,
                        help="No progress messages on stderr.")(fn)


def chip_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--chip", metavar="NAME|FILE.toml",
        help="Chip name or alias (see `traceroof chips`), or a path to a chip TOML. "
        "Default: detected from the trace.",
    )(fn)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="traceroof")
def cli() -> None:
    """Rank the ops of a profiler trace against the roofline of the chip they ran on.

    \b
    Example:
      traceroof analyze trace.json.gz --chip h100
      traceroof chips
    """


def load_trace_or_report(path: str, *, jobs: int | None = None):  # type: ignore[no-untyped-def]
    """A saved report (JSON with schema_version) or a trace to parse."""
    from .report import Report, is_report

    if is_report(path):
        return Report.load(path)
    from .io import read_trace

    p = Path(path)
    size = sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.is_dir() else (p.stat().st_size if p.exists() else 0)
    t0 = time.perf_counter()
    trace = read_trace(path, jobs=jobs)
    dt = time.perf_counter() - t0
    if dt > 1.0:
        n = trace.meta.stats.get("events", 0)
        _progress(f"read {size / 1e6:.1f} MB, {n:,} events in {dt:.1f} s ({n / dt:,.0f} events/s)")
    return trace


@cli.command()
@click.argument("trace", type=click.Path(path_type=str))
@chip_option
@click.option("--format", "fmt", type=click.Choice(["table", "json", "markdown", "csv"]),
              help="Output format (default: from -o's suffix, else table).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=str),
              help="Write to FILE. A .json FILE gets the full report (with the op table) for gate/serve.")
@click.option("--top", type=click.IntRange(min=1), default=20, show_default=True, help="Rows of the ranking to show.")
@click.option("--rank", type=int, help="Only this rank.")
@click.option("--step", type=int, help="Only this step (ProfilerStep#N).")
@click.option("--group-by", type=click.Choice(["op", "kernel"]), default="op", show_default=True,
              help="Rank by framework op (falling back to kernel name) or by kernel name.")
@click.option("--jobs", type=click.IntRange(min=1), help="Processes for multi-file traces (default: cores).")
@quiet_option
@debug_option
@_handle_errors
def analyze(trace: str, chip: str | None, fmt: str | None, output: str | None, top: int,
            rank: int | None, step: int | None, group_by: str, jobs: int | None) -> None:
    """Rank the ops of TRACE by the time they lost against the roofline.

    TRACE is a Kineto JSON (.json, .json.gz), a .tar.gz or directory of per-rank traces,
    an XSpace (.xplane.pb) or jax profile directory, or a report saved with -o report.json.

    \b
    Examples:
      traceroof analyze trace.json.gz --chip h100
      traceroof analyze trace.json.gz --format markdown --top 10
      traceroof analyze run/ --rank 0 --step 12 -o report.json
    """
    from .analysis import analyze as run_analysis
    from .render import SUFFIXES, render
    from .report import Report

    obj = load_trace_or_report(trace, jobs=jobs)
    if isinstance(obj, Report):
        report = obj
        if chip or rank is not None or step is not None:
            raise click.UsageError("--chip/--rank/--step need a trace, not a saved report")
    else:
        report = run_analysis(obj, chip, rank=rank, step=step, group_by=group_by)
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


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
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
