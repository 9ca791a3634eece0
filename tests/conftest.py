"""Shared test helpers.

Real third-party traces live in ``../shared/fixtures/real`` beside the checkout (CI lays
it there). A test that needs one FAILS when it is missing: it never skips.
"""

from __future__ import annotations

import gzip
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
REAL = REPO.parent / "shared" / "fixtures" / "real"
FIXTURES = REPO / "fixtures"

sys.path.insert(0, str(FIXTURES))


def require_native(*, module_level: bool = False) -> None:
    """Skip when the native Kineto scanner (``traceroof.parsers._kineto_scan``) is not built,
    but fail under ``TRACEROOF_REQUIRE_NATIVE=1`` (CI builds it: a missing build must not
    pass as a skip). ``module_level``: called at a test module's top level."""
    from traceroof.parsers import kineto_native

    if kineto_native.AVAILABLE:
        return
    if os.environ.get("TRACEROOF_REQUIRE_NATIVE") == "1":
        pytest.fail("TRACEROOF_REQUIRE_NATIVE=1 but traceroof.parsers._kineto_scan is not built")
    pytest.skip("the native scanner is not built (python setup.py build_ext --inplace)",
                allow_module_level=module_level)


def require_xplane_native() -> None:
    """Skip when the C XPlane event decoder (``traceroof.parsers._xplane_scan``) is not built,
    but fail under ``TRACEROOF_REQUIRE_NATIVE=1``, as :func:`require_native`."""
    from traceroof.parsers import xplane_proto_events

    if xplane_proto_events.NATIVE:
        return
    if os.environ.get("TRACEROOF_REQUIRE_NATIVE") == "1":
        pytest.fail("TRACEROOF_REQUIRE_NATIVE=1 but traceroof.parsers._xplane_scan is not built")
    pytest.skip("the C XPlane decoder is not built (python setup.py build_ext --inplace)")


def real(*parts: str) -> Path:
    """Path of a real fixture; raises (test fails) when it is missing."""
    p = REAL.joinpath(*parts)
    if not p.exists():
        raise FileNotFoundError(f"real fixture missing: {p} (CI must have ../shared beside the checkout)")
    return p


def load_json(path: Path) -> Any:
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return json.loads(data)


def union_ns(spans: list[tuple[int, int]]) -> int:
    """Length (ns) of the union of half-open ``[start, end)`` spans, by a sort and a sweep: the
    tests' oracle for busy time, written apart from :mod:`traceroof.intervals` on purpose."""
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted(spans):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return total + (cur_e - cur_s if cur_e is not None else 0)


def kineto(events: list[dict], **header: Any) -> bytes:
    """A minimal Kineto JSON document as bytes."""
    return json.dumps({"schemaVersion": 1, **header, "traceEvents": events}).encode()


def write(tmp_path: Path, name: str, data: bytes | str) -> Path:
    p = tmp_path / name
    p.write_bytes(data.encode() if isinstance(data, str) else data)
    return p


@pytest.fixture(scope="session")
def example_trace() -> Path:
    p = FIXTURES / "example_h100_decoder.json.gz"
    if not p.exists():
        raise FileNotFoundError(f"{p} missing: run python fixtures/make_example.py")
    return p


MODELS = FIXTURES / "models"


@pytest.fixture(scope="module")
def ref7b():
    """The reference 7B (Llama-2-7B shape: L=32, d=4096, 32 heads, d_ff=11008, V=32000, untied)."""
    from traceroof.model import load_model_config

    return load_model_config(MODELS / "llama2-7b.json")


@pytest.fixture(scope="module")
def gqa8():
    """The reference 7B with 8 KV heads."""
    from traceroof.model import load_model_config

    return load_model_config(MODELS / "llama2-7b-gqa8.json")


# --------------------------------------------------------------------------- headless chromium
# One browser fixture, here so that every module shares it: a fixture defined (or imported)
# in two test modules starts Playwright twice, and the second start fails inside the first
# one's event loop. Module-scoped: Playwright's sync API keeps an asyncio loop on the main
# thread while it runs, so it is stopped at the end of each module that used it (a session-
# long browser breaks later tests that run their own loop, e.g. test_mcp's anyio.run).


@pytest.fixture(scope="module")
def browser():
    from test_web_browser import CHROMIUM, CHROMIUM_ARGS, _missing

    why = _missing()
    if why:
        if os.environ.get("CI"):
            pytest.fail(f"browser tests must run in CI: {why}")
        pytest.skip(why)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


def _new_page(browser, **context: Any):
    """A page of a fresh context; ``page.errors`` collects console errors and uncaught
    exceptions."""
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000}, **context)
    pg = ctx.new_page()
    pg.set_default_timeout(60_000)  # a loaded CI machine with software WebGL is slow
    pg.errors = []
    pg.on("console", lambda m: pg.errors.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
    pg.on("pageerror", lambda e: pg.errors.append(f"pageerror: {e}"))
    return ctx, pg


@pytest.fixture
def page(browser):
    """A fresh page (downloads accepted); ``page.errors`` as :func:`_new_page`."""
    ctx, pg = _new_page(browser, accept_downloads=True)
    yield pg
    ctx.close()


@pytest.fixture
def offline_page(browser):
    """A fresh page with the network cut off (a self-contained page must fetch nothing);
    ``page.errors`` as :func:`_new_page`."""
    ctx, pg = _new_page(browser, offline=True)
    yield pg
    ctx.close()
