"""Decode products (one row of activations) on the GPU: cuBLAS fp16, the provider's fp16 GEMV and
the int4 MatMulNBits GEMV, timed inside CUDA graphs; prints one JSON line per case and shape.

    python bench/gpu_gemv_bench.py [--replays 50] [--calls 20] [--models qwen0.5b,qwen1.5b]
                                   [--cases ...] [--cold]
    python bench/gpu_gemv_bench.py --summary WARM.jsonl [COLD.jsonl]

Shapes (K -> N) are Qwen2.5-0.5B's (896 -> 1152 joined q/k/v, 896 -> 896 o, 896 -> 4864
up, 4864 -> 896 down, 896 -> 9728 joined gate/up, 896 -> 151936 LM head) and
Qwen2.5-1.5B's (1536 -> 2048, 1536 -> 1536, 1536 -> 8960, 8960 -> 1536, 1536 -> 151936).
Cases, each on the same activations:

* ``fp16_cublas``: ``x @ W`` with W ``[K, N]`` float16 through ``providers_cuda.blas``;
* ``fp16_gemv``: the same product through the GEMV kernel (``gemv_cuda.Gemv``: one launch,
  split K merged by the last block of each tile), checked to agree with cuBLAS; a session's
  plain MatMul runs cuBLAS, onnxep::MatMulBias this kernel;
* ``fp16_cublas_bias`` / ``fp16_gemv_bias``: ``x @ W + bias`` as MatMulBias would run it
  through cuBLAS (the bias broadcast into the output, then a GEMM with beta = 1) and through
  the GEMV (the bias in its epilogue);
* ``int4`` / ``int4_zp``: MatMulNBits with 4-bit weights in blocks of 32, without and with
  packed zero points, through the CUDA kernel builder (float16 activations: the tensor-core
  GEMV, ``nbits_mma_cuda``; the row's ``route`` says which ran);
* ``int4_cc`` / ``int4_zp_cc``: the same nodes through ``nbits_cuda``'s CUDA-core GEMV (the
  tensor-core route turned off), in the same run;
* ``fp16_ref``: a plain fp16 GEMV on W stored ``[N, K]`` (one warp per output), a floor
  for comparison;
* ``fp16_nt``: the same product through onnxep::MatMulNT's CUDA kernel on W^T stored
  ``[N, K]`` (what ``fuse_transposed_weights`` makes): the warp-per-output GEMV where its
  routing rule (``gemv_nt_cuda.use_warps``) says so, else cuBLAS with ``trans_b``; the row's
  ``route`` says which; checked to agree with cuBLAS;
* ``fp16_nt_swiglu`` (joined gate/up shapes only): MatMulNT with ``activation="swiglu"``,
  the SwiGLU in the GEMV's epilogue, against ``fp16_cublas`` plus one SwiGLU launch.

Each case is captured ``--calls`` times back to back into one CUDA graph; ``us`` is the
median over ``--replays`` replays (CUDA events around each) divided by the calls, so
launch gaps are those a captured decode step sees. ``bytes`` is what a call must move
(weights, scales, zero points, activations, output), ``tbs`` that over ``us``, and
``of_copy`` that against ``copy_tbs``, a device-to-device copy measured in the same run.
``host_us`` is one eager call's Python and launch cost.

Replayed 20 times, a product of a few MB reads its weights from the 50 MB L2, not from
memory. ``--cold`` gives each call of the graph its own copy of the weights, enough copies
to pass twice the device's L2 (``fp16_cublas``, ``fp16_nt`` and the ``int4`` cases; the
others are left out), so ``of_copy`` compares memory with memory; the row's ``copies`` says
how many.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

MODELS = {
    "qwen0.5b": {
        "qkv": (896, 1152),
        "o": (896, 896),
        "up": (896, 4864),
        "down": (4864, 896),
        "gate_up": (896, 9728),
        "lm_head": (896, 151936),
    },
    "qwen1.5b": {
        "qkv": (1536, 2048),
        "o": (1536, 1536),
        "up": (1536, 8960),
        "down": (8960, 1536),
        "lm_head": (1536, 151936),
    },
}

_SOURCE = r"""
#include <cuda_fp16.h>

// y[n] = sum_k w[n, k] x[k]: one warp per row, 16-byte loads, float32 sums (K % 8 == 0).
extern "C" __global__ void fp16_gemv(const __half* __restrict__ w, const __half* __restrict__ x,
                                     __half* __restrict__ y, int N, int K) {
  const long long row = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (row >= N) return;
  const uint4* wr = reinterpret_cast<const uint4*>(w + row * K);
  const uint4* xv = reinterpret_cast<const uint4*>(x);
  float acc = 0.f;
  for (int i = lane; i < K / 8; i += 32) {
    const uint4 a = wr[i];
    const uint4 b = xv[i];
    const __half2* ha = reinterpret_cast<const __half2*>(&a);
    const __half2* hb = reinterpret_cast<const __half2*>(&b);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 fa = __half22float2(ha[j]);
      const float2 fb = __half22float2(hb[j]);
      acc = fmaf(fa.x, fb.x, acc);
      acc = fmaf(fa.y, fb.y, acc);
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) y[row] = __float2half_rn(acc);
}
"""


def _graph_timer(cupy, replays: int, calls: int):
    """``us(fn, n)``: median per-call device time of ``fn`` captured ``max(calls, n)`` times in
    one graph."""

    def us(fn, n_calls: int = 0) -> float:
        n_calls = max(calls, n_calls)
        stream = cupy.cuda.Stream(non_blocking=True)
        with stream:
            fn()  # warm-up outside capture: handles, workspaces, pool blocks
            fn()
            stream.synchronize()
            # Each call's output is dropped before the next, so the pool hands the next call
            # the same blocks the warm-up left: nothing is allocated from the driver in capture.
            stream.begin_capture()
            for _ in range(n_calls):
                fn()
            graph = stream.end_capture()
            graph.launch(stream)
            stream.synchronize()
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            times = []
            for _ in range(replays):
                start.record(stream)
                graph.launch(stream)
                end.record(stream)
                end.synchronize()
                times.append(cupy.cuda.get_elapsed_time(start, end) * 1000.0 / n_calls)
        del graph
        return statistics.median(times)

    return us


def _host_us(cupy, fn, calls: int = 100) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - t0
    cupy.cuda.Device().synchronize()
    return elapsed / calls * 1e6


def _copy_tbs(cupy, replays: int) -> float:
    src = cupy.ones(256 * 1024 * 1024, dtype=np.float32)  # 1 GiB
    dst = cupy.empty_like(src)
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    times = []
    for _ in range(max(5, replays // 5)):
        start.record()
        dst.data.copy_from_device_async(src.data, src.nbytes)
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) * 1000.0)
    return 2 * src.nbytes / statistics.median(times) / 1e6


#: The cases ``--cold`` runs (each call on its own copy of the weights).
COLD_CASES = {"fp16_cublas", "fp16_nt", "int4", "int4_zp", "int4_cc", "int4_zp_cc"}


def _fp16_cases(cupy, k: int, n: int, x, cold: bool = False):
    from onnxep.providers_cuda import blas, nvrtc
    from onnxep.providers_cuda.ops.gemv_cuda import Gemv
    from onnxep.providers_cuda.xp import cuda_namespace

    w = (cupy.random.standard_normal((k, n), dtype=cupy.float32) * 0.05).astype(cupy.float16)
    wt = cupy.ascontiguousarray(w.T)  # [N, K] for the reference kernel
    y = cupy.empty((1, n), dtype=cupy.float16)
    bias = (cupy.random.standard_normal(n, dtype=cupy.float32) * 0.05).astype(cupy.float16)
    gemv = Gemv(cuda_namespace(), np.float16)
    if not gemv.takes(x, w):
        raise RuntimeError(f"the GEMV does not take K={k} N={n}")
    ref = nvrtc.function(_SOURCE, "fp16_gemv")
    blocks = -(-n * 32 // 256)
    got = gemv(x, w)
    want = blas.gemm(x, w)
    err = float(cupy.abs(got.astype(cupy.float32) - want.astype(cupy.float32)).max())
    scale = float(cupy.abs(want.astype(cupy.float32)).max())
    if not err <= 4e-3 * scale + 1e-3:
        raise RuntimeError(f"GEMV and cuBLAS disagree at K={k} N={n}: {err} (scale {scale})")
    nbytes = w.nbytes + x.nbytes + y.nbytes
    nt, route = _nt_case(cupy, x, wt, "none")
    copies = _copies(cupy, w.nbytes, cold)
    ws = [(w,)] + [(w.copy(),) for _ in range(copies - 1)]
    wts = [(wt,)] + [(wt.copy(),) for _ in range(copies - 1)]

    def cublas_bias():
        y[...] = bias
        blas.gemm(x, w, beta=1.0, out=y)

    more = {"copies": copies}
    return {
        "fp16_cublas": (_cycling(lambda w: blas.gemm(x, w, out=y), ws), nbytes, more),
        "fp16_gemv": (lambda: gemv(x, w), nbytes),
        "fp16_cublas_bias": (cublas_bias, nbytes + bias.nbytes),
        "fp16_gemv_bias": (lambda: gemv(x, w, bias), nbytes + bias.nbytes),
        "fp16_ref": (lambda: ref((blocks,), (256,), (wt, x, y, np.int32(n), np.int32(k))), nbytes),
        "fp16_nt": (_cycling(nt, wts), nbytes, {"route": route, **more}),
    }


def _nt_case(cupy, x, wt, activation: str):
    """``run()`` for onnxep::MatMulNT's CUDA kernel on ``x`` and ``wt`` ([N, K]) and which path
    its routing rule takes; the plain product is checked against cuBLAS first."""
    from onnxep.providers.node import NodeInfo, ValueInfo
    from onnxep.providers_cuda import blas
    from onnxep.providers_cuda.ops.gemv_nt_cuda import GemvNT
    from onnxep.providers_cuda.ops.op_onnxep_matmul_nt import matmul_nt
    from onnxep.providers_cuda.xp import cuda_namespace

    ins = tuple(ValueInfo(f"x{i}", "tensor", np.dtype(np.float16)) for i in range(2))
    attrs = {"activation": activation}
    node = NodeInfo("MatMulNT", "onnxep", "bench", 1, attrs, ins, (ValueInfo("Y"),))
    fn = matmul_nt(node, cuda_namespace())
    swiglu = activation == "swiglu"
    route = "warp" if GemvNT(cuda_namespace(), np.float16).takes(x, wt, swiglu) else "cublas"
    if not swiglu:
        (got,) = fn(x, wt)
        want = blas.gemm(x, wt, trans_b=True)
        err = float(cupy.abs(got.astype(cupy.float32) - want.astype(cupy.float32)).max())
        scale = float(cupy.abs(want.astype(cupy.float32)).max())
        if not err <= 4e-3 * scale + 1e-3:
            raise RuntimeError(f"MatMulNT and cuBLAS disagree at {tuple(wt.shape)}: {err}")
    return (lambda w=wt: fn(x, w)[0]), route


def _copies(cupy, nbytes: int, cold: bool) -> int:
    """Weight copies a case cycles through: 1, or (``--cold``) enough to pass twice the L2."""
    if not cold:
        return 1
    l2 = int(cupy.cuda.Device().attributes["L2CacheSize"])
    return max(1, -(-2 * l2 // nbytes))


def _cycling(fn, sets):
    """``fn(*set)`` over ``sets`` in turn, one per call (a graph captures them in order)."""
    state = {"i": 0}

    def call():
        i = state["i"]
        state["i"] = (i + 1) % len(sets)
        return fn(*sets[i])

    return call


def _int4_case(cupy, k: int, n: int, with_zp: bool, x, *, mma: bool = True, cold: bool = False):
    from onnxep.providers.node import NodeInfo, ValueInfo
    from onnxep.providers_cuda.ops import op_matmul_nbits
    from onnxep.providers_cuda.xp import cuda_namespace

    rng = np.random.default_rng(0)
    block, kb = 32, -(-k // 32)
    b = rng.integers(0, 256, (n, kb, 16), dtype=np.uint8)
    scales = (rng.random((n, kb), dtype=np.float32) * 0.02 + 0.001).astype(np.float16)
    zp = rng.integers(0, 256, (n, -(-kb // 2)), dtype=np.uint8) if with_zp else None
    consts = [("B", b), ("scales", scales)] + ([("zero_points", zp)] if with_zp else [])
    ins = (ValueInfo("A", "tensor", np.dtype(np.float16), (1, k)),) + tuple(
        ValueInfo(name, "tensor", arr.dtype, arr.shape, arr) for name, arr in consts
    )
    attrs = {"K": k, "N": n, "bits": 4, "block_size": block}
    node = NodeInfo("MatMulNBits", "com.microsoft", "bench", 1, attrs, ins, (ValueInfo("Y"),))
    saved = op_matmul_nbits.MMA_GEMV
    op_matmul_nbits.MMA_GEMV = mma
    try:
        fn = op_matmul_nbits.matmul_nbits(node, cuda_namespace())
    finally:
        op_matmul_nbits.MMA_GEMV = saved
    weights = b.nbytes + scales.nbytes + (zp.nbytes if with_zp else 0)
    # The session's device copies (the kernel adopts whichever it is given, as a view).
    sets = [[cupy.asarray(arr) for _, arr in consts] for _ in range(_copies(cupy, weights, cold))]
    extra = {"route": "mma" if mma and _ran_mma(fn) else "cuda-core", "copies": len(sets)}
    return _cycling(lambda *dev: fn(x, *dev)[0], sets), weights + x.nbytes + n * 2, extra


def _ran_mma(fn) -> bool:
    """Whether the built node takes the tensor-core GEMV (its runner holds one)."""
    return getattr(fn, "mma", None) is not None


def summary(warm: str, cold: str | None = None) -> str:
    """One line per shape and case from the JSON lines of a run (and of its ``--cold`` run):
    microseconds and share of the copy bandwidth, warm | cold."""

    def rows(path):
        out = {}
        if path is None:
            return out
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                if "case" in r:
                    out[r["model"], r["shape"], r["case"]] = r
        return out

    w, c = rows(warm), rows(cold)
    lines = []
    for key, r in w.items():
        text = f"{key[0]} {key[1]} {key[2]}{'/' + r['route'] if 'route' in r else ''}: "
        text += f"{r['us']} us {r['of_copy']:.0%}"
        if key in c:
            text += f" | cold {c[key]['us']} us {c[key]['of_copy']:.0%}"
        lines.append(text)
    return "\n".join(lines)


def main() -> None:
    if sys.argv[1:2] == ["--summary"]:
        print(summary(*sys.argv[2:4]))
        return
    import cupy

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--replays", type=int, default=50)
    ap.add_argument("--calls", type=int, default=20, help="calls captured in one graph")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument(
        "--cases",
        default=(
            "fp16_cublas,fp16_gemv,fp16_cublas_bias,fp16_gemv_bias,fp16_ref,fp16_nt,"
            "fp16_nt_swiglu,int4,int4_zp,int4_cc,int4_zp_cc"
        ),
    )
    ap.add_argument(
        "--cold", action="store_true", help="each call its own weight copy: no L2 reuse"
    )
    ap.add_argument(
        "--fill-warps",
        type=int,
        help="an experiment: nbits_mma_cuda's FILL_WARPS_PER_SM (16) for this run, the warps "
        "an SM should have before a tile's k-steps are split among several",
    )
    args = ap.parse_args()
    if args.fill_warps:
        from onnxep.providers_cuda.ops import nbits_mma_cuda

        nbits_mma_cuda.FILL_WARPS_PER_SM = args.fill_warps
    wanted = set(args.cases.split(","))
    if args.cold:
        wanted &= COLD_CASES
    device = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    us = _graph_timer(cupy, args.replays, args.calls)
    copy_tbs = round(_copy_tbs(cupy, args.replays), 3)
    print(json.dumps({"bench": "gemv", "copy_tbs": copy_tbs, "device": device}), flush=True)
    for model in args.models.split(","):
        for shape, (k, n) in MODELS[model].items():
            x = cupy.random.standard_normal((1, k), dtype=cupy.float32).astype(cupy.float16)
            cases = {}
            if any(c.startswith("fp16") for c in wanted):
                cases.update(_fp16_cases(cupy, k, n, x, args.cold))
            if "fp16_nt_swiglu" in wanted and shape == "gate_up":
                wt = (cupy.random.standard_normal((n, k), dtype=cupy.float32) * 0.05).astype(
                    cupy.float16
                )
                fn, route = _nt_case(cupy, x, wt, "swiglu")
                cases["fp16_nt_swiglu"] = (fn, wt.nbytes + x.nbytes + n, {"route": route})
            for case, zp, mma in (
                ("int4", False, True),
                ("int4_zp", True, True),
                ("int4_cc", False, False),
                ("int4_zp_cc", True, False),
            ):
                if case in wanted:
                    cases[case] = _int4_case(cupy, k, n, zp, x, mma=mma, cold=args.cold)
            for case, (fn, nbytes, *extra) in cases.items():
                if case not in wanted:
                    continue
                copies = max([e.get("copies", 1) for e in extra] or [1])
                t = us(fn, copies)  # a replay walks every copy
                row = {
                    "bench": "gemv",
                    "model": model,
                    "shape": shape,
                    "case": case,
                    "K": k,
                    "N": n,
                    "M": 1,
                    "us": round(t, 2),
                    "host_us": round(_host_us(cupy, fn), 2),
                    "bytes": nbytes,
                    "tbs": round(nbytes / t / 1e6, 3),
                    "of_copy": round(nbytes / t / 1e6 / copy_tbs, 3),
                    "copy_tbs": copy_tbs,
                }
                for more in extra:
                    row.update(more)
                print(json.dumps(row), flush=True)
            del cases
            cupy.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    main()
