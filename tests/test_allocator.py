"""traceroof._allocator: importing traceroof before polars sets polars' allocator (jemalloc)
to return freed memory, unless polars is already loaded or the user set the variable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _conf_after(code: str, env_value: str | None) -> str:
    """``_RJEM_MALLOC_CONF`` as a fresh interpreter sees it after ``code`` (polars imported
    last, so it reads that value)."""
    env = {k: v for k, v in os.environ.items() if k != "_RJEM_MALLOC_CONF"}
    env["PYTHONPATH"] = str(REPO)
    if env_value is not None:
        env["_RJEM_MALLOC_CONF"] = env_value
    script = code + "\nimport os, sys, polars\nsys.stdout.write(os.environ.get('_RJEM_MALLOC_CONF', '<unset>'))\n"
    res = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_importing_traceroof_first_sets_the_allocator_polars_then_reads():
    from traceroof._allocator import JEMALLOC_CONF

    # polars prepends its own defaults on import; jemalloc takes the last value of each key
    assert _conf_after("import traceroof", None).endswith("," + JEMALLOC_CONF)
    # the library's usual door, as a user script writes it
    assert _conf_after("from traceroof.io import read_trace", None).endswith("," + JEMALLOC_CONF)


@pytest.mark.parametrize("user", ["narenas:1", ""])
def test_a_users_own_setting_is_kept(user):
    from traceroof._allocator import JEMALLOC_CONF

    seen = _conf_after("import traceroof", user)
    assert seen.endswith(user) and JEMALLOC_CONF not in seen, seen


def test_polars_imported_first_is_left_alone():
    # the setting could not take effect any more: nothing is written
    from traceroof._allocator import JEMALLOC_CONF

    seen = _conf_after("import polars\nimport traceroof", None)
    assert JEMALLOC_CONF not in seen and "dirty_decay_ms:500" in seen, seen


def test_configure_reports_whether_it_set_the_variable(monkeypatch):
    # polars is loaded in this test process (by the imports of other tests): nothing set
    import polars  # noqa: F401

    from traceroof import _allocator

    monkeypatch.delenv("_RJEM_MALLOC_CONF", raising=False)
    assert _allocator.configure() is False and "_RJEM_MALLOC_CONF" not in os.environ
    monkeypatch.delitem(sys.modules, "polars")
    assert _allocator.configure() is True and os.environ["_RJEM_MALLOC_CONF"] == _allocator.JEMALLOC_CONF
