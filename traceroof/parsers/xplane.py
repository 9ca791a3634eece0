"""XPlane parser: jax / XLA / TensorFlow ``*.xplane.pb`` (an XSpace protobuf) -> :class:`Trace`.

Which events become op rows (see docs/xplane.md for the evidence behind each choice):

* **GPU planes** (``/device:GPU:N``): every event on the ``Stream #N...`` lines -- the kernels,
  memcpys and memsets as the device ran them. The ``XLA Ops`` / ``TensorFlow Ops`` lines of a
  GPU plane are *derived* from those same kernels by the profiler (one event per kernel, same
  spans), so they are skipped: reading both would count every kernel twice.
* **TPU planes** (``/device:TPU:N``): the ``XLA Ops`` line (a TPU has no stream lines). Times
  come from the ``device_offset_ps``/``device_duration_ps`` stats when present -- the device's
  own clock, and what xprof's ``hlo_stats`` reports (checked: identical per op); the XEvent span
  is the host-aligned copy and differs by up to 10 % per op. ``Async XLA Ops`` (in-flight async
  copies that overlap compute; their start/done ops are already on ``XLA Ops``) are not ops.
* **CPU-only profiles** (no device plane has ops): events on ``/host:CPU`` threads that carry
  ``hlo_op`` and ``hlo_module``/``program_id`` stats (XLA CPU thunks). ``device`` = the
  ``device_ordinal`` stat (0 when absent), ``stream`` = the thread's line id.

Per-op costs: ``flops``/``bytes_accessed`` from the event *metadata* stats (``cost_source =
"trace"``); otherwise, for ops with an HLO instruction (CPU, jax GPU), the cost of that
instruction from the module's ``Hlo Proto`` in ``/host:metadata``, decoded without jax
(:mod:`.hlo_modules`) and costed with HloCostAnalysis conventions
(:mod:`traceroof.costs.hlo_model`; ``cost_source = "shapes"``). When one HLO instruction
launched several kernels, its cost is spread over them by duration. A module that does not
decode leaves its ops' cost unknown (null, never 0) and a warning says so. Loop containers
(``while``/``conditional``/``call`` events enclosing their body's op events) are not op
rows: counted in ``meta.stats`` and a warning (:func:`.xplane_ops.drop_loop_containers`).

Times, in integer arithmetic on the raw fields: ``start = XLine.timestamp_ns + offset_ps //
1000`` and ``dur = (offset_ps + duration_ps) // 1000 - offset_ps // 1000`` (the ns interval
is the floor-image of the ps interval: adjacent events stay adjacent, sums are unbiased).
``start_ns`` is relative to the earliest kept event (``meta.origin_ns``, on the file's own
clock); ``meta.base_time_ns`` is the ``Task Environment`` ``profile_start_time`` (unix ns of
that clock's zero) when the file has it. Several hosts' files are aligned through it.

Public API: :func:`read`, :func:`read_bytes`, :func:`read_dir`, :func:`find_xplanes`, and the
format's registry entry :data:`FORMAT` (sniffed by structure, :func:`sniff`). This module is
light (no protobuf, no numpy): the reading is done by :mod:`.xplane_convert` (one file's planes
and lines, with :mod:`.xplane_planes`, :mod:`.xplane_ops`, :mod:`.xplane_host`) and
:mod:`.xplane_assemble` (files into one Trace), imported when a file is read.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import InputNotFoundError, TraceFormatError, path_text
from . import protowire as w
from .registry import CONTENT, HINT, SUFFIX, FormatFacts, Head, InputFormat

if TYPE_CHECKING:
    from ..progress import Progress
    from ..trace import Trace


def read(path: str | Path) -> Trace:
    """Read one ``*.xplane.pb`` (or ``.xplane.pb.gz``) into a :class:`Trace`.

    Raises:
        InputNotFoundError: the file does not exist.
        TraceFormatError: not an XSpace, empty, or nothing readable in it (names the byte
            offset where the wire format breaks).
    """
    p = Path(path)
    if p.is_dir():
        return read_dir(p)
    if not p.exists():
        raise InputNotFoundError(f"{path_text(p)}: no such file")
    return read_bytes(p.read_bytes(), path_text(p))


def read_bytes(data: bytes, path: str = "<bytes>", *, rank: int = 0) -> Trace:
    """Parse a serialized XSpace (``bytes``; gzip accepted) into a :class:`Trace`.

    ``rank`` fills the ``rank`` column. Raises :class:`TraceFormatError` as :func:`read`.
    """
    from .xplane_assemble import assemble
    from .xplane_convert import read_parts
    from .xplane_steps import infer_steps

    parts = read_parts(data, path, rank)
    return infer_steps(assemble([parts], [path]))


def find_xplanes(path: str | Path) -> tuple[list[Path], list[Path]]:
    """The ``*.xplane.pb`` files of a jax profile directory: the log dir, its
    ``plugins/profile`` dir, or one run dir. When several run dirs exist, the latest (by name:
    they are timestamps) is used. Returns (files of that run sorted by name, other files seen
    and ignored: ``*.trace.json.gz`` etc. beside them and older runs' files)."""
    root = Path(path)
    files = sorted(root.rglob("*.xplane.pb")) + sorted(root.rglob("*.xplane.pb.gz"))
    if not files:
        return [], []
    runs: dict[Path, list[Path]] = {}
    for f in files:
        runs.setdefault(f.parent, []).append(f)
    latest = max(runs, key=lambda d: (d.name, str(d)))
    chosen = sorted(runs[latest])
    ignored = [f for d, fs in runs.items() if d != latest for f in fs]
    ignored += sorted(x for x in latest.iterdir() if x.is_file() and x not in chosen)
    return chosen, ignored


def read_dir(path: str | Path, host: str | None = None) -> Trace:
    """Read a jax profile directory: every host's ``<host>.xplane.pb`` of one run (BC-21).

    Each file is one host (one process); ranks are assigned in file-name order. ``host``
    (a file stem or hostname) picks one. Other files in the run dir (``*.trace.json.gz``,
    xprof caches) are ignored so nothing is counted twice; so are older runs (warned).
    Host clocks are aligned through each file's ``profile_start_time`` when present.

    Raises:
        InputNotFoundError: no ``*.xplane.pb`` under ``path``, or ``host`` matches none.
        TraceFormatError: when a file is unreadable (others are still read; if none is,
            the first error is raised).
    """
    from .xplane_assemble import assemble
    from .xplane_convert import read_parts
    from .xplane_steps import infer_steps

    root = Path(path)
    if not root.exists():
        raise InputNotFoundError(f"{root}: no such directory")
    files, ignored = find_xplanes(root)
    if not files:
        raise InputNotFoundError(f"{root}: no *.xplane.pb under it")
    if host is not None:
        files = [f for f in files if file_stem(f) == host or file_stem(f).startswith(host)]
        if not files:
            raise InputNotFoundError(f"{root}: no xplane for host {host!r}")
    all_parts = []
    errors: list[TraceFormatError] = []
    used = []
    for rank, f in enumerate(files):
        try:
            data = f.read_bytes()
            all_parts.append(read_parts(data, str(f), rank))
            used.append(str(f))
        except TraceFormatError as exc:
            errors.append(exc)
    if not all_parts:
        raise errors[0]
    trace = infer_steps(assemble(all_parts, used))
    for exc in errors:
        trace.meta.warn(f"skipped unreadable profile {exc}")
    other_runs = [f for f in ignored if f.name.endswith((".xplane.pb", ".xplane.pb.gz"))]
    if other_runs:
        trace.meta.warn(f"{root}: read the latest run {files[0].parent.name}; "
                        f"{len(other_runs)} xplane file(s) of other runs ignored")
    trace.meta.count("xplane.files_ignored", len(ignored))
    return trace


def file_stem(f: Path) -> str:
    """The host part of an xplane file name: ``<host>.xplane.pb[.gz]`` → ``<host>``."""
    name = f.name
    for suffix in (".xplane.pb.gz", ".xplane.pb"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return f.stem


# --- the format's registry entry -------------------------------------------------------------

#: XPlane fields (openxla/xla ``xplane.proto``) → wire type: id, name, lines,
#: event_metadata, stat_metadata, stats
XPLANE_FIELDS = {1: w.VARINT, 2: w.LEN, 3: w.LEN, 4: w.LEN, 5: w.LEN, 6: w.LEN}


def looks_like_xspace(data: bytes, size: int | None = None) -> bool:
    """``data`` (the first bytes of a file of ``size`` bytes, when known) starts like an
    ``XSpace``: field 1 (``planes``) holds an XPlane whose visible fields are XPlane fields
    with their wire types, its ``name`` (when visible) UTF-8 text."""
    first = w.first_message(data, size)
    if first is None:
        return False
    seen = w.message_fields(data, *first)
    if not seen or any(XPLANE_FIELDS.get(n) != wt for n, wt, _, _ in seen):
        return False
    for n, _, p0, p1 in seen:
        if n == 2 and p1 <= len(data):
            try:
                data[p0:p1].decode("utf-8")
            except UnicodeDecodeError:
                return False
    return True


def sniff(head: Head) -> int:
    """:data:`~.registry.CONTENT` when the bytes start like an XSpace (:func:`looks_like_xspace`);
    else :data:`~.registry.SUFFIX` for a ``*.xplane.pb`` file (``*.xplane.pb.gz`` when gzip);
    else :data:`~.registry.HINT` when the first byte is the tag ``0x0a`` (a damaged XSpace is
    then read, to say where it breaks); else 0."""
    data = head.data
    if data[:1] == b"\x0a" and looks_like_xspace(data, head.size):
        return CONTENT
    if head.name.endswith(".xplane.pb.gz" if head.gzip else ".xplane.pb"):
        return SUFFIX
    return HINT if data[:1] == b"\x0a" else 0


def is_profile_dir(path: Path) -> bool:
    """``path`` holds a ``*.xplane.pb`` at any depth (a jax profile directory: one input)."""
    return next(iter(path.rglob("*.xplane.pb")), None) is not None


def read_input(path: Path, progress: Progress | None = None) -> Trace:
    """A file (:func:`read`) or a jax profile directory (:func:`read_dir`)."""
    return read(path)


FORMAT = InputFormat(
    name="xplane",
    read=read_input,
    sniff=sniff,
    unit_dir=is_profile_dir,
    dir_names=("*.xplane.pb",),
    describe="an XSpace (.xplane.pb)",
    facts=FormatFacts(chip_from_properties=True, default_group_by="kernel"),
)
