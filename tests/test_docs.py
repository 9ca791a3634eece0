"""Docs stay true: README commands, the CLI reference, the schema page, one page per finding."""

from __future__ import annotations

import re
import sys

from conftest import REPO

sys.path.insert(0, str(REPO / "docs"))


def _readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    quick = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.+?)\n```", quick, re.S)


def test_readme_quick_start_is_two_commands_and_ci_runs_the_test_one():
    cmds = _readme_commands()
    assert len(cmds) == 2
    install_run, install_test = cmds
    assert "traceroof analyze fixtures/example_h100_decoder.json.gz" in install_run
    assert (REPO / "fixtures" / "example_h100_decoder.json.gz").is_file()
    test_cmd = install_test.split("&&", 2)[2].strip()  # after venv creation and activation
    assert test_cmd in (REPO / ".ci" / "run").read_text()


def test_cli_reference_is_current():
    import gen_cli

    assert (REPO / "docs" / "cli.md").read_text() == gen_cli.render(), "run: python docs/gen_cli.py"


def test_every_schema_column_is_documented():
    from traceroof.schema import HOST_SCHEMA, OP_SCHEMA, ROOFLINE_SCHEMA

    doc = (REPO / "docs" / "schema.md").read_text()
    for col in list(OP_SCHEMA) + list(ROOFLINE_SCHEMA) + list(HOST_SCHEMA):
        assert f"`{col}`" in doc, col


def test_every_finding_has_a_doc_page():
    from traceroof.findings import DETECTORS, _load_builtin

    _load_builtin()
    assert DETECTORS, "no detectors registered"
    for name in DETECTORS:
        assert (REPO / "docs" / "findings" / f"{name}.md").is_file(), name


def test_docs_links_in_readme_exist():
    text = (REPO / "README.md").read_text()
    for link in re.findall(r"\]\((docs/[^)]+)\)", text):
        assert (REPO / link).exists(), link
