"""Softmax on CUDA: one kernel per node for float32/float16, accumulating in float32.

From opset 13 the softmax runs along one axis: the input is seen as
``(outer, n, inner)`` around it. Before 13 the input is flattened to 2-D at
``axis`` and the softmax runs over the whole second dim, so ``inner == 1``.
``inner == 1`` runs ``softmax_rows`` (a warp per short row, a block per long
one); otherwise ``softmax_cols`` (a block covers up to 32 consecutive
columns, coalesced). The arithmetic is the CPU kernel's
(``providers/ops/_reduce.py``): ``m = max`` (NaN wins) replaced by 0 when not
finite, ``e = exp(x - m)``, ``y = e / sum(e)``, rounded once on store.
Other dtypes and 0-d inputs run the generic kernel on the device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo
from onnxep.providers.ops import op_softmax as generic
from onnxep.providers.ops.reduce import norm_axis

from . import reduce_cuda as K
from .reduce_source import COMMON, CTYPE

SOFTMAX_BODY = (
    COMMON
    + r"""
// Softmax of rows of x (rows, n): one warp per row when tpr == 32 (blockDim.x / 32 rows per
// block), else one block of tpr == blockDim.x threads per row. The row is read three times
// (max, sum, write); the second and third reads hit L2. vec: n is a whole number of vectors
// and x, y are 16-byte aligned.
template <typename T>
__global__ void softmax_rows(const T* __restrict__ x, T* __restrict__ y, i64 rows, i64 n,
                             int tpr, int vec) {
  __shared__ float sh[32];
  i64 row;
  int t;
  if (!row_of(tpr, rows, &row, &t)) return;
  constexpr int V = Vec<T>::N;
  const T* xr = x + row * n;
  T* yr = y + row * n;
  float m = -pos_inf();
  if (vec) {
    for (i64 i = (i64)t * V; i < n; i += (i64)tpr * V) {
      float v[V];
      load_vec(xr + i, v);
#pragma unroll
      for (int k = 0; k < V; ++k) m = r_combine<R_MAX>(m, v[k]);
    }
  } else {
    for (i64 i = t; i < n; i += tpr) m = r_combine<R_MAX>(m, to_f(xr[i]));
  }
  m = row_reduce<R_MAX>(m, tpr, sh);
  if (!is_finite(m)) m = 0.f;  // an all -inf row gives NaN (0 / 0), as on the CPU
  float s = 0.f;
  if (vec) {
    for (i64 i = (i64)t * V; i < n; i += (i64)tpr * V) {
      float v[V];
      load_vec(xr + i, v);
#pragma unroll
      for (int k = 0; k < V; ++k) s += expf(v[k] - m);
    }
  } else {
    for (i64 i = t; i < n; i += tpr) s += expf(to_f(xr[i]) - m);
  }
  s = row_reduce<R_SUM>(s, tpr, sh);
  if (vec) {
    for (i64 i = (i64)t * V; i < n; i += (i64)tpr * V) {
      float v[V];
      load_vec(xr + i, v);
#pragma unroll
      for (int k = 0; k < V; ++k) v[k] = expf(v[k] - m) / s;
      store_vec(yr + i, v);
    }
  } else {
    for (i64 i = t; i < n; i += tpr) yr[i] = from_f<T>(expf(to_f(xr[i]) - m) / s);
  }
}

// Softmax along the middle axis of x (outer, n, inner), inner > 1. A block covers
// tx_count = 1 << tx_log2 consecutive columns of one outer index (coalesced), with
// blockDim.x / tx_count threads down the axis. Blocks are numbered o * tiles + tile.
template <typename T>
__global__ void softmax_cols(const T* __restrict__ x, T* __restrict__ y, i64 outer, i64 n,
                             i64 inner, int tx_log2) {
  __shared__ float sh[1024];
  const int tx_count = 1 << tx_log2;
  const int ty_count = blockDim.x >> tx_log2;
  const int tx = threadIdx.x & (tx_count - 1);
  const int ty = threadIdx.x >> tx_log2;
  const i64 tiles = (inner + tx_count - 1) >> tx_log2;
  const i64 o = blockIdx.x / tiles;
  const i64 i = (blockIdx.x % tiles) * tx_count + tx;
  const bool live = i < inner;
  const i64 base = o * n * inner + i;
  float m = -pos_inf();
  if (live) {
    for (i64 j = ty; j < n; j += ty_count) m = r_combine<R_MAX>(m, to_f(x[base + j * inner]));
  }
  m = column_reduce<R_MAX>(m, sh, tx, ty, tx_count, ty_count);
  if (!is_finite(m)) m = 0.f;
  float s = 0.f;
  if (live) {
    for (i64 j = ty; j < n; j += ty_count) s += expf(to_f(x[base + j * inner]) - m);
  }
  s = column_reduce<R_SUM>(s, sh, tx, ty, tx_count, ty_count);
  if (live) {
    for (i64 j = ty; j < n; j += ty_count) {
      y[base + j * inner] = from_f<T>(expf(to_f(x[base + j * inner]) - m) / s);
    }
  }
}
"""
)

SOFTMAX_KERNELS = ("softmax_rows", "softmax_cols")
SOFTMAX_NAMES = tuple(f"{k}<{t}>" for t in CTYPE.values() for k in SOFTMAX_KERNELS)


@dataclass(frozen=True)
class SoftmaxPlan:
    """One launch for one input shape, with its scalar arguments built once."""

    kernel: str  # "softmax_rows", "softmax_cols", or "" for an empty tensor
    grid: tuple[int]
    block: tuple[int]
    args: tuple  # after (x, y); the rows kernel's vec flag follows
    vec: bool


def plan_softmax(outer: int, n: int, inner: int, dtype: np.dtype) -> SoftmaxPlan | None:
    if outer * n * inner == 0:
        return SoftmaxPlan("", (0,), (0,), (), False)
    i64, i32 = np.int64, np.int32
    if inner == 1:
        tpr = K.row_threads(n)
        if tpr == K.WARP:
            grid, block = K.warp_rows_grid(outer), K.BLOCK
        else:
            grid, block = outer, tpr
        args = (i64(outer), i64(n), i32(tpr))
        vec = n % K.vector_width(dtype) == 0
        plan = SoftmaxPlan("softmax_rows", (grid,), (block,), args, vec)
    else:
        tx = min(K.WARP, K.pow2_at_least(inner))
        grid = outer * -(-inner // tx)
        args = (i64(outer), i64(n), i64(inner), i32(tx.bit_length() - 1))
        plan = SoftmaxPlan("softmax_cols", (grid,), (K.BLOCK,), args, False)
    return plan if plan.grid[0] <= K.MAX_GRID else None


@kernel("Softmax", since=(1, 11, 13))
def softmax(node: NodeInfo, xp: Any):
    fallback = generic.softmax_kernel(node, xp)
    dtypes = K.dtypes_for(node.input_dtype(0))
    if not dtypes:
        return fallback
    axis = int(node.attr("axis", 1 if node.opset < 13 else -1))
    one_axis = node.opset >= 13
    fns: dict[np.dtype, dict[str, Any]] = {}
    for dt in dtypes:
        names = [f"{k}<{CTYPE[dt]}>" for k in SOFTMAX_KERNELS]
        compiled = K.compile_kernels(SOFTMAX_BODY, names)
        fns[dt] = {k: compiled[n] for k, n in zip(SOFTMAX_KERNELS, names, strict=True)}

    def plan_for(shape: tuple[int, ...], dtype: np.dtype) -> SoftmaxPlan | None:
        if dtype not in fns or not shape:
            return None
        a = norm_axis(axis, len(shape), "Softmax")  # out of range: the generic kernel's error
        if one_axis:
            return plan_softmax(math.prod(shape[:a]), shape[a], math.prod(shape[a + 1 :]), dtype)
        return plan_softmax(math.prod(shape[:a]), math.prod(shape[a:]), 1, dtype)

    plans = K.PlanCache(plan_for)
    if (meta := K.static_meta(node, 0)) is not None:
        plans.prewarm(*meta)
    contiguous = K.contiguity_test(xp)

    def run(x: Any) -> tuple:
        plan = plans(x.shape, x.dtype)
        if plan is None:
            return fallback(x)
        if not contiguous(x):
            x = xp.ascontiguousarray(x)
        y = xp.empty(x.shape, x.dtype)
        if plan.kernel == "softmax_rows":
            vec = K.VEC_FLAGS[plan.vec and K.all_aligned((x, y))]
            fns[x.dtype]["softmax_rows"](plan.grid, plan.block, (x, y, *plan.args, vec))
        elif plan.kernel:
            fns[x.dtype]["softmax_cols"](plan.grid, plan.block, (x, y, *plan.args))
        return (y,)

    return run
