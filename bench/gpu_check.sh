#!/usr/bin/env bash
# The GPU machine's checks, one stage per call (each fits the device tool's 10 minutes).
#
#   bench/gpu_check.sh STAGE [STAGE...]     STAGE: tests | conformance | conformance-cpu | bench
#
# Run from the repository root on the GPU machine, with the wheels in .device/wheels
# (build them here: pip wheel --no-deps -w .device/wheels . && cp ../shared/wheels/*.whl
# .device/wheels/). It installs onnxep with no network into /tmp/site, runs the stages,
# writes logs and JSON under $OUT (default .device/out) and prints a short table last.
set -uo pipefail
OUT=${OUT:-.device/out}
mkdir -p "$OUT"
if ! python3 -m pip install -q --no-index --no-deps --target /tmp/site .device/wheels/*.whl \
    >"$OUT/install.log" 2>&1; then
  cat "$OUT/install.log"
  exit 1
fi
export PYTHONPATH=/tmp/site
export CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-/tmp/cupy_cache}
python3 - >"$OUT/machine.json" <<'PY'
import json, subprocess, cupy, onnxep
p = cupy.cuda.runtime.getDeviceProperties(0)
print(json.dumps({"device": p["name"].decode(), "cupy": cupy.__version__,
                  "cuda_runtime": cupy.cuda.runtime.runtimeGetVersion(),
                  "driver": cupy.cuda.runtime.driverGetVersion(),
                  "onnxep": onnxep.__file__}))
PY
SUMMARY=()
for STAGE in "$@"; do
  t0=$(date +%s)
  case "$STAGE" in
    tests)
      # PYTEST_ARGS narrows the run (default: every GPU test); it may hold quoted -k text
      eval "PY_ARGS=(${PYTEST_ARGS:-tests/cuda})"
      timeout 330 python3 -m pytest -q -p no:cacheprovider -o addopts="" \
        --junitxml="$OUT/tests.xml" -rfE "${PY_ARGS[@]}" >"$OUT/tests.log" 2>&1
      rc=$?
      SUMMARY+=("tests: $(tail -1 "$OUT/tests.log") (rc $rc)")
      ;;
    conformance)
      timeout 420 python3 bench/gpu_conformance.py "$OUT" --budget "${CONFORMANCE_BUDGET:-380}" \
        >"$OUT/conformance.log" 2>&1
      rc=$?
      SUMMARY+=("conformance (rc $rc):" "$(head -4 "$OUT/conformance.log")")
      ;;
    conformance-cpu)
      timeout 560 python3 bench/gpu_conformance.py "$OUT" --cpu --budget 520 \
        >"$OUT/conformance.log" 2>&1
      rc=$?
      SUMMARY+=("conformance+cpu (rc $rc):" "$(head -5 "$OUT/conformance.log")")
      ;;
    bench)
      timeout 60 python3 bench/gpu_micro.py "$OUT/micro.json" >"$OUT/micro.log" 2>&1
      timeout 90 python3 bench/overhead.py --providers cuda --nodes 500 --runs 100 \
        >"$OUT/overhead_cuda.log" 2>&1
      rc=$?
      SUMMARY+=("micro: $(tr '\n' ';' <"$OUT/micro.log")" "overhead: $(tr '\n' ';' <"$OUT/overhead_cuda.log") (rc $rc)")
      ;;
    *)
      echo "unknown stage $STAGE (tests | conformance | conformance-cpu | bench)"
      exit 2
      ;;
  esac
  echo "$STAGE took $(( $(date +%s) - t0 )) s" >>"$OUT/stages.log"
done
echo "---- summary ($(cat "$OUT/machine.json"))"
cat "$OUT/stages.log"
printf '%s\n' "${SUMMARY[@]}"
