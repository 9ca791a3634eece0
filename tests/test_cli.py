"""The CLI contract: outputs, formats, exit codes, one clear line per error (DESIGN §9)."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import REAL, REPO, real, write

from traceroof.cli import cli

QWEN = "TraceLens/tests/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"


def run(*args: str):
    return CliRunner().invoke(cli, list(args))


def test_analyze_table_shows_what_was_read_summary_ranking_and_warnings():
    res = run("analyze", str(real(QWEN)), "--top", "5")
    assert res.exit_code == 0, res.output
    out = res.output
    for needle in ("kineto:", "NVIDIA H100", "bf16 989.4 TFLOP/s", "3.35 TB/s", "cost coverage", "step time",
                   "device busy", "HFU", "Top 5 ops", "gap", "efficiency", "Warnings:", "no host launch",
                   "[h100_sxm]"):  # bracketed text is printed, not eaten as rich markup
        assert needle in out, needle


def test_analyze_json_is_versioned_and_ranked_by_gap():
    res = run("analyze", str(real(QWEN)), "--format", "json", "--top", "50", "-q")
    assert res.exit_code == 0
    d = json.loads(res.stdout)
    assert d["schema_version"] == 2
    gaps = [r["gap_ns"] for r in d["ranking"] if r["gap_ns"] is not None]
    assert gaps == sorted(gaps, reverse=True) and len(gaps) > 5
    r0 = d["ranking"][0]
    assert abs(r0["measured_ns"] - r0["expected_ns"] - r0["gap_ns"]) < 1e-6 * r0["measured_ns"]
    assert d["chip"]["key"] == "h100_sxm"


def test_analyze_csv_and_markdown():
    res = run("analyze", str(real(QWEN)), "--format", "csv", "--top", "7", "-q")
    rows = list(csv.DictReader(io.StringIO(res.output)))
    assert len(rows) == 7 and {"label", "gap_ns", "measured_ns", "expected_ns", "bound"} <= set(rows[0])
    md = run("analyze", str(real(QWEN)), "--format", "markdown", "-q").output
    assert md.startswith("# traceroof report") and "| op | kind |" in md


def test_output_json_saves_full_report_that_reloads(tmp_path):
    out = tmp_path / "r.json"
    res = run("analyze", str(real(QWEN)), "-o", str(out), "-q")
    assert res.exit_code == 0
    res2 = run("analyze", str(out), "--format", "json", "-q")
    assert res2.exit_code == 0
    a, b = json.loads(out.read_text()), json.loads(res2.stdout)
    assert a["ranking"][:20] == b["ranking"]
    assert len(a["ops"]["dur_ns"]) == a["trace"]["device_ops"]


def test_rank_and_step_filters():
    p = str(real("param/et_replay/tests/inputs/dlrm_kineto.tar.gz"))
    d = json.loads(run("analyze", p, "--rank", "3", "--format", "json", "-q").output)
    assert d["filters"]["rank"] == 3 and {s["rank"] for s in d["steps"]} == {3}
    res = run("analyze", p, "--rank", "42")
    assert res.exit_code == 2 and "--rank 42" in res.output
    res = run("analyze", p, "--step", "999", "--rank", "0")
    assert res.exit_code == 2 and "--step 999" in res.output


@pytest.mark.parametrize(
    "make, code, needle",
    [
        (lambda tmp: str(tmp / "nope.json"), 3, "no such file"),
        (lambda tmp: str(write(tmp, "empty.json", b"")), 4, "empty file"),
        (lambda tmp: str(write(tmp, "x.json", b"<html>")), 4, "byte 0"),
        (lambda tmp: str(write(tmp, "t.json", json.dumps({"traceEvents": [
            {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 0, "dur": 1}]}))), 5, "--chip"),
    ],
)
def test_bad_input_is_one_line_with_exit_code(tmp_path, make, code, needle):
    res = run("analyze", make(tmp_path))
    assert res.exit_code == code, res.output
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("traceroof: error:") and needle in lines[0]


def test_unknown_chip_lists_candidates():
    res = run("analyze", str(real(QWEN)), "--chip", "h1000")
    assert res.exit_code == 5
    assert "h100" in res.output.lower()


def test_usage_error_exit_2_via_console_script():
    p = subprocess.run([sys.executable, "-m", "traceroof.cli", "analyze", "--top", "zero", "x"],
                       capture_output=True, text=True, cwd=REPO)
    assert p.returncode == 2 and "Traceback" not in p.stderr


def test_debug_shows_traceback(tmp_path):
    p = subprocess.run([sys.executable, "-m", "traceroof.cli", "analyze", str(write(tmp_path, "e.json", b"")), "--debug"],
                       capture_output=True, text=True, cwd=REPO)
    assert p.returncode != 0 and "Traceback" in p.stderr


def test_chips_lists_ridge_points():
    res = run("chips", "--format", "json")
    rows = {r["key"]: r for r in json.loads(res.stdout)}
    # ridge = dense bf16 peak / HBM bandwidth: 989.4e12 / 3.35e12 = 295.3
    assert round(rows["h100_sxm"]["ridge_point_flops_per_byte"]) == 295
    table = run("chips").output
    assert "h100_sxm" in table and "ridge" in table


def test_every_command_help_has_an_example():
    for name, cmd in cli.commands.items():
        res = run(name, "--help")
        assert res.exit_code == 0 and "Example" in res.output, name


def test_xplane_tpu_profile_end_to_end():
    res = run("analyze", str(real("xprof/xprof/convert/test_xplanes/tpu_inference_2.xplane.pb")), "--format", "json", "-q", "--top", "50")
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["chip"]["key"] == "tpu_v6e" and d["trace"]["format"] == "xplane"
    assert d["coverage"]["trace_share"] == pytest.approx(1.0)  # per-op FLOPs/bytes from the trace
    # async copy halves are exposed transfer time: expected 0, never "above the roof"
    done = [r for r in d["ranking"] if r["label"].startswith("copy-done")]
    assert done and all(r["expected_ns"] == 0 for r in done)
    assert not any("copy" in (i.get("op") or "") for i in d["inconsistencies"])


def test_cpu_jax_profile_with_a_user_chip_file():
    from conftest import FIXTURES

    chip = FIXTURES / "jax_cpu" / "cpu_chip.toml"
    res = run("analyze", str(FIXTURES / "jax_cpu" / "train_step.xplane.pb"), "--chip", str(chip), "--format", "json", "-q")
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["chip"]["peak_flops_per_s"]["fp32"] == 160e9 and d["chip"]["reason"].endswith("cpu_chip.toml")
    assert d["coverage"]["costed_share"] == pytest.approx(1.0)
    res = run("analyze", str(FIXTURES / "jax_cpu" / "train_step.xplane.pb"))
    assert res.exit_code == 5 and "'CPU'" in res.output  # a CPU is no chip in the database


XPLANES = sorted(str(p.relative_to(REAL)) for p in REAL.rglob("*.xplane.pb*"))


def test_xplane_corpus_is_present():
    assert len(XPLANES) == 7, XPLANES  # 6 profiles + the UTF-8-mangled copy


@pytest.mark.parametrize("rel", XPLANES)
def test_every_real_xplane_gives_a_report_or_one_clear_error(rel):
    res = run("analyze", str(real(rel)), "--top", "3", "-q")
    assert "Traceback" not in res.output
    if rel.endswith("utf8-mangled"):
        lines = [x for x in res.output.splitlines() if x.strip()]
        assert res.exit_code == 4 and len(lines) == 1
        assert rel.split("/")[-1] in lines[0] and "byte 1" in lines[0]
        return
    assert res.exit_code == 0, res.output
    assert "xplane:" in res.output and "Top 3 ops" in res.output


# -- many inputs and --jobs (issue 7 items 3-4) -------------------------------------------------


@pytest.mark.parametrize("command", ["analyze", "ingest", "gate", "serve"])
def test_jobs_option_defaults_to_the_core_count(command):
    res = run(command, "--help")
    assert res.exit_code == 0
    text = " ".join(res.output.split())
    assert "--jobs INTEGER RANGE" in text and "Default: the core count." in text


def test_a_saved_report_cannot_be_mixed_with_other_inputs(tmp_path):
    report = tmp_path / "r.json"
    assert run("analyze", str(real(QWEN)), "-o", str(report), "-q").exit_code == 0
    res = run("analyze", str(report), str(real(QWEN)))
    assert res.exit_code == 2
    assert "is a saved report" in res.output


def test_gate_reads_a_glob_of_ranks_in_parallel(tmp_path):
    from test_many_ranks import write_ranks

    write_ranks(tmp_path / "run", 3)
    res = run("gate", str(tmp_path / "run" / "rank-*.json.gz"), "--chip", "h100", "--min-hfu", "0",
              "--format", "json", "--jobs", "2", "-q")
    assert res.exit_code == 0, res.output
    assert res.stderr == ""
    res = run("gate", str(tmp_path / "run" / "rank-*.json.gz"), "--chip", "h100", "--min-hfu", "0.99",
              "--jobs", "2", "-q")
    assert res.exit_code == 1


def test_ingest_of_a_directory_of_ranks_writes_a_dataset(tmp_path):
    from test_many_ranks import write_ranks

    from traceroof.cache import read_cache
    from traceroof.io import read_trace

    write_ranks(tmp_path / "run", 12)
    res = run("ingest", str(tmp_path / "run"), "-o", str(tmp_path / "c"), "--jobs", "2", "-q")
    assert res.exit_code == 0, res.output
    first = res.stdout.splitlines()[0]
    assert "(dataset)" in first and "12 ranks" in first and "37 files" in first
    assert res.stdout.splitlines()[-1] == "  ... and 17 more"
    t = read_cache(tmp_path / "c")
    ref = read_trace(tmp_path / "run", jobs=1)
    assert t.meta == ref.meta and t.ops.equals(ref.ops) and t.host.equals(ref.host)


def _allocator_conf_seen_by_cli(env_value: str | None) -> str:
    import os
    import subprocess
    import sys

    code = (
        "import os, sys\n"
        "from traceroof import cli\n"
        "try:\n    cli.main(['chips', '--format', 'json'])\n"
        "except SystemExit:\n    pass\n"
        "import polars\n"  # loaded by the command, after the setting
        "sys.stderr.write('CONF=' + os.environ.get('_RJEM_MALLOC_CONF', '<unset>'))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "_RJEM_MALLOC_CONF"}
    if env_value is not None:
        env["_RJEM_MALLOC_CONF"] = env_value
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    return res.stderr.rsplit("CONF=", 1)[-1]


def test_the_cli_sets_the_allocator_to_return_memory_and_a_user_setting_wins():
    from traceroof.cli import JEMALLOC_CONF

    # polars prepends its own defaults on import; jemalloc takes the last value of each key
    ours = _allocator_conf_seen_by_cli(None)
    assert ours.endswith(JEMALLOC_CONF), ours
    assert "dirty_decay_ms:100" in JEMALLOC_CONF and "background_thread:true" in JEMALLOC_CONF
    theirs = _allocator_conf_seen_by_cli("narenas:1")
    assert theirs.endswith("narenas:1") and JEMALLOC_CONF not in theirs, theirs


@pytest.mark.parametrize("where", ["missing-folder", "sysfs"])
def test_an_unwritable_output_is_exit_9_before_any_parsing(tmp_path, monkeypatch, example_trace, where):
    """-o into a missing folder, or onto a file system that refuses new files, is the user's
    mistake: one line naming the path, exit 9, and the trace is never parsed."""
    import traceroof.analysis as A

    def no_parse(*a, **k):
        raise AssertionError("parsed although the output cannot be written")

    monkeypatch.setattr(A, "load_report", no_parse)
    out = tmp_path / "no-such-folder" / "report.json" if where == "missing-folder" else Path("/sys/report.json")
    res = CliRunner().invoke(cli, ["analyze", str(example_trace), "-o", str(out)])
    assert res.exit_code == 9, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and str(out) in lines[0] and lines[0].startswith("traceroof: error: -o ")
    assert not out.exists()


def test_an_output_check_leaves_nothing_behind(tmp_path, example_trace):
    """The check creates no file of its own: a report written where none was is the report."""
    out = tmp_path / "r.md"
    res = CliRunner().invoke(cli, ["analyze", str(example_trace), "-q", "-o", str(out), "--top", "2"])
    assert res.exit_code == 0, res.output
    assert out.read_text().startswith("# traceroof report")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.md"]


def test_ingest_into_an_unwritable_place_is_exit_9_before_parsing(monkeypatch, example_trace):
    import traceroof.io as io

    monkeypatch.setattr(io, "read_trace", lambda *a, **k: (_ for _ in ()).throw(AssertionError("parsed")))
    res = CliRunner().invoke(cli, ["ingest", str(example_trace), "-o", "/sys/x.cache"])
    assert res.exit_code == 9, res.output
    assert "/sys/x.cache" in res.output and "cannot write in /sys" in res.output


def test_a_closed_pipe_is_a_normal_end(tmp_path, example_trace):
    """`traceroof analyze … | head`: a reader that leaves early (here `true`, which reads
    nothing and exits before the report is written) ends the run normally, exit 0, no
    "internal error: BrokenPipeError"."""
    for args in (f"analyze {example_trace} -q", f"ingest {example_trace} -o {tmp_path / 'c'} -q"):
        cmd = f"{sys.executable} -m traceroof.cli {args} | true"
        res = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True,
                             cwd=REPO, timeout=120)
        assert "internal error" not in res.stderr and "BrokenPipe" not in res.stderr, res.stderr
        assert res.returncode == 0, res.stderr
