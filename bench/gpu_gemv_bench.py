"""The CUDA MatMulNBits decode GEMV against fp16 GEMVs; prints one JSON line per case.

    python bench/gpu_gemv_bench.py [--repeats 100] [--shapes lm_head,mlp]

Shapes: Qwen2.5-0.5B's LM head (N=151936, K=896) and its MLP up projection
(N=4864, K=896), one row of activations (M=1), float16. Cases:

* ``int4``: MatMulNBits with 4-bit weights in blocks of 32, without and with
  (packed uint8) zero points, built through the CUDA kernel builder;
* ``fp16_cublas``: the same product on an fp16 weight through
  ``providers_cuda.blas`` (cuBLAS);
* ``fp16_gemv``: a plain fp16 GEMV kernel (one warp per output, 16-byte loads,
  float32 accumulation), the fp16 floor without cuBLAS's choices.

Each is timed with CUDA events, median of ``--repeats`` after warm-up:
``device_us`` with a spin kernel queued first, so every launch of the step is
already waiting when the start event fires (device time alone), and
``eager_us`` as the executor would call it (host launch gaps included);
``host_us`` is one call's Python and launch cost. With ``--sweep`` (the
default) the int4 cases are also timed with every other GEMV geometry (columns
per task ``r``, lanes per task ``G``), so one run shows whether the builder's
choice is the fastest. ``bytes`` is what the step
must move (packed weights, scales, zero points, activations, outputs),
``tbs`` that over ``device_us``, ``of_copy`` that against the 4.26 TB/s the
H200 reaches in a device-to-device copy (GPU.md); ``copy_tbs`` is this run's
own copy figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

COPY_TBS = 4.26
SHAPES = {"lm_head": (151936, 896), "mlp": (4864, 896)}

_SOURCE = r"""
#include <cuda_fp16.h>

extern "C" __global__ void spin(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

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


def _timer(cupy, repeats: int):
    from onnxep.providers_cuda import nvrtc

    spin = nvrtc.function(_SOURCE, "spin")
    rate = cupy.cuda.Device().attributes.get("ClockRate") or 2_000_000  # kHz
    cycles = np.int64(rate // 5)  # ~200 us: longer than the host needs to queue one step

    def median_us(fn, queued: bool) -> float:
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        times = []
        for _ in range(repeats):
            if queued:
                spin((1,), (1,), (cycles,))
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(cupy.cuda.get_elapsed_time(start, end) * 1000.0)
        return statistics.median(times)

    return median_us


def _host_us(fn, calls: int = 200) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def _int4_step(cupy, n: int, k: int, with_zp: bool, x):
    from onnxep.providers.node import NodeInfo, ValueInfo
    from onnxep.providers_cuda.ops.op_matmul_nbits import matmul_nbits
    from onnxep.providers_cuda.xp import cuda_namespace

    rng = np.random.default_rng(0)
    block, kb = 32, -(-k // 32)
    b = rng.integers(0, 256, (n, kb, 16), dtype=np.uint8)
    scales = (rng.random((n, kb)) * 0.02 + 0.001).astype(np.float16)
    zp = rng.integers(0, 256, (n, -(-kb // 2)), dtype=np.uint8) if with_zp else None
    consts = [("B", b), ("scales", scales)] + ([("zero_points", zp)] if with_zp else [])
    ins = (ValueInfo("A", "tensor", np.dtype(np.float16), (1, k)),) + tuple(
        ValueInfo(name, "tensor", arr.dtype, arr.shape, arr) for name, arr in consts
    )
    attrs = {"K": k, "N": n, "bits": 4, "block_size": block}
    node = NodeInfo("MatMulNBits", "com.microsoft", "bench", 1, attrs, ins, (ValueInfo("Y"),))
    fn = matmul_nbits(node, cuda_namespace())
    dev = [cupy.asarray(arr) for _, arr in consts]  # the session's device copies
    nbytes = b.nbytes + scales.nbytes + (zp.nbytes if with_zp else 0) + x.nbytes + n * 2

    def step():
        return fn(x, *dev)

    step.runner = fn
    return step, nbytes


def _geometries(cupy, n: int, k: int, with_zp: bool, x) -> dict:
    """The int4 step with each (r, G) geometry forced, for comparison with the builder's pick."""
    from onnxep.providers_cuda.ops import _nbits_cuda as K_
    from onnxep.providers_cuda.ops._quant_cuda import sm_count

    out = {}
    for r in (1, 2, 4):
        for g in (4, 8, 16, 32):
            step, nbytes = _int4_step(cupy, n, k, with_zp, x)
            runner = step.runner
            w = runner.w
            name = K_.gemv_name("__half", "__half", "__half", 4, 32, w.zp_kind, r, 1)
            runner.geoms[1] = K_.gemv_geometry(n, w.chunks, 4, 1, sm_count(), force=(r, g))
            runner.gemv[1] = K_.module((name,)).get_function(name)
            out[f"int4{'_zp' if with_zp else ''}_r{r}_g{g}"] = (step, nbytes)
    return out


def _fp16_steps(cupy, n: int, k: int, x):
    from onnxep.providers_cuda import blas, nvrtc

    w = cupy.asarray((np.random.default_rng(1).standard_normal((n, k)) * 0.05).astype(np.float16))
    y = cupy.empty((1, n), dtype=np.float16)
    gemv = nvrtc.function(_SOURCE, "fp16_gemv")
    blocks = -(-n * 32 // 256)
    nbytes = w.nbytes + x.nbytes + y.nbytes
    return {
        "fp16_cublas": (lambda: blas.gemm(x, w, trans_b=True, out=y)),
        "fp16_gemv": (lambda: gemv((blocks,), (256,), (w, x, y, np.int32(n), np.int32(k)))),
    }, nbytes


def _copy_tbs(cupy, median_us) -> float:
    src = cupy.ones(256 * 1024 * 1024, dtype=np.float32)  # 1 GiB
    dst = cupy.empty_like(src)
    us = median_us(lambda: dst.data.copy_from_device_async(src.data, src.nbytes), True)
    return 2 * src.nbytes / us / 1e6


def main() -> None:
    import cupy

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--shapes", default="lm_head,mlp")
    ap.add_argument("--no-sweep", dest="sweep", action="store_false")
    args = ap.parse_args()
    device = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    median_us = _timer(cupy, args.repeats)
    copy_tbs = round(_copy_tbs(cupy, median_us), 3)
    for shape in args.shapes.split(","):
        n, k = SHAPES[shape]
        x = cupy.asarray(np.random.default_rng(2).standard_normal((1, k)).astype(np.float16))
        steps = {}
        for zp in (False, True):
            steps[f"int4{'_zp' if zp else ''}"] = _int4_step(cupy, n, k, zp, x)
            if args.sweep:
                steps.update(_geometries(cupy, n, k, zp, x))
        fp16, fp16_bytes = _fp16_steps(cupy, n, k, x)
        steps.update({name: (fn, fp16_bytes) for name, fn in fp16.items()})
        for case, (fn, nbytes) in steps.items():
            for _ in range(args.warmup):
                fn()
            cupy.cuda.Device().synchronize()
            dev_us = median_us(fn, True)
            row = {
                "bench": "gemv",
                "case": case,
                "shape": shape,
                "N": n,
                "K": k,
                "M": 1,
                "device_us": round(dev_us, 2),
                "eager_us": round(median_us(fn, False), 2),
                "host_us": round(_host_us(fn), 2),
                "bytes": nbytes,
                "tbs": round(nbytes / dev_us / 1e6, 3),
                "of_copy": round(nbytes / dev_us / 1e6 / COPY_TBS, 3),
                "copy_tbs": copy_tbs,
                "device": device,
            }
            cupy.cuda.Device().synchronize()
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
