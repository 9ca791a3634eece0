"""Fitting text to the terminal it is printed in: the width, which table columns fit,
wrapped lines, no trailing padding.

The width is the caller's, else the terminal's (``COLUMNS`` first, as
:func:`shutil.get_terminal_size` reads it; then the terminal stdout or, when it is piped,
stderr is attached to), else :data:`PIPE_WIDTH` when there is no terminal. Tables drop their lowest-value columns first when the terminal is narrow
(:func:`fit_columns`); every line loses its trailing spaces (:func:`finish`), so piped output
is not padded.
"""

from __future__ import annotations

import io
import os
import re
import sys
import textwrap
from collections.abc import Sequence

from rich.console import Console

#: columns when the output is not a terminal and ``COLUMNS`` is not set
PIPE_WIDTH = 120
#: the narrowest layout drawn; a narrower terminal wraps it
MIN_WIDTH = 60


def width(explicit: int | None = None) -> int:
    """The width to render at, in columns (at least :data:`MIN_WIDTH`): ``explicit``, else
    ``COLUMNS``, else the terminal stdout is, else the terminal stderr is (``analyze | head``
    and ``analyze | less`` in an 80-column terminal fit it), else :data:`PIPE_WIDTH` (no
    terminal at all: a file or CI log)."""
    w = explicit or _terminal_columns()
    return max(int(w), MIN_WIDTH)


def _terminal_columns() -> int:
    """``COLUMNS``, else the size of the terminal on stdout or stderr, else :data:`PIPE_WIDTH`."""
    env = os.environ.get("COLUMNS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    for stream in (sys.stdout, sys.stderr):
        try:
            fd = stream.fileno()
            if os.isatty(fd):
                return os.get_terminal_size(fd).columns
        except (AttributeError, ValueError, OSError, io.UnsupportedOperation):
            continue  # no file descriptor (captured, closed) or not a terminal
    return PIPE_WIDTH


def console(buf: io.StringIO, cols: int) -> Console:
    """A plain-text rich console of ``cols`` columns writing into ``buf``."""
    return Console(file=buf, width=cols, force_terminal=False, color_system=None, highlight=False,
                   soft_wrap=False)


def finish(text: str) -> str:
    """``text`` with the trailing spaces of every line removed."""
    return "\n".join(line.rstrip() for line in text.split("\n"))


#: a number and the unit after it (``243 µs``, ``0.5 %``, ``3.35 TB/s``): never split by a wrap
_NUMBER_UNIT = re.compile(r"(\d) (?=%|[kMGTPµmn]?(?:FLOP/s|FLOP|B/s|B|s)\b|[KMGT]iB\b)")


def wrap(text: str, cols: int, first: str = "  - ", rest: str = "    ") -> str:
    """``text`` wrapped at word boundaries to ``cols`` columns, the first line behind
    ``first``, the others behind ``rest`` (long words, e.g. paths, are not broken, nor a
    number from its unit)."""
    held = _NUMBER_UNIT.sub("\\1\u00a0", text)  # textwrap breaks only at ASCII whitespace
    lines = textwrap.wrap(held, width=cols, initial_indent=first, subsequent_indent=rest,
                          break_long_words=False, break_on_hyphens=False)
    return "\n".join(line.replace("\u00a0", " ") for line in lines) or first.rstrip()


def fit_columns(headers: Sequence[str], rows: Sequence[Sequence[str]], cols: int, *,
                drop_order: Sequence[str], flexible: str | None = None,
                flexible_min: int = 16) -> tuple[list[str], int | None]:
    """Which columns of a rich box table fit in ``cols`` columns.

    Each column needs its widest cell (or header line: a header may hold ``\n``) plus 3 (padding and border), and the table
    one more. Columns named in ``drop_order`` are dropped in that order until the table fits
    with the ``flexible`` column (the one whose cells may be shortened, e.g. op names) at
    least ``flexible_min`` wide.

    Returns:
        The headers kept (in their order) and the width left for the flexible column (None
        when there is none, or it fits as it is).
    """
    natural = {h: max([max(map(len, h.split("\n")))] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)}
    kept = list(headers)
    drop = [d for d in drop_order if d in natural]
    while True:
        fixed = sum(natural[h] + 3 for h in kept if h != flexible) + 1
        room = cols - fixed - (3 if flexible in kept else 0)
        if flexible not in kept:
            if fixed <= cols or not drop:
                return kept, None
        elif room >= min(natural[flexible], flexible_min) or not drop:
            return kept, (None if room >= natural[flexible] else max(room, flexible_min))
        kept.remove(drop.pop(0))
