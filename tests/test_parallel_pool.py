"""The worker pool of ``--jobs`` (issue 19 items 4 and 7): no child outlives it, a script
without a ``__main__`` guard is told so in one line, workers import what reading needs and
nothing heavy, and the parent shares the work (results in input order whoever ran them).

The children are seen through ``/proc`` (``/proc/<pid>/stat``: state and parent pid;
``/proc/<pid>/environ``: a marker variable every descendant inherits), independently of
multiprocessing's own bookkeeping.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from make_unlaunched_ranks import write as write_ranks

from traceroof.parallel import run_parallel

REPO = Path(__file__).resolve().parents[1]


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{REPO / 'tests'}{os.pathsep}{REPO / 'fixtures'}")
    env.update(extra)
    return env


def _marked(marker: str) -> list[tuple[int, str]]:
    """Every live process whose environment holds ``marker``: ``(pid, state)``."""
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            if marker.encode() not in (p / "environ").read_bytes():
                continue
            state = (p / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        out.append((int(p.name), state))
    return out


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("pool") / "run"
    write_ranks(d)  # 4 ranks; this module imports neither click nor the CLI (see the import test)
    return d


#: the scripts' children() (pid, state): every process whose parent is this one, from /proc
CHILDREN_FN = """
def children():
    me = os.getpid()
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                rest = (p / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(rest[1]) == me:
                out.append((int(p.name), rest[0]))
    return out
"""

SCRIPT_CHILDREN = """
import os, sys
from pathlib import Path
import traceroof

""" + CHILDREN_FN + """
if __name__ == "__main__":
    t = traceroof.read_trace(sys.argv[1], jobs=2)
    print(len(t.meta.ranks), children())
"""


def test_no_child_process_is_left_once_the_read_returns(tmp_path, ranks):
    script = tmp_path / "children.py"
    script.write_text(SCRIPT_CHILDREN)
    res = subprocess.run([sys.executable, str(script), str(ranks)], capture_output=True, text=True,
                         env=_env(), timeout=300)
    assert res.returncode == 0, res.stderr
    # 4 ranks read; no child (worker, resource tracker, zombie) of the script is left
    assert res.stdout.split() == ["4", "[]"], res.stdout


def test_analyze_jobs_2_leaves_no_process_behind(tmp_path, ranks):
    marker = f"TRACEROOF_TEST_{uuid.uuid4().hex}"
    res = subprocess.run([sys.executable, "-m", "traceroof.cli", "analyze", str(ranks), "--chip", "h100",
                          "--jobs", "2", "-q"], capture_output=True, text=True, env=_env(**{marker: "1"}),
                         timeout=300)
    assert res.returncode == 0, res.stderr
    assert "aten::mm" in res.stdout
    assert _marked(marker) == []  # nothing the command started outlives it


SCRIPT_NO_GUARD = """
import sys
import traceroof
t = traceroof.read_trace(sys.argv[1], jobs=2)
print("ranks", len(t.meta.ranks))
"""


def test_a_script_without_the_main_guard_is_told_so_in_one_line(tmp_path, ranks):
    script = tmp_path / "no_guard.py"
    script.write_text(SCRIPT_NO_GUARD)
    res = subprocess.run([sys.executable, str(script), str(ranks)], capture_output=True, text=True,
                         env=_env(), timeout=300)
    assert res.returncode == 1
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("traceroof.errors.UsageError: ")
    assert str(script) in last and "if __name__ == \"__main__\":" in last
    assert "out of memory" not in res.stderr
    # the workers leave before multiprocessing prints its bootstrapping error in each of them
    assert "bootstrapping phase" not in res.stderr
    assert res.stderr.count("Traceback") == 1  # the script's own, with the one line at its end


def test_the_same_script_with_the_guard_reads_every_rank(tmp_path, ranks):
    script = tmp_path / "guarded.py"
    body = textwrap.indent(SCRIPT_NO_GUARD.split("import traceroof\n", 1)[1], "    ")
    script.write_text(f"import sys\nimport traceroof\nif __name__ == '__main__':\n{body}")
    res = subprocess.run([sys.executable, str(script), str(ranks)], capture_output=True, text=True,
                         env=_env(), timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["ranks", "4"]


def test_a_script_piped_into_python_reads_with_workers(ranks):
    # ``python -``: the main module is ``<stdin>``, no file a spawned worker can run (it died
    # looking for one, and the read said "out of memory? try fewer --jobs")
    res = subprocess.run([sys.executable, "-", str(ranks)], input=SCRIPT_NO_GUARD, capture_output=True,
                         text=True, env=_env(), timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["ranks", "4"]
    assert "Traceback" not in res.stderr


def modules_after_reading(path: str) -> tuple[int, list[str]]:
    """Run in a worker: read and prepare ``path`` as ``analyze`` does, then say who ran it and
    which modules that process holds."""
    from traceroof.io import _read_worker

    _read_worker(path, prepare=True)
    time.sleep(0.2)  # so that the parent cannot run every item before the worker has started
    return os.getpid(), sorted(sys.modules)


def test_a_worker_imports_what_reading_needs_and_nothing_heavy(ranks):
    files = sorted(str(p) for p in ranks.iterdir())
    assert "click" not in sys.modules or "traceroof.cli" in sys.modules  # (the CLI's, not this module's)
    # the parent runs some items itself: enough items that a worker surely gets some
    results = run_parallel(modules_after_reading, files * 4, jobs=2)
    theirs = [mods for pid, mods in results if pid != os.getpid()]
    assert theirs, "no item ran in a worker"
    tops = {m.split(".")[0] for m in theirs[0]}
    assert {"polars", "traceroof"} <= tops
    heavy = {"plotly", "dash", "rich", "jax", "jaxlib", "tensorflow", "torch", "pandas", "pyarrow", "click",
             "matplotlib", "flask", "IPython"}
    assert tops & heavy == set()
    ours = {m for m in theirs[0] if m.startswith("traceroof.")}
    assert not {m for m in ours if m.startswith(("traceroof.render", "traceroof.web", "traceroof.findings"))}
    assert "traceroof.analysis" not in ours and "traceroof.cli" not in ours


def slow_square(x: str) -> tuple[int, int]:
    time.sleep(0.05)  # long enough that the worker has started before this process is done
    return os.getpid(), int(x) ** 2


def test_results_come_in_input_order_whoever_ran_them():
    items = [str(i) for i in range(120)]
    out = run_parallel(slow_square, items, jobs=2)
    assert [v for _, v in out] == [i * i for i in range(120)]  # each item once, in input order
    # the parent took part (from the back) and a worker did too (from the front)
    pids = [pid for pid, _ in out]
    assert pids[-1] == os.getpid() and pids[0] != os.getpid()
    # one run of each: the worker's items are a prefix, the parent's the rest
    first_mine = pids.index(os.getpid())
    assert set(pids[first_mine:]) == {os.getpid()} and os.getpid() not in pids[:first_mine]


# --------------------------------------------------------------------------- early workers

SCRIPT_EARLY = """
import json, os, sys, time
from pathlib import Path
with open(os.environ["TOP_LEVEL_RUNS"], "a") as f:  # every process that runs this top level
    f.write(f"{os.getpid()}\\n")
from traceroof import parallel
from traceroof.parallel import early_workers, run_parallel

""" + CHILDREN_FN + """
if __name__ == "__main__":
    mode, jobs = sys.argv[1], int(sys.argv[2])
    out = {}
    with early_workers(1):
        procs = list(parallel._EARLY.pool._processes.values())
        out["before"] = sorted(pid for pid, _ in children())
        if mode == "one":
            import traceroof
            traceroof.read_trace(sys.argv[3], jobs=2)  # one file: read here
            out["stopped_inside"] = [p.exitcode for p in procs]
        if mode == "run":
            from test_parallel_pool import pid_and_main
            ran = run_parallel(pid_and_main, [str(i) for i in range(60)], jobs=jobs)
            out["theirs"] = sorted({pid for pid, _ in ran} - {os.getpid()})
            out["spawned"] = sorted({spawned for pid, spawned in ran if pid != os.getpid()})
            # released once the run is over: the workers leave before the block ends
            deadline = time.time() + 60
            while time.time() < deadline and {p for p, st in children() if st != "Z"} & set(out["theirs"]):
                time.sleep(0.05)
            out["left_inside"] = sorted({p for p, st in children() if st != "Z"} & set(out["theirs"]))
    out["exitcodes"] = [p.exitcode for p in procs]
    out["after"] = children()
    out["me"] = os.getpid()
    print(json.dumps(out))
"""


def pid_and_main(x: str) -> tuple[int, bool]:
    """Run in a worker: its pid, and whether it was spawned (a fresh interpreter, whose
    command line is multiprocessing's ``spawn_main``) rather than forked."""
    time.sleep(0.05)  # long enough that the worker takes some items
    return os.getpid(), b"spawn_main" in Path("/proc/self/cmdline").read_bytes()


def _early(tmp_path: Path, mode: str, jobs: int = 2, *args: str) -> dict:
    import json

    script = tmp_path / "early.py"
    script.write_text(SCRIPT_EARLY)
    runs = tmp_path / "top_level_runs.txt"
    res = subprocess.run([sys.executable, str(script), mode, str(jobs), *args], capture_output=True, text=True,
                         env=_env(TOP_LEVEL_RUNS=str(runs)), timeout=300)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    # the processes other than the script's own that ran its top level (spawn imports it)
    out["main_in_workers"] = sorted({int(x) for x in runs.read_text().split()} - {out["me"]})
    return out


def test_early_workers_run_the_next_read_and_leave_as_soon_as_it_is_done(tmp_path):
    out = _early(tmp_path, "run")
    # the items this process did not run ran on the worker started before the call
    assert out["theirs"] and set(out["theirs"]) <= set(out["before"])
    # forked (the script holds no polars, numpy or thread: parallel.fork_is_safe), so the
    # script's top level (main module) ran in no worker
    assert out["spawned"] == [False]
    assert out["main_in_workers"] == []
    assert out["left_inside"] == []  # gone before the block's end (released, reaped later)
    assert out["exitcodes"] == [0]  # it left on its own, not stopped
    assert out["after"] == []  # no worker, zombie or resource tracker outlives the block


def test_early_workers_nobody_used_are_stopped_where_they_are(tmp_path):
    out = _early(tmp_path, "idle")
    assert len(out["before"]) >= 1  # the worker (and the resource tracker) were up
    assert out["exitcodes"] == [-15]  # SIGTERM: not waited for (a wrong guess costs no wait)
    assert out["after"] == []


def test_early_workers_are_stopped_as_soon_as_the_read_is_of_one_file(tmp_path, ranks):
    out = _early(tmp_path, "one", 2, str(sorted(ranks.iterdir())[0]))
    assert out["stopped_inside"] == [-15]  # by the read itself, before the block's end
    assert out["after"] == []


def test_a_read_asking_for_more_workers_than_started_early_starts_its_own(tmp_path):
    out = _early(tmp_path, "run", jobs=3)  # two workers wanted, one started early
    assert out["exitcodes"] == [-15]  # the early one stopped at once
    assert len(out["theirs"]) == 2 and not set(out["theirs"]) & set(out["before"])
    assert out["spawned"] == [True]  # a plain pool's workers are spawned (the script imported polars)
    assert set(out["theirs"]) <= set(out["main_in_workers"])  # and they import the main module
    assert out["after"] == []


def test_likely_files_guesses_what_a_folder_a_glob_and_files_expand_to(tmp_path, ranks):
    from traceroof.io import resolve_inputs
    from traceroof.parallel import likely_files

    # the fixture's folder: exactly what the readers expand it to
    assert likely_files([str(ranks)]) == len(resolve_inputs(str(ranks))) == 4
    d = tmp_path / "d"
    d.mkdir()
    for name in ("a.json", "b.json.gz", "notes.txt"):
        (d / name).write_text("{}")
    assert likely_files([str(d)]) == 2  # a.json, b.json.gz; not the .txt
    assert likely_files([str(d / "a.json"), str(d / "notes.txt")]) == 2  # files given: each one
    assert likely_files([str(d / "*.json*")]) == 2  # a glob: its matches
    assert likely_files([str(d / "missing.json")]) == 0
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "meta.json").write_text("{}")
    (cache / "x.json").write_text("{}")
    assert likely_files([str(cache)]) == 0  # a cache is one input, read by this process


SCRIPT_BUFFERED = """
import os, sys
from traceroof.parallel import early_workers, run_parallel

if __name__ == "__main__":
    sys.stdout.write("written before the workers start\\n")  # a pipe: buffered, not yet flushed
    with early_workers(1):
        from test_parallel_pool import pid_and_main
        ran = run_parallel(pid_and_main, [str(i) for i in range(40)], jobs=2)
    print("workers", len({pid for pid, _ in ran} - {os.getpid()}))
"""


def test_output_buffered_before_a_fork_is_written_once(tmp_path):
    script = tmp_path / "buffered.py"
    script.write_text(SCRIPT_BUFFERED)
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         env=_env(TOP_LEVEL_RUNS=str(tmp_path / "runs.txt")), timeout=300)
    assert res.returncode == 0, res.stderr
    # a forked child would write the stdout buffer it inherited again when it exits
    # (multiprocessing's fork flushes the standard streams first)
    assert res.stdout.count("written before the workers start") == 1, res.stdout
    assert res.stdout.split()[-2:] == ["workers", "1"]  # the forked worker did run items


def test_fork_is_safe_only_before_polars_and_numpy_are_imported():
    def safe(code: str) -> str:
        res = subprocess.run([sys.executable, "-c", code + "; import traceroof.parallel as p; print(p.fork_is_safe())"],
                             capture_output=True, text=True, env=_env(), timeout=120)
        assert res.returncode == 0, res.stderr
        return res.stdout.strip()

    assert safe("import os") == "True"
    assert safe("import polars") == "False"
    assert safe("import numpy") == "False"
    assert safe("import threading, time; threading.Thread(target=time.sleep, args=(5,), daemon=True).start()") == "False"


def test_the_format_option_is_parsed_without_importing_polars():
    # the early workers start after click parsed the options: when --format's choices
    # imported traceroof.report (and polars), the workers could only be spawned, not forked
    code = ("import sys; from traceroof.cli import _RendererChoice; "
            "print(_RendererChoice().convert('json', None, None), 'polars' in sys.modules, 'numpy' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["json", "False", "False"]


def test_while_waiting_runs_once_here_after_this_process_ran_its_last_item():
    class Seen:  # what run_parallel calls of a Progress
        def __init__(self) -> None:
            self.done: list[str] = []

        def file_done(self, path: str, size: int, events: int) -> None:  # noqa: ARG002
            self.done.append(path)

    seen = Seen()
    calls: list[tuple[int, set[str]]] = []
    items = [str(i) for i in range(60)]
    out = run_parallel(slow_square, items, jobs=2, progress=seen,
                       while_waiting=lambda: calls.append((os.getpid(), set(seen.done))))
    assert [v for _, v in out] == [i * i for i in range(60)]
    assert len(calls) == 1 and calls[0][0] == os.getpid()
    mine = {items[i] for i, (pid, _) in enumerate(out) if pid == os.getpid()}
    assert mine and mine <= calls[0][1]  # every item this process ran was done before the call
    assert sorted(seen.done, key=int) == items  # and every item reported once, after it
    # with one job everything runs here: nothing to wait for, no call
    run_parallel(slow_square, items[:3], jobs=1, while_waiting=lambda: calls.append((0, set())))
    assert len(calls) == 1
