"""The live commands of the command line: ``traceroof capture`` (attach to a running jax
program's profiler server) and ``traceroof watch`` (analyze each trace torch writes into a
folder). :func:`register` adds them to :data:`traceroof.cli.cli` when :mod:`traceroof.cli`
is imported.

Exit codes: those of docs/cli.md; the capture failures of :mod:`traceroof.capture_errors`
(2, 6, 7, 8, 10-13), 1 for ``watch --fail-below`` when a trace falls below the threshold.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click


def _cli() -> Any:
    """:mod:`traceroof.cli`, whose helpers the commands use (imported when they are
    registered or run: cli imports this module, so not at module level)."""
    from . import cli

    return cli


def _progress(msg: str) -> None:
    _cli()._progress(msg)


def output_options(fn: Any) -> Any:
    """The output options of ``analyze`` (--format, --report FILE, --top, --rank, --step,
    --group-by, --findings), for the live commands."""
    opts = [
        click.option("--format", "fmt", type=_cli()._RendererChoice(),
                     help="Output format (default: from --report's suffix, else table)."),
        click.option("--report", "report_path", type=click.Path(dir_okay=False, path_type=str),
                     help="Write the report to FILE, as `analyze -o` (a .json FILE gets the "
                     "full report, for gate/serve)."),
        click.option("--top", type=click.IntRange(min=1), default=20, show_default=True,
                     help="Rows of the ranking to show."),
        click.option("--rank", type=int, help="Only this rank."),
        click.option("--step", type=int, help="Only this step."),
        click.option("--group-by", type=click.Choice(["op", "kernel"]),
                     help="Rank by framework op or by kernel name (default: per format)."),
        click.option("--findings", "findings_opt", metavar="NAME,...",
                     help="Only these detectors (comma-separated; default: all)."),
    ]
    for o in reversed(opts):
        fn = o(fn)
    return fn


def emit(trace: Any, chip: str | None, out: dict[str, Any]) -> Any:
    """Analyze ``trace`` with the output options ``out`` (as parsed by :func:`output_options`
    and :func:`traceroof.cli.model_options`) and print or write the report, as ``analyze``
    does. Returns the :class:`~traceroof.report.Report`.

    Raises:
        click.UsageError: inconsistent model options; the errors of ``analyze``.
    """
    from .analysis import load_report
    from .outputs import check_output_file
    from .render import SUFFIXES, render

    report_path, fmt = out["report_path"], out["fmt"]
    if report_path:
        check_output_file(report_path)
    c = _cli()
    mflops, formula = c.resolve_model_flops(out["model_path"], out["tokens_per_step"], out["seq_len"],
                                          out["mode"], out["model_flops_per_step"])
    names = [n.strip() for n in out["findings_opt"].split(",") if n.strip()] \
        if out["findings_opt"] else None
    report = load_report(trace, chip, analyzing=c._analyzing, rank=out["rank"], step=out["step"],
                         group_by=out["group_by"], model_flops_per_step=mflops,
                         model_flops_formula=formula, n_devices=out["devices"], findings=names)
    if fmt is None:
        fmt = SUFFIXES.get(Path(report_path).suffix.lower(), "table") if report_path else "table"
    if report_path and fmt == "json":
        report.save(report_path)
        _progress(f"report written to {report_path}")
        return report
    text = render(report, fmt, top=out["top"])
    if report_path:
        Path(report_path).write_text(text)
        _progress(f"{fmt} written to {report_path}")
    else:
        c.echo(text, nl=not text.endswith("\n"))
    return report


#: the parameters of ``capture`` that are plain click (the shared ones are added by register)
CAPTURE_PARAMS = [
    click.argument("address", metavar="HOST:PORT"),
    click.option("--duration", "duration_s", type=click.FloatRange(min=0, min_open=True),
                 default=2.0, show_default=True, help="Capture window, seconds."),
    click.option("--steps", type=click.IntRange(min=1),
                 help="Capture until N steps were recorded (annotated, or inferred from repeated "
                 "XLA program executions): windows grow to the measured step rate, 3 at most."),
    click.option("-o", "--out-dir", type=click.Path(file_okay=False, path_type=str),
                 help="Keep the captured .xplane.pb under DIR (plugins/profile/<time>/). "
                 "Default: a temporary folder, removed after the analysis."),
    click.option("--timeout", "timeout_s", type=click.FloatRange(min=0, min_open=True),
                 help="Hard limit per capture window, seconds (default: 2 x duration + 20)."),
    click.option("--no-analyze", is_flag=True,
                 help="Only capture: print the path of the .xplane.pb (kept, in a temporary "
                 "folder without -o)."),
]


#: the parameters of ``watch`` that are plain click
WATCH_PARAMS = [
    click.argument("folder", metavar="DIR", type=click.Path(path_type=str)),
    click.option("--every", "every_s", type=click.FloatRange(min=0, min_open=True), default=1.0,
                 show_default=True, help="Seconds between looks at DIR."),
    click.option("--count", type=click.IntRange(min=1), help="Stop after N traces."),
    click.option("--idle-timeout", "idle_timeout_s", type=click.FloatRange(min=0, min_open=True),
                 help="Stop when no new trace landed for S seconds (default: never)."),
    click.option("--new-only", is_flag=True, help="Skip the traces already in DIR."),
    click.option("--min-hfu", type=click.FloatRange(0, 1),
                 help="Exit 1 at the first trace whose HFU is below this fraction."),
    click.option("--min-busy", type=click.FloatRange(0, 1),
                 help="Exit 1 at the first trace whose device busy share is below this fraction."),
    click.option("--max-step-time-increase", type=click.FloatRange(0),
                 help="Exit 1 at the first trace whose step time is this fraction (0.05 = 5 %) "
                 "above the first trace's."),
    click.option("--format", "fmt", type=click.Choice(["text", "jsonl"]), default="text",
                 show_default=True, help="A block per trace, or one JSON object per line."),
]


def register(group: click.Group) -> None:
    """Add ``capture`` and ``watch`` to ``group``, with the options they share with
    ``analyze`` (chip, outputs, model, -q, --debug) and its error handling."""
    c = _cli()
    shared = [c.chip_option, output_options, c.model_options, c.quiet_option, c.debug_option,
              c._handle_errors]
    fn: Any = capture_command
    for deco in reversed([group.command("capture"), *CAPTURE_PARAMS, *shared]):
        fn = deco(fn)
    fn = watch_command
    for deco in reversed([group.command("watch"), *WATCH_PARAMS, c.chip_option, c.jobs_option,
                          c.quiet_option, c.debug_option, c._handle_errors]):
        fn = deco(fn)


def watch_command(folder: str, every_s: float, count: int | None, idle_timeout_s: float | None,
                  new_only: bool, min_hfu: float | None, min_busy: float | None,
                  max_step_time_increase: float | None, fmt: str, chip: str | None,
                  jobs: int | None) -> None:
    """Analyze each trace that lands in DIR: the folder torch.profiler's
    tensorboard_trace_handler(DIR) writes one trace per profiling cycle into (or any
    *.pt.trace.json[.gz] / *.xplane.pb files). Prints each trace's headline numbers and the
    history strip of step time, busy share and HFU across the traces.

    A trace is read once its size held still over two looks. One that cannot be read is said
    (its error line) and the watch goes on. --min-hfu, --min-busy and
    --max-step-time-increase make it a soak-test gate: exit 1 at the first trace that breaks
    one. See docs/watch.md.

    \b
    Examples:
      traceroof watch ./log --chip h100
      traceroof watch ./log --chip h100 --count 10 --min-hfu 0.3 --max-step-time-increase 0.1
    """
    import json

    from .analysis import load_report
    from .watch import History, check, watch

    c = _cli()
    history = History()
    unreadable = 0

    def analyze(path: Path) -> Any:
        with c._stage(f"analyzing {path.name}", f"analyzed {path.name}"):
            return load_report(str(path), chip, jobs=jobs)

    _progress(f"watching {folder} every {every_s:g} s")
    for landed in watch(folder, analyze, every_s=every_s, count=count,
                        idle_timeout_s=idle_timeout_s, new_only=new_only):
        if landed.error is not None:
            unreadable += 1
            # click.echo, not cli.echo: a stream whose reader left stops (exit 0, docs/cli.md)
            click.echo(json.dumps({"trace": str(landed.path), "error": landed.error})
                       if fmt == "jsonl" else f"{landed.path}: error: {landed.error}")
            continue
        history.add(landed.path.name, landed.report)
        broken = check(history, min_hfu=min_hfu, min_busy=min_busy,
                       max_step_time_increase=max_step_time_increase)
        click.echo(_watch_text(landed, history) if fmt == "text" else json.dumps(
            {"trace": str(landed.path), "steps": landed.report.summary.steps,
             "history": history.to_dict(), "broken": broken}))
        if broken:
            for b in broken:
                click.echo(f"traceroof: watch failed: {b}", err=True)
            sys.exit(1)
    if unreadable:
        _progress(f"{unreadable} of {unreadable + len(history.names)} traces could not be read")


def _watch_text(landed: Any, history: Any) -> str:
    s = landed.report.summary
    n = len(history.names)
    from .units import plural

    return "\n".join([f"[{n}] {landed.path}: {plural(s.steps, 'step')}", *("  " + ln for ln in history.lines())])


def capture_command(address: str, duration_s: float, steps: int | None, out_dir: str | None,
                    timeout_s: float | None, no_analyze: bool, chip: str | None,
                    **out: Any) -> None:
    """Capture a running jax program's profile from its profiler server at HOST:PORT, and
    analyze it as `traceroof analyze` does.

    The program must have called `server = jax.profiler.start_server(PORT)` and keep the
    handle alive. Each failure has its own exit code and advice (docs/capture.md): 6 nothing
    listens, 7 nothing recorded (idle target), 8 the port accepts and never answers,
    10 not a profiler server (e.g. HTTP), 11 another profiling session is active, 12 the
    target exited mid-capture, 13 xprof missing, 2 a bad address.

    \b
    Examples:
      traceroof capture localhost:9999 --duration 3
      traceroof capture localhost:9999 --steps 20 -o prof/ --report report.json
      traceroof capture 10.0.0.5:9999 --no-analyze -o prof/
    """
    import shutil
    import tempfile

    from . import capture as cap

    host, port = cap.parse_address(address)
    analysis = [n for n, v in (("--steps", steps), ("--chip", chip), ("--report", out["report_path"]),
                               ("--format", out["fmt"])) if v]
    if no_analyze and analysis:
        raise click.UsageError(f"--no-analyze captures only: {', '.join(analysis)} need the analysis")
    temporary = out_dir is None and not no_analyze
    root = Path(tempfile.mkdtemp(prefix="traceroof-capture-")) if temporary else out_dir
    try:
        _progress(f"connecting to {host}:{port}")
        cap.probe(host, port)
        if no_analyze:
            _progress(f"recording {duration_s:.1f} s")
            path = cap.capture_xplane(address, duration_s, root, timeout_s=timeout_s)
            _cli().echo(f"wrote {path} ({path.stat().st_size:,} bytes)")
            return
        try:
            trace = _record(cap, address, duration_s, steps, root, timeout_s)
        except cap.TargetExitedError as exc:
            if exc.kept_trace is not None:  # the report of what was kept, then exit 12
                emit(exc.kept_trace, chip, out)
            raise
        emit(trace, chip, out)
    finally:
        if temporary:
            shutil.rmtree(root, ignore_errors=True)


def _record(cap: Any, address: str, duration_s: float, steps: int | None, root: Any,
            timeout_s: float | None) -> Any:
    """The captured Trace (``--steps``: until N steps); progress on stderr."""
    def recording(d: float) -> None:
        _progress(f"recording {d:.1f} s")

    if steps is None:
        recording(duration_s)
        trace = cap.capture(address, duration_s, root, timeout_s=timeout_s)
    else:
        trace = cap.capture_steps(address, steps, duration_s, root, timeout_s=timeout_s,
                                  on_attempt=recording)
    from .units import plural

    _progress(f"parsed {trace.meta.sources[0]}: {plural(trace.ops.height, 'op')}, "
              f"{plural(cap.count_steps(trace), 'step')}")
    return trace


def serve_live(address: str | None, folder: str | None, chip: str | None, every_s: float,
               duration_s: float, host: str, port: int, open_browser: bool) -> None:
    """``serve --live HOST:PORT``: the live dashboard of the jax program at ``address``,
    capturing ``duration_s`` seconds every ``every_s`` seconds; ``serve --watch DIR``: of each
    trace that lands in ``folder`` (:mod:`traceroof.web.live`).

    Raises:
        BadAddressError: ``address`` is not HOST:PORT. InputNotFoundError: ``folder`` is not a
        folder. Capture and trace failures are shown on the page.
    """
    from . import capture as cap
    from .analysis import analyze, load_report
    from .errors import InputNotFoundError
    from .web import app as web
    from .web import live

    c = _cli()
    state = live.LiveState("captures" if address is not None else "traces")
    if address is not None:
        cap.parse_address(address)
        worker: Any = live.Capturer(state, address, every_s=every_s, duration_s=duration_s,
                                    capture=cap.capture, analyze=lambda t: analyze(t, chip=chip))
        _progress(f"capturing {address}: {duration_s:g} s every {every_s:g} s")
    else:
        if not Path(folder).is_dir():
            raise InputNotFoundError(f"{folder}: no such folder to watch")
        worker = live.Watcher(state, folder, every_s=every_s or 1.0,
                              analyze=lambda p: load_report(str(p), chip))
        _progress(f"watching {folder} every {every_s or 1.0:g} s")
    worker.start()
    try:
        web.run(live.create_live_app(state, address or folder), host, port,
                open_browser=open_browser, echo=click.echo, warn=c._progress)
    finally:
        if hasattr(worker, "stop"):
            worker.stop()
