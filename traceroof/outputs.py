"""Outputs checked before the work: an ``-o`` path that cannot be written is the user's
mistake, said in one line (:class:`~traceroof.errors.OutputError`, exit code 9) before any
trace is parsed, never an internal error after the whole parse."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .errors import OutputError


def check_output_file(path: str | os.PathLike[str], what: str = "-o") -> None:
    """Check that the file ``path`` can be written (created, or replaced) now; the message
    names it as ``what`` (the option or variable it came from: ``-o``, ``$GITHUB_STEP_SUMMARY``).

    The check writes nothing that stays: a file that did not exist is created empty and
    removed again; an existing one is opened for appending and left as it was.

    Raises:
        OutputError: a folder is in its place, its folder does not exist or is a file, or it
            cannot be opened for writing (permission, read-only or virtual file system).
    """
    p = Path(path)
    if p.is_dir():
        raise OutputError(f"{what} {path}: is a directory; expected the path of a file to write")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.exists():
        raise OutputError(f"{what} {path}: folder {parent} does not exist (create it first)")
    if not parent.is_dir():
        raise OutputError(f"{what} {path}: {parent} is a file, not a folder")
    existed = p.exists()
    try:
        with open(p, "a"):
            pass
    except OSError as exc:
        raise OutputError(f"{what} {path}: cannot be written ({exc.strerror or exc})") from exc
    if not existed:
        p.unlink(missing_ok=True)


def check_output_dir(path: str | os.PathLike[str]) -> None:
    """Check that the directory ``path`` can be written: it is a directory, or it can be
    created (its nearest existing ancestor is a folder this process can write in).

    Raises:
        OutputError: a file is in the way, or the folder (or the ancestor it would be
            created in) cannot be written.
    """
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise OutputError(f"-o {path}: a file is in the way; expected a directory")
    anc = p
    while not anc.exists():
        anc = anc.parent
    if not anc.is_dir():
        raise OutputError(f"-o {path}: {anc} is a file, not a folder")
    try:
        fd, probe = tempfile.mkstemp(dir=anc, prefix=".traceroof-write-check-")
    except OSError as exc:
        raise OutputError(f"-o {path}: cannot write in {anc} ({exc.strerror or exc})") from exc
    os.close(fd)
    os.unlink(probe)
