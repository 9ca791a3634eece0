"""Nothing imported that the input does not need (issue 19 item 5).

``traceroof analyze FILE --format json`` runs in a fresh interpreter and reports which heavy
packages ended up in ``sys.modules``. jax, jaxlib, torch, plotly, dash and pandas are
all installed by the ``test`` extra (so their absence is the code's doing, not the venv's):
none of them is needed to read a Kineto or an XPlane trace, cost its ops (XLA's costs come from
the HLO proto, not from jax) or write JSON. rich is needed only to print a table. numpy (~55 ms)
is no longer imported by the analysis (:mod:`traceroof.timeline` partitions device time with
polars); the readers still import it (the native Kineto scanner's columns are numpy arrays, the
XPlane assembly sorts with it), so a Kineto run imports numpy from ``traceroof.parsers`` only.
protobuf is imported for an XPlane (its plane metadata is decoded by upb), not its
``descriptor_pb2`` module (~12 ms), which only building the message classes needed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from conftest import REPO, real

HEAVY = ("jax", "jaxlib", "torch", "plotly", "dash", "pandas", "rich", "numpy", "tomllib")
NEVER = ("jax", "jaxlib", "torch", "plotly", "dash", "pandas")

BERT = ("TraceLens", "tests", "traces", "h100", "gaunernst_bert-small-uncased__1016001.json.gz")
GPU_XPLANE = ("TraceLens", "tests", "traces", "mi300", "jax08_gemm", "tw003.xplane.pb")
TPU_XPLANE = ("xprof", "xprof", "convert", "test_xplanes", "tpu_inference_2.xplane.pb")

_PROBE = """
import builtins, contextlib, io, json, sys
numpy_from = set()  # the modules whose code runs an `import numpy` (a cached one included)
_imp = builtins.__import__
def _hook(name, globals=None, locals=None, fromlist=(), level=0):
    if name.split(".")[0] == "numpy":
        numpy_from.add((globals or {}).get("__name__", "?"))
    return _imp(name, globals, locals, fromlist, level)
builtins.__import__ = _hook
from traceroof.cli import main
out = io.StringIO()
try:
    with contextlib.redirect_stdout(out):
        main(sys.argv[1:])
    code = 0
except SystemExit as e:
    code = e.code
loaded = sorted({m.split(".")[0] for m in sys.modules} & set(%r))
ours = sorted(m for m in numpy_from if m.split(".")[0] == "traceroof")
print(json.dumps({"exit": code, "loaded": loaded, "bytes": len(out.getvalue()), "numpy_from": ours,
                  "descriptor_pb2": "google.protobuf.descriptor_pb2" in sys.modules}))
""" % (HEAVY,)


def _loaded(*args: str) -> dict:
    res = subprocess.run([sys.executable, "-c", _PROBE, *args], cwd=REPO, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=120)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_the_heavy_packages_are_installed():
    """The absence asserted below means something only if they could have been imported."""
    missing = [m for m in NEVER + ("rich",) if importlib.util.find_spec(m) is None]
    assert missing == []


@pytest.mark.parametrize("parts", [BERT, GPU_XPLANE, TPU_XPLANE], ids=["kineto", "xplane-gpu", "xplane-tpu"])
def test_json_output_imports_no_heavy_package(parts):
    got = _loaded("analyze", str(real(*parts)), "--format", "json", "-q")
    assert got["exit"] == 0 and got["bytes"] > 1000, got
    assert [m for m in got["loaded"] if m in NEVER] == []
    assert "rich" not in got["loaded"]  # no table printed
    assert "tomllib" not in got["loaded"]  # the chip table is read from chips.parsed.json
    assert not got["descriptor_pb2"]  # the XSpace messages are loaded from bytes


def test_a_table_imports_rich_and_still_no_jax():
    got = _loaded("analyze", str(real(*GPU_XPLANE)), "-q")
    assert got["exit"] == 0
    assert "rich" in got["loaded"]
    assert [m for m in got["loaded"] if m in NEVER] == []


def test_the_analysis_imports_no_numpy():
    """Only the readers import numpy on a Kineto trace: the time base, the steps, the costing,
    the findings and the report do their work in polars (``import numpy`` ran in no module
    outside ``traceroof.parsers``, lazily or not)."""
    got = _loaded("analyze", str(real(*BERT)), "--format", "json", "-q")
    assert got["exit"] == 0 and got["bytes"] > 1000, got
    assert got["numpy_from"] != [], got  # the probe sees imports: the native scanner's columns are numpy
    assert [m for m in got["numpy_from"] if not m.startswith("traceroof.parsers.")] == [], got


def test_importing_the_analysis_loads_no_numpy():
    """The stages, the report and the command line import without numpy (a fresh interpreter:
    nothing else loaded it first)."""
    code = "import sys, traceroof.analysis, traceroof.report, traceroof.cli; print('numpy' in sys.modules)"
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False"
