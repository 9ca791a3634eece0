"""The Kineto JSON format's registry entry (``torch.profiler`` / ``export_chrome_trace``).

The reader is :mod:`.kineto` (imported only when a Kineto file is read: its decoder loads
msgspec). A ``.json``/``.json.gz`` file is one rank; a plain folder of them is a multi-rank
run, one input per file.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from .registry import CONTENT, FormatFacts, Head, InputFormat

if TYPE_CHECKING:
    from ..progress import Progress
    from ..trace import Trace


def sniff(head: Head) -> int:
    """:data:`~.registry.CONTENT` when the text starts with ``{`` (or, in a gzip stream,
    ``{`` or ``[``) after a UTF-8 byte-order mark and white space (:attr:`.registry.Head.text`),
    else 0."""
    first = head.text[:1] if head.text is not None else b""
    return CONTENT if first == b"{" or (head.gzip and first == b"[") else 0


def read(path: Path, progress: Progress | None = None) -> Trace:
    """One Kineto file, streamed (:func:`traceroof.parsers.kineto.read`), reporting the bytes
    and events read to ``progress``.

    Raises:
        TraceFormatError: not a Kineto trace, or nothing recoverable in it.
    """
    from . import kineto

    return kineto.read(path, progress=None if progress is None else progress.update)


FORMAT = InputFormat(
    name="kineto",
    read=read,
    sniff=sniff,
    folder_suffixes=(".json", ".json.gz"),
    dir_names=("*.json", "*.json.gz"),
    describe="a Kineto JSON trace (.json/.json.gz)",
    gzip_describe="a Kineto JSON trace",
    facts=FormatFacts(
        shapes_hint="no shapes recorded: re-run torch.profiler with record_shapes=True to get "
        "FLOPs and bytes per op"),
)
