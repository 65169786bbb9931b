"""GEMV for products with few rows of A: ``y = A @ B (+ bias)`` with B a 2-D ``[K, N]`` matrix.

Decode multiplies one to a few rows of activations by each weight, so the
product is bound by reading B once; cuBLAS reaches about a third of the copy
bandwidth there. This kernel reads B row-major as it is stored: each thread
owns ``V`` consecutive columns (16 bytes, one load, when every row starts on
a 16-byte boundary; else one column) and walks rows ``k = ty, ty + TY, ...``
of the block's share of K, keeping ``U`` row loads in flight. ``TX`` threads
of a block lie along N (``TX * 16`` bytes of a row: whole 128-byte lines),
``TY = 256 / TX`` along K. Sums are float32; a block adds its ``TY`` partial
sums of a column in a fixed order through shared memory.

When N alone gives too few blocks to fill the device (from the SM count),
K is split across blocks too: each split leaves float32 partials, and the
last split of a column tile to finish (an integer ticket per tile, in a
buffer each plan allocates once and the merging block puts back to zero, so
CUDA graph replays find it zeroed) adds them in split order, adds the bias
and rounds: one launch, the same bits on every run (no float atomics). Without a split the
block adds the bias and rounds itself. Either way the result is rounded once,
from the float32 sum with the bias in it: cuBLAS's contract on this path.

The source is built on ``reduce_source.PRIMITIVES`` and compiled through
``reduce_cuda.compile_kernels``, so the tests' kernel emulator can run it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from . import reduce_cuda as K
from .reduce_source import CTYPE

#: Rows of A the GEMV takes (after flattening A's batch dims); more go to cuBLAS.
GEMV_MAX_M = 8
#: Threads per block.
BLOCK = 256
#: Row loads each thread keeps in flight.
UNROLL = 4
#: Blocks per SM a launch should reach: 1024 threads, 64 KiB of loads in flight per SM.
FILL_PER_SM = 4
#: Row tiles (instantiations): the GEMV for ``m`` rows runs the smallest one covering it.
ROW_TILES = (1, 2, 4, 8)

GEMV_BODY = r"""
// V consecutive elements of T: 16 bytes in one load, or one element.
template <typename T, int V> struct GemvRaw { typedef uint4 type; };
template <typename T> struct GemvRaw<T, 1> { typedef T type; };

template <typename T, int V>
__device__ __forceinline__ typename GemvRaw<T, V>::type gemv_load(const T* p) {
  if constexpr (V == 1) {
    return *p;
  } else {
    return load16(p);
  }
}

template <typename T, int V>
__device__ __forceinline__ void gemv_unpack(const typename GemvRaw<T, V>::type& r, float (&w)[V]) {
  if constexpr (V == 1) {
    w[0] = to_f(r);
  } else {
    const T* e = reinterpret_cast<const T*>(&r);
#pragma unroll
    for (int v = 0; v < V; ++v) w[v] = to_f(e[v]);
  }
}

// y[m, n] = sum_k a[m, k] b[k, n] (+ bias[n]) for m < M <= MT. Block i covers column tile
// i % tiles (TX * V columns) and rows [s * kc, (s + 1) * kc) of K, s = i / tiles. With
// splits > 1 it writes float32 partials part[s, m, n]; the last of a tile's splits to finish
// (a ticket in done[tile], which it puts back to 0 for the next launch) adds them in split
// order, adds the bias and rounds once. Without a split it stores y itself, rounded once.
template <typename T, int V, int MT>
__global__ void gemv_kn(const T* __restrict__ a, const T* __restrict__ b,
                        const T* __restrict__ bias, T* __restrict__ y, float* part,
                        int* __restrict__ done, i64 M_, i64 N_, i64 K_, i64 log2tx_, i64 tiles_,
                        i64 kc_, i64 splits_, i64 has_bias) {
  // 64-bit parameters (the driver-level launcher packs 8-byte arguments), 32-bit arithmetic.
  const int M = (int)M_, N = (int)N_, K = (int)K_, log2tx = (int)log2tx_;
  const int tiles = (int)tiles_, kc = (int)kc_, splits = (int)splits_;
  const bool split = splits > 1;
  constexpr int U = 4;
  __shared__ float red[256 * V];
  __shared__ int last;
  typedef typename GemvRaw<T, V>::type Raw;
  const int TX = 1 << log2tx;
  const int TY = (int)blockDim.x >> log2tx;
  const int tx = (int)threadIdx.x & (TX - 1);
  const int ty = (int)threadIdx.x >> log2tx;
  const int tile = (int)blockIdx.x % tiles;
  const int s = (int)blockIdx.x / tiles;
  const int n0 = (tile * TX + tx) * V;
  const int k0 = s * kc;
  const int k1 = K < k0 + kc ? K : k0 + kc;
  float acc[MT][V];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int v = 0; v < V; ++v) acc[m][v] = 0.f;
  if (n0 < N) {
    for (int k = k0 + ty; k < k1; k += U * TY) {
      Raw r[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int kk = k + u * TY;
        if (kk < k1) r[u] = gemv_load<T, V>(b + (i64)kk * N + n0);
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int kk = k + u * TY;
        if (kk < k1) {
          float w[V];
          gemv_unpack<T, V>(r[u], w);
#pragma unroll
          for (int m = 0; m < MT; ++m) {
            // Rows past M repeat row M - 1; their sums are never stored.
            const float av = to_f(a[(i64)(m < M ? m : M - 1) * K + kk]);
#pragma unroll
            for (int v = 0; v < V; ++v) acc[m][v] = fmaf(av, w[v], acc[m][v]);
          }
        }
      }
    }
  }
  const int cols = TX * V;
#pragma unroll
  for (int m = 0; m < MT; ++m) {
    if (m < M) {  // uniform over the block: the barriers below are met by every thread
#pragma unroll
      for (int v = 0; v < V; ++v) red[ty * cols + tx * V + v] = acc[m][v];
      __syncthreads();
      for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        const int n = tile * cols + c;
        if (n < N) {
          float sum = 0.f;
          for (int j = 0; j < TY; ++j) sum += red[j * cols + c];
          if (split) {
            part[((i64)s * M + m) * N + n] = sum;
          } else {
            if (has_bias) sum += to_f(bias[n]);
            y[(i64)m * N + n] = from_f<T>(sum);
          }
        }
      }
      __syncthreads();
    }
  }
  if (!split) return;
  // The tile's partials are made visible device-wide before its ticket is taken; the last
  // split to take one merges them all (no second launch, which costs more than the merge).
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const int ticket = atomicAdd(done + tile, 1);
    last = ticket == splits - 1;
    if (last) done[tile] = 0;  // ready for the next launch (CUDA graph replays)
  }
  __syncthreads();
  if (!last) return;
  __threadfence();  // the other splits' partials are read after their tickets
  // Partials written by other blocks are read through L2 (__ldcg), not a stale L1 line.
  for (int i = threadIdx.x; i < M * cols; i += blockDim.x) {
    const int m = i / cols;
    const int n = tile * cols + (i - m * cols);
    if (n < N) {
      float sum = 0.f;
      for (int j = 0; j < splits; ++j) sum += __ldcg(part + ((i64)j * M + m) * N + n);
      if (has_bias) sum += to_f(bias[n]);
      y[(i64)m * N + n] = from_f<T>(sum);
    }
  }
}
"""


def vector_width(dtype: Any) -> int:
    """Columns per 16-byte load of ``dtype`` (8 for float16, 4 for float32)."""
    return 16 // np.dtype(dtype).itemsize


def kernel_names(dtype: Any) -> tuple[str, ...]:
    """Every instantiation a node of ``dtype`` may launch."""
    c = CTYPE[np.dtype(dtype)]
    vecs = (vector_width(dtype), 1)
    return tuple(f"gemv_kn<{c}, {v}, {mt}>" for v in vecs for mt in ROW_TILES)


GEMV_NAMES = tuple(n for dt in CTYPE for n in kernel_names(dt))


def row_tile(m: int) -> int:
    """The instantiation (rows of A per launch) that covers ``m`` rows."""
    for mt in ROW_TILES:
        if m <= mt:
            return mt
    raise ValueError(f"GEMV takes at most {GEMV_MAX_M} rows, got {m}")


def _pow2_ceil(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


@dataclass(frozen=True)
class Plan:
    """How one ``[M, K] @ [K, N]`` product is launched."""

    v: int  # columns per thread (16 bytes, or 1)
    mt: int  # row tile (template)
    log2tx: int  # threads of a block along N, as a power of two
    tiles: int  # column tiles (blocks along N)
    splits: int  # blocks along K
    kc: int  # rows of K per split


def plan(m: int, n: int, k: int, itemsize: int, vec: bool, sms: int) -> Plan:
    """Geometry from the shape, whether 16-byte loads may be used, and the SM count.

    A thread block's ``TX`` threads along N read ``TX * V`` columns: 128 bytes
    of a row (whole cache lines), fewer only when N is that narrow. Blocks
    along N first; when they fall short of :data:`FILL_PER_SM` per SM, K is
    split until they reach it, but never so finely that a thread has fewer
    than :data:`UNROLL` rows (its loads in flight) of its split.
    """
    v = 16 // itemsize if vec else 1
    groups = -(-n // v)
    tx = min(_pow2_ceil(groups), max(1, 128 // (v * itemsize)))
    ty = BLOCK // tx
    tiles = -(-groups // tx)
    want = sms * FILL_PER_SM
    splits = 1
    if tiles < want:
        splits = max(1, min(-(-want // tiles), k // (ty * UNROLL)))
    kc = -(-k // splits)
    splits = -(-k // kc)  # no empty split
    return Plan(v, row_tile(m), tx.bit_length() - 1, tiles, splits, kc)


class Gemv:
    """The GEMV launches of one node, for the dtypes it may see; :meth:`__call__` runs a
    product or answers None when the operands are not its case (the caller runs cuBLAS)."""

    def __init__(self, xp: Any, dtype: Any = None) -> None:
        self.xp = xp
        dtypes = K.dtypes_for(dtype)
        self.fns: dict[np.dtype, dict[str, Any]] = {}
        for dt in dtypes:
            names = kernel_names(dt)
            self.fns[dt] = K.compile_kernels(GEMV_BODY, names)
        self.sms = K.sm_count()
        self.contiguous = K.contiguity_test(xp)
        self._launch = self.emulated if xp is np else self.driver(dtypes)
        self.plans = K.PlanCache(self._plan)
        self._dummy = {dt: xp.zeros(1, dt) for dt in dtypes}
        self._dummy_f32 = xp.zeros(1, np.float32)
        self._dummy_i32 = xp.zeros(1, np.int32)

    def driver(self, dtypes: list[np.dtype]) -> Any:
        """Launches straight through the driver (``launch.Launcher``): CuPy's kernel call
        converts every argument per launch, several microseconds a decode step pays per
        product when it is not captured."""
        from ..elementwise import stream_ptr_fn
        from ..launch import Launcher

        stream = stream_ptr_fn()
        launchers = {
            (dt, name): Launcher(fn, "pppppp" + "q" * 8)
            for dt in dtypes
            for name, fn in self.fns[dt].items()
        }

        def launch(dt: np.dtype, name: str, grid: int, arrays: tuple, ints: tuple) -> None:
            ptrs = tuple(x.data.ptr for x in arrays)
            launchers[dt, name](grid, BLOCK, ptrs + ints, stream())

        return launch

    def emulated(self, dt: np.dtype, name: str, grid: int, arrays: tuple, ints: tuple) -> None:
        """NumPy arrays (the tests' kernel emulator): the kernel called as CuPy calls one."""
        self.fns[dt][name]((grid,), (BLOCK,), arrays + tuple(np.int64(v) for v in ints))

    def _plan(self, m: int, n: int, k: int, itemsize: int, vec: bool) -> tuple[Plan, Any]:
        """The plan and, with a split, its per-tile tickets: zeroed once here, then put back
        to zero by each launch's merging blocks, so a captured launch replays on them."""
        p = plan(m, n, k, itemsize, vec, self.sms)
        done = self.xp.zeros(p.tiles, np.int32) if p.splits > 1 else self._dummy_i32
        return p, done

    def takes(self, a: Any, b: Any) -> bool:
        """Whether ``a @ b`` is this kernel's case: the same float16/float32 dtype, B a
        C-contiguous 2-D matrix, at most :data:`GEMV_MAX_M` rows of A after its batch dims
        and nothing empty (cuBLAS handles the rest)."""
        if a.dtype != b.dtype or a.dtype not in self.fns:
            return False
        if b.ndim != 2 or a.ndim < 1 or not self.contiguous(b):
            return False
        k, n = b.shape
        if a.shape[-1] != k or k == 0 or n == 0:
            return False
        m = 1
        for d in a.shape[:-1]:
            m *= d
        return 1 <= m <= GEMV_MAX_M

    def __call__(self, a: Any, b: Any, bias: Any = None) -> Any:
        """``a @ b (+ bias)`` of shape ``(*a.shape[:-1], N)``; the caller checked :meth:`takes`
        (and that ``bias``, when given, is ``N`` values of the same dtype)."""
        xp = self.xp
        k, n = b.shape
        lead = a.shape[:-1]
        m = 1
        for d in lead:
            m *= d
        if not self.contiguous(a):
            a = xp.ascontiguousarray(a)
        if bias is not None and not self.contiguous(bias):
            bias = xp.ascontiguousarray(bias)
        dt = a.dtype
        vec = (n * dt.itemsize) % 16 == 0 and K.address(b) % 16 == 0
        p, done = self.plans(m, n, k, dt.itemsize, vec)
        y = xp.empty((*lead, n), dt)
        has_bias = int(bias is not None)
        bias_arg = self._dummy[dt] if bias is None else bias
        part = xp.empty((p.splits, m, n), np.float32) if p.splits > 1 else self._dummy_f32
        name = f"gemv_kn<{CTYPE[dt]}, {p.v}, {p.mt}>"
        ints = (m, n, k, p.log2tx, p.tiles, p.kc, p.splits, has_bias)
        self._launch(dt, name, p.tiles * p.splits, (a, b, bias_arg, y, part, done), ints)
        return y
