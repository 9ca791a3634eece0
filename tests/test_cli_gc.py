"""The command line's garbage-collector policy (traceroof/cli.py ``main``): one-shot commands
run with the cyclic collector off and give it back on; the others keep it; `python -m
traceroof.cli` runs the module's body once."""

from __future__ import annotations

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
    during_enabled.append(gc.isenabled())
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
                  "enabled_after": gc.isenabled()}))
"""


def _probe(argv: list[str]) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argv)], env=env, cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_analyze_runs_without_collections_and_gives_the_collector_back(tmp_path):
    """A real analyze: no collection while it runs (a default-threshold run of bert makes
    ~100: 700 container allocations each), the collector enabled again afterwards."""
    got = _probe(["analyze", str(real(*BERT)), "--format", "json", "-q", "-o", str(tmp_path / "r.json")])
    assert got == {"code": 0, "collections": 0, "enabled_during": [False], "enabled_after": True}
    assert json.loads((tmp_path / "r.json").read_text())["trace"]["format"] == "kineto"


def test_collector_back_on_after_an_error_exit():
    got = _probe(["analyze", "/nonexistent/trace.json"])
    assert got == {"code": 3, "collections": 0, "enabled_during": [False], "enabled_after": True}


def test_other_commands_keep_the_collector():
    got = _probe(["--version"])
    assert got["code"] == 0 and got["enabled_during"] == [True] and got["enabled_after"] is True


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
