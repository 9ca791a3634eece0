#!/usr/bin/env bash
# A user's plain `pip install .` (no extras) in a fresh venv must read every input format:
# the main job on a Kineto trace, an .xplane.pb, a cache written by `ingest`, then `chips`
# and `estimate`. A dependency the default path needs but pyproject.toml does not declare
# (numpy, once) fails here, because the test extras are not installed yet.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv-bare}"
rm -rf "$VENV"
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q .
T="$VENV/bin/traceroof"
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
run() { echo "+ traceroof $*"; "$T" "$@" > "$OUT/last.txt" || { cat "$OUT/last.txt"; exit 1; }; head -3 "$OUT/last.txt"; }
run analyze fixtures/example_h100_decoder.json.gz --top 3 -q
run analyze fixtures/jax_cpu/train_step.xplane.pb --chip fixtures/jax_cpu/cpu_chip.toml --top 3 -q
run ingest fixtures/example_h100_decoder.json.gz -o "$OUT/cache" -q
run analyze "$OUT/cache" --top 3 -q
run chips
run estimate --model fixtures/models/llama2-7b.json --chip h100
echo "bare install: every format read"
