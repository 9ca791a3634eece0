"""The command line's fast exit (traceroof/cli_entry.py ``entry``): a one-shot command ends the
process with ``os._exit`` once its output is flushed, so the output and the exit code are
those of the normal exit, and no ``atexit`` hook runs; other commands, and
``TRACEROOF_FULL_EXIT=1``, exit as usual. The oracle for "the output is whole" is the same
command run in process through :func:`traceroof.cli.main` (no fast exit there)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import REPO, real

BERT = ("TraceLens", "tests", "traces", "h100", "gaunernst_bert-small-uncased__1016001.json.gz")

# runs entry() as the console script does, with an atexit hook that leaves a mark in a file
SCRIPT = """
import atexit, sys
mark = sys.argv.pop(1)
atexit.register(lambda: open(mark, "w").write("atexit ran"))
sys.argv[0] = "traceroof"
from traceroof.cli_entry import entry
entry()
"""


def _run(tmp_path, *args, full=False):
    mark = tmp_path / "mark"
    mark.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("TRACEROOF_FULL_EXIT", None)
    if full:
        env["TRACEROOF_FULL_EXIT"] = "1"
    p = subprocess.run([sys.executable, "-c", SCRIPT, str(mark), *args], capture_output=True, env=env,
                       cwd=tmp_path, timeout=120)
    return p, mark.exists()


def _in_process(capsys, *args) -> str:
    from traceroof import cli

    capsys.readouterr()
    try:
        cli.main(list(args))
    except SystemExit as exc:  # click's own exit on success, where it raises one
        assert exc.code in (0, None)
    return capsys.readouterr().out


def test_a_one_shot_command_exits_at_once_with_its_whole_output(tmp_path, capsys):
    args = ("analyze", str(real(*BERT)), "--chip", "h100", "-q", "--format", "json")
    fast, hook_ran = _run(tmp_path, *args)
    assert fast.returncode == 0 and not hook_ran  # os._exit: the interpreter's exit did not run
    full, full_hook_ran = _run(tmp_path, *args, full=True)
    assert full.returncode == 0 and full_hook_ran
    doc = json.loads(fast.stdout)  # whole JSON on a pipe (a cut flush would not parse)
    ref = json.loads(_in_process(capsys, *args))
    for d in (doc, ref):
        d.pop("created_at", None)
    assert doc == ref and len(fast.stdout) == len(full.stdout)


def test_an_output_file_is_whole_and_the_error_codes_stay(tmp_path):
    out = tmp_path / "r.json"
    p, hook_ran = _run(tmp_path, "analyze", str(real(*BERT)), "--chip", "h100", "-q", "-o", str(out))
    assert p.returncode == 0 and not hook_ran
    assert json.loads(out.read_text())["ops"]  # parses: written and closed before the exit
    bad = tmp_path / "bad.json"
    bad.write_text("not a trace")
    p, hook_ran = _run(tmp_path, "analyze", str(bad), "--chip", "h100")
    assert p.returncode == 4 and not hook_ran
    assert p.stderr.decode().strip().splitlines()[-1].startswith(f"traceroof: error: {bad}")
    p, hook_ran = _run(tmp_path, "analyze", str(real(*BERT)), "--chip", "no-such-chip")
    assert p.returncode != 0 and p.stderr  # an unknown chip is an error with its line
    p, hook_ran = _run(tmp_path, "analyze", "--no-such-option")
    assert p.returncode == 2 and not hook_ran and b"no-such-option" in p.stderr


def test_other_commands_exit_as_usual(tmp_path):
    p, hook_ran = _run(tmp_path, "--version")
    assert p.returncode == 0 and hook_ran and p.stdout.strip()


def test_the_command_line_keeps_openblas_to_one_thread(monkeypatch):
    """``entry`` sets ``OPENBLAS_NUM_THREADS=1`` before anything imports numpy (its OpenBLAS
    would start a thread per core, ~0.1 s of CPU, for no linear algebra), unless the user set
    it: their value stays."""
    import traceroof.cli as cli
    from traceroof import cli_entry

    seen = []
    monkeypatch.setattr(cli, "main", lambda: seen.append(os.environ.get("OPENBLAS_NUM_THREADS")))
    monkeypatch.setattr(cli, "_one_shot", lambda _ctx: False)  # exits by SystemExit, not os._exit
    for preset, want in ((None, "1"), ("4", "4")):
        if preset is None:
            monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
        else:
            monkeypatch.setenv("OPENBLAS_NUM_THREADS", preset)
        try:
            cli_entry.entry()
        except SystemExit as exc:
            assert exc.code == 0
        assert seen[-1] == want
