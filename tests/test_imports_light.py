"""What a command imports (issue 19 item 5): only what its input needs.

Each command runs in a fresh interpreter (``python -c``: nothing imported before it) and
reports the modules in ``sys.modules``. The heavy ones are all importable in the test venv
(:func:`test_the_modules_named_here_exist`), so their absence is the code's doing.

* ``--help``, ``--version`` and a usage error (exit 2) import no polars (~0.15 s): click
  parses, prints, exits.
* ``analyze`` of a Kineto trace to JSON imports no XPlane decoder, no XLA cost model, no
  dashboard, no renderer but ``render.json``, no numpy (under 15 MB of JSON), and none of
  jax, torch, pandas, scipy, plotly, dash, rich, IPython, protobuf, tomllib; and, for one
  file, nothing to start worker processes with (``multiprocessing``, the process pool: ~5 ms).
* ``analyze`` of an XPlane trace imports no Kineto decoder (msgspec events, the native
  scanner), no dashboard, no jax or torch.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from conftest import REPO, real

BERT = ("TraceLens", "tests", "traces", "h100", "gaunernst_bert-small-uncased__1016001.json.gz")
GPU_XPLANE = ("TraceLens", "tests", "traces", "mi300", "jax08_gemm", "tw003.xplane.pb")

#: third-party packages no ``analyze … --format json`` needs
THIRD_PARTY = ("jax", "jaxlib", "torch", "pandas", "scipy", "plotly", "dash", "rich", "IPython", "tomllib")
#: traceroof modules no ``analyze … --format json`` needs
OURS = ("traceroof.web", "traceroof.render.html", "traceroof.render.plots", "traceroof.render.table",
        "traceroof.render.terminal", "traceroof.capture", "traceroof.mcp_server", "traceroof.ingest",
        "traceroof.cache", "traceroof.diff", "traceroof.gate", "traceroof.estimate_plan")
#: what only a read of several files in worker processes needs (traceroof.parallel imports
#: them where it starts a pool)
PROCESSES = ("multiprocessing", "concurrent.futures.process")
#: what only an XPlane needs
XPLANE_ONLY = ("numpy", "google.protobuf", "traceroof.parsers.xplane_proto", "traceroof.parsers.xplane_assemble",
               "traceroof.costs.hlo", "traceroof.costs.hlo_model")
#: what only a Kineto trace needs
KINETO_ONLY = ("traceroof.parsers.kineto", "traceroof.parsers.kineto_stream", "traceroof.parsers.kineto_native",
               "traceroof.parsers._kineto_scan", "traceroof.parsers.kineto_link")

_PROBE = """
import contextlib, io, json, sys
from traceroof.cli import main
out = io.StringIO()
try:
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        main(sys.argv[1:])
    code = 0
except SystemExit as e:
    code = e.code
print(json.dumps({"exit": code, "bytes": len(out.getvalue()), "modules": sorted(sys.modules)}))
"""


def _run(*args: str) -> dict:
    res = subprocess.run([sys.executable, "-c", _PROBE, *args], cwd=REPO, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def _loaded(got: dict, names: tuple[str, ...]) -> list[str]:
    """The names of ``names`` imported (a package counts when any of its modules is)."""
    mods = got["modules"]
    return [n for n in names if any(m == n or m.startswith(n + ".") for m in mods)]


def test_the_modules_named_here_exist():
    """Each name is importable here: an absence below is the code's doing, not the venv's."""
    for n in THIRD_PARTY + OURS + XPLANE_ONLY + KINETO_ONLY + PROCESSES:
        assert importlib.util.find_spec(n) is not None, n


@pytest.mark.parametrize(("args", "exit_code"), [
    (["--help"], 0), (["--version"], 0), (["analyze", "--help"], 0), (["capture", "--help"], 0),
    (["gate", "--help"], 0), (["diff", "--help"], 0), (["serve", "--help"], 0), (["estimate", "--help"], 0),
    (["analyze"], 2),  # TRACE missing
    (["analyze", "t.json", "--top", "0"], 2),  # --top below its range
    (["analyze", "t.json", "--format", "pdf"], 2),  # no such renderer (the choices are listed without importing them)
    (["nonsense"], 2),
], ids=lambda v: " ".join(v) if isinstance(v, list) else str(v))
def test_help_version_and_usage_errors_import_no_polars(args, exit_code):
    got = _run(*args)
    assert got["exit"] == exit_code, got["exit"]
    assert "polars" not in got["modules"]
    assert _loaded(got, ("traceroof.analysis", "traceroof.report", "traceroof.io", "traceroof.parsers")) == []
    if args[-1] in ("--help", "--version"):
        assert got["bytes"] > 10  # it printed


def test_a_kineto_analyze_imports_nothing_of_xplane_dashboards_or_frameworks():
    got = _run("analyze", str(real(*BERT)), "--chip", "h100", "--format", "json", "-q")
    assert got["exit"] == 0 and got["bytes"] > 1000
    assert _loaded(got, THIRD_PARTY) == []
    assert _loaded(got, OURS) == []
    assert _loaded(got, XPLANE_ONLY) == []
    assert _loaded(got, PROCESSES) == []
    assert _loaded(got, KINETO_ONLY) == list(KINETO_ONLY)  # the probe sees what was imported
    assert "traceroof.render.json" in got["modules"]


def test_an_xplane_analyze_imports_no_kineto_decoder():
    got = _run("analyze", str(real(*GPU_XPLANE)), "--format", "json", "-q")
    assert got["exit"] == 0 and got["bytes"] > 1000
    assert _loaded(got, ("jax", "jaxlib", "torch", "pandas", "scipy", "plotly", "dash", "rich", "IPython")) == []
    assert _loaded(got, OURS) == []
    assert _loaded(got, KINETO_ONLY) == []
    assert _loaded(got, PROCESSES) == []
    assert _loaded(got, ("numpy", "traceroof.parsers.xplane_proto")) == ["numpy", "traceroof.parsers.xplane_proto"]


def test_a_reading_worker_warms_up_without_the_segmentation():
    # a worker imports what a read needs before its first file (io.warm_worker, overlapping
    # the parent's start); the per-rank segmentation only runs with three processes or more
    # (io.SEGMENT_MIN_PROCESSES): with two its modules (~15-30 ms of CPU) are not imported
    probe = ("import json, sys; from traceroof.io import warm_worker; warm_worker(); "
             "print(json.dumps(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=120)
    modules = set(json.loads(out.stdout))
    assert {"traceroof.parsers.kineto", "traceroof.rank_prep", "traceroof.costing", "traceroof.unlaunched"} <= modules
    assert not modules & {"traceroof.steps", "traceroof.timeline", "traceroof.roofline", "traceroof.chip_detect"}
