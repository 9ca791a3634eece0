"""Nothing imported that the input does not need (issue 19 item 5).

``traceroof analyze FILE --format json`` runs in a fresh interpreter and reports which heavy
packages ended up in ``sys.modules``. jax, jaxlib, torch, plotly, dash and pandas are
all installed by the ``test`` extra (so their absence is the code's doing, not the venv's):
none of them is needed to read a Kineto or an XPlane trace, cost its ops (XLA's costs come from
the HLO proto, not from jax) or write JSON. rich is needed only to print a table. numpy (~55 ms)
is no longer imported by the analysis (:mod:`traceroof.timeline` partitions device time with
polars); the readers still import it where they need it (the native Kineto scanner's columns
are numpy arrays, the XPlane readers decode and sort with it), so a Kineto run imports numpy
from ``traceroof.parsers`` only, and a Kineto file under 15 MB of JSON (decoded by msgspec) not
at all.
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
NS_RES = ("HolisticTraceAnalysis", "tests", "data", "ns_resolution_trace", "rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz")
DLRM_TAR = ("param", "et_replay", "tests", "inputs", "dlrm_kineto.tar.gz")
QWEN = ("TraceLens", "tests", "traces", "h100", "Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz")
MTIA = ("HolisticTraceAnalysis", "tests", "data", "mtia_inference_trace", "mtia_inference_rank_0.json.gz")
NESTING = ("HolisticTraceAnalysis", "tests", "data", "critical_path", "alexnet",
           "benchmark_result_2869224_1695835535_trace.json.gz")

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
    """Only the native Kineto scanner imports numpy on a Kineto trace, and only on a file of
    15 MB of JSON or more (``kineto.NATIVE_MIN_BYTES``): the time base, the steps, the costing,
    the findings and the report do their work in polars (``import numpy`` ran in no module
    outside ``traceroof.parsers``, lazily or not). The ns_resolution trace is 15,377,659 bytes
    of JSON (``zcat | wc -c``), so the scanner reads it: the probe sees that import."""
    got = _loaded("analyze", str(real(*NS_RES)), "--format", "json", "-q")
    assert got["exit"] == 0 and got["bytes"] > 1000, got
    assert got["numpy_from"] != [], got  # the probe sees imports: the native scanner's columns are numpy
    assert [m for m in got["numpy_from"] if not m.startswith("traceroof.parsers.")] == [], got


@pytest.mark.parametrize(("parts", "chip"), [(BERT, ()), (DLRM_TAR, ()), (NESTING, ()), (MTIA, ("--chip", "h100")),
                                             (QWEN, ())], ids=["bert", "dlrm-tar", "alexnet", "mtia", "qwen"])
def test_a_small_kineto_trace_imports_no_numpy(parts, chip):
    """Under 15 MB of JSON msgspec decodes the file (~60-90 ms of ``import numpy`` saved): no
    module ran ``import numpy`` and numpy is not loaded. bert: 1,078,563 bytes of JSON; the
    DLRM tar: 8 plain members of 0.9-1.0 MB each, with collectives (the speed of light's
    overlap test); HTA's alexnet: PyTorch 1.x links by nesting (``kineto_enclose``); HTA's MTIA
    trace: unlaunched kernels lent by eager ops (``graph_sources.build_source``; it names no
    chip); the Qwen trace (8,647,357 bytes of JSON): CUDA-graph replays matched to their eager
    twins (``graph_match.starts_of``)."""
    got = _loaded("analyze", str(real(*parts)), *chip, "--format", "json", "-q")
    assert got["exit"] == 0 and got["bytes"] > 1000, got
    assert got["numpy_from"] == [] and "numpy" not in got["loaded"], got


def test_importing_the_analysis_loads_no_numpy():
    """The stages, the report and the command line import without numpy (a fresh interpreter:
    nothing else loaded it first)."""
    code = "import sys, traceroof.analysis, traceroof.report, traceroof.cli; print('numpy' in sys.modules)"
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False"
