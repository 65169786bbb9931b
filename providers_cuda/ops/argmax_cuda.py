"""Greedy decoding's argmax over the last position's logits, one launch, into a bound buffer.

``generate`` reads one token id per row per step. CuPy's argmax takes two launches (CUB's
device-wide reduction) and writes a new array; this kernel splits each row of the
vocabulary across ``blocks_per_row`` blocks, each leaving its (max, index) in a scratch
pair, and the last block of a row to finish (an integer ticket per row, put back to zero
by that block, so CUDA graph replays and later launches find it zeroed) merges them and
writes the row's token id where the caller says: the next step's ``input_ids`` buffer.

Ties go to the lowest index and a NaN wins (its lowest index), as NumPy's argmax; values
are compared as float32 (exact for float16).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import reduce_cuda as K
from .reduce_source import CTYPE

BLOCK = 256
#: Values each thread of a block should compare before another block shares the row: few,
#: so a vocabulary row spreads over most SMs (the merge is one more block's work).
PER_THREAD = 8
#: Loads a thread has in flight at once.
AM_BATCH = 8

ARGMAX_BODY = r"""
// Whether (v, i) beats (bv, bi): NaN first (lowest index), then larger, then lower index.
__device__ __forceinline__ bool am_better(float v, i64 i, float bv, i64 bi) {
  const bool vn = v != v, bn = bv != bv;
  if (vn || bn) return vn && (!bn || i < bi);
  return v > bv || (v == bv && i < bi);
}

// Warp then block reduction of (v, i) to thread 0 (sv, si hold 32 entries).
__device__ __forceinline__ void am_block(float* v, i64* i, float* sv, i64* si) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = shfl_xor(*v, off);
    const i64 oi = (i64)shfl_xor_i(*i, off);
    if (am_better(ov, oi, *v, *i)) { *v = ov; *i = oi; }
  }
  __syncthreads();
  if (lane == 0) { sv[warp] = *v; si[warp] = *i; }
  __syncthreads();
  if (warp == 0) {
    const int nw = blockDim.x >> 5;
    *v = lane < nw ? sv[lane] : -pos_inf();
    *i = lane < nw ? si[lane] : (i64)0x7fffffffffffffffLL;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      const float ov = shfl_xor(*v, off);
      const i64 oi = (i64)shfl_xor_i(*i, off);
      if (am_better(ov, oi, *v, *i)) { *v = ov; *i = oi; }
    }
  }
}

// out[r * out_stride] = argmax_j x[r * row_stride + j], j < n, for r < rows. Block b works on
// row b / bpr, its share (b % bpr) of the row's chunks; the last of a row's blocks to take
// its ticket merges the row's partials (pv, pi: rows * bpr each) and writes the id.
template <typename T>
__global__ void argmax_rows(const T* __restrict__ x, i64 rows, i64 n, i64 row_stride,
                            long long* __restrict__ out, i64 out_stride, float* pv, i64* pi,
                            int* __restrict__ done, i64 bpr) {
  __shared__ float sv[32];
  __shared__ i64 si[32];
  __shared__ int last;
  // Launched as a programmatic dependent of the logits' GEMV: its blocks are resident and
  // waiting when the logits land, rather than launched after them.
  pdl_wait();
  const i64 r = (i64)blockIdx.x / bpr, part = (i64)blockIdx.x - r * bpr;
  const i64 chunk = (n + bpr - 1) / bpr;
  const i64 lo = part * chunk, hi = lo + chunk < n ? lo + chunk : n;
  const T* row = x + r * row_stride;
  float v = -pos_inf();
  i64 i = (i64)0x7fffffffffffffffLL;
  // AM_BATCH loads issued before the first comparison: one load's latency a batch, not one
  // per value (a thread's values were a chain of dependent round trips: 31 us a 152k row)
  for (i64 j0 = lo + threadIdx.x; j0 < hi; j0 += (i64)AM_BATCH * blockDim.x) {
    float xs[AM_BATCH];
#pragma unroll
    for (int u = 0; u < AM_BATCH; ++u) {
      const i64 j = j0 + (i64)u * blockDim.x;
      xs[u] = j < hi ? to_f(row[j]) : 0.f;
    }
#pragma unroll
    for (int u = 0; u < AM_BATCH; ++u) {
      const i64 j = j0 + (i64)u * blockDim.x;
      if (j < hi && am_better(xs[u], j, v, i)) { v = xs[u]; i = j; }
    }
  }
  am_block(&v, &i, sv, si);
  if (bpr == 1) {
    if (threadIdx.x == 0) out[r * out_stride] = (long long)i;
    return;
  }
  if (threadIdx.x == 0) {
    pv[blockIdx.x] = v;
    pi[blockIdx.x] = i;
    __threadfence();  // the partial is visible device-wide before the ticket is taken
    const int ticket = atomicAdd(done + r, 1);
    last = ticket == (int)bpr - 1;
    if (last) done[r] = 0;  // ready for the next launch (CUDA graph replays)
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  v = -pos_inf();
  i = (i64)0x7fffffffffffffffLL;
  for (i64 p = threadIdx.x; p < bpr; p += blockDim.x) {
    const float ov = __ldcg(pv + r * bpr + p);
    const i64 oi = __ldcg(pi + r * bpr + p);
    if (am_better(ov, oi, v, i)) { v = ov; i = oi; }
  }
  am_block(&v, &i, sv, si);
  if (threadIdx.x == 0) out[r * out_stride] = (long long)i;
}
"""

#: The integer shuffle the kernel needs beyond the float one (the emulator has its own).
SHFL_I64 = r"""
__device__ __forceinline__ long long shfl_xor_i(long long v, int lane_mask) {
  return __shfl_xor_sync(0xffffffffu, v, lane_mask);
}
"""

ARGMAX_NAMES = tuple(f"argmax_rows<{c}>" for c in CTYPE.values())


def source() -> str:
    """The kernels' source past ``reduce_source.PRIMITIVES`` (read at build time, so the
    emulator can stand its own :data:`SHFL_I64` in)."""
    return f"#define AM_BATCH {AM_BATCH}\n" + SHFL_I64 + ARGMAX_BODY


def blocks_per_row(n: int, rows: int, sms: int) -> int:
    """Blocks sharing a row: enough to have every SM busy, each with at least
    :data:`PER_THREAD` values a thread."""
    want = max(1, -(-2 * sms // max(rows, 1)))
    return max(1, min(want, n // (BLOCK * PER_THREAD)))


class ArgMaxRows:
    """``run(x2d, out, out_stride)``: each row's argmax written into ``out`` (int64)."""

    def __init__(self, xp: Any) -> None:
        self.xp = xp
        self.fns = K.compile_kernels(source(), ARGMAX_NAMES)
        self.sms = K.sm_count()
        self.scratch: dict[tuple[int, int], tuple[Any, Any, Any]] = {}
        self._launch = self.emulated if xp is np else self.driver()

    def driver(self) -> Any:
        """Launches straight through the driver (``launch.Launcher``)."""
        from ..elementwise import stream_ptr_fn
        from ..launch import Launcher

        stream = stream_ptr_fn()
        # dependent: argmax_rows waits (pdl_wait) before anything else
        launchers = {n: Launcher(fn, "pqqqpqpppq", dependent=True) for n, fn in self.fns.items()}

        def launch(name: str, grid: int, args: tuple) -> None:
            vals = tuple(int(a) if isinstance(a, np.integer) else a.data.ptr for a in args)
            launchers[name](grid, BLOCK, vals, stream())

        return launch

    def emulated(self, name: str, grid: int, args: tuple) -> None:
        self.fns[name]((grid,), (BLOCK,), args)

    def _scratch_for(self, rows: int, bpr: int) -> tuple[Any, Any, Any]:
        """Partials and tickets for ``rows`` x ``bpr`` blocks, made once (the tickets zeroed
        here and put back to zero by every launch's merging blocks)."""
        key = (rows, bpr)
        got = self.scratch.get(key)
        if got is None:
            xp = self.xp
            got = (
                xp.empty(rows * bpr, np.float32),
                xp.empty(rows * bpr, np.int64),
                xp.zeros(rows, np.int32),
            )
            self.scratch[key] = got
        return got

    def takes(self, x: Any) -> bool:
        return x.ndim == 2 and x.dtype in (np.float16, np.float32) and x.strides[-1] == x.itemsize

    def __call__(self, x: Any, out: Any, out_stride: int = 1) -> None:
        """``x``: [rows, n] with unit stride along n (rows may be strided: the last position
        of [batch, seq, vocab] logits); ``out``: int64, row r's id at ``r * out_stride``."""
        rows, n = x.shape
        bpr = blocks_per_row(n, rows, self.sms)
        pv, pi, done = self._scratch_for(rows, bpr)
        stride = x.strides[0] // x.itemsize
        name = f"argmax_rows<{CTYPE[np.dtype(x.dtype)]}>"
        i64 = np.int64
        args = (x, i64(rows), i64(n), i64(stride), out, i64(out_stride), pv, pi, done, i64(bpr))
        self._launch(name, rows * bpr, args)
