"""Progress on stderr (issue 7 item 4): shown only past one second, throttled, quiet with -q.

Time is a fake clock injected into :class:`traceroof.progress.Progress` (or, for the CLI,
put in place of ``traceroof.progress._now``): nothing here sleeps, so the tests are
deterministic. The final line's event count is checked against the parsed trace's.
"""

from __future__ import annotations

import io
import re

import pytest
from click.testing import CliRunner
from conftest import real

from traceroof import progress as progress_mod
from traceroof.cli import cli
from traceroof.io import read_trace
from traceroof.progress import Progress

TRACE = ("HolisticTraceAnalysis", "tests", "data", "trace_filter", "sampled_rank-0.json.gz")
SUMMARY = re.compile(
    r"^traceroof: read (?:(\d+) files, )?([\d.,]+) (kB|MB|GB), ([\d,]+) events in ([\d.]+) s \(([\d,]+) events/s\)$"
)


class Clock:
    """Returns the given times one call after another, then the last one forever."""

    def __init__(self, *times: float) -> None:
        self.times = list(times)
        self.calls = 0

    def __call__(self) -> float:
        t = self.times[min(self.calls, len(self.times) - 1)]
        self.calls += 1
        return t


def _summary(text: str) -> re.Match[str]:
    lines = [x for x in text.splitlines() if x.strip()]
    assert lines, "nothing on stderr"
    m = SUMMARY.match(lines[-1])
    assert m, f"last line is not the summary: {lines[-1]!r}"
    return m


# -- the Progress object -----------------------------------------------------------------------


def test_nothing_is_shown_during_the_first_second_nor_for_a_fast_read():
    out = io.StringIO()
    p = Progress(out, clock=Clock(0.0, 0.2, 0.5, 0.9, 0.95), tty=False)
    p.start(files=3, bytes=3000)
    p.update(100, 10)
    p.file_done("a", 1000, 10)
    p.close()
    assert out.getvalue() == ""
    assert not p.shown


def test_plain_lines_are_at_most_every_5_s_off_a_tty_then_a_summary():
    out = io.StringIO()
    # construction at 0; then start, 6 updates, close
    p = Progress(out, clock=Clock(0.0, 0.5, 1.0, 2.0, 3.0, 5.9, 6.1, 7.0, 8.0), tty=False)
    p.start(files=2, bytes=2_000_000)
    for i in range(6):
        p.update(100_000 * (i + 1), 1000 * (i + 1))
    p.file_done("a", 1_000_000, 6000)
    p.close()
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    # shown at 1.0 (first time past the delay) and 6.1 (5 s later); not at 2, 3, 5.9, 7
    assert [x.split(",")[0] for x in lines[:-1]] == ["traceroof: reading 0/2 files"] * 2
    assert "100.0 kB of 2.0 MB" in lines[0] and "1,000 events" in lines[0]
    assert "500.0 kB of 2.0 MB" in lines[1] and "5,000 events" in lines[1]
    assert lines[-1] == "traceroof: read 1.0 MB, 6,000 events in 8.0 s (750 events/s)"
    assert len(lines) == 3


def test_a_tty_gets_one_rewritten_line_a_few_times_a_second():
    out = io.StringIO()
    p = Progress(out, clock=Clock(0.0, 1.1, 1.2, 1.35, 1.4, 1.6, 2.0), tty=True)
    for i in range(5):
        p.update(1000 * (i + 1), 10 * (i + 1))
    text_before_close = out.getvalue()
    p.file_done("a", 5000, 50)
    p.close()
    text = out.getvalue()
    # rewrites at 1.1, 1.35, 1.6 (>= 0.2 s apart); none at 1.2, 1.4
    assert text_before_close.count("\r") == 3
    assert "\n" not in text_before_close
    assert text.endswith("\n") and text.count("\n") == 1
    assert text.rsplit("\r", 1)[1].startswith("traceroof: read 5.0 kB, 50 events in 2.0 s (25 events/s)")


def test_the_library_prints_nothing_by_default(capfd):
    read_trace(real(*TRACE))
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_read_trace_reports_the_trace_event_count():
    out = io.StringIO()
    p = Progress(out, clock=Clock(0.0, 2.0), tty=False)
    t = read_trace(real(*TRACE), progress=p)
    m = _summary(out.getvalue())
    events = t.meta.stats["events"]
    assert events > 1000
    assert int(m.group(4).replace(",", "")) == events
    assert float(m.group(5)) == 2.0
    assert int(m.group(6).replace(",", "")) == round(events / 2.0)
    assert p.files_done == 1 and p.bytes_done == real(*TRACE).stat().st_size


def test_multi_file_progress_counts_files_and_events(tmp_path):
    from test_many_ranks import write_ranks

    write_ranks(tmp_path, 4)
    out = io.StringIO()
    p = Progress(out, clock=Clock(0.0, 1.5, 3.0), tty=False)
    t = read_trace(tmp_path, jobs=1, progress=p)
    text = out.getvalue()
    assert "traceroof: reading 0/4 files" in text  # shown at start(), past the delay
    m = _summary(text)
    assert m.group(1) == "4"
    assert int(m.group(4).replace(",", "")) == t.meta.stats["events"]
    assert p.bytes_done == sum(f.stat().st_size for f in tmp_path.iterdir())


# -- the CLI -----------------------------------------------------------------------------------


@pytest.fixture
def slow_clock(monkeypatch):
    """The CLI's Progress sees 0 s at its start and 2 s at every later call: a 'slow' read."""
    clock = Clock(0.0, 2.0)
    monkeypatch.setattr(progress_mod, "_now", clock)
    return clock


def test_cli_shows_progress_for_a_read_over_a_second(slow_clock):
    res = CliRunner().invoke(cli, ["analyze", str(real(*TRACE)), "--chip", "h100", "--top", "3"])
    assert res.exit_code == 0, res.output
    m = _summary(res.stderr)
    events = read_trace(real(*TRACE)).meta.stats["events"]
    assert int(m.group(4).replace(",", "")) == events
    assert int(m.group(6).replace(",", "")) == round(events / 2.0)
    assert "events/s" not in res.stdout


def test_cli_quiet_shows_no_progress(slow_clock):
    res = CliRunner().invoke(cli, ["analyze", str(real(*TRACE)), "--chip", "h100", "--top", "3", "-q"])
    assert res.exit_code == 0, res.output
    assert res.stderr == ""
    assert slow_clock.calls == 0  # no Progress was even made


def test_cli_fast_read_shows_nothing(monkeypatch):
    monkeypatch.setattr(progress_mod, "_now", Clock(0.0, 0.3))
    res = CliRunner().invoke(cli, ["analyze", str(real(*TRACE)), "--chip", "h100", "--top", "3"])
    assert res.exit_code == 0, res.output
    assert "traceroof: read" not in res.stderr and "reading" not in res.stderr


def test_cli_ingest_of_many_files_shows_file_progress(slow_clock, tmp_path):
    from test_many_ranks import write_ranks

    write_ranks(tmp_path / "run", 3)
    res = CliRunner().invoke(cli, ["ingest", str(tmp_path / "run"), "-o", str(tmp_path / "c"), "--jobs", "1"])
    assert res.exit_code == 0, res.output
    m = _summary(res.stderr)
    assert m.group(1) == "3"
    events = read_trace(tmp_path / "run", jobs=1).meta.stats["events"]
    assert int(m.group(4).replace(",", "")) == events


class _FiringTimer:
    """threading.Timer stand-in that fires at start(): the stage is 'still running after 1 s'."""

    def __init__(self, interval, fn):
        self.interval, self.fn, self.daemon, self.cancelled = interval, fn, False, False

    def start(self):
        assert self.interval == 1.0
        self.fn()

    def cancel(self):
        self.cancelled = True


def test_a_slow_analysis_says_it_is_running_and_how_long_it_took(capsys, monkeypatch):
    from traceroof import cli as C

    monkeypatch.setattr(C._State, "quiet", False)
    ticks = iter([10.0, 13.25])  # start, end: 3.25 s
    with C._stage("analyzing 5 device ops", "analyzed 5 device ops", clock=lambda: next(ticks), timer=_FiringTimer):
        pass
    assert capsys.readouterr().err.splitlines() == [
        "traceroof: analyzing 5 device ops …",
        "traceroof: analyzed 5 device ops in 3.2 s",
    ]


def test_a_fast_or_quiet_analysis_says_nothing(capsys, monkeypatch):
    from traceroof import cli as C

    class _Idle(_FiringTimer):
        def start(self):  # finished before the second was up: never fires
            pass

    monkeypatch.setattr(C._State, "quiet", False)
    ticks = iter([0.0, 0.4])
    with C._stage("analyzing", "analyzed", clock=lambda: next(ticks), timer=_Idle):
        pass
    monkeypatch.setattr(C._State, "quiet", True)
    with C._stage("analyzing", "analyzed", clock=lambda: 1 / 0, timer=_FiringTimer):
        pass
    assert capsys.readouterr().err == ""
