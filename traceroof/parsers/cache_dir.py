"""The columnar cache directory's registry entry (written by ``traceroof ingest``).

A cache (single or dataset, :mod:`traceroof.cache`) is one input; its traces keep the
``meta.format`` of the traces it was made from, so it has no facts of its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from .registry import InputFormat

if TYPE_CHECKING:
    from ..progress import Progress
    from ..trace import Trace


def is_cache_dir(path: Path) -> bool:
    """``path`` is a cache directory (:func:`traceroof.cache.is_cache`)."""
    from ..cache import is_cache

    return is_cache(path)


def read(path: Path, progress: Progress | None = None) -> Trace:
    """The trace the cache was written from (:func:`traceroof.cache.read_cache`).

    Raises:
        TraceFormatError: a damaged cache (names the file).
    """
    from ..cache import read_cache

    return read_cache(path)


FORMAT = InputFormat(name="cache", read=read, unit_dir=is_cache_dir)
