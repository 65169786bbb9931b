"""What programmatic dependent launch would save a captured decode step (GPU machine).

    python bench/gpu_pdl_probe.py [--layers 24] [--hidden 896] [--inter 4864] [--qkv 1152]
        [--repeats 30]

A decode step is a chain of GEMVs, each reading its weights (the bulk of its bytes, known
before the step starts) and the vector the one before wrote. Inside a CUDA graph each kernel
starts only once the one before has finished and its writes are flushed, so every launch
pays its own ramp (blocks scheduled, first loads in flight) on top of its bytes. With
programmatic dependent launch (``cuLaunchKernelEx`` with
``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION``; in the kernel
``griddepcontrol.launch_dependents`` and ``griddepcontrol.wait``) the next kernel's blocks
start while the previous one runs and may read whatever does not depend on it (its weights)
before they wait.

The probe builds the 0.5B decoder's GEMV chain (per layer Q/K/V, O, gate/up and down; a warp
per output row, fp16 weights [N, K] with 16-byte loads, float32 sums), captures ``--layers``
layers in one graph per variant and replays it (CUDA events, median of ``--repeats``):

* ``plain``: ordinary launches (today's captured step);
* ``pdl-wait-first``: PDL, the kernel waits before any load (only the launch overlaps);
* ``pdl-prefetch``: PDL, each warp loads its weight row into registers before it waits;
* ``pdl-l2-prefetch``: PDL, each warp asks for its row's lines in L2 (``prefetch.global.L2``)
  before it waits, then loads as ``plain`` does.

Each line: microseconds per replay and per kernel, the weight bytes' bandwidth, and whether
the chain's final vector is bit-equal to the plain variant's (a wait in the wrong place would
read a stale vector and change it).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics

import numpy as np

SOURCE = r"""
#include <cuda_fp16.h>
// y[N] = W[N, K] x[K]: a warp per row, lane l takes halves [c*256 + 8l, +8) of each chunk c.
template <int NCH, int PDL, int PREFETCH>
__global__ void __launch_bounds__(128) gemv_probe(const __half* __restrict__ x,
                                                  const __half* __restrict__ w,
                                                  __half* __restrict__ y, int N, int K) {
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * 4 + (threadIdx.x >> 5);
  if (PDL) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  uint4 wr[NCH];
  const __half* wrow = w + (long long)(row < N ? row : 0) * K;
  if (PREFETCH == 2) {  // the row's 128-byte lines into L2 only: no registers held
    for (int i = lane * 64; i < K; i += 32 * 64)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(wrow + i));
  } else if (PREFETCH) {
#pragma unroll
    for (int c = 0; c < NCH; ++c) {
      const int i = c * 256 + lane * 8;
      wr[c] = i < K ? __ldg(reinterpret_cast<const uint4*>(wrow + i)) : make_uint4(0, 0, 0, 0);
    }
  }
  if (PDL) asm volatile("griddepcontrol.wait;" ::: "memory");
  if (row >= N) return;
  float acc = 0.f;
#pragma unroll
  for (int c = 0; c < NCH; ++c) {
    const int i = c * 256 + lane * 8;
    if (i >= K) break;
    const uint4 wv = PREFETCH == 1 ? wr[c] : __ldg(reinterpret_cast<const uint4*>(wrow + i));
    const uint4 xv = *reinterpret_cast<const uint4*>(x + i);
    const __half2* wh = reinterpret_cast<const __half2*>(&wv);
    const __half2* xh = reinterpret_cast<const __half2*>(&xv);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 a = __half22float2(wh[j]), b = __half22float2(xh[j]);
      acc = fmaf(a.x, b.x, acc);
      acc = fmaf(a.y, b.y, acc);
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  // keep the chain's values in range whatever the shapes
  if (lane == 0) y[row] = __float2half(tanhf(acc));
}
"""


class _Attr(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_int), ("value", ctypes.c_char * 64)]


class _Config(ctypes.Structure):
    _fields_ = [
        ("gridDimX", ctypes.c_uint),
        ("gridDimY", ctypes.c_uint),
        ("gridDimZ", ctypes.c_uint),
        ("blockDimX", ctypes.c_uint),
        ("blockDimY", ctypes.c_uint),
        ("blockDimZ", ctypes.c_uint),
        ("sharedMemBytes", ctypes.c_uint),
        ("hStream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(_Attr)),
        ("numAttrs", ctypes.c_uint),
    ]


_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CUlaunchAttributeID


def _launcher():
    lib = ctypes.CDLL("libcuda.so.1")
    fn = lib.cuLaunchKernelEx
    fn.argtypes = [ctypes.POINTER(_Config), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--hidden", type=int, default=896)
    ap.add_argument("--qkv", type=int, default=1152)
    ap.add_argument("--inter", type=int, default=4864)
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    import cupy as cp

    h, inter = args.hidden, args.inter
    shapes = [(args.qkv, h), (h, h), (2 * inter, h), (h, inter)] * args.layers  # (N, K)
    rng = np.random.default_rng(0)
    weights = [
        cp.asarray((rng.standard_normal((n, k), np.float32) / np.sqrt(k)).astype(np.float16))
        for n, k in shapes
    ]
    width = max(n for n, _ in shapes)
    bufs = [cp.zeros(width, cp.float16) for _ in range(2)]
    x0 = cp.asarray(rng.standard_normal(width, np.float32).astype(np.float16))
    mod = cp.RawModule(
        code=SOURCE,
        options=("--std=c++17",),
        name_expressions=[
            f"gemv_probe<{(k + 255) // 256}, {p}, {f}>"
            for k in sorted({k for _, k in shapes})
            for p, f in ((0, 0), (1, 0), (1, 1), (1, 2))
        ],
    )
    launch = _launcher()
    stream = cp.cuda.Stream(non_blocking=True)
    variants = {
        "plain": (0, 0),
        "pdl-wait-first": (1, 0),
        "pdl-prefetch": (1, 1),
        "pdl-l2-prefetch": (1, 2),
    }
    weight_bytes = sum(w.nbytes for w in weights)
    results = {}
    for name, (pdl, pre) in variants.items():
        fns = {
            k: mod.get_function(f"gemv_probe<{(k + 255) // 256}, {pdl}, {pre}>")
            for k in {k for _, k in shapes}
        }
        keep = []

        def step(fns=fns, pdl=pdl, keep=keep):
            for i, ((n, k), w) in enumerate(zip(shapes, weights)):
                src = x0 if i == 0 else bufs[(i - 1) % 2]
                dst = bufs[i % 2]
                vals = [
                    ctypes.c_uint64(src.data.ptr),
                    ctypes.c_uint64(w.data.ptr),
                    ctypes.c_uint64(dst.data.ptr),
                    ctypes.c_int(n),
                    ctypes.c_int(k),
                ]
                params = (ctypes.c_void_p * 5)(*[ctypes.addressof(v) for v in vals])
                attr = _Attr(_PROGRAMMATIC_STREAM_SERIALIZATION, 0, b"\x01" + b"\x00" * 63)
                cfg = _Config((n + 3) // 4, 1, 1, 128, 1, 1, 0, stream.ptr, None, 0)
                if pdl:
                    cfg.attrs = ctypes.pointer(attr)
                    cfg.numAttrs = 1
                keep.append((vals, params, attr, cfg))
                rc = launch(ctypes.byref(cfg), fns[k].kernel.ptr, params, None)
                if rc:
                    raise RuntimeError(f"cuLaunchKernelEx failed: CUDA error {rc}")

        with stream:
            step()
            stream.synchronize()
            stream.begin_capture()
            step()
            graph = stream.end_capture()
            graph.launch(stream)
            stream.synchronize()
            out = cp.asnumpy(bufs[(len(shapes) - 1) % 2]).copy()
            times = []
            for _ in range(args.repeats + 3):
                a, b = cp.cuda.Event(), cp.cuda.Event()
                a.record(stream)
                graph.launch(stream)
                b.record(stream)
                b.synchronize()
                times.append(cp.cuda.get_elapsed_time(a, b) * 1e3)
        us = statistics.median(times[3:])
        results[name] = out
        print(
            json.dumps(
                {
                    "variant": name,
                    "kernels": len(shapes),
                    "us_per_replay": round(us, 1),
                    "us_per_kernel": round(us / len(shapes), 2),
                    "weight_mb": round(weight_bytes / 1e6, 1),
                    "weight_tbs": round(weight_bytes / us / 1e6, 3),
                    "equal_to_plain": bool(np.array_equal(out, results["plain"])),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
