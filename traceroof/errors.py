"""The traceroof exception hierarchy.

Every error the library raises is a :class:`TraceroofError`. The CLI (and only the CLI)
turns them into one line on stderr and an exit code; each subclass carries its code so the
mapping lives in one place.

Exit codes (DESIGN §9; docs/cli.md): 0 ok, 1 gate failed, 2 usage, 3 input not found,
4 invalid/unsupported trace, 5 unknown chip, 6–8 capture (no server, empty, timeout: the
errors of :mod:`traceroof.capture`), 9 an output that cannot be written (:class:`OutputError`),
70 internal error.
"""

from __future__ import annotations

import stat


class TraceroofError(Exception):
    """Base class of every error traceroof raises on purpose."""

    exit_code: int = 70


class InputNotFoundError(TraceroofError, FileNotFoundError):
    """The trace path (file or directory) does not exist or holds no trace."""

    exit_code = 3


def path_text(path: object) -> str:
    """How a file's path is named in messages and ``meta.sources``: ``str(path)``, but with
    ``./`` in front of a relative path that starts with ``-`` (``Path("./-")`` prints as
    ``-``, the name of stdin, which the readers name ``<stdin>``; ``Path("./-x")`` as ``-x``,
    which reads as an option)."""
    s = str(path)
    return "./" + s if s.startswith("-") else s


def file_kind(mode: int) -> str:
    """What a file that is neither a regular file nor a directory is, in messages: ``mode`` is
    ``os.stat_result.st_mode``; e.g. ``"a character device"`` (``/dev/zero``, a terminal)."""
    return ("a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a character device" if stat.S_ISCHR(mode)
            else "a block device" if stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "not a regular file")


class TraceFormatError(TraceroofError, ValueError):
    """The input is not a trace we can read, or nothing in it can be recovered.

    The message names the file, the place (byte offset or event index) and what was expected.
    """

    exit_code = 4

    def __init__(self, path: object, where: str, expected: str) -> None:
        self.path = path_text(path)
        self.where = where
        self.expected = expected
        super().__init__(f"{self.path}: {where}: {expected}")

    def __reduce__(self) -> tuple[object, ...]:
        # the default exception pickling calls cls(*args) with the one message: rebuild from
        # the three parts, so the error crosses a process boundary (ProcessPool, Dask, Ray) intact
        return (type(self), (self.path, self.where, self.expected), dict(self.__dict__))


class MixedInputsError(TraceroofError, ValueError):
    """Several inputs that are not the per-rank traces of one job: different formats (a
    Kineto trace and an ``.xplane.pb``) or different devices (an H100 and an MI300X trace).
    They are never merged (one chip's peaks would cost both); analyze them one at a time.
    Exit code 4, as for any input traceroof cannot read as given."""

    exit_code = 4


class SchemaError(TraceroofError, ValueError):
    """A table does not match its declared schema (missing/extra columns, wrong dtypes)."""

    exit_code = 70


class UnknownChipError(TraceroofError, LookupError):
    """A chip name or detected device that is not in the database, or is ambiguous."""

    exit_code = 5

    def __init__(self, message: str, candidates: list[str] | None = None) -> None:
        self.candidates = list(candidates or [])
        super().__init__(message)


class DuplicateFormulaError(TraceroofError, ValueError):
    """Two cost formulas were registered for the same op name."""

    exit_code = 70


class ReportVersionError(TraceroofError, ValueError):
    """A saved report JSON has a schema_version this traceroof cannot read."""

    exit_code = 4


class OutputError(TraceroofError, OSError):
    """An output (``-o FILE``, ``ingest -o DIR``, ``gate``'s ``$GITHUB_STEP_SUMMARY``) that cannot be written: its folder is
    missing, a file or folder is in the way, or there is no permission. Checked before any
    parsing, so a user's mistake costs no parse. Exit code 9."""

    exit_code = 9


class UsageError(TraceroofError, ValueError):
    """Invalid option values or combinations passed by the caller."""

    exit_code = 2
