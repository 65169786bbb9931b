"""The CUDA C of the reductions: device primitives, combining steps and the Reduce* kernels.

``PRIMITIVES`` is the only block that names CUDA built-ins the host compiler
lacks (``cuda_fp16.h``, shuffles, 16-byte loads); the kernel emulator in the
tests swaps it for host versions of the same names and compiles the rest as
it is. Softmax and the RMS norms build on ``COMMON``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: The CUDA element type of each dtype the kernels take.
CTYPE = {np.dtype(np.float32): "float", np.dtype(np.float16): "__half"}

#: Device primitives; the test emulator swaps this block for host versions of the same names.
PRIMITIVES = r"""
#include <cuda_fp16.h>

typedef long long i64;

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_f<__half>(float x) {
  return __float2half_rn(x);
}

// 16 bytes at a 16-byte aligned address, in one transaction.
__device__ __forceinline__ uint4 load16(const void* p) {
  return *reinterpret_cast<const uint4*>(p);
}
__device__ __forceinline__ void store16(void* p, const uint4& v) {
  *reinterpret_cast<uint4*>(p) = v;
}

__device__ __forceinline__ float shfl_xor(float v, int lane_mask) {
  return __shfl_xor_sync(0xffffffffu, v, lane_mask);
}

__device__ __forceinline__ float pos_inf() { return __int_as_float(0x7f800000); }

// Programmatic dependent launch (sm_90 and up; no-ops below, and in a launch without the
// attribute). pdl_trigger: the next kernel in the stream may start its blocks once every
// block of this one has called it (or exited). pdl_wait: nothing is read that an earlier
// kernel wrote, and nothing written, before the kernels this one depends on have finished
// and their writes are visible. A kernel launched with the attribute must call pdl_wait
// before its first dependent access.
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
// A hint that the 128-byte line at p be brought into L2. L2 is where global memory is
// coherent, so a line prefetched before pdl_wait is never stale: the earlier kernel's
// writes land there.
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}
"""

#: Reductions, vector loads and the warp/block/column combining steps.
COMMON = r"""
enum { R_SUM = 0, R_MEAN, R_MAX, R_MIN, R_PROD, R_SUMSQ, R_L1, R_L2, R_LOGSUM };

__device__ __forceinline__ bool is_finite(float x) { return fabsf(x) < pos_inf(); }

template <int OP> __device__ __forceinline__ float r_identity() {
  return OP == R_MAX ? -pos_inf() : OP == R_MIN ? pos_inf() : OP == R_PROD ? 1.f : 0.f;
}

// The per-element part of a reduction; the square is rounded before it is summed, as on
// the CPU (no fused multiply-add).
template <int OP> __device__ __forceinline__ float r_map(float x) {
  if (OP == R_SUMSQ || OP == R_L2) return __fmul_rn(x, x);
  if (OP == R_L1) return fabsf(x);
  return x;
}

template <int OP> __device__ __forceinline__ float r_combine(float a, float b) {
  if (OP == R_MAX) return (a > b || a != a) ? a : b;  // NaN wins, as in NumPy
  if (OP == R_MIN) return (a < b || a != a) ? a : b;
  if (OP == R_PROD) return a * b;
  return a + b;
}

template <int OP> __device__ __forceinline__ float r_final(float acc, i64 n) {
  if (OP == R_MEAN) return acc / (float)n;  // 0 / 0: NaN for an empty mean, as on the CPU
  if (OP == R_L2) return sqrtf(acc);
  if (OP == R_LOGSUM) return logf(acc);
  return acc;
}

// Elements of T in one 16-byte vector.
template <typename T> struct Vec { static constexpr int N = 16 / sizeof(T); };

template <typename T> __device__ __forceinline__ void load_vec(const T* p, float* v) {
  const uint4 u = load16(p);
  const T* t = reinterpret_cast<const T*>(&u);
#pragma unroll
  for (int k = 0; k < Vec<T>::N; ++k) v[k] = to_f(t[k]);
}

template <typename T> __device__ __forceinline__ void store_vec(T* p, const float* v) {
  uint4 u;
  T* t = reinterpret_cast<T*>(&u);
#pragma unroll
  for (int k = 0; k < Vec<T>::N; ++k) t[k] = from_f<T>(v[k]);
  store16(p, u);
}

// Every lane of the warp gets the warp's reduction.
template <int OP> __device__ __forceinline__ float warp_reduce(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = r_combine<OP>(v, shfl_xor(v, o));
  return v;
}

// Every thread of the block gets the block's reduction. blockDim.x is a multiple of 32;
// sh holds 32 floats. Safe to call twice in a row with the same sh.
template <int OP> __device__ __forceinline__ float block_reduce(float v, float* sh) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  v = warp_reduce<OP>(v);
  __syncthreads();  // a previous call may still be reading sh
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  v = lane < (int)(blockDim.x >> 5) ? sh[lane] : r_identity<OP>();
  return warp_reduce<OP>(v);
}

// The row and thread a row kernel's thread works on: one warp per row when tpr == 32
// (blockDim.x / 32 rows per block), else one block of tpr == blockDim.x threads per row.
// False for the lanes of a warp past the last row (whole warps; they never meet a barrier).
__device__ __forceinline__ bool row_of(int tpr, i64 rows, i64* row, int* t) {
  if (tpr == 32) {
    *row = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    *t = threadIdx.x & 31;
    return *row < rows;
  }
  *row = blockIdx.x;
  *t = threadIdx.x;
  return true;
}

// The reduction over the threads of a row as row_of assigns them.
template <int OP> __device__ __forceinline__ float row_reduce(float v, int tpr, float* sh) {
  return tpr == 32 ? warp_reduce<OP>(v) : block_reduce<OP>(v, sh);
}

// Threads form a (ty_count, tx_count) grid, threadIdx.x = ty * tx_count + tx, both powers
// of two; every thread gets the reduction over ty of its column tx. sh holds blockDim.x
// floats and is free again on return.
template <int OP>
__device__ __forceinline__ float column_reduce(float v, float* sh, int tx, int ty, int tx_count,
                                               int ty_count) {
  sh[threadIdx.x] = v;
  __syncthreads();
  for (int st = ty_count >> 1; st > 0; st >>= 1) {
    if (ty < st) sh[threadIdx.x] = r_combine<OP>(sh[threadIdx.x], sh[threadIdx.x + st * tx_count]);
    __syncthreads();
  }
  const float r = sh[tx];
  __syncthreads();
  return r;
}
"""

REDUCE_BODY = (
    COMMON
    + r"""
// Rows of x (rows, n) into y (rows). One warp per (row, split) when tpr == 32 (blockDim.x / 32
// of them per block), else one block of tpr == blockDim.x threads. A split covers `chunk`
// elements; with splits > 1 it leaves its raw accumulator in part[row * splits + split].
// vec: n and chunk are multiples of the vector width and x is 16-byte aligned.
template <typename T, int OP>
__global__ void reduce_rows(const T* __restrict__ x, T* __restrict__ y, float* __restrict__ part,
                            i64 rows, i64 n, i64 chunk, int splits, int tpr, int vec) {
  __shared__ float sh[32];
  const i64 items = rows * splits;
  i64 item;
  int t;
  if (!row_of(tpr, items, &item, &t)) return;
  const i64 row = item / splits;
  const i64 begin = (item % splits) * chunk;
  const i64 end = begin + chunk < n ? begin + chunk : n;
  const T* xr = x + row * n;
  float acc = r_identity<OP>();
  if (vec) {
    constexpr int V = Vec<T>::N;
    for (i64 i = begin + (i64)t * V; i < end; i += (i64)tpr * V) {
      float v[V];
      load_vec(xr + i, v);
#pragma unroll
      for (int k = 0; k < V; ++k) acc = r_combine<OP>(acc, r_map<OP>(v[k]));
    }
  } else {
    for (i64 i = begin + t; i < end; i += tpr) acc = r_combine<OP>(acc, r_map<OP>(to_f(xr[i])));
  }
  acc = row_reduce<OP>(acc, tpr, sh);
  if (t == 0) {
    if (splits == 1) {
      y[row] = from_f<T>(r_final<OP>(acc, n));
    } else {
      part[item] = acc;
    }
  }
}

// The middle axis of x (outer, n, inner) into y (outer, inner). A block covers
// tx_count = 1 << tx_log2 consecutive columns of one outer index (coalesced loads) with
// blockDim.x / tx_count threads down one split of `chunk` elements of the reduced axis.
// Blocks are numbered ((split * outer) + o) * tiles + tile. Partials as in reduce_rows,
// at part[(o * inner + i) * splits + split].
template <typename T, int OP>
__global__ void reduce_cols(const T* __restrict__ x, T* __restrict__ y, float* __restrict__ part,
                            i64 outer, i64 n, i64 inner, i64 chunk, int splits, int tx_log2) {
  __shared__ float sh[1024];
  const int tx_count = 1 << tx_log2;
  const int ty_count = blockDim.x >> tx_log2;
  const int tx = threadIdx.x & (tx_count - 1);
  const int ty = threadIdx.x >> tx_log2;
  const i64 tiles = (inner + tx_count - 1) >> tx_log2;
  const i64 b = blockIdx.x;
  const i64 tile = b % tiles;
  const i64 o = (b / tiles) % outer;
  const int split = (int)(b / tiles / outer);
  const i64 i = tile * tx_count + tx;
  const i64 begin = (i64)split * chunk;
  const i64 end = begin + chunk < n ? begin + chunk : n;
  float acc = r_identity<OP>();
  if (i < inner) {
    const T* col = x + o * n * inner + i;
    for (i64 j = begin + ty; j < end; j += ty_count) {
      acc = r_combine<OP>(acc, r_map<OP>(to_f(col[j * inner])));
    }
  }
  acc = column_reduce<OP>(acc, sh, tx, ty, tx_count, ty_count);
  if (ty == 0 && i < inner) {
    const i64 out = o * inner + i;
    if (splits == 1) {
      y[out] = from_f<T>(r_final<OP>(acc, n));
    } else {
      part[out * splits + split] = acc;
    }
  }
}

// Second pass of a split reduction: one warp per output combines its `splits` partials.
template <typename T, int OP>
__global__ void reduce_finish(const float* __restrict__ part, T* __restrict__ y, i64 outputs,
                              int splits, i64 n) {
  const i64 w = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (w >= outputs) return;  // whole warps
  float acc = r_identity<OP>();
  for (int k = lane; k < splits; k += 32) acc = r_combine<OP>(acc, part[w * splits + k]);
  acc = warp_reduce<OP>(acc);
  if (lane == 0) y[w] = from_f<T>(r_final<OP>(acc, n));
}
"""
)

#: Reduction kind (as ``providers/ops/_reduce.py`` names it) -> the kernels' OP code.
KINDS = {
    "sum": 0,
    "mean": 1,
    "max": 2,
    "min": 3,
    "prod": 4,
    "sumsq": 5,
    "l1": 6,
    "l2": 7,
    "logsum": 8,
}
REDUCE_KERNELS = ("reduce_rows", "reduce_cols", "reduce_finish")


def reduce_names(kind: str, ctypes: Sequence[str] = tuple(CTYPE.values())) -> tuple[str, ...]:
    """Template instantiations of the reduction kernels for ``kind`` and element types."""
    op = KINDS[kind]
    return tuple(f"{k}<{t}, {op}>" for t in ctypes for k in REDUCE_KERNELS)


#: Every instantiation REDUCE_BODY is ever asked for (the tests compile them all at once).
ALL_REDUCE_NAMES = tuple(n for kind in KINDS for n in reduce_names(kind))
