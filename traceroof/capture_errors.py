"""The failures of a live capture, each its own exception, exit code and one line of advice,
and the reading of xprof's client log that tells them apart.

xprof's client (``_pywrap_profiler_plugin.trace``) raises the same ``UNAVAILABLE: No trace
event was collected`` for every failure; the cause is only in its log on stderr (absl
warnings, visible with ``TF_CPP_MIN_LOG_LEVEL`` <= 1), as lines like::

    W... capture_profile.cc:181] 127.0.0.1:9999 returned INTERNAL: Another profiling session active.

:func:`classify` maps those lines to the errors below. The strings were measured on loopback
with jax 0.10.2 / xprof 2.24.2 (docs/capture.md, "Errors and exit codes").

====================  ====  =====================================================
error                 code  cause
====================  ====  =====================================================
BadAddressError          2  not HOST:PORT, or a port outside 1..65535
NoServerError            6  DNS failure, connection refused, no TCP answer
EmptyCaptureError        7  the server answered and recorded nothing (idle target)
CaptureTimeoutError      8  the port accepts and never answers (silent acceptor)
NotProfilerServerError  10  another protocol answers (an HTTP server: "Failed parsing HTTP/2")
ProfilerBusyError       11  another profiling session is active in the target
TargetExitedError       12  the target closed the connection mid-capture (exited, killed)
CaptureUnavailable      13  the capture client (xprof) is not installed
====================  ====  =====================================================
"""

from __future__ import annotations

import re

from .errors import TraceroofError

__all__ = [
    "BadAddressError", "CaptureError", "CaptureTimeoutError", "CaptureUnavailable",
    "EmptyCaptureError", "NoServerError", "NotProfilerServerError", "ProfilerBusyError",
    "TargetExitedError", "classify",
]


class CaptureError(TraceroofError):
    """Base class of live-capture failures (exit code 6 unless a subclass says otherwise)."""

    exit_code = 6


class BadAddressError(CaptureError):
    """The address is not ``HOST:PORT`` with a port in 1..65535 (a usage error, exit 2)."""

    exit_code = 2


class NoServerError(CaptureError):
    """Nothing listens at the address: DNS failure, connection refused, or no TCP answer."""

    exit_code = 6


class EmptyCaptureError(CaptureError):
    """The profiler server answered but recorded nothing (an idle target, a freed handle,
    an empty file)."""

    exit_code = 7


class CaptureTimeoutError(CaptureError):
    """No answer within the bound: the port accepted the connection and stayed silent, or
    the client did not finish within its hard timeout (it is killed)."""

    exit_code = 8


class NotProfilerServerError(CaptureError):
    """Something else answers on the port (an HTTP server, another gRPC service)."""

    exit_code = 10


class ProfilerBusyError(CaptureError):
    """The target's profiler already runs a session (another capture, or the program's own
    ``jax.profiler.trace``)."""

    exit_code = 11


class TargetExitedError(CaptureError):
    """The target closed the connection during the window: it exited or was killed.

    ``elapsed_s`` is how far into the window it went (seconds, None when unknown);
    ``kept`` the paths of whatever was recorded (empty when nothing was: a jax profiler
    server sends its events only at the end of the window)."""

    exit_code = 12

    def __init__(self, message: str, elapsed_s: float | None = None,
                 kept: list[str] | None = None) -> None:
        self.elapsed_s = elapsed_s
        self.kept = list(kept or [])
        self.kept_trace = None  # a Trace of an earlier, complete window (capture_steps)
        super().__init__(message)


class CaptureUnavailable(CaptureError):
    """The capture client (the ``xprof`` package) is not installed."""

    exit_code = 13


#: ``<address> returned <CODE>: <message>`` in the client's log (capture_profile.cc)
_RETURNED = re.compile(r"returned ([A-Z_]+): (.*)$")
#: the client's own error line (profiler_client.cc) when no ``returned`` line is written
_CLIENT_ERR = re.compile(r"profiler_client\.cc:\d+\] ([A-Z_]+): (.*)$")

ADVICE_START = "start one in the target with `server = jax.profiler.start_server(PORT)` and keep the handle alive"


def _cause(log: str) -> tuple[str, str] | None:
    """(gRPC status code, message) of the first failure the client logged, or None."""
    for pattern in (_RETURNED, _CLIENT_ERR):
        for line in log.splitlines():
            m = pattern.search(line)
            if m:
                return m.group(1), m.group(2).strip()
    return None


def classify(where: str, log: str, error: str, duration_s: float,
             elapsed_s: float | None) -> CaptureError:
    """The error for a failed client run.

    Args:
        where: ``host:port``, the start of the message.
        log: the client's stderr (absl log lines).
        error: the exception text the client raised.
        duration_s: the capture window asked for, seconds.
        elapsed_s: seconds the client ran before failing (None when unknown).

    Returns:
        The most specific :class:`CaptureError` the log supports; a plain CaptureError
        naming the client's own words when none fits.
    """
    cause = _cause(log)
    code, msg = cause if cause else ("", "")
    said = f"{code}: {msg}" if cause else error
    if "Failed parsing HTTP/2" in msg or code == "UNIMPLEMENTED":
        return NotProfilerServerError(
            f"{where}: not a jax profiler server ({said}); something else (an HTTP server?) "
            f"listens there: check the port the target passed to jax.profiler.start_server")
    if "before receiving SETTINGS frame" in msg or code == "DEADLINE_EXCEEDED":
        return CaptureTimeoutError(
            f"{where}: the port accepted the connection and never answered ({said}); check "
            f"that it is the profiler's port")
    if "Another profiling session active" in msg:
        return ProfilerBusyError(
            f"{where}: another profiling session is active in the target ({said}); wait for "
            f"it to end (another capture, or the program's own jax.profiler.trace) and retry")
    if "Socket closed" in msg or "Stream removed" in msg or "Connection reset" in msg:
        into = f"{elapsed_s:.1f} s into" if elapsed_s is not None else "during"
        return TargetExitedError(
            f"{where}: the target closed the connection {into} the {duration_s:.1f} s window "
            f"({said}): it exited or was killed; nothing was recorded (a jax profiler server "
            f"sends its events only when the window ends): capture while it runs",
            elapsed_s=elapsed_s)
    if "Connection refused" in msg or "failed to connect" in msg:
        return NoServerError(f"{where}: no profiler server answers ({said}); {ADVICE_START}")
    if "No trace event" in log or "No trace event" in error:
        return EmptyCaptureError(
            f"{where}: the profiler server answered but recorded nothing in {duration_s:.1f} s: "
            f"the target ran no jax/XLA computation during the window (idle, blocked, or "
            f"finished), or its server handle was stopped or garbage-collected: keep "
            f"`server = jax.profiler.start_server(...)` alive and capture while the work runs")
    return CaptureError(f"{where}: capture failed: {said}")
