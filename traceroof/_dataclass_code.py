"""The methods that ``@dataclass`` generates for traceroof's classes, compiled once per Python
version and kept on disk beside the ``.pyc`` files (issue 19, small traces).

``dataclasses`` builds each class's ``__init__``, ``__repr__``, ``__eq__``, ``__hash__``,
``__setattr__`` and ``__delattr__`` from source text and compiles it with ``exec`` at every
import: traceroof defines ~75 dataclasses on an ``analyze`` run, and compiling their ~400
generated methods costs ~35 ms of CPU per process, the largest single item of traceroof's own
imports (docs/performance.md, "Small traces (session 9)"; 62 ms for the whole of
``dataclasses._process_class`` at load ~2). :func:`install` puts a caching ``exec`` in the
``dataclasses`` module's namespace (``dataclasses`` calls the ``exec`` its own globals name,
builtins' otherwise), which, for a class of a ``traceroof`` module only, looks the source text up
in a ``{source text: code object}`` table read once from the cache file and compiles only what
is not in it. The code object is the one ``exec`` would have compiled from the same text
(``compile(text, "<string>", "exec", dont_inherit=True)``: ``dataclasses`` has no
``__future__`` flags to pass on), so the classes are unchanged; any other module's text goes to
the builtin ``exec`` untouched.

The cache file is ``<pycache of this module>.dataclass-code`` (it follows
``sys.pycache_prefix``), written like a ``.pyc``: not when ``sys.dont_write_bytecode`` is set,
atomically (a temporary file, then ``os.replace``), and a failed write or an unreadable,
truncated or other-version file is ignored (the texts are compiled as without the cache). It
starts with ``importlib.util.MAGIC_NUMBER`` (the bytecode version) and holds a ``marshal``
dump of the table. It is rewritten at exit only when this process compiled a new text, keeping
the earlier entries (another command imports other modules), and starts over past
:data:`MAX_ENTRIES`, so stale texts of edited classes do not accumulate. Set
``TRACEROOF_DATACLASS_CACHE=0`` to do without it.
"""

from __future__ import annotations

import atexit
import builtins
import dataclasses
import importlib.util
import marshal
import os
import sys
from types import CodeType
from typing import Any

#: entries past which the file is started over with this process's texts only (an ``analyze``
#: run compiles ~400; the whole package, every command, fewer than 1,000)
MAX_ENTRIES = 4000

_state: dict[str, Any] = {"table": None, "new": 0, "path": None, "used": set()}


def cache_path() -> str | None:
    """The cache file's path, or None where Python keeps no bytecode cache for this module."""
    try:
        pyc = importlib.util.cache_from_source(__file__)
    except (NotImplementedError, ValueError):
        return None
    return pyc[: -len(".pyc")] + ".dataclass-code" if pyc.endswith(".pyc") else None


def _load(path: str | None) -> dict[str, CodeType]:
    """The table stored at ``path``; empty when the file is missing, of another bytecode
    version or unreadable (never raises)."""
    if path is None:
        return {}
    try:
        with open(path, "rb") as f:
            data = f.read()
        magic = importlib.util.MAGIC_NUMBER
        if not data.startswith(magic):
            return {}
        table = marshal.loads(data[len(magic):])
    except (OSError, ValueError, EOFError, TypeError):
        return {}
    if not isinstance(table, dict):
        return {}
    return {k: v for k, v in table.items() if isinstance(k, str) and isinstance(v, CodeType)}


def _table() -> dict[str, CodeType]:
    table = _state["table"]
    if table is None:
        table = _state["table"] = _load(_state["path"])
    return table


def _compile(source: str) -> CodeType:
    return compile(source, "<string>", "exec", dont_inherit=True)


def _exec(source: Any, globals: dict[str, Any] | None = None, locals: Any = None, /) -> None:
    """``exec`` as ``dataclasses`` calls it, the code of a traceroof class's method taken from
    the table (compiled and added to it when missing)."""
    module = globals.get("__name__") if isinstance(globals, dict) else None
    if not (isinstance(source, str) and isinstance(module, str)
            and (module == "traceroof" or module.startswith("traceroof."))):
        if isinstance(source, str):
            source = _compile(source)  # as dataclasses' own frame would: no __future__ flags
        return builtins.exec(source, globals, locals)
    table = _table()
    _state["used"].add(source)
    code = table.get(source)
    if code is None:
        code = table[source] = _compile(source)
        if not _state["new"]:
            atexit.register(save)
        _state["new"] += 1
    return builtins.exec(code, globals, locals)


def save() -> bool:
    """Write the table if this process compiled a new text; returns whether a file was written
    (never raises: a failed write leaves the cache as it was)."""
    path, table = _state["path"], _state["table"]
    if path is None or not table or not _state["new"] or sys.dont_write_bytecode:
        return False
    try:
        merged = {**_load(path), **table}
        if len(merged) > MAX_ENTRIES:
            merged = {k: table[k] for k in _state["used"] if k in table}
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(importlib.util.MAGIC_NUMBER + marshal.dumps(merged))
        os.replace(tmp, path)
    except (OSError, ValueError):
        return False
    _state["new"] = 0
    return True


def install() -> bool:
    """Route ``dataclasses``' method compilation through the cache (idempotent); returns
    whether it is in place (not with ``TRACEROOF_DATACLASS_CACHE=0``)."""
    if os.environ.get("TRACEROOF_DATACLASS_CACHE", "1") == "0":
        return False
    if getattr(dataclasses, "exec", None) is not _exec:
        _state["path"] = cache_path()
        dataclasses.exec = _exec  # type: ignore[attr-defined]
    return True
