#!/usr/bin/env bash
# The GPU machine's checks, one stage per call (each fits the device tool's 10 minutes).
#
#   bench/gpu_check.sh STAGE [STAGE...]     STAGE: tests | conformance | conformance-cpu | bench
#                                                  | attention | gemv | decode | decode-1.5b
#                                                  | decode-hybrid | fusions | prefill
#                                                  | prefill-nbits | prefill-models | vision
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
# onnxruntime-gpu, where ../shared/gpu/install_peers.sh put it (/tmp/ortgpu), goes first: the
# decode stages' onnxruntime sides run on its CUDA provider (without it they are skipped,
# with the reason, in every table)
if [ -d /tmp/ortgpu ] && [ -f /tmp/ort_env.sh ]; then
  . /tmp/ort_env.sh
  export PYTHONPATH=/tmp/ortgpu:/tmp/site
fi
export CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-/tmp/cupy_cache}
# The decode stages' onnxruntime peers: onnxruntime-gpu eager and graph where it is on the
# path; else only the graph side, which the tables then list as skipped with the reason (a
# CPU onnxruntime beside a GPU decode would only slow the stage down)
if python3 -c "import onnxruntime as o, sys; sys.exit('CUDAExecutionProvider' not in o.get_available_providers())" 2>/dev/null; then
  ORT_SIDES=onnxruntime,onnxruntime-graph
else
  ORT_SIDES=onnxruntime-graph
fi
python3 - >"$OUT/machine.json" <<'PY'
import json, subprocess, cupy, onnxep
p = cupy.cuda.runtime.getDeviceProperties(0)
print(json.dumps({"device": p["name"].decode(), "cupy": cupy.__version__,
                  "cuda_runtime": cupy.cuda.runtime.runtimeGetVersion(),
                  "driver": cupy.cuda.runtime.driverGetVersion(),
                  "onnxep": onnxep.__file__}))
PY
# decode_stage NAME KIND SIZE BUDGET PROFILE DTYPE...: the factory's KIND/SIZE decoder built here in
# each DTYPE (too big to carry), then, in one bench run per dtype and context (16 and ~2000
# tokens; DECODE_CONTEXTS="16 2000 8000 32000" replaces them), onnxep eager (capture off),
# onnxep-graph (the same decode with CUDA-graph capture auto: full-capacity masks, one graph
# replayed per step), torch eager and torch-graph (the
# torch twin with a static cache, its decode step one torch.cuda.CUDAGraph), onnxruntime-cuda
# and onnxruntime-graph (onnxruntime-gpu through IO binding, each KV cache one buffer shared
# as past and present, its CUDA graph off and on; skipped with the reason where onnxruntime
# has no CUDA provider) on the same weights; each side also decodes alone, back to back.
# DECODE_VS replaces the peers. The JSON and the summary state each side's captures, replays and fallbacks and
# its fraction of the bandwidth floor (initializer bytes / 4.26 TB/s). The environment's
# ONNXEP_CUDA_CAPTURE is unset (it overrides both onnxep sides' option). PROFILE yes adds
# a profiled onnxep session at context 16 (host us per op; one more model load). DECODE_STEPS
# (64) and BUDGET (s) trim it, DECODE_DTYPES replaces the dtypes (a rerun of one); the first
# dtype goes first so a short budget still reports it: a run that would start past the budget
# is listed as skipped. Files: $OUT/NAME.log, $OUT/NAME_<dtype>_ctx<N>.json; the models stay
# in /tmp/m/KIND-SIZE-DTYPE (stage fusions reuses the 0.5b ones; all three sizes take ~7 GB).
decode_stage() {
  local name=$1 kind=$2 size=$3 budget=$4 profile=$5
  shift 5
  local deadline=$(( $(date +%s) + budget )) rc=0 dtype ctx left g0 b0 model
  local dtypes=("$@")
  if [ -n "${DECODE_DTYPES:-}" ]; then read -ra dtypes <<<"$DECODE_DTYPES"; fi
  for dtype in "${dtypes[@]}"; do
    left=$(( deadline - $(date +%s) ))
    if (( left < 90 )); then SUMMARY+=("$name $dtype: skipped, budget spent"); continue; fi
    g0=$(date +%s)
    model="/tmp/m/$kind-$size-$dtype/model.onnx"
    if [ -f "$model" ]; then  # written last, after its .data
      SUMMARY+=("$name: $size $dtype reused from an earlier stage on this machine")
    else
      timeout $(( left < 240 ? left : 240 )) python3 bench/make_models.py --size "$size" \
        --dtype "$dtype" --kind "$kind" --out /tmp/m >>"$OUT/$name.log" 2>&1 || rc=$?
      SUMMARY+=("$name: made $size $dtype in $(( $(date +%s) - g0 )) s")
    fi
    for ctx in ${DECODE_CONTEXTS:-16 2000}; do
      left=$(( deadline - $(date +%s) ))
      if (( left < 45 )); then SUMMARY+=("$name $dtype ctx $ctx: skipped, budget spent"); continue; fi
      local extra=()
      if [ "$ctx" = 16 ] && [ "$profile" = yes ]; then extra=(--profile); fi
      b0=$(date +%s)
      echo "== $dtype context $ctx" >>"$OUT/$name.log"
      env -u ONNXEP_CUDA_CAPTURE timeout $(( left < 240 ? left : 240 )) python3 -m onnxep.tools.cli bench \
        "$model" --providers cuda,cpu \
        --vs "${DECODE_VS:-torch,onnxep-graph,torch-graph,$ORT_SIDES}" \
        --decode "${DECODE_STEPS:-64}" --context "$ctx" --warmup 3 "${extra[@]}" \
        --json "$OUT/${name}_${dtype}_ctx${ctx}.json" >>"$OUT/$name.log" 2>&1 || rc=$?
      echo "$name $dtype ctx $ctx took $(( $(date +%s) - b0 )) s" >>"$OUT/$name.log"
      SUMMARY+=("$name: $dtype ctx $ctx bench took $(( $(date +%s) - b0 )) s")
    done
  done
  SUMMARY+=("$name (rc $rc):" "$(python3 -m onnxep.tools.benchmark.decode_report "$OUT" \
    --pattern "${name}_*_ctx*.json" 2>&1)")
}

SUMMARY=()
for STAGE in "$@"; do
  t0=$(date +%s)
  case "$STAGE" in
    tests)
      # PYTEST_ARGS narrows the run (default: every GPU test); it may hold quoted -k text.
      # TESTS_SHARDS=N (whole runs) runs N pytest processes side by side on the one GPU, the
      # files split by their last recorded times (bench/gpu_test_shards.py): the suite is
      # mostly host work, so 4 shards take about a third of one process's time.
      eval "PY_ARGS=(${PYTEST_ARGS:-tests/cuda})"
      rm -f "$OUT"/tests*.xml "$OUT"/tests*.log
      whole=$([ -z "${PYTEST_ARGS:-}" ] && echo yes || echo no)
      if [ "${TESTS_SHARDS:-1}" -gt 1 ] && [ -z "${PYTEST_ARGS:-}" ]; then
        mapfile -t SHARD_LINES < <(python3 bench/gpu_test_shards.py "$TESTS_SHARDS")
        threads=$(( $(nproc) / ${#SHARD_LINES[@]} )); [ "$threads" -ge 1 ] || threads=1
        pids=()
        for i in "${!SHARD_LINES[@]}"; do
          read -ra files <<<"${SHARD_LINES[$i]}"
          OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads \
            timeout "${TESTS_TIMEOUT:-330}" python3 -m pytest -q -p no:cacheprovider \
            -o addopts="" --basetemp="/tmp/pytest-shard$i" --junitxml="$OUT/tests.$i.xml" \
            -rfE "${files[@]}" >"$OUT/tests.$i.log" 2>&1 &
          pids+=($!)
        done
        rc=0
        for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
        for i in "${!SHARD_LINES[@]}"; do
          [ -f "$OUT/tests.$i.xml" ] || whole=no  # a shard cut off writes no junit file
          SUMMARY+=("tests shard $i: $(tail -1 "$OUT/tests.$i.log")")
          cat "$OUT/tests.$i.log" >>"$OUT/tests.log"
        done
      else
        timeout "${TESTS_TIMEOUT:-330}" python3 -m pytest -q -p no:cacheprovider -o addopts="" \
          --junitxml="$OUT/tests.xml" -rfE "${PY_ARGS[@]}" >"$OUT/tests.log" 2>&1
        rc=$?
        SUMMARY+=("tests: $(tail -1 "$OUT/tests.log")")
      fi
      # The record bench/record_gpu_suite.py appends to bench/results/gpu-suite.jsonl.
      python3 bench/record_gpu_suite.py --from-junit "$OUT"/tests*.xml --whole "$whole" \
        >"$OUT/gpu_suite.json"
      SUMMARY+=("tests rc $rc" "record: $(cat "$OUT/gpu_suite.json")")
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
    attention)
      # The decode GroupQueryAttention step alone (bench/gpu_attention_bench.py): per shape
      # (0.5b, 1.5b, head size 256), decode kernel (tensor cores, CUDA cores) and context
      # (16, 2000, 8000, 32000), captured and eager us per layer, KV bytes, TB/s and its
      # fraction of a device-to-device copy measured in the same run. ATTENTION_ARGS adds
      # or replaces options (--contexts, --shapes, --routes, --capacity).
      timeout 540 python3 bench/gpu_attention_bench.py ${ATTENTION_ARGS:-} \
        >"$OUT/attention.jsonl" 2>"$OUT/attention.log"
      rc=$?
      SUMMARY+=("attention (rc $rc): $(tail -3 "$OUT/attention.log" | tr '\n' ';')" \
        "$(python3 - "$OUT/attention.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["bench"] == "d2d_copy":
        print(f"copy {r['copy_tbs']} TB/s")
        continue
    print(f"{r['shape']} {r['route']} ctx {r['context']}: {r['us_per_call']} us "
          f"(eager {r['eager_us']}), {r['bandwidth_tbs']} TB/s = {r['of_copy']:.0%} of copy, "
          f"{r['splits']}/{r['grid_splits']} splits")
PY
)")
      ;;
    gemv)
      # Decode GEMVs at the Qwen2.5-0.5B/1.5B shapes (bench/gpu_gemv_bench.py): cuBLAS and
      # MatMulNT in fp16, MatMulNBits int4 on the tensor cores and on the CUDA cores, each
      # against a device copy measured in the same run; then again with every call on its
      # own weight copy (--cold: memory, not L2). About 2 minutes in all.
      GEMV_CASES=${GEMV_CASES:-fp16_cublas,fp16_nt,int4,int4_zp,int4_cc,int4_zp_cc}
      timeout 240 python3 bench/gpu_gemv_bench.py --cases "$GEMV_CASES" \
        >"$OUT/gemv.jsonl" 2>"$OUT/gemv.log"
      rc=$?
      timeout 240 python3 bench/gpu_gemv_bench.py --cold --cases "$GEMV_CASES" \
        >"$OUT/gemv_cold.jsonl" 2>>"$OUT/gemv.log" || rc=$?
      SUMMARY+=("gemv (rc $rc): us and share of copy bandwidth, warm L2 | cold" \
        "$(python3 bench/gpu_gemv_bench.py --summary "$OUT/gemv.jsonl" "$OUT/gemv_cold.jsonl" 2>&1)")
      ;;
    fusions)
      # Fusions off against on, same run: kernels, plan nodes and ms per decode step, eager
      # and captured (bench/gpu_fusions.py). The decode stages delete the qwen2.5-0.5b models
      # they build; FUSIONS_QWEN=1 builds them here first (about 20 s each), else the
      # script takes the tiny genai decoders and says so.
      : >"$OUT/fusions.log"
      if [ "${FUSIONS_QWEN:-0}" = 1 ]; then
        for dtype in fp16 int4; do
          [ -f "/tmp/m/genai-qwen2.5-0.5b-$dtype/model.onnx" ] || timeout 240 python3 \
            bench/make_models.py --size qwen2.5-0.5b --dtype "$dtype" --kind genai --out /tmp/m \
            >>"$OUT/fusions.log" 2>&1
        done
      fi
      env -u ONNXEP_CUDA_CAPTURE timeout 175 python3 bench/gpu_fusions.py "$OUT/fusions.json" \
        --budget "${FUSIONS_BUDGET:-140}" >>"$OUT/fusions.log" 2>&1
      rc=$?
      SUMMARY+=("fusions (rc $rc):" "$(grep '^#' "$OUT/fusions.log")")
      ;;
    prefill)
      # The attention prefill: the tensor-core kernel (both tile shapes where there are two),
      # GroupQueryAttention's step with it and with the tiled kernel, torch's SDPA, the dense
      # fp16 GEMM rate (bench/gpu_prefill_bench.py; PREFILL_ARGS adds or narrows).
      eval "PF_ARGS=(${PREFILL_ARGS:---bidirectional})"
      timeout 500 python3 bench/gpu_prefill_bench.py "${PF_ARGS[@]}" \
        --json "$OUT/prefill_attention.jsonl" >"$OUT/prefill.log" 2>&1
      rc=$?
      SUMMARY+=("prefill (rc $rc): $(grep -c attention_prefill "$OUT/prefill_attention.jsonl") rows")
      ;;
    prefill-nbits)
      # MatMulNBits at prefill row counts: a GEMV launch per 8 rows against dequantise +
      # cuBLAS, and the scratch each holds (bench/gpu_nbits_prefill_bench.py).
      timeout 500 python3 bench/gpu_nbits_prefill_bench.py --json "$OUT/nbits_prefill.jsonl" \
        >"$OUT/prefill_nbits.log" 2>&1
      rc=$?
      SUMMARY+=("prefill-nbits (rc $rc): $(grep -c matmul_nbits "$OUT/nbits_prefill.jsonl") rows")
      ;;
    prefill-models)
      # The qwen2.5-0.5b decoders' prefill (PREFILL_MODELS: SIZE:DTYPE list) per op type and
      # kernel at 128-8000 tokens beside onnxruntime (its CUDA build where installed), greedy
      # tokens and device memory after 2000/8000-token prompts and 32 steps.
      read -ra specs <<<"${PREFILL_MODELS:-qwen2.5-0.5b:fp16 qwen2.5-0.5b:int4}"
      makes=()
      for spec in "${specs[@]}"; do makes+=(--make "$spec"); done
      timeout 560 python3 bench/gpu_prefill_profile.py "${makes[@]}" --vs onnxruntime \
        --json "$OUT/prefill_profile.jsonl" >"$OUT/prefill_models.log" 2>&1
      rc=$?
      SUMMARY+=("prefill-models (rc $rc):" "$(grep '"bench": "prefill"' "$OUT/prefill_profile.jsonl" | cut -c1-220)")
      ;;
    decode)
      # The factory's qwen2.5-0.5b decoders (fp16, int4), built here (too big to carry).
      decode_stage decode genai qwen2.5-0.5b "${DECODE_BUDGET:-540}" yes fp16 int4
      ;;
    decode-1.5b)
      # qwen2.5-1.5b, fp16 then int4: builds ~50 s each, bench runs ~60-100 s each (expected;
      # no profiled session: it would load the 3 GB model once more).
      decode_stage decode-1.5b genai qwen2.5-1.5b "${DECODE_BUDGET:-540}" no fp16 int4
      ;;
    vision)
      # CNNs and a voice-activity model through cuDNN (bench/gpu_vision.py): onnxep
      # ["cuda","cpu"] beside onnxruntime-gpu, batch 1 and 8, fp32 and fp16, medians,
      # capture_stats and the difference from onnxep's CPU provider (~3 minutes).
      timeout "${VISION_BUDGET:-270}" python3 bench/gpu_vision.py --runs "${VISION_RUNS:-20}" \
        --json "$OUT/vision.json" >"$OUT/vision.log" 2>&1
      rc=$?
      SUMMARY+=("vision (rc $rc):" "$(grep -E '^\||^    ' "$OUT/vision.log")")
      ;;
    decode-hybrid)
      # The 0.8B hybrid (Qwen3.5 text decoder: gated-delta linear and full attention), fp16.
      decode_stage decode-hybrid hybrid qwen3.5-0.8b "${DECODE_BUDGET:-420}" yes fp16
      ;;
    *)
      echo "unknown stage $STAGE (tests | conformance | conformance-cpu | bench | attention" \
        "| gemv | decode | decode-1.5b | decode-hybrid | fusions | prefill | prefill-nbits" \
        "| prefill-models | vision)"
      exit 2
      ;;
  esac
  echo "$STAGE took $(( $(date +%s) - t0 )) s" >>"$OUT/stages.log"
done
echo "---- summary ($(cat "$OUT/machine.json"))"
cat "$OUT/stages.log"
printf '%s\n' "${SUMMARY[@]}"
