"""Live capture from a running ``jax.profiler`` server, then parse it into a :class:`Trace`.

``traceroof.capture`` is this module (after ``import traceroof``, in any interpreter)::

    import traceroof
    trace = traceroof.capture.capture("localhost:9999", duration_s=2.0)   # -> Trace
    path = traceroof.capture.capture_xplane("localhost:9999", 2.0, "prof/")  # -> Path

The target process must have called ``jax.profiler.start_server(PORT)`` **and keep the returned
handle alive** (``server = jax.profiler.start_server(9999)``; a handle that is stopped or
collected means "no server" or an empty capture, BC-19).

Before the client runs, a probe connects (refused: :class:`NoServerError` at once) and sends
the HTTP/2 client preface (RFC 9113 §3.4): a gRPC server answers with a SETTINGS frame at
once; anything else that answers is not a profiler server (:class:`NotProfilerServerError`),
and a port that stays silent for :data:`PROBE_TIMEOUT_S` is a :class:`CaptureTimeoutError`.
The client is xprof's (``xprof.convert._pywrap_profiler_plugin.trace``, what
``python -m jax.collect_profile`` uses), run in a **subprocess with a hard timeout**; its log
(stderr) names the real cause of a failure, read by :func:`traceroof.capture_errors.classify`.
The errors and their exit codes are listed in :mod:`traceroof.capture_errors` and
docs/capture.md.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .capture_errors import (
    ADVICE_START,
    BadAddressError,
    CaptureError,
    CaptureTimeoutError,
    CaptureUnavailable,
    EmptyCaptureError,
    NoServerError,
    NotProfilerServerError,
    ProfilerBusyError,
    TargetExitedError,
    classify,
)
from .trace import Trace

__all__ = [
    "BadAddressError", "CaptureError", "CaptureTimeoutError", "CaptureUnavailable",
    "EmptyCaptureError", "NoServerError", "NotProfilerServerError", "ProfilerBusyError",
    "TargetExitedError", "capture", "capture_steps", "capture_xplane", "count_steps",
    "parse_address",
]

_CLIENT = r"""
import json, os, sys, time
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "1"  # warnings and errors: they name the cause
try:
    from xprof.convert import _pywrap_profiler_plugin as pw
except Exception as exc:
    print(json.dumps({"status": "unavailable", "error": repr(exc)}), flush=True)
    sys.exit(3)
address, logdir, duration_ms, options = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
t0 = time.monotonic()
try:
    pw.trace(address, logdir, "", True, duration_ms, 1, options)
except Exception as exc:
    print(json.dumps({"status": "error", "error": str(exc), "elapsed_s": time.monotonic() - t0}), flush=True)
    sys.exit(2)
print(json.dumps({"status": "ok", "elapsed_s": time.monotonic() - t0}), flush=True)
"""

#: Tracer levels sent to the server (as ``jax.collect_profile``, without Python tracing: it
#: inflates the capture and is not needed for device ops).
DEFAULT_OPTIONS = {"host_tracer_level": 2, "device_tracer_level": 1, "python_tracer_level": 0}

#: seconds the probe waits for the TCP connection, then for the server's HTTP/2 greeting: a
#: gRPC server on loopback answers in microseconds (measured: 8 µs), so a port silent this
#: long is not a profiler server that works
PROBE_TIMEOUT_S = 5.0

#: the HTTP/2 client connection preface and an empty SETTINGS frame (RFC 9113 §3.4, §6.5)
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_H2_SETTINGS = 0x04  # frame type of SETTINGS, the 4th byte of a frame header (RFC 9113 §4.1)


def parse_address(address: str) -> tuple[str, int]:
    """``"host:port"``, ``"port"``, ``"grpc://host:port"`` or ``"[::1]:port"`` -> (host, port).

    Raises:
        BadAddressError: no port, or a port outside 1..65535 (exit code 2).
    """
    a = address.strip()
    if "://" in a:
        a = a.split("://", 1)[1]
    if a.isdigit():
        host, port = "127.0.0.1", a
    elif a.startswith("["):
        host, _, rest = a[1:].partition("]")
        port = rest.lstrip(":")
    else:
        host, _, port = a.rpartition(":")
    if not port.isdigit() or not host:
        raise BadAddressError(f"{address!r}: expected HOST:PORT (e.g. localhost:9999)")
    if not 1 <= int(port) <= 65535:
        raise BadAddressError(f"{address!r}: port {int(port)} is outside 1..65535")
    return host, int(port)


def _connect(host: str, port: int) -> socket.socket:
    """A TCP connection to the address, or NoServerError (DNS, refused, no answer)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise NoServerError(f"{host}:{port}: cannot resolve host {host!r} ({exc})") from None
    last: Exception | None = None
    for family, kind, proto, _name, sockaddr in infos:
        s = socket.socket(family, kind, proto)
        s.settimeout(PROBE_TIMEOUT_S)
        try:
            s.connect(sockaddr)
            return s
        except OSError as exc:
            last = exc
            s.close()
    if isinstance(last, ConnectionRefusedError):
        raise NoServerError(f"{host}:{port}: connection refused -- no profiler server listens "
                            f"there; {ADVICE_START.replace('PORT', str(port))}")
    raise NoServerError(f"{host}:{port}: no TCP answer within {PROBE_TIMEOUT_S:.0f} s ({last}); "
                        "check the host, the port and any firewall")


def probe(host: str, port: int) -> None:
    """Check that a gRPC (HTTP/2) server answers at ``host:port`` (at most 2 ×
    :data:`PROBE_TIMEOUT_S` seconds).

    Raises:
        NoServerError: nothing listens. NotProfilerServerError: something answers that is not
        HTTP/2. CaptureTimeoutError: the port accepts and stays silent.
    """
    s = _connect(host, port)
    try:
        s.sendall(_H2_PREFACE)
        t0 = time.monotonic()
        try:
            head = s.recv(64)
        except (TimeoutError, socket.timeout):
            raise CaptureTimeoutError(
                f"{host}:{port}: the port accepted the connection and did not answer in "
                f"{time.monotonic() - t0:.1f} s; it is not a working profiler server: check "
                f"that it is the port the target passed to jax.profiler.start_server") from None
        except ConnectionResetError:
            head = b""
    finally:
        s.close()
    if len(head) >= 4 and head[3] == _H2_SETTINGS:
        return
    said = f"it answered {head[:24].decode('latin-1')!r}" if head else "it closed the connection"
    kind = "an HTTP server" if head.startswith((b"HTTP/", b"<")) else "something else"
    raise NotProfilerServerError(
        f"{host}:{port}: not a jax profiler server ({said}, not HTTP/2): {kind} listens there; "
        f"check the port the target passed to jax.profiler.start_server")


def _find_xplanes(root: Path, since: float) -> list[Path]:
    found = [p for p in root.rglob("*.xplane.pb") if p.stat().st_mtime >= since - 1.0]
    return sorted(found, key=lambda p: p.stat().st_mtime)


class _Dirs:
    """The output directory of a capture, and what to remove when it fails: a temporary
    directory whole, or the empty folders the capture made in the user's."""

    def __init__(self, out_dir: str | os.PathLike | None) -> None:
        self.temporary = out_dir is None
        self.root = Path(tempfile.mkdtemp(prefix="traceroof-capture-")) if out_dir is None \
            else Path(out_dir)
        self.existed = {p for p in (self.root, *self.root.parents) if p.is_dir()}
        if self.root.is_dir():
            self.existed.update(p for p in self.root.rglob("*") if p.is_dir())
        self.root.mkdir(parents=True, exist_ok=True)

    def clean(self) -> None:
        if self.temporary:
            shutil.rmtree(self.root, ignore_errors=True)
            return
        made = [p for p in self.root.rglob("*") if p.is_dir()] + [self.root]
        for p in sorted(made, key=lambda d: len(d.parts), reverse=True):
            if p not in self.existed and not any(p.iterdir()):
                p.rmdir()


def capture_xplane(
    address: str,
    duration_s: float = 2.0,
    out_dir: str | os.PathLike | None = None,
    *,
    timeout_s: float | None = None,
    retries: int = 1,
    options: dict | None = None,
) -> Path:
    """Capture ``duration_s`` seconds from the profiler server at ``address`` and return the
    path of the written ``*.xplane.pb`` (verified non-empty).

    The file lands under ``out_dir`` (default: a new temporary directory, kept on success,
    removed on failure) in ``plugins/profile/<timestamp>/<host>_<port>.xplane.pb``, found
    recursively. An empty capture is retried ``retries`` times with the duration doubled each
    time (an idle target stays empty, a bursty one may not); no other failure is retried.

    Args:
        address: ``host:port`` of a process that called ``jax.profiler.start_server(port)``.
        duration_s: capture window, seconds.
        out_dir: where to write the capture.
        timeout_s: hard limit per attempt, seconds (default ``2 * duration + 20``); the client
            subprocess is killed at the limit.
        retries: extra attempts on an empty capture, each with twice the duration.
        options: profiler options (default :data:`DEFAULT_OPTIONS`).

    Raises:
        The errors of :mod:`traceroof.capture_errors` (BadAddressError, NoServerError,
        EmptyCaptureError, CaptureTimeoutError, NotProfilerServerError, ProfilerBusyError,
        TargetExitedError, CaptureUnavailable).
    """
    host, port = parse_address(address)
    if duration_s <= 0:
        raise BadAddressError(f"duration must be > 0 s, got {duration_s}")
    dirs = _Dirs(out_dir)
    opts = dict(DEFAULT_OPTIONS if options is None else options)
    duration = float(duration_s)
    try:
        for attempt in range(retries + 1):
            limit = timeout_s if timeout_s is not None else 2 * duration + 20
            probe(host, port)
            try:
                return _attempt(host, port, duration, dirs.root, limit, opts)
            except EmptyCaptureError:
                duration *= 2
                if attempt == retries:
                    raise
        raise AssertionError("unreachable")
    except CaptureError:
        dirs.clean()
        raise


def _attempt(host: str, port: int, duration: float, root: Path, limit: float,
             opts: dict) -> Path:
    started = time.time()
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="1")
    cmd = [sys.executable, "-c", _CLIENT, f"{host}:{port}", str(root),
           str(max(1, int(round(duration * 1000)))), json.dumps(opts)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        _kill(proc)
        raise CaptureTimeoutError(
            f"{host}:{port}: no capture result within {limit:.0f} s (capture window "
            f"{duration:.1f} s); the server accepted the connection but did not answer. "
            f"The client was stopped.") from None
    result = {}
    for line in reversed(out.splitlines()):
        if line.startswith("{"):
            try:
                result = json.loads(line)
                break
            except ValueError:
                continue
    status = result.get("status")
    if status == "unavailable":
        raise CaptureUnavailable(
            "live capture needs the xprof package (pip install 'traceroof[xprof]' or "
            f"pip install xprof): {result.get('error')}")
    files = _find_xplanes(root, started)
    if status != "ok":
        error = result.get("error") or (err.strip().splitlines() or ["client failed"])[-1]
        exc = classify(f"{host}:{port}", err, error, duration, result.get("elapsed_s"))
        if isinstance(exc, EmptyCaptureError) and files:
            exc.args = (f"{exc.args[0]} (an empty profile was written: {files[-1]})",)
        raise exc
    if not files:
        raise EmptyCaptureError(f"{host}:{port}: the capture reported success but no "
                                f"*.xplane.pb was written under {root}")
    path = files[-1]
    if path.stat().st_size == 0:
        raise EmptyCaptureError(f"{host}:{port}: the capture wrote an empty file: {path}")
    return path


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    try:
        proc.communicate(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def capture(
    address: str,
    duration_s: float = 2.0,
    out_dir: str | os.PathLike | None = None,
    *,
    timeout_s: float | None = None,
    retries: int = 1,
) -> Trace:
    """Capture ``duration_s`` seconds from ``address`` (``host:port`` of a process that called
    ``jax.profiler.start_server(port)``) and parse the result into a :class:`Trace`.

    The xplane is written under ``out_dir`` (default: a kept temporary directory); its path is
    ``trace.meta.sources[0]``. See :func:`capture_xplane` for arguments.

    Raises:
        the errors of :func:`capture_xplane`; EmptyCaptureError (7) also when the file parses
        but holds no op at all; TraceFormatError.
    """
    from .parsers import xplane

    path = capture_xplane(address, duration_s, out_dir, timeout_s=timeout_s, retries=retries)
    trace = xplane.read(path)
    if trace.ops.height == 0:
        raise EmptyCaptureError(
            f"{address}: captured {path} ({path.stat().st_size} bytes) but it holds no device "
            f"or XLA op: the target ran no computation during the {duration_s:.1f} s window")
    return trace


def count_steps(trace: Trace) -> int:
    """Distinct steps the ops of ``trace`` belong to (annotated or inferred; 0 with none)."""
    if "step" not in trace.ops.columns or trace.ops.height == 0:
        return 0
    return int(trace.ops["step"].drop_nulls().n_unique())


def capture_steps(address: str, steps: int, duration_s: float = 2.0,
                  out_dir: str | os.PathLike | None = None, *, max_duration_s: float = 120.0,
                  timeout_s: float | None = None, attempts: int = 3,
                  on_attempt=None) -> Trace:
    """Capture until at least ``steps`` steps were recorded: a first window of ``duration_s``
    seconds, then windows grown to the measured step rate (× 1.5, at most ``max_duration_s``)
    until the count is reached or ``attempts`` windows were taken.

    ``on_attempt(duration_s)`` is called before each window (progress). Returns the last
    capture; its ``meta`` warns when fewer steps than asked were recorded.

    Raises:
        BadAddressError: ``steps`` < 1; the errors of :func:`capture`. A TargetExitedError in
        a later window carries the earlier window's Trace as ``kept_trace`` and says its
        steps and ops.
    """
    if steps < 1:
        raise BadAddressError(f"--steps must be >= 1, got {steps}")
    made = out_dir is None
    if made:  # one kept temporary folder for all the windows (removed if nothing is kept)
        out_dir = tempfile.mkdtemp(prefix="traceroof-capture-")
    duration = float(duration_s)
    trace: Trace | None = None
    for _ in range(attempts):
        if on_attempt is not None:
            on_attempt(duration)
        try:
            trace = capture(address, duration, out_dir, timeout_s=timeout_s)
        except TargetExitedError as exc:
            if trace is not None:  # keep the window recorded before the target went away
                exc.kept_trace = trace
                exc.args = (f"{exc.args[0]}; kept the previous window "
                            f"({trace.meta.sources[0]}): {count_steps(trace)} steps, "
                            f"{trace.ops.height} ops",)
            elif made:
                shutil.rmtree(out_dir, ignore_errors=True)
            raise
        except CaptureError:
            if made:  # nothing kept: no folder left behind
                shutil.rmtree(out_dir, ignore_errors=True)
            raise
        got = count_steps(trace)
        if got >= steps or duration >= max_duration_s:
            break
        rate = got / duration if got else 0.0
        duration = min(max_duration_s, 1.5 * steps / rate if rate else 4 * duration)
    assert trace is not None
    got = count_steps(trace)
    if got < steps:
        trace.meta.warn(f"capture: {got} of the {steps} steps asked for were recorded in "
                        f"{duration:.1f} s (the last window)")
    return trace
