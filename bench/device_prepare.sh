#!/usr/bin/env bash
# Prepare .device/ for the GPU machine from HEAD, not the working tree (uncommitted files
# never travel into a measured wheel): the wheel, the wheels the device lacks, and HEAD's
# tests/ and bench/ in .device/head. Then, in one device call carrying .device:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .device/wheels/*.whl
#   export PYTHONPATH=/tmp/site; cd .device/head && python3 -m pytest -o addopts="" tests/cuda
set -euo pipefail
cd "$(dirname "$0")/.."
build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT
git archive HEAD | tar -x -C "$build"
rm -rf .device/wheels .device/head
mkdir -p .device/wheels .device/head/.device
cp ../shared/wheels/*.whl .device/wheels/
python3 -m pip wheel -q --no-deps -w .device/wheels "$build"
cp -r "$build/tests" "$build/bench" "$build/pyproject.toml" .device/head/
ln -sfn ../../wheels .device/head/.device/wheels  # gpu_check.sh installs from .device/wheels
# the suite record names the commit it measured (run from .device/head or the root)
git rev-parse HEAD | tee .device/head/COMMIT >.device/wheels/COMMIT
echo "prepared .device from $(git rev-parse --short HEAD)"
