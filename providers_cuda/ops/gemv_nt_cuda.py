"""GEMV over a transposed weight: ``y = A @ Wt^T (+ bias)`` with ``Wt`` stored ``[N, K]``.

``fuse_transposed_weights`` stores a decode MatMul's constant weight
transposed, once, at session creation, so each output's weights are one
contiguous row of K. One warp computes one output column for every row of A
(at most :data:`GEMV_NT_MAX_M`): its lanes walk the row in 16-byte loads
(``V`` elements; a row whose length is not a multiple of 16 bytes, or an
operand off a 16-byte boundary, runs the one-element instantiation),
keeping :data:`UNROLL` loads in flight, sum in float32, and combine their
partial sums by a fixed butterfly of shuffles (the same bits on every run).
The bias is added to the float32 sum and the result rounded once, as the
MatMulBias GEMV rounds.

With ``SWIGLU`` the weight holds the gate rows then the up rows (2H of
them) and warp ``j`` reads rows ``j`` and ``j + H``: the gate and up sums are
rounded to the storage type (where the unfused graph stored the GEMM's
output), then the SwiGLU follows as ``swiglu_k`` computes it, with the
elementwise Sigmoid kernel's own expression, rounding after each step.

Whether a product runs here or through cuBLAS is :func:`use_warps`: a warp
per output pays when the outputs fit in a few waves of the device's resident
warps (a GEMV bound by latency); beyond that cuBLAS's tiling wins (a 151936-
row LM head: 72 us here against cuBLAS's 66 on the H200).

The source is built on ``reduce_source.PRIMITIVES`` and compiled through
``reduce_cuda.compile_kernels``, so the tests' kernel emulator can run it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import elementwise as EW
from . import reduce_cuda as K
from .gemv_cuda import GEMV_BODY, ROW_TILES, row_tile, vector_width
from .reduce_source import CTYPE

#: Rows of A the kernel takes (after flattening A's batch dims); more go to cuBLAS.
GEMV_NT_MAX_M = 8
#: Threads per block (8 warps: 8 outputs).
BLOCK = 256
WARP = 32
#: Row loads each lane keeps in flight.
UNROLL = 4
#: Resident warps per SM (2048 threads on sm_80 and sm_90; 1536 on sm_86/89, where the
#: rule below then allows a third more waves than it says).
WARPS_PER_SM = 64
#: Waves of resident warps up to which a warp per output beats cuBLAS: the H200's decode
#: shapes take 0.1 to 1.2 waves (faster than cuBLAS at all but 896 -> 9728, 5.70 against
#: 5.17 us), a 151936-row LM head 18 (slower: 72 against 66 us).
MAX_WAVES = 4

# The load helpers (GemvRaw, gemv_load, gemv_unpack) are the [K, N] GEMV's, shared: its source
# up to its kernel's comment.
_HELPERS, _MARK, _ = GEMV_BODY.partition("// y[m, n] = sum_k")
if not _MARK or "gemv_unpack" not in _HELPERS:
    raise ImportError("gemv_cuda.GEMV_BODY no longer starts with its load helpers")

GEMV_NT_BODY = (
    _HELPERS
    + r"""
__device__ __forceinline__ float nt_sigmoid(float x) { return SIGMOID_EXPR; }

template <typename T> __device__ __forceinline__ float nt_rnd(float x) {
  return to_f(from_f<T>(x));
}

// Warp j computes y[m, j] for m < M <= MT from row j of w (and row j + N with SWIGLU,
// N being the output width H), reading a[m, :] alongside.
template <typename T, int V, int MT, int SWIGLU>
__global__ void gemv_nt(const T* __restrict__ a, const T* __restrict__ w,
                        const T* __restrict__ bias, T* __restrict__ y, i64 M_, i64 N_, i64 K_,
                        i64 has_bias) {
  const int M = (int)M_, N = (int)N_, K = (int)K_;
  constexpr int U = 4;
  constexpr int P = SWIGLU ? 2 : 1;  // weight rows per warp
  typedef typename GemvRaw<T, V>::type Raw;
  const int j = (int)(((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5);
  const int lane = (int)threadIdx.x & 31;
  if (j >= N) return;  // j is the same for the whole warp: no shuffle loses a lane
  const T* rows[P];
#pragma unroll
  for (int p = 0; p < P; ++p) rows[p] = w + (i64)(j + p * N) * K;
  float acc[P][MT];
#pragma unroll
  for (int p = 0; p < P; ++p)
#pragma unroll
    for (int m = 0; m < MT; ++m) acc[p][m] = 0.f;
  const int chunks = K / V;  // V divides K: the host picks V = 1 otherwise
  for (int c = lane; c < chunks; c += U * 32) {
    Raw r[P][U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int cc = c + u * 32;
#pragma unroll
      for (int p = 0; p < P; ++p)
        if (cc < chunks) r[p][u] = gemv_load<T, V>(rows[p] + (i64)cc * V);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int cc = c + u * 32;
      if (cc < chunks) {
        float wv[P][V];
#pragma unroll
        for (int p = 0; p < P; ++p) gemv_unpack<T, V>(r[p][u], wv[p]);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          // Rows past M repeat row M - 1; their sums are never stored.
          const T* ar = a + (i64)(m < M ? m : M - 1) * K + (i64)cc * V;
          float av[V];
          gemv_unpack<T, V>(gemv_load<T, V>(ar), av);
#pragma unroll
          for (int p = 0; p < P; ++p)
#pragma unroll
            for (int v = 0; v < V; ++v) acc[p][m] = fmaf(av[v], wv[p][v], acc[p][m]);
        }
      }
    }
  }
#pragma unroll
  for (int p = 0; p < P; ++p)
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) acc[p][m] += shfl_xor(acc[p][m], off);
  // Every lane holds the sums; lane m stores row m.
#pragma unroll
  for (int m = 0; m < MT; ++m) {
    if (m < M && lane == m) {
      float g = acc[0][m];
      if (has_bias) g += to_f(bias[j]);
      if (SWIGLU) {
        float u = acc[P - 1][m];
        if (has_bias) u += to_f(bias[j + N]);
        const float gv = nt_rnd<T>(g);
        const float act = nt_rnd<T>(gv * nt_rnd<T>(nt_sigmoid(gv)));
        y[(i64)m * N + j] = from_f<T>(act * nt_rnd<T>(u));
      } else {
        y[(i64)m * N + j] = from_f<T>(g);
      }
    }
  }
}
""".replace("SIGMOID_EXPR", EW.UNARY["sigmoid"])
)


def kernel_names(dtype: Any) -> tuple[str, ...]:
    """Every instantiation a node of ``dtype`` may launch."""
    c = CTYPE[np.dtype(dtype)]
    vecs = (vector_width(dtype), 1)
    return tuple(f"gemv_nt<{c}, {v}, {mt}, {s}>" for v in vecs for mt in ROW_TILES for s in (0, 1))


GEMV_NT_NAMES = tuple(n for dt in CTYPE for n in kernel_names(dt))


def use_warps(m: int, outputs: int, sms: int) -> bool:
    """Whether a warp per output (``m`` rows by ``outputs`` columns, the gate/up pairs of a
    SwiGLU counted once) beats cuBLAS: the ``m * outputs`` row-products fit in
    :data:`MAX_WAVES` waves of the device's resident warps. Past that the GEMV is no longer
    bound by latency and cuBLAS's tiles reuse A and B better."""
    return 1 <= m <= GEMV_NT_MAX_M and m * outputs <= MAX_WAVES * sms * WARPS_PER_SM


class GemvNT:
    """The warp-per-output launches of one node; :meth:`takes` says which products are its
    case (the caller runs cuBLAS on the others)."""

    def __init__(self, xp: Any, dtype: Any = None) -> None:
        self.xp = xp
        dtypes = K.dtypes_for(dtype)
        self.fns: dict[np.dtype, dict[str, Any]] = {
            dt: K.compile_kernels(GEMV_NT_BODY, kernel_names(dt)) for dt in dtypes
        }
        self.sms = K.sm_count()
        self.contiguous = K.contiguity_test(xp)
        self._launch = self.emulated if xp is np else self.driver(dtypes)
        self._dummy = {dt: xp.zeros(1, dt) for dt in dtypes}

    def driver(self, dtypes: list[np.dtype]) -> Any:
        """Launches straight through the driver (``launch.Launcher``), as ``Gemv`` does."""
        from ..elementwise import stream_ptr_fn
        from ..launch import Launcher

        stream = stream_ptr_fn()
        launchers = {
            (dt, name): Launcher(fn, "pppp" + "q" * 4)
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

    def takes(self, a: Any, wt: Any, swiglu: bool = False) -> bool:
        """Whether ``a @ wt.T`` is this kernel's case: one float16/float32 dtype, ``wt`` a
        C-contiguous non-empty ``[N, K]`` matrix, and :func:`use_warps` for A's rows."""
        if a.dtype != wt.dtype or a.dtype not in self.fns:
            return False
        if wt.ndim != 2 or a.ndim < 1 or not self.contiguous(wt):
            return False
        n, k = wt.shape
        if a.shape[-1] != k or k == 0 or n == 0 or (swiglu and n % 2):
            return False
        m = 1
        for d in a.shape[:-1]:
            m *= d
        return use_warps(m, n // 2 if swiglu else n, self.sms)

    def __call__(self, a: Any, wt: Any, bias: Any = None, swiglu: bool = False) -> Any:
        """``a @ wt.T (+ bias)``, then the SwiGLU of its halves when ``swiglu``; the caller
        checked :meth:`takes` (and that ``bias``, when given, is N values of a's dtype)."""
        xp = self.xp
        n, k = wt.shape
        cols = n // 2 if swiglu else n
        lead = a.shape[:-1]
        m = 1
        for d in lead:
            m *= d
        if not self.contiguous(a):
            a = xp.ascontiguousarray(a)
        if bias is not None and not self.contiguous(bias):
            bias = xp.ascontiguousarray(bias)
        dt = a.dtype
        vec = (k * dt.itemsize) % 16 == 0 and K.all_aligned((a, wt))
        v = vector_width(dt) if vec else 1
        y = xp.empty((*lead, cols), dt)
        name = f"gemv_nt<{CTYPE[dt]}, {v}, {row_tile(m)}, {int(swiglu)}>"
        bias_arg = self._dummy[dt] if bias is None else bias
        ints = (m, cols, k, int(bias is not None))
        grid = -(-cols * WARP // BLOCK)
        self._launch(dt, name, grid, (a, wt, bias_arg, y), ints)
        return y
