"""RMS normalisation on CUDA: SimplifiedLayerNormalization and SkipSimplifiedLayerNormalization.

One kernel per node, one warp per short row (several rows per block) or one
block per long row, 16-byte vector loads where every operand is aligned.
Numerics are the CPU kernels' (``providers/ops/op_simplified_layer_normalization.py``
and ``_contrib.skip_norm_builder``), in the same order: the residual sum
``s = (x + skip) + bias`` in float32 (not rounded to the storage type before
it is normalised, as on the CPU), ``inv = 1 / sqrt(sum(s * s) / n + eps)``
with each square rounded, then ``(s * inv) * w`` rounded once on store. The
sum is computed twice per element (once per pass) rather than kept, so both
passes see the same float32 value.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from onnxep.providers.node import NodeInfo

from . import _reduce_cuda as K
from ._reduce_source import COMMON, CTYPE

RMS_BODY = (
    COMMON
    + r"""
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

// Rows of n elements: y = (s * inv) * w with s = x (+ skip) (+ bias) and
// inv = 1 / sqrt(sum(s * s) / n + eps). One warp per row when tpr == 32 (blockDim.x / 32
// rows per block), else one block of tpr == blockDim.x threads per row. skip row r is
// skip[r % skip_rows]; skip, bias, sum_out (s, rounded) and inv_out (float32) may be null.
// vec: n is a multiple of the vector width and every pointer is 16-byte aligned.
template <typename T>
__global__ void rms_norm(const T* __restrict__ x, const T* __restrict__ skip,
                         const T* __restrict__ bias, const T* __restrict__ w, T* __restrict__ y,
                         T* __restrict__ sum_out, float* __restrict__ inv_out, i64 rows, i64 n,
                         i64 skip_rows, float eps, int tpr, int vec) {
  __shared__ float sh[32];
  i64 row;
  int t;
  if (tpr == 32) {
    row = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    t = threadIdx.x & 31;
    if (row >= rows) return;  // whole warps leave; warp mode never waits at a block barrier
  } else {
    row = blockIdx.x;
    t = threadIdx.x;
  }
  constexpr int V = Vec<T>::N;
  const T* xr = x + row * n;
  const T* sr = skip == nullptr ? nullptr : skip + (row % skip_rows) * n;
  float acc = 0.f;
  if (vec) {
    for (i64 i = (i64)t * V; i < n; i += (i64)tpr * V) {
      float s[V];
      residual_vec(xr, sr, bias, i, s);
#pragma unroll
      for (int k = 0; k < V; ++k) acc += __fmul_rn(s[k], s[k]);
    }
  } else {
    for (i64 i = t; i < n; i += tpr) {
      const float s = residual(xr, sr, bias, i);
      acc += __fmul_rn(s, s);
    }
  }
  acc = tpr == 32 ? warp_reduce<R_SUM>(acc) : block_reduce<R_SUM>(acc, sh);
  const float inv = 1.f / sqrtf(acc / (float)n + eps);  // n == 0: NaN, as the CPU's mean
  if (inv_out != nullptr && t == 0) inv_out[row] = inv;
  T* yr = y + row * n;
  T* so = sum_out == nullptr ? nullptr : sum_out + row * n;
  if (vec) {
    for (i64 i = (i64)t * V; i < n; i += (i64)tpr * V) {
      float s[V], wv[V], out[V];
      residual_vec(xr, sr, bias, i, s);
      load_vec(w + i, wv);
#pragma unroll
      for (int k = 0; k < V; ++k) out[k] = __fmul_rn(__fmul_rn(s[k], inv), wv[k]);
      store_vec(yr + i, out);
      if (so != nullptr) store_vec(so + i, s);
    }
  } else {
    for (i64 i = t; i < n; i += tpr) {
      const float s = residual(xr, sr, bias, i);
      yr[i] = from_f<T>(__fmul_rn(__fmul_rn(s, inv), to_f(w[i])));
      if (so != nullptr) so[i] = from_f<T>(s);
    }
  }
}
"""
)

RMS_NAMES = tuple(f"rms_norm<{t}>" for t in CTYPE.values())


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


class RmsKernel:
    """The compiled ``rms_norm`` kernels for some dtypes, and one launch of them."""

    def __init__(self, dtypes: list[np.dtype]) -> None:
        names = [f"rms_norm<{CTYPE[dt]}>" for dt in dtypes]
        compiled = K.compile_kernels(RMS_BODY, names)
        self.fns = {dt: compiled[n] for dt, n in zip(dtypes, names, strict=True)}

    def launch(
        self,
        plan: RowsPlan,
        eps: np.float32,
        x: Any,
        w: Any,
        y: Any,
        *,
        skip: Any = None,
        skip_rows: int = 1,
        bias: Any = None,
        sum_out: Any = None,
        inv_out: Any = None,
    ) -> None:
        if plan.rows == 0:
            return
        operands = (x, skip, bias, w, y, sum_out)
        vec = plan.vec and all(a is None or K.address(a) % 16 == 0 for a in operands)
        self.fns[x.dtype](
            (plan.grid,),
            (plan.block,),
            (x, skip, bias, w, y, sum_out, inv_out, np.int64(plan.rows), np.int64(plan.n),
             np.int64(skip_rows), eps, np.int32(plan.tpr), np.int32(vec)),
        )  # fmt: skip


def declared_dtype(node: NodeInfo, j: int) -> np.dtype | None:
    v = node.outputs[j] if j < len(node.outputs) else None
    return None if v is None or v.dtype is None else np.dtype(v.dtype)


def _or_float32(dtype: np.dtype | None) -> np.dtype:
    return np.dtype(np.float32) if dtype is None else dtype


def is_row_vector(shape: tuple[int, ...], n: int, rank: int) -> bool:
    """Whether an operand of ``shape`` holds one value per element of the last axis
    (shape (..., 1, n)) and broadcasts against a rank-``rank`` array without adding dims."""
    return 1 <= len(shape) <= rank and shape[-1] == n and math.prod(shape) == n


def trailing_rows(shape: tuple[int, ...], target: tuple[int, ...]) -> int | None:
    """How many rows of ``target``'s last axis an operand of ``shape`` holds when it is a
    trailing block of ``target`` (broadcast over the leading dims, as x + skip broadcasts),
    else None."""
    if not shape or not target or len(shape) > len(target) or shape[-1] != target[-1]:
        return None
    padded = (1,) * (len(target) - len(shape)) + tuple(shape)
    lead = 0
    while lead < len(padded) and padded[lead] == 1:
        lead += 1
    if padded[lead:] != tuple(target[lead:]):
        return None
    return math.prod(padded[:-1])


Runner = Callable[..., tuple]


def rms_runner(node: NodeInfo, xp: Any, general: Runner) -> Runner:
    """SimplifiedLayerNormalization(X, scale) -> (Y[, inv_std_var]) over dims ``axis..``."""
    axis = int(node.attr("axis", -1))
    eps = np.float32(node.attr("epsilon", 1e-5))
    dtypes = K.dtypes_for(node.input_dtype(0))
    if int(node.attr("stash_type", 1)) == 11 or not dtypes:
        return general  # double statistics, or a dtype the kernel lacks
    y_decl = declared_dtype(node, 0)
    want_inv = node.has_output(1)
    inv_dtype = _or_float32(declared_dtype(node, 1))
    width = max(node.num_outputs, 1)
    kern = RmsKernel(dtypes)
    plans: dict[tuple, RowsPlan | None] = {}

    def plan_for(xs: tuple, xdt: np.dtype, ws: tuple, wdt: np.dtype) -> RowsPlan | None:
        r = len(xs)
        a = axis + r if axis < 0 else axis
        if xdt not in kern.fns or wdt != xdt or (y_decl is not None and y_decl != xdt):
            return None  # mixed types: the generic kernel's promotions
        if not 0 <= a < r or len(ws) > r:
            return None  # the generic kernel raises or broadcasts
        padded = (1,) * (r - len(ws)) + tuple(ws)
        if any(d != 1 for d in padded[:a]) or padded[a:] != xs[a:]:
            return None  # scale varies outside the normalised dims, or broadcasts inside them
        return plan_rows(math.prod(xs[:a]), math.prod(xs[a:]), xdt)

    def run(x: Any, scale: Any) -> tuple:
        key = (x.shape, x.dtype, scale.shape, scale.dtype)
        if key in plans:
            plan = plans[key]
        else:
            if len(plans) >= K.MAX_PLANS:
                plans.clear()
            plan = plans[key] = plan_for(*key)
        if plan is None:
            return general(x, scale)
        x = x if x.flags.c_contiguous else xp.ascontiguousarray(x)
        scale = scale if scale.flags.c_contiguous else xp.ascontiguousarray(scale)
        y = xp.empty(x.shape, x.dtype)
        inv = None
        if want_inv:
            a = axis + x.ndim if axis < 0 else axis
            inv = xp.empty(x.shape[:a] + (1,) * (x.ndim - a), np.float32)
        kern.launch(plan, eps, x, scale, y, inv_out=inv)
        if inv is not None and inv_dtype != np.float32:
            inv = inv.astype(inv_dtype)
        return (y, inv, *(None,) * (width - 2)) if width > 1 else (y,)

    return run


def skip_rms_runner(node: NodeInfo, xp: Any, general: Runner) -> Runner:
    """SkipSimplifiedLayerNormalization(input, skip, gamma[, bias]) ->
    (output, mean, inv_std_var, input_skip_bias_sum), each output only where the node has it."""
    eps = np.float32(node.attr("epsilon", 1e-12))
    dtypes = K.dtypes_for(node.input_dtype(0))
    if not dtypes:
        return general
    want = [node.has_output(j) for j in range(4)]
    stat_dtypes = [_or_float32(declared_dtype(node, j)) for j in (1, 2)]
    width = max(node.num_outputs, 1)
    kern = RmsKernel(dtypes)
    plans: dict[tuple, tuple[RowsPlan, int] | None] = {}

    def plan_for(key: tuple) -> tuple[RowsPlan, int] | None:
        (xs, xdt), (ss, sdt), (gs, gdt) = key[0], key[1], key[2]
        bias_meta = key[3]
        dts = (sdt, gdt) if bias_meta is None else (sdt, gdt, bias_meta[1])
        if xdt not in kern.fns or not xs or any(d != xdt for d in dts):
            return None  # mixed types: the generic kernel's promotions
        n = xs[-1]
        skip_rows = trailing_rows(ss, xs)
        row_vectors = [gs] if bias_meta is None else [gs, bias_meta[0]]
        if skip_rows is None or not all(is_row_vector(v, n, len(xs)) for v in row_vectors):
            return None  # the generic kernel broadcasts (or refuses) these
        plan = plan_rows(math.prod(xs[:-1]), n, xdt)
        return None if plan is None else (plan, max(skip_rows, 1))

    def run(x: Any, skip: Any, gamma: Any, bias: Any = None) -> tuple:
        meta = None if bias is None else (bias.shape, bias.dtype)
        key = ((x.shape, x.dtype), (skip.shape, skip.dtype), (gamma.shape, gamma.dtype), meta)
        if key in plans:
            found = plans[key]
        else:
            if len(plans) >= K.MAX_PLANS:
                plans.clear()
            found = plans[key] = plan_for(key)
        if found is None:
            return general(x, skip, gamma, bias)
        plan, skip_rows = found
        x, skip, gamma, bias = (
            a if a is None or a.flags.c_contiguous else xp.ascontiguousarray(a)
            for a in (x, skip, gamma, bias)
        )
        y = xp.empty(x.shape, x.dtype)
        stat_shape = x.shape[:-1] + (1,)
        inv = xp.empty(stat_shape, np.float32) if want[2] else None
        total = xp.empty(x.shape, x.dtype) if want[3] else None
        kern.launch(plan, eps, x, gamma, y, skip=skip, skip_rows=skip_rows, bias=bias,
                    sum_out=total, inv_out=inv)  # fmt: skip
        outs: list[Any] = [y, None, None, total]
        if want[1]:
            outs[1] = xp.zeros(stat_shape, stat_dtypes[0])  # RMSNorm subtracts no mean
        if inv is not None:
            outs[2] = inv if stat_dtypes[1] == np.float32 else inv.astype(stat_dtypes[1])
        return tuple(outs[:width])

    return run
