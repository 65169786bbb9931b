#!/usr/bin/env bash
# The suite against the newest releases of every dependency and test tool, in a venv of its own
# (.venv-newest), ignoring constraints.txt: drift in an oracle (onnxruntime, torch, onnx...) shows
# here on purpose, not in the pinned run. Prints the versions it got before the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv-newest && . .venv-newest/bin/activate
pip install -q -U pip && pip install -q -U -e ".[test]"
pip freeze --exclude onnxep | grep -iE "^(onnx|onnxruntime|onnx-ir|onnxscript|numpy|torch|hypothesis|ruff|pytest)=="
ONNXEP_NEWEST=1 python -m pytest -q "$@"
