"""What the ``traceroof`` commands share: the process-wide flags (``--debug``, ``--quiet``),
progress lines on stderr, the error handler (one line and the exit code of a
:class:`~traceroof.errors.TraceroofError`, never a traceback unless ``--debug``) and the
options several commands take (``--chip``, ``--jobs``, the model options).
:mod:`traceroof.cli` re-exports them.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, ContextManager

import click

from .errors import TraceroofError

logger = logging.getLogger("traceroof")

EXIT_INTERNAL = 70


class _State:
    """Process-wide CLI flags set by the eager --debug / --quiet options."""

    debug = False
    quiet = False


def _reader_gone(err: bool) -> None:
    """stdout (stderr when ``err``) is a pipe whose reader has gone away: point the file
    descriptor at the null device, so that what is still buffered, and whatever the command
    writes after, is dropped without another ``BrokenPipeError`` (at the interpreter's final
    flush too), and the command ends with its own exit status."""
    stream = sys.stderr if err else sys.stdout
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # not a real file (CliRunner's buffers)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def echo(message: str = "", *, nl: bool = True, err: bool = False) -> None:
    """``click.echo`` for every line a command writes: a reader that leaves early
    (``traceroof analyze T | head -3``) is a normal end, not an error. The rest of the output
    is dropped and the command carries on to its own exit status (0; ``gate``'s 1 when the
    gate fails; ``diff``'s), as if the reader had read it all (docs/cli.md, exit codes).
    ``watch`` streams with ``click.echo`` instead, so that it stops when its reader has gone."""
    try:
        click.echo(message, nl=nl, err=err)
    except BrokenPipeError:
        _reader_gone(err)


def _progress(msg: str) -> None:
    if not _State.quiet:
        echo(f"traceroof: {msg}", err=True)


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
        help="Processes reading multi-file traces (directories, globs, several files, the "
        "members of a tar). Default: the core count.",
    )(fn)


def early_workers(traces: Sequence[str], jobs: int | None) -> ContextManager[None]:
    """The worker processes of a multi-file read started now, before the command's own
    imports (:func:`traceroof.parallel.early_workers`): ``min(jobs, files) − 1`` of them, the
    files guessed from ``traces`` (:func:`~traceroof.parallel.likely_files`), ``jobs``
    defaulting to the core count; none for one file. Shut down when the block is left."""
    from .parallel import default_jobs, early_workers, likely_files

    return early_workers(min(jobs or default_jobs(), likely_files(traces, jobs)) - 1)


def _handle_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run a command; turn TraceroofError into one line + its exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except TraceroofError as exc:
            if _State.debug:
                raise
            echo(f"traceroof: error: {exc}", err=True)
            sys.exit(exc.exit_code)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise
        except KeyboardInterrupt:
            echo("traceroof: interrupted", err=True)
            sys.exit(130)
        except BrokenPipeError:
            # the reader went away (`traceroof analyze … | head`) during a write that did not
            # go through echo(): a normal end, not a bug (exit 0, docs/cli.md). Both streams
            # are pointed at the null device so that the interpreter's final flush stays quiet.
            _reader_gone(False)
            _reader_gone(True)
            sys.exit(0)
        except Exception as exc:  # noqa: BLE001 - the last line of defence for users
            if _State.debug:
                raise
            echo(
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
