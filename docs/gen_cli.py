"""Regenerate docs/cli.md from the commands' --help (tests/test_docs.py checks it is current).

Run: python docs/gen_cli.py
"""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from traceroof.cli import cli

HEAD = """# CLI reference

Generated from `--help` by `docs/gen_cli.py`; do not edit by hand.

Exit codes: 0 ok, 1 gate failed, 2 usage, 3 input not found, 4 invalid or unsupported trace
or report, or inputs that are not one job (different formats or devices: they are never merged;
analyze them one at a time), 5 unknown or ambiguous chip, 6 capture: no server, 7 capture: empty, 8 capture:
timeout, 9 an output (`-o`) that cannot be written, 10 capture: not a profiler server, 11 capture: another
profiling session is active, 12 capture: the target exited, 13 capture: xprof missing (docs/capture.md), 70 internal error (a bug: re-run with `--debug` and report it). Errors are one line
on stderr (`traceroof: error: …`); `--debug` shows the traceback.
"""


def render() -> str:
    out = [HEAD]
    r = CliRunner()
    out.append("## traceroof\n\n```text\n" + r.invoke(cli, ["--help"], terminal_width=100, prog_name="traceroof").output.rstrip() + "\n```\n")
    for name in sorted(cli.commands):
        text = r.invoke(cli, [name, "--help"], terminal_width=100, prog_name="traceroof").output.rstrip()
        out.append(f"## traceroof {name}\n\n```text\n{text}\n```\n")
    return "\n".join(out)


if __name__ == "__main__":
    Path(__file__).with_name("cli.md").write_text(render())
