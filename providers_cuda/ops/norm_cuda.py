"""The row-normalisation kernel behind the RMS and layer norms on CUDA, and its launch plan.

One kernel, ``norm_rows``, serves SimplifiedLayerNormalization,
SkipSimplifiedLayerNormalization, LayerNormalization and
SkipLayerNormalization: one warp per short row (several rows per block) or
one block per long row, 16-byte vector loads where every operand is aligned,
all arithmetic in float32 and each result rounded once on store. Its order is
the CPU kernels' (``providers/ops/op_simplified_layer_normalization.py``,
``op_layer_normalization.py`` and ``_contrib.skip_norm_builder``):

* ``s = (x + skip) + bias`` in float32 (a skip norm normalises this sum, not
  the sum rounded to the storage type, as the CPU does);
* ``c = s - mean`` with ``mean = sum(s) / n`` for the layer norms (two passes,
  as NumPy's moments) and ``c = s`` for the RMS norms;
* ``inv = 1 / sqrt(sum(c * c) / n + eps)``, each square rounded;
* ``y = (c * inv) * w + beta``, where ONNX LayerNormalization rounds
  ``c * inv`` to X's type first (its second stage runs in X's type).

``s`` and ``c`` are recomputed in each pass rather than kept, so every pass
sees the same float32 values. The host side (which nodes take the kernel) is
in ``norm_runners.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from . import reduce_cuda as K
from .reduce_source import COMMON, CTYPE

#: The per-element steps of ``norm_rows`` (the residual sum and the normalised value), shared
#: with the GEMVs that normalise their input in a prologue (``nbits_mma_cuda``, ``gemv_nt_cuda``)
#: so a fused norm gives the same bits as this kernel.
NORM_HELPERS = r"""
// x (+ skip) (+ bias) at element i, in float32, added in that order as on the CPU.
template <typename T>
__device__ __forceinline__ float residual(const T* xr, const T* sr, const T* bias, i64 i) {
  float s = to_f(xr[i]);
  if (sr != nullptr) s += to_f(sr[i]);
  if (bias != nullptr) s += to_f(bias[i]);
  return s;
}

// The same for the Vec<T>::N elements from i (16-byte aligned).
template <typename T>
__device__ __forceinline__ void residual_vec(const T* xr, const T* sr, const T* bias, i64 i,
                                             float* s) {
  constexpr int V = Vec<T>::N;
  load_vec(xr + i, s);
  float v[V];
  if (sr != nullptr) {
    load_vec(sr + i, v);
#pragma unroll
    for (int k = 0; k < V; ++k) s[k] += v[k];
  }
  if (bias != nullptr) {
    load_vec(bias + i, v);
#pragma unroll
    for (int k = 0; k < V; ++k) s[k] += v[k];
  }
}

// One output element from c = s - mean: (c * inv) * w (+ beta).
template <typename T>
__device__ __forceinline__ float normalised(float c, float inv, float w, const T* beta, i64 i,
                                            int round_c) {
  float o = __fmul_rn(c, inv);
  if (round_c) o = to_f(from_f<T>(o));
  o = __fmul_rn(o, w);
  return beta != nullptr ? o + to_f(beta[i]) : o;
}

// Thread t's share of sum((s - mean)^2) over a row of n when tpr threads share the row (the
// order the row reduction then combines), each square rounded.
template <typename T>
__device__ __forceinline__ float sq_dev_part(const T* xr, const T* sr, const T* bias, i64 n,
                                             float mean, int t, int tpr, int vec) {
  constexpr int V = Vec<T>::N;
  float acc = 0.f;
  if (vec) {
    for (i64 i = (i64)t * V; i < n; i += (i64)tpr * V) {
      float s[V];
      residual_vec(xr, sr, bias, i, s);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float c = s[k] - mean;
        acc += __fmul_rn(c, c);
      }
    }
  } else {
    for (i64 i = t; i < n; i += tpr) {
      const float c = residual(xr, sr, bias, i) - mean;
      acc += __fmul_rn(c, c);
    }
  }
  return acc;
}
"""

#: What a GEMV needs to normalise its rows in a prologue exactly as ``norm_rows`` does (after
#: ``COMMON`` and :data:`NORM_HELPERS`).
NORM_PROLOGUE = r"""
// inv = 1 / sqrt(sum(s * s) / n + eps) for one row, s = x (+ skip) (+ bias), as norm_rows
// computes it with tpr threads per row (an RMS norm: no mean), for a block of any size: its
// threads stand in for the tpr, pass by pass, and the ones past tpr add zeros, which leave
// every partial sum as it was. Every thread of the block must call it (two barriers) and
// gets inv. sh holds 32 floats.
template <typename T>
__device__ __forceinline__ float prologue_inv(const T* xr, const T* sr, const T* bias, i64 n,
                                              float eps, int tpr, int vec, float* sh) {
  const int nt = blockDim.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int passes = tpr > nt ? tpr / nt : 1;
  for (int pass = 0; pass < passes; ++pass) {
    const int vt = pass * nt + threadIdx.x;
    float acc = vt < tpr ? sq_dev_part(xr, sr, bias, n, 0.f, vt, tpr, vec) : 0.f;
    acc = warp_reduce<R_SUM>(acc);
    if (lane == 0) sh[pass * (nt >> 5) + warp] = acc;
  }
  __syncthreads();
  // norm_rows: a warp per row adds its lanes only; a block per row, its warps' sums too.
  const float total = tpr == 32 ? sh[0] : warp_reduce<R_SUM>(lane < (tpr >> 5) ? sh[lane] : 0.f);
  __syncthreads();  // every thread has read sh before it is written again
  return 1.f / sqrtf(total / (float)n + eps);
}

// Element i of a normalised row (no beta, no rounding of s * inv): norm_rows's y[i].
template <typename T>
__device__ __forceinline__ float prologue_value(float s, float inv, const T* gamma, i64 i) {
  return normalised<T>(s - 0.f, inv, to_f(gamma[i]), nullptr, 0, 0);
}
"""

NORM_BODY = (
    COMMON
    + NORM_HELPERS
    + r"""
// Rows of n elements: s = x (+ skip) (+ bias); c = s - mean, mean = sum(s) / n when
// centered, else 0; inv = 1 / sqrt(sum(c * c) / n + eps); y = (c * inv) * w (+ beta), with
// c * inv rounded to T first when round_c. One warp per row when tpr == 32 (blockDim.x / 32
// rows per block), else one block of tpr == blockDim.x threads per row. skip row r is
// skip[r % skip_rows]. skip, bias, beta, sum_out (s, rounded), mean_out and inv_out (float32,
// one per row) may be null. vec: n is a whole number of vectors and every pointer is 16-byte
// aligned.
template <typename T>
__global__ void norm_rows(const T* __restrict__ x, const T* __restrict__ skip,
                          const T* __restrict__ bias, const T* __restrict__ w,
                          const T* __restrict__ beta, T* __restrict__ y, T* __restrict__ sum_out,
                          float* __restrict__ mean_out, float* __restrict__ inv_out, i64 rows,
                          i64 n, i64 skip_rows, float eps, int centered, int round_c, int tpr,
                          int vec) {
  __shared__ float sh[32];
  i64 row;
  int t;
  if (!row_of(tpr, rows, &row, &t)) return;
  constexpr int V = Vec<T>::N;
  const T* xr = x + row * n;
  const T* sr = skip == nullptr ? nullptr : skip + (row % skip_rows) * n;
  float mean = 0.f;
  if (centered) {
    float acc = 0.f;
    if (vec) {
      for (i64 i = (i64)t * V; i < n; i += (i64)tpr * V) {
        float s[V];
        residual_vec(xr, sr, bias, i, s);
#pragma unroll
        for (int k = 0; k < V; ++k) acc += s[k];
      }
    } else {
      for (i64 i = t; i < n; i += tpr) acc += residual(xr, sr, bias, i);
    }
    acc = row_reduce<R_SUM>(acc, tpr, sh);
    mean = acc / (float)n;  // n == 0: NaN, as the CPU's mean of nothing
  }
  float acc = sq_dev_part(xr, sr, bias, n, mean, t, tpr, vec);
  acc = row_reduce<R_SUM>(acc, tpr, sh);
  const float inv = 1.f / sqrtf(acc / (float)n + eps);
  if (t == 0) {
    if (mean_out != nullptr) mean_out[row] = mean;
    if (inv_out != nullptr) inv_out[row] = inv;
  }
  T* yr = y + row * n;
  T* so = sum_out == nullptr ? nullptr : sum_out + row * n;
  if (vec) {
    for (i64 i = (i64)t * V; i < n; i += (i64)tpr * V) {
      float s[V], wv[V], out[V];
      residual_vec(xr, sr, bias, i, s);
      load_vec(w + i, wv);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        out[k] = normalised(s[k] - mean, inv, wv[k], beta, i + k, round_c);
      }
      store_vec(yr + i, out);
      if (so != nullptr) store_vec(so + i, s);
    }
  } else {
    for (i64 i = t; i < n; i += tpr) {
      const float s = residual(xr, sr, bias, i);
      yr[i] = from_f<T>(normalised(s - mean, inv, to_f(w[i]), beta, i, round_c));
      if (so != nullptr) so[i] = from_f<T>(s);
    }
  }
}
"""
)

NORM_NAMES = tuple(f"norm_rows<{t}>" for t in CTYPE.values())


@dataclass(frozen=True)
class RowsPlan:
    """Launch geometry of one row-wise kernel for ``rows`` rows of ``n`` elements."""

    rows: int
    n: int
    grid: int
    block: int
    tpr: int  # threads per row: 32 (a warp per row) or the block size
    vec: bool  # n is a whole number of 16-byte vectors


def plan_rows(rows: int, n: int, dtype: np.dtype) -> RowsPlan | None:
    """A warp per short row, else a block sized to the row; None if the grid would not fit."""
    tpr = K.row_threads(n)
    if tpr == K.WARP:
        grid, block = K.warp_rows_grid(rows), K.BLOCK
    else:
        grid, block = rows, tpr
    if grid > K.MAX_GRID:
        return None
    return RowsPlan(rows, n, grid, block, tpr, n % K.vector_width(dtype) == 0)


@dataclass(frozen=True)
class NormKind:
    """What distinguishes the four norms inside the kernel."""

    centered: bool  # subtract the mean (layer norms) or not (RMS norms)
    round_c: bool  # round (c * inv) to X's type before the scale (ONNX LayerNormalization)


RMS = NormKind(centered=False, round_c=False)
LAYER = NormKind(centered=True, round_c=False)
ONNX_LAYER = NormKind(centered=True, round_c=True)


@dataclass(frozen=True)
class NormLaunch:
    """One ``norm_rows`` launch for one input shape, its scalar arguments built once."""

    fn: Any
    grid: tuple[int]
    block: tuple[int]
    tails: tuple[tuple, tuple]  # the arguments after the pointers: (scalar path, vector path)
    vec: bool  # n is a whole number of vectors (alignment is checked per call)
    rows: int

    def __call__(self, x: Any, w: Any, y: Any, beta: Any = None, skip: Any = None,
                 bias: Any = None, sum_out: Any = None, mean_out: Any = None,
                 inv_out: Any = None) -> None:  # fmt: skip
        """Queue the kernel on C-contiguous arrays (nothing when there are no rows)."""
        if not self.rows:
            return
        vec = self.vec and K.all_aligned((x, skip, bias, w, beta, y, sum_out))
        args = (x, skip, bias, w, beta, y, sum_out, mean_out, inv_out, *self.tails[vec])
        self.fn(self.grid, self.block, args)


class NormKernel:
    """The compiled ``norm_rows`` kernels of one norm for some dtypes."""

    def __init__(self, dtypes: list[np.dtype], kind: NormKind, eps: float) -> None:
        names = [f"norm_rows<{CTYPE[dt]}>" for dt in dtypes]
        compiled = K.compile_kernels(NORM_BODY, names)
        self.fns = {dt: compiled[n] for dt, n in zip(dtypes, names, strict=True)}
        self.flags = (np.float32(eps), np.int32(kind.centered), np.int32(kind.round_c))

    def prepare(self, rows: int, n: int, dtype: np.dtype, skip_rows: int = 1) -> NormLaunch | None:
        """The launch for ``rows`` rows of ``n``; None if the grid would not fit."""
        plan = plan_rows(rows, n, dtype)
        if plan is None:
            return None
        head = (np.int64(rows), np.int64(n), np.int64(skip_rows), *self.flags, np.int32(plan.tpr))
        tails = (head + (K.VEC_FLAGS[0],), head + (K.VEC_FLAGS[1],))
        return NormLaunch(self.fns[dtype], (plan.grid,), (plan.block,), tails, plan.vec, rows)
