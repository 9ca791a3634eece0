"""``traceroof diff`` and ``serve --compare``: the command line's side of the comparison
(:mod:`traceroof.diff` compares, :mod:`traceroof.render.diff` and
:mod:`traceroof.web.diff_view` present). Kept out of :mod:`traceroof.cli` (600-line rule)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

#: ``traceroof diff --help``
HELP = """Explain the step-time change from A to B (traces, caches or saved reports).

    Two waterfalls that add up to the change exactly: by op label, and by cause (roofline
    time of the work, findings that appeared, grew or went away, unclaimed gaps, idle); the
    per-op table (count, measured, expected, gap, FLOPs), the ops matched by what they compute
    (kind, dtype, FLOPs, bytes: across frameworks and chips) and what changed (chip, format).
    Exit codes as `gate`: 1 when --max-step-time-increase is exceeded. docs/diff.md.

    \\b
    Examples:
      traceroof diff main.json pr.json --format markdown
      traceroof diff before.json.gz after.json.gz --chip a100 --max-step-time-increase 0.05
    """


def options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``diff``'s own options: --chip-b, --format, --top, --max-step-time-increase."""
    for opt in reversed([
        click.option("--chip-b", metavar="NAME|FILE.toml", help="B's chip, when it differs from A's (default: --chip)."),
        click.option("--format", "fmt", type=click.Choice(["table", "markdown", "json"]), default="table",
                     show_default=True),
        click.option("--top", type=click.IntRange(min=1), default=15, show_default=True, help="Rows per table."),
        click.option("--max-step-time-increase", type=click.FloatRange(0),
                     help="Exit 1 when B's step is more than this much slower than A's (0.05 = 5 %)."),
    ]):
        fn = opt(fn)
    return fn


def run(a: str, b: str, load: Callable[..., Any], chip: str | None, *, chip_b: str | None, fmt: str,
        top: int, max_step_time_increase: float | None, echo: Callable[..., None]) -> int:
    """Load A and B (``load(path, chip)``), print the diff in ``fmt``; the exit code: 1 when B's
    step is more than ``max_step_time_increase`` slower than A's, else 0.

    Raises:
        UsageError: a report without its op table; ``max_step_time_increase`` with a side that
            has no complete step (no step time).
    """
    from .diff import compare
    from .errors import UsageError
    from .render.diff import render

    d = compare(_load(load, a, chip, "--chip"), _load(load, b, chip_b or chip, "--chip-b" if chip_b else "--chip"),
                name_a=a, name_b=b)
    echo(render(d, fmt, top=top), nl=False)
    if max_step_time_increase is None:
        return 0
    if d.a.measured_ns is None or d.b.measured_ns is None:
        raise UsageError("--max-step-time-increase: a side has no complete step, so no step time to compare")
    rise = (d.b.measured_ns - d.a.measured_ns) / d.a.measured_ns
    if rise > max_step_time_increase:
        echo(f"traceroof: diff: step time +{rise:.1%} > +{max_step_time_increase:.1%} allowed", err=True)
        return 1
    return 0


def _load(load: Callable[..., Any], path: str, chip: str | None, option: str) -> Any:
    """``load(path, chip)``, refusing a chip option given with a saved report (it names its
    chip already: the option would be silently ignored).

    Raises:
        UsageError: ``chip`` given and ``path`` is a saved report.
    """
    from .errors import UsageError

    def trace_only(_report: Any) -> None:
        if chip:
            raise UsageError(f"{option} needs a trace, not a saved report ({path} already names its chip)")

    return load(path, chip, on_saved=trace_only)


def compare_app(a: str, b: str, load: Callable[..., Any], chip: str | None) -> Any:
    """The ``serve A --compare B`` app (:func:`traceroof.web.diff_view.create_compare_app`).

    Raises:
        UsageError: ``chip`` with a saved report; a report without its op table.
    """
    from .web.diff_view import create_compare_app

    return create_compare_app(_load(load, a, chip, "--chip"), _load(load, b, chip, "--chip"), a, b)
