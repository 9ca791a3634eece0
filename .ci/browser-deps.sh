#!/usr/bin/env bash
# What the dashboard's browser tests (tests/test_web_browser.py, marker `browser`) need:
# Debian's chromium (apt) and the Playwright Python package (PyPI) in the active Python.
# Playwright drives /usr/bin/chromium (executable_path=...); it never downloads a browser,
# so do NOT run `playwright install`. Run as root (CI) or with sudo; safe to re-run.
set -euo pipefail
PY="${PYTHON:-python}"
if ! command -v chromium >/dev/null 2>&1; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null
fi
"$PY" -m pip install -q 'playwright>=1.45'
chromium --version 2>/dev/null
"$PY" -c "import playwright, importlib.metadata as m; print('playwright', m.version('playwright'))"
