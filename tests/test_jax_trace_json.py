"""jax's trace-viewer JSON exports (``perfetto_trace.json.gz``): recognised by content and
refused with the ``.xplane.pb`` to pass instead; a profile folder holding both is read once,
from the XSpace. The export is generated here with jax on the CPU (fixtures/make_jax_profile.py)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from conftest import FIXTURES, REPO, write

from traceroof import read_trace
from traceroof.errors import TraceFormatError
from traceroof.parsers import registry


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A real jax CPU profile, written with ``create_perfetto_trace=True``: its run folder."""
    log = tmp_path_factory.mktemp("jaxprof")
    code = ("import sys; from pathlib import Path; import make_jax_profile as m; "
            "sys.exit(0 if len(m.write_profile(Path(sys.argv[1]), perfetto=True)) == 1 else 1)")
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": f"{FIXTURES}{os.pathsep}{REPO}"}
    subprocess.run([sys.executable, "-c", code, str(log)], check=True, env=env, timeout=300)
    (run,) = (log / "plugins" / "profile").iterdir()
    return run


def _events(path: Path) -> list[dict]:
    return json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]


def test_the_export_is_recognised_by_content(run_dir):
    export = run_dir / "perfetto_trace.json.gz"
    ev = _events(export)
    # what jax writes: processes named after the XSpace planes, and a trailing {} (BC-04)
    assert {"ph": "M", "pid": ev[0]["pid"], "name": "process_name", "args": {"name": "/host:CPU"}} in ev
    assert ev[-1] == {}
    assert registry.detect(export).name == "jax_trace_json"
    # the same bytes under another name are still recognised (content, not the suffix)
    other = write(run_dir.parent, "renamed.json.gz", export.read_bytes())
    assert registry.detect(other).name == "jax_trace_json"


def test_the_export_is_refused_naming_the_xplane_beside_it(run_dir):
    export = run_dir / "perfetto_trace.json.gz"
    (xplane,) = run_dir.glob("*.xplane.pb")
    with pytest.raises(TraceFormatError) as e:
        read_trace(export)
    msg = str(e.value)
    assert "\n" not in msg and "jax's Perfetto export" in msg
    assert msg.endswith(f"pass the .xplane.pb beside it: {xplane}")
    assert "no HLO costs" in msg


def test_the_cli_exits_4_with_one_line(run_dir):
    export = run_dir / "perfetto_trace.json.gz"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-m", "traceroof.cli", "analyze", str(export)], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 4  # README: 4 invalid or unsupported trace
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr and ".xplane.pb beside it" in lines[0]


def test_the_xplane_holds_every_op_of_the_export(run_dir):
    """Pointing to the XSpace loses nothing: the export's HLO-op events are the op table's
    ops (same count, same durations), and the folder is read once, from the XSpace."""
    (xplane,) = run_dir.glob("*.xplane.pb")
    ops = read_trace(xplane).ops
    hlo = [e for e in _events(run_dir / "perfetto_trace.json.gz")
           if e.get("ph") == "X" and "hlo_op" in (e.get("args") or {})]
    assert len(hlo) == ops.height > 0
    # the export's µs (3 decimals) → ns
    assert Counter(round(e["dur"] * 1000) for e in hlo) == Counter(ops["dur_ns"].to_list())
    assert Counter(e["args"]["hlo_op"] for e in hlo) == Counter(ops["name"].to_list())
    others = [p for p in run_dir.iterdir() if not p.name.endswith(".xplane.pb")]
    for folder in (run_dir, run_dir.parent.parent.parent):  # the run folder, the log dir
        t = read_trace(folder)
        assert t.meta.format == "xplane" and t.ops.height == ops.height  # not double counted
        assert t.meta.stats["xplane.files_ignored"] == len(others) >= 1


def _export(events: list[dict]) -> bytes:
    return gzip.compress(json.dumps({"displayTimeUnit": "ns", "traceEvents": events}).encode())


def test_a_built_gpu_export_with_a_trailing_empty_event(tmp_path):
    events = [
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/device:GPU:0"}},
        {"ph": "M", "pid": 1, "tid": 2, "name": "thread_name", "args": {"name": "XLA Ops"}},
        {"ph": "X", "pid": 1, "tid": 2, "ts": 1.0, "dur": 2.5, "name": "fusion.1",
         "args": {"hlo_op": "fusion.1", "hlo_module": "jit_f"}},
        {},
    ]
    p = write(tmp_path, "perfetto_trace.json.gz", _export(events))
    with pytest.raises(TraceFormatError, match="none is beside this file"):
        read_trace(p)
    xplane = write(tmp_path, "host0.xplane.pb", b"")
    with pytest.raises(TraceFormatError) as e:
        read_trace(p)
    assert str(e.value).endswith(f"beside it: {xplane}")


def test_kineto_json_is_not_taken_for_an_export(tmp_path):
    # Kineto names its processes by pid / "GPU 0"; the BC-04 repro stays a Kineto trace
    kin = {"traceEvents": [{"ph": "M", "pid": 7, "name": "process_name", "args": {"name": "python 7"}},
                           {"ph": "X", "name": "k", "pid": 1, "tid": 1, "ts": 0, "dur": 5}, {}],
           "metadata": {"x": 1}}
    p = write(tmp_path, "t.json", json.dumps(kin))
    assert registry.detect(p).name == "kineto"
    assert read_trace(p).meta.stats["skipped_empty"] == 1
