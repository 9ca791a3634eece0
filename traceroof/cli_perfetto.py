"""``analyze --perfetto``: the command line's side of the Perfetto export
(:mod:`traceroof.render.perfetto` writes the file)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def check_path(path: str) -> None:
    """``--perfetto``'s file, checked before the parse (exit 9, the message naming the option)."""
    from .errors import OutputError
    from .outputs import check_output_file

    try:
        check_output_file(path)
    except OutputError as exc:
        raise OutputError(f"--perfetto {str(exc).removeprefix('-o ')}") from exc


def write(report: Any, path: str, progress: Callable[[str], None]) -> None:
    """``analyze --perfetto``: the trace-event file, and what it holds (``progress``: a line
    on stderr).

    Raises:
        UsageError: the report holds no op table.
        OutputError: the file cannot be written.
    """
    from . import units
    from .errors import UsageError
    from .render.perfetto import write_perfetto

    if report.ops is None:
        raise UsageError(f"--perfetto {path}: the report holds no op table (saved without ops): nothing to export")
    from .errors import OutputError

    try:
        out = write_perfetto(report, path)
    except OSError as exc:  # checked before the parse; the disk can still fill or vanish since
        raise OutputError(f"--perfetto {path}: cannot be written ({exc.strerror or exc})") from exc
    progress(f"perfetto trace written to {path}: {units.plural(out.ops, 'device op')}, "
              f"{units.plural(out.launches, 'host launch', 'host launches')}, "
              f"{units.plural(out.findings, 'finding')} ({units.plural(out.flows, 'flow')}), "
              f"{units.plural(out.steps, 'step')}")
    for note in out.notes:
        progress(f"perfetto: {note}")
