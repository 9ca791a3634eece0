"""Helpers of the live tests (capture, serve --live, watch): a tiny jax program with a
profiler server on a loopback port, and processes that are always stopped.

Every process started here is in its own process group and is killed (SIGKILL to the group)
by the fixture that started it; every wait has a bound.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: a jitted step of 2*64^3 + 64^2 FLOPs (the dot, then the multiply; tanh is a
#: transcendental), run every ~10 ms; mode "steps" wraps each execution in a
#: StepTraceAnnotation, "plain" does not, "idle" runs nothing after warm-up.
#: It prints one JSON line: {"ready": true, "flops": cost_analysis()["flops"]}.
JAX_TARGET = textwrap.dedent(
    """
    import json, os, sys, time
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax, jax.numpy as jnp
    port, mode, seconds = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
    server = jax.profiler.start_server(port)  # keep the handle alive (BC-19)

    @jax.jit
    def train_step(x):
        return jnp.tanh(x @ x) * 0.5

    x = jnp.ones((64, 64))
    cost = train_step.lower(x).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    train_step(x).block_until_ready()
    print(json.dumps({"ready": True, "flops": float(cost["flops"])}), flush=True)
    end, i = time.time() + seconds, 0
    while time.time() < end:
        if mode == "steps":
            with jax.profiler.StepTraceAnnotation("train", step_num=i):
                x = train_step(x).block_until_ready()
        elif mode == "plain":
            x = train_step(x).block_until_ready()
        i += 1
        time.sleep(0.01 if mode != "idle" else 0.05)
    """
)


#: a torch CPU loop profiled with a schedule: every cycle (wait 1, warmup 1, active 2 steps)
#: tensorboard_trace_handler writes one trace into DIR; `cycles` cycles, a matmul of
#: 2*128^3 FLOPs per step (argv: DIR, cycles, seconds to sleep per step).
TORCH_TARGET = textwrap.dedent(
    """
    import sys, time
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler
    out, cycles, pause = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    torch.set_num_threads(1)
    a = torch.ones(128, 128)
    sched = schedule(wait=1, warmup=1, active=2, repeat=cycles)
    with profile(activities=[ProfilerActivity.CPU], schedule=sched,
                 on_trace_ready=tensorboard_trace_handler(out, worker_name="w")) as prof:
        for _ in range(4 * cycles):
            b = a @ a
            time.sleep(pause)
            prof.step()
    print("DONE", flush=True)
    """
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def silent_acceptor() -> Iterator[int]:
    """A loopback port that accepts TCP connections and never sends a byte (the port); the
    listener and every accepted connection are closed on exit."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.2)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                pass

    th = threading.Thread(target=accept, daemon=True)
    th.start()
    try:
        yield srv.getsockname()[1]
    finally:
        stop.set()
        th.join(timeout=10)
        for c in held:
            c.close()
        srv.close()


def kill_group(p: subprocess.Popen) -> None:
    """SIGKILL the process group of ``p`` (started with start_new_session) and reap it."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


class Processes:
    """Processes a test starts; :meth:`stop_all` kills each one's group (the finalizer)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[subprocess.Popen] = []

    def popen(self, cmd: list[str], **kw) -> subprocess.Popen:
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.PIPE)
        env = dict(os.environ, PYTHONPATH=str(REPO), **kw.pop("env", {}))
        p = subprocess.Popen(cmd, text=True, start_new_session=True, env=env, **kw)
        self.procs.append(p)
        return p

    def jax_target(self, mode: str, seconds: float = 60.0) -> tuple[int, float, subprocess.Popen]:
        """Start the jax program; (port, cost_analysis FLOPs of one step, process) once it
        printed its ready line (at most 120 s)."""
        script = self.tmp / "jax_target.py"
        script.write_text(JAX_TARGET)
        port = free_port()
        p = self.popen([sys.executable, str(script), str(port), mode, str(seconds)],
                       stderr=subprocess.DEVNULL)
        line = _readline(p, 120)
        ready = json.loads(line)
        assert ready["ready"], line
        return port, ready["flops"], p

    def stop_all(self) -> None:
        for p in self.procs:
            kill_group(p)


def _readline(p: subprocess.Popen, timeout_s: float) -> str:
    import selectors

    sel = selectors.DefaultSelector()
    sel.register(p.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if sel.select(timeout=0.5):
            line = p.stdout.readline()
            if line:
                return line
        if p.poll() is not None:
            raise AssertionError(f"process exited with {p.returncode} before its first line")
    raise AssertionError(f"no line from the process within {timeout_s} s")


def traceroof(*args: str, timeout_s: float = 180, env: dict | None = None
              ) -> subprocess.CompletedProcess:
    """``python -m traceroof.cli ARGS`` of this checkout, bounded in time."""
    return subprocess.run([sys.executable, "-m", "traceroof.cli", *args], capture_output=True,
                          text=True, timeout=timeout_s,
                          env=dict(os.environ, PYTHONPATH=str(REPO), **(env or {})))


def gpu_trace(path: Path, idle_ns: int, steps: int = 4) -> Path:
    """Steps of one 100 µs bf16 GEMM kernel and ``idle_ns`` of host time: the step time is
    about ``idle_ns`` + 0.1 ms."""
    from tracegen import Kernel, TraceBuilder  # fixtures/ is on sys.path (conftest)

    b = TraceBuilder()
    for n in range(steps):
        b.begin_step(n)
        b.op("aten::mm", [[1024, 1024], [1024, 1024]], ["c10::BFloat16", "c10::BFloat16"],
             [Kernel("sm90_xmma_gemm_bf16bf16_bf16f32", 100_000)])
        b.idle_host(idle_ns)
        b.end_step()
    return b.write(path)
