"""Outputs of the user's making (issue 17, item 3), beyond ``-o``: ``gate`` appends its summary
to ``$GITHUB_STEP_SUMMARY``; a path there that cannot be written is one line and exit 9,
checked before any trace is parsed (it was exit 70, "this is a bug", after the whole parse).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from traceroof.cli import cli


@pytest.mark.parametrize("where", ["missing-folder", "sysfs", "a-folder"])
def test_an_unwritable_step_summary_is_exit_9_before_any_parsing(tmp_path, monkeypatch, example_trace, where):
    import traceroof.analysis as A

    def no_parse(*a, **k):
        raise AssertionError("parsed although the summary cannot be written")

    monkeypatch.setattr(A, "load_report", no_parse)
    path = {"missing-folder": tmp_path / "no-such-folder" / "summary.md", "sysfs": Path("/sys/summary.md"),
            "a-folder": tmp_path}[where]
    res = CliRunner().invoke(cli, ["gate", str(example_trace), "--min-hfu", "0.1", "-q"],
                             env={"GITHUB_STEP_SUMMARY": str(path)})
    assert res.exit_code == 9, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"traceroof: error: $GITHUB_STEP_SUMMARY {path}: "), lines
    assert "internal error" not in res.output
    if where != "a-folder":
        assert not path.exists()


def test_a_writable_step_summary_is_appended_to(tmp_path, example_trace):
    path = tmp_path / "summary.md"
    path.write_text("earlier step\n")
    res = CliRunner().invoke(cli, ["gate", str(example_trace), "--min-hfu", "0.1", "-q"],
                             env={"GITHUB_STEP_SUMMARY": str(path)})
    assert res.exit_code == 0, res.output
    text = path.read_text()
    # what was there stays first; the summary printed on stdout is what was appended
    assert text.startswith("earlier step\n") and text[len("earlier step\n"):].strip() == res.stdout.strip()
