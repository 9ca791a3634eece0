"""Live capture from a running ``jax.profiler`` server, then parse it into a :class:`Trace`.

``traceroof.capture`` is this module (after ``import traceroof``, in any interpreter)::

    import traceroof
    trace = traceroof.capture.capture("localhost:9999", duration_s=2.0)   # -> Trace
    path = traceroof.capture.capture_xplane("localhost:9999", 2.0, "prof/")  # -> Path

The target process must have called ``jax.profiler.start_server(PORT)`` **and keep the returned
handle alive** (``server = jax.profiler.start_server(9999)``; jax itself also keeps a module
reference, but a handle that is stopped or collected means "no server" or an empty capture,
BC-19).

The client is xprof's profiler client (``xprof.convert._pywrap_profiler_plugin.trace``, the
one ``python -m jax.collect_profile`` uses), run in a **subprocess with a hard timeout**, so a
server that accepts the connection and never answers cannot hang the caller: the subprocess is
killed and :class:`CaptureTimeoutError` is raised.

Failure layers, each its own error and exit code (documented in docs/capture.md):

====================  ====  =====================================================
error                 code  meaning
====================  ====  =====================================================
NoServerError            6  DNS failure, connection refused, or no TCP answer
EmptyCaptureError        7  server reached, but nothing was recorded: the target ran
                            no XLA computation in the window (idle), the profiler
                            handle was freed/stopped, or the written file is empty
CaptureTimeoutError      8  no result within ``timeout_s`` (client killed)
CaptureUnavailable       9  the capture client (xprof) is not installed
====================  ====  =====================================================

``TF_CPP_MIN_LOG_LEVEL=3`` is set for the client (silences absl logging).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .errors import TraceroofError
from .trace import Trace

__all__ = [
    "CaptureError",
    "CaptureTimeoutError",
    "CaptureUnavailable",
    "EmptyCaptureError",
    "NoServerError",
    "capture",
    "capture_xplane",
    "parse_address",
]


class CaptureError(TraceroofError):
    """Base class of live-capture failures."""

    exit_code = 6


class NoServerError(CaptureError):
    """Nothing answers at the address: DNS failure, connection refused, or no TCP answer."""

    exit_code = 6


class EmptyCaptureError(CaptureError):
    """The server was reached but the capture holds nothing (idle target, freed handle,
    empty file)."""

    exit_code = 7


class CaptureTimeoutError(CaptureError):
    """The capture did not finish within its timeout; the client was killed."""

    exit_code = 8


class CaptureUnavailable(CaptureError):
    """The capture client (the ``xprof`` package) is not installed."""

    exit_code = 9


_CLIENT = r"""
import json, os, sys, time
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
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


def parse_address(address: str) -> tuple[str, int]:
    """``"host:port"``, ``"port"``, ``"grpc://host:port"`` or ``"[::1]:port"`` -> (host, port).

    Raises:
        NoServerError: the address has no valid port.
    """
    a = address.strip()
    if "://" in a:
        a = a.split("://", 1)[1]
    if a.isdigit():
        return "127.0.0.1", int(a)
    if a.startswith("["):
        host, _, rest = a[1:].partition("]")
        port = rest.lstrip(":")
    else:
        host, _, port = a.rpartition(":")
    if not port.isdigit() or not host:
        raise NoServerError(f"{address!r}: expected HOST:PORT (e.g. localhost:9999)")
    return host, int(port)


def _probe(host: str, port: int, timeout_s: float) -> None:
    """Fail fast when nothing listens: DNS, refused, or no TCP answer."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise NoServerError(f"{host}:{port}: cannot resolve host {host!r} ({exc})") from None
    last: Exception | None = None
    for family, kind, proto, _name, sockaddr in infos:
        s = socket.socket(family, kind, proto)
        s.settimeout(timeout_s)
        try:
            s.connect(sockaddr)
            return
        except ConnectionRefusedError as exc:
            last = exc
        except (TimeoutError, socket.timeout) as exc:
            last = exc
        except OSError as exc:
            last = exc
        finally:
            s.close()
    if isinstance(last, ConnectionRefusedError):
        raise NoServerError(
            f"{host}:{port}: connection refused -- no profiler server listens there. Start one "
            f"in the target with `server = jax.profiler.start_server({port})` and keep the "
            f"handle alive."
        )
    raise NoServerError(f"{host}:{port}: no TCP answer within {timeout_s:.0f} s ({last}); "
                        "check the host, the port and any firewall")


def _find_xplanes(root: Path, since: float) -> list[Path]:
    found = [p for p in root.rglob("*.xplane.pb") if p.stat().st_mtime >= since - 1.0]
    return sorted(found, key=lambda p: p.stat().st_mtime)


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

    The file lands under ``out_dir`` (default: a new temporary directory, kept) in
    ``plugins/profile/<timestamp>/<host>_<port>.xplane.pb``, found recursively. When the
    capture is empty it is retried ``retries`` times with the duration doubled each time
    (an idle target stays empty, a bursty one may not).

    Args:
        address: ``host:port`` of a process that called ``jax.profiler.start_server(port)``.
        duration_s: capture window, seconds.
        out_dir: where to write the capture.
        timeout_s: hard limit per attempt, seconds (default ``2 * duration + 20``); the client
            subprocess is killed at the limit.
        retries: extra attempts on an empty capture, each with twice the duration.
        options: profiler options (default :data:`DEFAULT_OPTIONS`).

    Raises:
        NoServerError, EmptyCaptureError, CaptureTimeoutError, CaptureUnavailable.
    """
    host, port = parse_address(address)
    if duration_s <= 0:
        raise EmptyCaptureError(f"duration must be > 0 s, got {duration_s}")
    root = Path(out_dir) if out_dir is not None else Path(
        tempfile.mkdtemp(prefix="traceroof-capture-"))
    root.mkdir(parents=True, exist_ok=True)
    opts = dict(DEFAULT_OPTIONS if options is None else options)
    duration = float(duration_s)
    empty: EmptyCaptureError | None = None
    for attempt in range(retries + 1):
        limit = timeout_s if timeout_s is not None else 2 * duration + 20
        _probe(host, port, timeout_s=min(5.0, max(1.0, limit / 4)))
        try:
            return _attempt(host, port, duration, root, limit, opts)
        except EmptyCaptureError as exc:
            empty = exc
            duration *= 2
            if attempt < retries:
                continue
    assert empty is not None
    raise empty


def _attempt(host: str, port: int, duration: float, root: Path, limit: float,
             opts: dict) -> Path:
    started = time.time()
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
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
            f"The client was stopped."
        ) from None
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
            f"pip install xprof): {result.get('error')}"
        )
    files = _find_xplanes(root, started)
    if status != "ok":
        message = result.get("error") or (err.strip().splitlines() or ["client failed"])[-1]
        if "No trace event" in message or "empty trace" in message.lower():
            where = f" (an empty profile was written: {files[-1]})" if files else ""
            raise EmptyCaptureError(
                f"{host}:{port}: the profiler server answered but recorded nothing in "
                f"{duration:.1f} s{where}. The target ran no jax/XLA computation during the "
                f"window (idle, blocked, or finished), or its profiler server handle was "
                f"stopped or garbage-collected: keep `server = jax.profiler.start_server(...)` "
                f"alive and capture while the work runs."
            )
        if "UNAVAILABLE" in message or "failed to connect" in message.lower():
            raise NoServerError(f"{host}:{port}: the profiler RPC failed: {message}")
        raise CaptureError(f"{host}:{port}: capture failed: {message}")
    if not files:
        raise EmptyCaptureError(
            f"{host}:{port}: the capture reported success but no *.xplane.pb was written "
            f"under {root}"
        )
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
        NoServerError (exit 6), EmptyCaptureError (7) -- also when the file parses but holds
        no op at all --, CaptureTimeoutError (8), CaptureUnavailable (9), TraceFormatError.
    """
    from .parsers import xplane

    path = capture_xplane(address, duration_s, out_dir, timeout_s=timeout_s, retries=retries)
    trace = xplane.read(path)
    if trace.ops.height == 0:
        raise EmptyCaptureError(
            f"{address}: captured {path} ({path.stat().st_size} bytes) but it holds no device "
            f"or XLA op: the target ran no computation during the {duration_s:.1f} s window"
        )
    return trace

