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
timeout, 9 an output that cannot be written (`-o`, or `gate`'s `$GITHUB_STEP_SUMMARY`; checked before any parsing), 10 capture: not a profiler server, 11 capture: another
profiling session is active, 12 capture: the target exited, 13 capture: xprof missing (docs/capture.md), 70 internal error (a bug: re-run with `--debug` and report it). Errors are one line
on stderr (`traceroof: error: …`); `--debug` shows the traceback.

Inputs (every command that reads a TRACE): a file, a folder, a glob, or `-`, the trace piped
into stdin (`ssh host cat trace.json.gz | traceroof analyze -`, read alone and once), or a FIFO
(named pipe). A file named `-` is `./-`. A file's format is told by its first bytes, not its
name: a tar by its header (`ustar` at byte 257 with the header's checksum, or an old V7 header),
whatever its member names; gzip by its magic, then the format inside it; a JSON or protobuf
trace by its structure; a name's suffix weighs less than any of these. A stream's format is
sniffed from its first bytes (gzip or not, as a file's); a Kineto trace is streamed from it as
from a file, any other format (an `.xplane.pb`, a tar) is first copied to a temporary file in
`$TMPDIR`, read, and removed (on Linux a file without a name, read through `/proc/self/fd`:
nothing is left behind however the command ends, `kill -9` included; elsewhere a
`traceroof-stream-*` folder, removed on exit and on SIGTERM or SIGHUP); messages name `<stdin>`
or the FIFO. stdin has no folder: the CUDA-graph capture traces beside a trace
(`capture_traces/`) are not looked for in the current directory; give them with
`--capture-trace` (a FIFO's folder is looked in, as a file's). `-` given twice in one command
(`diff - -`, `analyze - --capture-trace -`, `gate - --baseline -`, `serve - --compare -`) is a
usage error, exit 2, before anything is read.
A Kineto JSON text may start with a UTF-8 byte-order mark and up to 64 MiB (67,108,864 bytes)
of white space, on every path (plain, `.gz`, in a tar, in a rank folder, piped); text in UTF-16
or UTF-32, LE or BE, with a byte-order mark or without one (then told by the zero bytes of its
first characters, white space included), is one line naming the encoding (`iconv -f UTF-16LE
-t UTF-8`), exit 4, on every path too. A character or
block device (`/dev/zero`, `/dev/urandom`, a terminal) or a socket is refused at once, exit 4;
`-` when stdin is a terminal, exit 3; `-` with other inputs, exit 2. A cut or damaged trace
keeps what can be read and says what was lost (docs/xplane.md, "Bad and damaged input"); a cut
`.xplane.pb` that keeps no line and no event is one line, exit 4.

A reader that leaves early (`traceroof analyze T | head -3`, on stdout or on stderr) is a
normal end: the rest of the output is dropped, no error is printed, and the exit status is the
command's own, as if everything had been read: 0, or `gate`'s 1 when the gate fails and
`diff`'s 1 when the step time rose too much (`watch`, which streams, stops there, with 0). Not 141 (128 + SIGPIPE): under `set -o pipefail`
(GitHub Actions' bash) a 141 would fail a step that only looked at the first lines.

Terminal output (`analyze`, `chips`, `estimate`) fits the width it is printed at: `COLUMNS`,
else the terminal on stdout, else the terminal on stderr (so `traceroof analyze T | head`
fits the terminal you watch), else 120 columns (a file, a CI log). Where a table does not
fit, its least useful columns go first and a line names them (`--format markdown/json` keep
every column); long names are shortened at template arguments and word boundaries, two that
would read the same show where they differ (`aten::_scaled…_backward`); warnings wrap at
words; no line has trailing spaces.

A one-shot command (`analyze`, `chips`, `diff`, `estimate`, `gate`, `ingest`) ends its process
as soon as its output is flushed and its files closed (`os._exit` with its exit code), without
the interpreter's teardown of every module (~50 ms on a small trace). Set
`TRACEROOF_FULL_EXIT=1` for the usual exit (a coverage tool or profiler that writes its data
from an `atexit` hook).
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
