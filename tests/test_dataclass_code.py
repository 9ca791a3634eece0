"""The cache of dataclass method code (traceroof/_dataclass_code.py): same classes, compiled
once per Python version, the file written like a .pyc and ignored when unusable."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from traceroof import _dataclass_code as dcc

REPO = Path(__file__).resolve().parents[1]

CLASS_SRC = """
import dataclasses

@dataclasses.dataclass(frozen=True)
class Point:
    x: int
    y: float = 2.5
    tags: list = dataclasses.field(default_factory=list)
"""


def _module(name: str) -> types.ModuleType:
    mod = types.ModuleType(name)
    sys.modules[name] = mod
    try:
        exec(compile(CLASS_SRC, f"<{name}>", "exec", dont_inherit=True), mod.__dict__)
    finally:
        del sys.modules[name]
    return mod


def test_installed_by_import_traceroof():
    assert dataclasses.exec is dcc._exec  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", ["traceroof._test_cached_point", "elsewhere_test_point"])
def test_classes_equal_those_of_plain_dataclasses(name):
    """A traceroof class (cached) and any other (the builtin exec) behave as dataclasses
    always did: defaults, default_factory, eq, hash, repr, frozen, and ``__init__``'s
    annotations are the types themselves (compiled without traceroof's ``__future__``
    annotations flag, which would make them strings)."""
    P = _module(name).Point
    p = P(1)
    assert (p.x, p.y, p.tags) == (1, 2.5, [])
    assert P(1, 2.5, []) == p and P(2) != p
    assert repr(P(3, 1.0, [4])) == "Point(x=3, y=1.0, tags=[4])"
    assert hash(P(1, 2.0, ())) == hash((1, 2.0, ()))  # the generated __hash__ of the fields
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.x = 5
    assert P.__init__.__annotations__ == {"x": int, "y": float, "tags": list, "return": None}
    assert [f.name for f in dataclasses.fields(P)] == ["x", "y", "tags"]
    cached = any("def __init__(self,x:" in k and "'tags'" in k
                 for k in (dcc._state["table"] or {}))
    if name.startswith("traceroof."):
        assert cached  # the text of Point's __init__ is in the table
    assert P(1).tags is not P(1).tags  # one list per instance


def _run(code: str, env: dict[str, str]) -> dict:
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


PROBE = (
    "import json, traceroof.sections, traceroof._dataclass_code as d;"
    "print(json.dumps({'new': d._state['new'], 'path': d._state['path'],"
    " 'loaded': len(d._state['table'] or {}) - d._state['new']}))"
)


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONPYCACHEPREFIX=str(tmp_path / "pyc"),
               **extra)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("TRACEROOF_DATACLASS_CACHE", None)
    env.update(extra)
    return env


#: sections.py's frozen dataclasses, 6 generated methods each (__init__, __repr__, __eq__,
#: __setattr__, __delattr__, __hash__), counted from its source
SECTION_METHODS = 6 * (REPO / "traceroof" / "sections.py").read_text().count("@dataclass(frozen=True)")


def test_written_once_then_read(tmp_path):
    """First process: sections.py's methods compile and the file is written at exit; second
    process: nothing compiled, every text found."""
    env = _env(tmp_path)
    first = _run(PROBE, env)
    path = Path(first["path"])
    assert first["new"] == SECTION_METHODS and first["loaded"] == 0
    assert path.is_relative_to(tmp_path / "pyc") and path.name.endswith(".dataclass-code")
    assert path.read_bytes().startswith(importlib.util.MAGIC_NUMBER)
    second = _run(PROBE, env)
    assert second["new"] == 0 and second["loaded"] == SECTION_METHODS


@pytest.mark.parametrize("content", [b"", b"garbage", importlib.util.MAGIC_NUMBER + b"\x00\x01",
                                     b"\x00\x00\x00\x00" + b"x" * 100])
def test_unusable_file_is_ignored_and_replaced(tmp_path, content):
    env = _env(tmp_path)
    path = Path(_run(PROBE, env)["path"])
    path.write_bytes(content)
    got = _run(PROBE, env)
    assert got["loaded"] == 0 and got["new"] == SECTION_METHODS  # compiled as without a cache
    assert _run(PROBE, env)["new"] == 0  # and the file written again


def test_no_file_without_bytecode_writing_or_when_switched_off(tmp_path):
    got = _run(PROBE, _env(tmp_path, PYTHONDONTWRITEBYTECODE="1"))
    assert got["new"] > 0 and not Path(got["path"]).exists()
    off = _run("import json, dataclasses, traceroof;"
               "print(json.dumps({'installed': getattr(dataclasses, 'exec', None) is not None}))",
               _env(tmp_path, TRACEROOF_DATACLASS_CACHE="0"))
    assert off == {"installed": False}


def test_load_rejects_other_versions_and_non_code(tmp_path):
    import marshal

    path = tmp_path / "x.dataclass-code"
    code = compile("x = 1", "<string>", "exec")
    path.write_bytes(importlib.util.MAGIC_NUMBER + marshal.dumps({"a": code, "b": 3, 4: code}))
    assert dcc._load(str(path)) == {"a": code}  # the entry of the wrong types dropped
    path.write_bytes(b"\x01\x02\x03\x04" + marshal.dumps({"a": code}))
    assert dcc._load(str(path)) == {}
    assert dcc._load(str(tmp_path / "missing")) == {} and dcc._load(None) == {}
