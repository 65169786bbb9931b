#!/usr/bin/env bash
# The GPU machine's checks, one stage per call (each fits the device tool's 10 minutes).
#
#   bench/gpu_check.sh STAGE [STAGE...]     STAGE: tests | conformance | conformance-cpu | bench
#                                                  | decode
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
    decode)
      # The factory's qwen2.5-0.5b decoders (fp16, int4) are built here (too big to carry),
      # then, in one bench run each, onnxep eager (capture off), onnxep-graph (the same
      # decode with CUDA-graph capture auto: full-capacity masks, one graph replayed per
      # step) and torch eager on the same weights, at 16 and ~2000 tokens of context; the
      # JSON and the summary state each side's captures, replays and fallbacks. The
      # environment's ONNXEP_CUDA_CAPTURE is unset (it overrides both sides' option).
      # DECODE_STEPS (64) and
      # DECODE_BUDGET (s, 540) trim it; fp16 goes first so a short budget still reports it.
      deadline=$(( $(date +%s) + ${DECODE_BUDGET:-540} ))
      rc=0
      for dtype in fp16 int4; do
        left=$(( deadline - $(date +%s) ))
        if (( left < 60 )); then SUMMARY+=("decode $dtype: skipped, budget spent"); continue; fi
        g0=$(date +%s)
        timeout $(( left < 240 ? left : 240 )) python3 bench/make_models.py --size qwen2.5-0.5b \
          --dtype "$dtype" --kind genai --out /tmp/m >>"$OUT/decode.log" 2>&1 || rc=$?
        SUMMARY+=("decode: made qwen2.5-0.5b $dtype in $(( $(date +%s) - g0 )) s")
        for ctx in 16 2000; do
          left=$(( deadline - $(date +%s) ))
          if (( left < 30 )); then SUMMARY+=("decode $dtype ctx $ctx: skipped, budget spent"); continue; fi
          extra=()
          if [ "$ctx" = 16 ]; then extra=(--profile); fi
          b0=$(date +%s)
          echo "== $dtype context $ctx" >>"$OUT/decode.log"
          env -u ONNXEP_CUDA_CAPTURE timeout $(( left < 200 ? left : 200 )) python3 -m onnxep.cli bench \
            "/tmp/m/genai-qwen2.5-0.5b-$dtype/model.onnx" --providers cuda,cpu --vs torch,onnxep-graph \
            --decode "${DECODE_STEPS:-64}" --context "$ctx" --warmup 3 "${extra[@]}" \
            --json "$OUT/decode_${dtype}_ctx${ctx}.json" >>"$OUT/decode.log" 2>&1 || rc=$?
          echo "decode $dtype ctx $ctx took $(( $(date +%s) - b0 )) s" >>"$OUT/decode.log"
        done
      done
      SUMMARY+=("decode (rc $rc):" "$(python3 - "$OUT" <<'PY'
import glob, json, os, sys
def key(path):
    dtype, ctx = os.path.basename(path)[len("decode_"):-len(".json")].split("_ctx")
    return dtype, int(ctx)
def us(v):
    return "n/a" if v is None else f"{v:.1f}"
for path in sorted(glob.glob(os.path.join(sys.argv[1], "decode_*_ctx*.json")), key=key):
    r = json.load(open(path))
    tag = "%s context %d" % key(path)
    sides = "; ".join(
        f"{k} {1000 / s['median_ms']:.1f} tok/s {s['median_ms']:.3f} ms/step"
        for k, s in r["summary"].items()
    )
    ours = next((s for s in r["sides"] if s["name"] == "onnxep"), {})
    graph = next((s for s in r["sides"] if s["name"] == "onnxep-graph"), {})
    ref = r["tokens"].get("onnxep", [])
    agree = ", ".join(
        f"{k} {sum(a == b for a, b in zip(ref, t))}/{len(ref)}"
        for k, t in r["tokens"].items() if k != "onnxep"
    )
    print(f"{tag}: {sides}")
    print(
        f"  onnxep: state {ours.get('state_path')}, d2h reads/step "
        f"{ours.get('device_to_host_reads_per_step')}, copied/step "
        f"{ours.get('copied_outputs_per_step')}, host {us(ours.get('host_us_per_op'))} us/op "
        f"of {ours.get('compute_nodes')} nodes, profiled {us(ours.get('profiled_us_per_op'))}"
        f" us/op, placement {ours.get('nodes_per_provider')}; tokens equal: {agree}"
    )
    for side in (ours, graph):
        c = side.get("capture_timed")
        if c:
            print(
                f"  {side['name']} capture {c['policy']}: timed decode captures {c['captures']},"
                f" replays {c['replays']}, fallbacks {c['fallbacks']}, copied/step "
                f"{side.get('copied_outputs_per_step')}, full-capacity mask {side.get('full_mask')}"
                + (f"; failures: {'; '.join(c['failures'])[:300]}" if c["failures"] else "")
            )
    for name, why in r.get("skipped", {}).items():
        print(f"  {name} skipped: {why}")
PY
)")
      ;;
    *)
      echo "unknown stage $STAGE (tests | conformance | conformance-cpu | bench | decode)"
      exit 2
      ;;
  esac
  echo "$STAGE took $(( $(date +%s) - t0 )) s" >>"$OUT/stages.log"
done
echo "---- summary ($(cat "$OUT/machine.json"))"
cat "$OUT/stages.log"
printf '%s\n' "${SUMMARY[@]}"
