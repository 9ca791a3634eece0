"""Input formats: one module per format, each declaring an :class:`~.registry.InputFormat`
(its sniff, reader, directory handling and facts) that :mod:`.registry` collects.

``traceroof.io.read_trace`` reads any registered format; :func:`register` adds one (see
docs/extending.md, "An input format"). The registry API is re-exported here; the format
modules themselves are imported on first use, and their decoders only when a file is read.
"""

from .registry import (
    CONTENT,
    HINT,
    MAGIC,
    SUFFIX,
    FormatFacts,
    Head,
    InputFormat,
    detect,
    facts_for,
    formats,
    get,
    register,
    unregister,
)

__all__ = ["InputFormat", "FormatFacts", "Head", "MAGIC", "CONTENT", "SUFFIX", "HINT", "register", "unregister",
           "formats", "get", "detect", "facts_for"]
