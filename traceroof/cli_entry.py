"""The ``traceroof`` console script's entry point (``pyproject.toml``: ``traceroof.cli_entry:entry``;
``python -m traceroof.cli`` calls it too): :func:`traceroof.cli.main`, then the process ended
at once after a one-shot command."""

from __future__ import annotations

import os
import sys
from typing import Any


def entry() -> None:
    """The ``traceroof`` console script and ``python -m traceroof.cli``: :func:`traceroof.cli.main`, and for
    a one-shot command (:data:`traceroof.cli.ONE_SHOT_COMMANDS`) the process then ended at once.

    Once the command has returned (its outputs written and closed, its worker processes
    reaped), stdout and stderr are flushed, logging is shut down and the process exits with
    ``os._exit`` and the command's exit code, instead of letting the interpreter tear down
    every module and free every object one by one: ~45–55 ms less per run on a small trace
    (bert: 70–90 → 27–33 ms from the command's end to the process's; docs/performance.md,
    "Issue 19's bars at the end of session 10"). Nothing is written after that point, and
    traceroof registers no ``atexit`` hook. When the flush fails (the reader of a pipe left)
    or the command is not one-shot, or ``TRACEROOF_FULL_EXIT=1`` is set (a coverage tool or
    profiler that writes its data at exit), the interpreter exits as usual. ``main``
    itself never ends the process this way (library and test callers).

    Before the command, ``OPENBLAS_NUM_THREADS`` is set to 1 unless the user set it: numpy's
    OpenBLAS would start a thread per core when the XPlane reader (or a big Kineto file)
    imports numpy, ~0.1 s of CPU per run, and no command does linear algebra
    (docs/performance.md, "XPlane events in C (session 18)").

    Raises:
        SystemExit: the command's exit code (documented in docs/cli.md), when it does not
            end the process itself.
    """
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy is imported (docstring)
    from .cli import _one_shot, main

    try:
        main()
        code: Any = 0
    except SystemExit as exc:
        code = exc.code
    if not _one_shot(None) or os.environ.get("TRACEROOF_FULL_EXIT") == "1":
        raise SystemExit(code)
    if code is None:
        code = 0
    elif not isinstance(code, int):  # SystemExit("message"): printed, exit 1, as Python does
        sys.stderr.write(f"{code}\n")
        code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):  # a closed or broken stream: the usual exit handles it
        raise SystemExit(code) from None
    import logging

    logging.shutdown()
    os._exit(code)
