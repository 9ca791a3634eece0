"""polars' allocator (jemalloc) settings, made when traceroof is imported before polars.

polars reads ``_RJEM_MALLOC_CONF`` once, when it is loaded, and appends it to its own
``dirty_decay_ms:500,muzzy_decay_ms:1000`` (polars issue 18088; jemalloc takes the last
value of each key). With polars' setting, memory freed while a large trace is linked stays
resident for half a second and is counted again by the next stage's peak; with
:data:`JEMALLOC_CONF` it goes back to the OS within ~100 ms, purged by jemalloc's own
background thread rather than on the parsing thread. Measured on a 1,018 MB Kineto trace,
``read_trace`` + ``analyze`` in a plain script: peak RSS 697–747 MB with polars' setting,
673–684 MB with this one, at the same CPU time (docs/performance.md, "1 GB: the issue-19 bars").

The setting is made only when it can take effect and no one else chose: polars not yet
imported (``"polars" not in sys.modules``) and ``_RJEM_MALLOC_CONF`` not set by the user.
Worker processes started afterwards inherit it through the environment.
"""

from __future__ import annotations

import os
import sys

#: background purging, dirty pages returned after 100 ms, no muzzy stage (jemalloc's
#: ``opt.background_thread``, ``opt.dirty_decay_ms``, ``opt.muzzy_decay_ms``)
JEMALLOC_CONF = "background_thread:true,dirty_decay_ms:100,muzzy_decay_ms:0"


def configure() -> bool:
    """Set ``_RJEM_MALLOC_CONF`` to :data:`JEMALLOC_CONF` if polars is not loaded yet and
    the variable is unset. Returns whether it was set (never raises)."""
    if "polars" in sys.modules or "_RJEM_MALLOC_CONF" in os.environ:
        return False
    os.environ["_RJEM_MALLOC_CONF"] = JEMALLOC_CONF
    return True


configure()
