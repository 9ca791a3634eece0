"""The command line's garbage-collector policy (traceroof/cli.py ``main``): one-shot commands
run with the cyclic collector's first threshold raised and put the old one back; the others
keep it; `python -m traceroof.cli` runs the module's body once; an XPlane read leaves no
cycle holding the file's bytes."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys

import pytest
from conftest import REPO, real

from traceroof import cli

BERT = ("TraceLens", "tests", "traces", "h100", "gaunernst_bert-small-uncased__1016001.json.gz")


@pytest.mark.parametrize(("argv", "one_shot"), [
    (["analyze", "t.json"], True), (["--version"], False), (["serve", "t.json"], False),
    (["watch", "dir"], False), (["mcp"], False), (["capture", "localhost:9999"], False),
    ([], False), (["gate", "r.json", "--min-mfu", "0.3"], True), (["chips"], True),
])
def test_one_shot(argv, one_shot):
    assert cli._one_shot(argv) is one_shot


PROBE = """
import gc, json, sys
from traceroof import cli
runs, during_enabled = [], []
gc.callbacks.append(lambda phase, info: phase == "start" and runs.append(info["generation"]))
real_run = cli._run
inside = []


def wrapped(argv):
    during_enabled.append(list(gc.get_threshold()))
    before = len(runs)
    try:
        real_run(argv)
    finally:
        inside.append(len(runs) - before)


cli._run = wrapped
argv = json.loads(sys.argv[1])
code = 0
try:
    cli.main(argv)
except SystemExit as exc:
    code = exc.code
during = sum(inside)  # collections while the command ran
gc.collect()
print(json.dumps({"code": code, "collections": during, "enabled_during": during_enabled,
                  "enabled_after": list(gc.get_threshold())}))
"""


def _probe(argv: list[str]) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argv)], env=env, cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


RAISED, DEFAULT = list(cli.ONE_SHOT_GC_THRESHOLDS), list(gc.get_threshold())


def test_analyze_runs_with_few_collections_and_gives_the_thresholds_back(tmp_path):
    """A real analyze: a handful of collections while it runs (a default-threshold run of
    bert makes ~100: one per 700 container allocations), the old thresholds back after."""
    assert DEFAULT == [700, 10, 10]  # CPython's defaults, as this test process runs them
    got = _probe(["analyze", str(real(*BERT)), "--format", "json", "-q", "-o", str(tmp_path / "r.json")])
    assert got["code"] == 0 and got["enabled_during"] == [RAISED] and got["enabled_after"] == DEFAULT
    assert got["collections"] <= 10, got
    assert json.loads((tmp_path / "r.json").read_text())["trace"]["format"] == "kineto"


def test_thresholds_back_after_an_error_exit():
    got = _probe(["analyze", "/nonexistent/trace.json"])
    assert got["code"] == 3 and got["enabled_during"] == [RAISED] and got["enabled_after"] == DEFAULT


def test_other_commands_keep_the_collector():
    got = _probe(["--version"])
    assert got["code"] == 0 and got["enabled_during"] == [DEFAULT] and got["enabled_after"] == DEFAULT


def test_an_xplane_read_leaves_no_cycle_holding_the_file():
    """The planes, their line feed and its jobs were a cycle holding the file's bytes (freed
    only by the cyclic collector): with the collector off, reads of a 3 MB XPlane file grew
    the process by ~9 MB each. Now reference counting frees them: a collection afterwards
    finds no plane or plane scan among the garbage."""
    from traceroof import read_trace
    from traceroof.parsers import xplane_planes, xplane_proto

    path = real("profiler", "demo", "plugins", "profile", "GPU-multi-worker", "34.83.195.179_6003.xplane.pb")
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        read_trace(path)
        gc.collect()
        kinds = {type(o).__name__ for o in gc.garbage}
        held = [o for o in gc.garbage if isinstance(o, (xplane_planes.Plane, xplane_proto.PlaneScan))]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert not held, sorted(kinds)[:20]


def test_python_m_runs_the_body_once():
    """`python -m traceroof.cli`: the module body runs as traceroof.cli only, not again as
    __main__ (counted by the commands click registers: one group object)."""
    code = ("import runpy, sys, click; n = []; orig = click.Group.add_command\n"
            "def add(self, *a, **k):\n    n.append(self.name); return orig(self, *a, **k)\n"
            "click.Group.add_command = add\n"
            "sys.argv = ['traceroof', '--version']\n"
            "try:\n    runpy.run_module('traceroof.cli', run_name='__main__')\n"
            "except SystemExit:\n    pass\n"
            "print(len(n), len(set(map(id, [sys.modules['traceroof.cli'].cli]))))")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    registered, _ = map(int, out.stdout.split()[-2:])
    commands = len(cli.cli.commands)  # every command registered once, by the one module body
    assert registered == commands
