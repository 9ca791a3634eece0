"""jax's trace-viewer JSON exports (``perfetto_trace.json.gz``, ``<host>.trace.json.gz``):
recognised, to say exactly what to pass instead.

``jax.profiler.trace(dir, create_perfetto_trace=True)`` writes ``perfetto_trace.json.gz``
beside the XSpace (``plugins/profile/<run>/<host>.xplane.pb``); xprof/TensorBoard write the
same Chrome-trace JSON as ``<host>.trace.json.gz``. It is a conversion of the XSpace for a
viewer: ``M`` events naming the XSpace planes as processes (``/host:CPU``,
``/device:GPU:0``) and ``X`` events with ``hlo_op``/``hlo_module`` arguments, but none of
what the roofline needs: no HLO costs (the XSpace's per-op ``flops``/``bytes_accessed`` stats,
or the HLO proto in ``/host:metadata`` they are derived from) and no device-plane stats (the
chip's name, peaks, memory). Read as a Kineto trace it would be "metadata only" or a table
of uncosted ops; so :data:`FORMAT`'s reader refuses it with one line that names the
``.xplane.pb`` beside it (:class:`~traceroof.errors.TraceFormatError`, exit code 4).

Recognised by content (:func:`sniff`): a JSON object whose first bytes hold a
``process_name`` metadata event naming an XSpace plane (``"/host:…"``, ``"/device:…"``,
optionally under ``/job:…/replica:…/task:…``). A trailing empty event ``{}`` (BC-04) is
beyond the head and changes nothing. A jax profile directory holding both is read as an
XSpace (:mod:`.xplane`): these exports are ignored there (counted in
``stats["xplane.files_ignored"]``), never read twice.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import TraceFormatError
from .registry import CONTENT, Head, InputFormat

if TYPE_CHECKING:
    from ..progress import Progress
    from ..trace import Trace

#: an XSpace plane named as a Chrome-trace process: ``"name": "/host:CPU"``,
#: ``"name": "/device:TPU:0"``, ``"name": "/job:w/replica:0/task:0/device:GPU:0"``
_PLANE_NAME = re.compile(rb'"name"\s*:\s*"(?:/[^"/]*)*/(?:host|device):[A-Za-z]')


def sniff(head: Head) -> int:
    """:data:`~.registry.CONTENT` when the text is a JSON object (after white space) whose
    first bytes name an XSpace plane as a process (``process_name`` → ``/host:…`` or
    ``/device:…``), else 0. Kineto names its processes by pid or ``GPU N``, never so."""
    data = head.text or b""  # (after a UTF-8 byte-order mark and white space)
    if data[:1] != b"{" or b'"process_name"' not in data:
        return 0
    return CONTENT if _PLANE_NAME.search(data) else 0


def _what(path: Path) -> str:
    if path.name.startswith("perfetto_trace.json"):
        return "jax's Perfetto export (jax.profiler.trace(..., create_perfetto_trace=True))"
    return "a jax/XLA trace-viewer JSON export of an XSpace (<host>.trace.json.gz, by jax.profiler or xprof)"


def xplanes_beside(path: Path) -> list[Path]:
    """The XSpace files in the folder of ``path`` (``*.xplane.pb``, ``*.xplane.pb.gz``), by name."""
    folder = path.parent
    return sorted(folder.glob("*.xplane.pb")) + sorted(folder.glob("*.xplane.pb.gz"))


def advice(path: Path) -> str:
    """What to pass instead of the export ``path``: the ``.xplane.pb`` beside it (the first,
    and how many more), or where jax writes one when none is there."""
    found = xplanes_beside(path)
    lacks = "it holds no HLO costs (FLOPs, bytes) and no device stats (chip, peaks)"
    if not found:
        return (f"{_what(path)}: {lacks}; pass the .xplane.pb that jax wrote with it instead "
                "(jax.profiler.trace writes <host>.xplane.pb in the same plugins/profile/<run>/ folder; "
                "none is beside this file)")
    more = f" (or the folder {path.parent}, {len(found)} hosts)" if len(found) > 1 else ""
    return f"{_what(path)}: {lacks}; pass the .xplane.pb beside it: {found[0]}{more}"


def read(path: Path, progress: Progress | None = None) -> Trace:
    """Refuse the export, naming what to pass instead.

    Raises:
        TraceFormatError: always (``<path>: byte 0: jax's Perfetto export (...): ...; pass the
            .xplane.pb beside it: <path>``).
    """
    raise TraceFormatError(path, "byte 0", advice(Path(path)))


FORMAT = InputFormat(name="jax_trace_json", read=read, sniff=sniff)
