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
from .norm_cuda import NORM_HELPERS, NORM_PROLOGUE
from .reduce_source import COMMON, CTYPE

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

#: The dynamic shared memory a normalising launch stages its rows in; the tests' emulator
#: stands a static buffer in (read at build time).
NT_SMEM = "extern __shared__ uint4 nt_smem[];\n"

GEMV_NT_BODY = (
    COMMON
    + NORM_HELPERS
    + NORM_PROLOGUE
    + _HELPERS
    + r"""
__device__ __forceinline__ float nt_sigmoid(float x) { return SIGMOID_EXPR; }

template <typename T> __device__ __forceinline__ float nt_rnd(float x) {
  return to_f(from_f<T>(x));
}

// Rows m < M of A normalised as norm_rows normalises them (NORM_PROLOGUE), into sa ([M, K]
// of T); block 0 writes the rounded sums s to sum_out.
template <typename T>
__device__ __forceinline__ void nt_stage_norm(const T* __restrict__ x, const T* __restrict__ skip,
                                              const T* __restrict__ nbias,
                                              const T* __restrict__ gamma, T* __restrict__ sum_out,
                                              T* sa, int M, int K, int skip_rows, float eps,
                                              int tpr, int vec, float* sh) {
  constexpr int VN = Vec<T>::N;
  for (int m = 0; m < M; ++m) {
    const T* xr = x + (i64)m * K;
    const T* sr = skip == nullptr ? nullptr : skip + (i64)(m % skip_rows) * K;
    const float inv = prologue_inv(xr, sr, nbias, (i64)K, eps, tpr, vec, sh);
    T* so = (sum_out != nullptr && blockIdx.x == 0) ? sum_out + (i64)m * K : nullptr;
    T* out = sa + (i64)m * K;
    if (vec) {
      for (int i = threadIdx.x * VN; i < K; i += blockDim.x * VN) {
        float v[VN], o[VN];
        residual_vec(xr, sr, nbias, (i64)i, v);
#pragma unroll
        for (int e = 0; e < VN; ++e) o[e] = prologue_value(v[e], inv, gamma, (i64)(i + e));
        store_vec(out + i, o);
        if (so != nullptr) store_vec(so + i, v);
      }
    } else {
      for (int i = threadIdx.x; i < K; i += blockDim.x) {
        const float v = residual(xr, sr, nbias, (i64)i);
        out[i] = from_f<T>(prologue_value(v, inv, gamma, (i64)i));
        if (so != nullptr) so[i] = from_f<T>(v);
      }
    }
  }
}

// Warp j computes y[m, j] for m < M <= MT from row j of w (and row j + N with SWIGLU,
// N being the output width H), reading a[m, :] alongside. With NORM, a is the norm's input x
// and every block first stages its rows normalised in shared memory (skip, nbias, gamma,
// sum_out, skip_rows, tpr, nvec and eps as norm_rows takes them), then reads A there.
// SPLIT: whether `split_` warps share an output; the launches that never split compile
// without the slice arithmetic and the merge (their registers and loop as before k_split).
template <typename T, int V, int MT, int SWIGLU, int NORM, int SPLIT>
__global__ void gemv_nt(const T* __restrict__ a, const T* __restrict__ w,
                        const T* __restrict__ bias, T* __restrict__ y,
                        const T* __restrict__ skip, const T* __restrict__ nbias,
                        const T* __restrict__ gamma, T* __restrict__ sum_out, i64 M_, i64 N_,
                        i64 K_, i64 has_bias, i64 skip_rows, i64 tpr, i64 nvec, i64 split_,
                        double eps) {
  const int M = (int)M_, N = (int)N_, K = (int)K_, split = SPLIT ? (int)split_ : 1;
  constexpr int U = 4;
  constexpr int P = SWIGLU ? 2 : 1;  // weight rows per warp
  typedef typename GemvRaw<T, V>::type Raw;
  // `split` warps of one block share output j, each a contiguous slice of the row's chunks.
  const int gw = (int)(((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5);
  const int j = gw / split, part = gw - j * split;
  const int lane = (int)threadIdx.x & 31;
  const int chunks = K / V;  // V divides K: the host picks V = 1 otherwise
  const int per = (chunks + split - 1) / split;
  const int c_lo = part * per, c_hi = chunks < c_lo + per ? chunks : c_lo + per;
  // The weights are this product's bulk and no earlier kernel writes them: their lines are
  // asked for in L2 before the wait, so under programmatic dependent launch they stream in
  // while the kernel before (the one writing A) still runs.
  pdl_trigger();
  if (j < N && c_lo < c_hi) {
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const char* row = reinterpret_cast<const char*>(w + (i64)(j + p * N) * K);
      const char* lo = row + (i64)c_lo * V * sizeof(T);
      const char* hi = row + (i64)c_hi * V * sizeof(T);
      for (const char* q = lo - (reinterpret_cast<unsigned long long>(lo) & 127) + lane * 128;
           q < hi; q += 32 * 128)
        prefetch_l2(q);
    }
  }
  pdl_wait();
  if (NORM) {  // every thread of the block takes part (barriers), whatever its j
    __shared__ float sh[32];
    T* sa = reinterpret_cast<T*>(nt_smem);
    nt_stage_norm(a, skip, nbias, gamma, sum_out, sa, M, K, (int)skip_rows, (float)eps,
                  (int)tpr, (int)nvec, sh);
    __syncthreads();
    a = sa;
  }
  // j is the same for the whole warp: no shuffle loses a lane. Where outputs split, a warp
  // past N returns only after the block's barrier below (every warp reaches it).
  if (!SPLIT && j >= N) return;
  const bool live = j < N;
  const T* rows[P];
#pragma unroll
  for (int p = 0; p < P; ++p) rows[p] = w + (i64)((live ? j : 0) + p * N) * K;
  float acc[P][MT];
#pragma unroll
  for (int p = 0; p < P; ++p)
#pragma unroll
    for (int m = 0; m < MT; ++m) acc[p][m] = 0.f;
  const int c_end = live ? c_hi : c_lo;
  for (int c = c_lo + lane; c < c_end; c += U * 32) {
    Raw r[P][U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int cc = c + u * 32;
#pragma unroll
      for (int p = 0; p < P; ++p)
        if (cc < c_end) r[p][u] = gemv_load<T, V>(rows[p] + (i64)cc * V);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int cc = c + u * 32;
      if (cc < c_end) {
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
  if (SPLIT && split > 1) {  // the slices' sums meet in the output's first warp, in slice order
    __shared__ float red[BLOCK_WARPS][2][GEMV_NT_MT];
    const int warp = (int)threadIdx.x >> 5;
    if (lane == 0) {
#pragma unroll
      for (int p = 0; p < P; ++p)
#pragma unroll
        for (int m = 0; m < MT; ++m) red[warp][p][m] = acc[p][m];
    }
    __syncthreads();
    if (part != 0) return;
    for (int s = 1; s < split; ++s)
#pragma unroll
      for (int p = 0; p < P; ++p)
#pragma unroll
        for (int m = 0; m < MT; ++m) acc[p][m] += red[warp + s][p][m];
  }
  if (!live) return;
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
    .replace("BLOCK_WARPS", str(BLOCK // WARP))
    .replace("GEMV_NT_MT", str(max(ROW_TILES)))
)


def kernel_names(dtype: Any, norm: bool = False) -> tuple[str, ...]:
    """Every instantiation a node of ``dtype`` may launch (the normalising ones with ``norm``)."""
    c = CTYPE[np.dtype(dtype)]
    vecs = (vector_width(dtype), 1)
    tiles = [(v, mt) for v in vecs for mt in ROW_TILES]
    return tuple(
        f"gemv_nt<{c}, {v}, {mt}, {s}, {int(norm)}, {p}>"
        for v, mt in tiles
        for s in (0, 1)
        for p in (0, 1)
    )


GEMV_NT_NAMES = tuple(n for dt in CTYPE for norm in (False, True) for n in kernel_names(dt, norm))


def source() -> str:
    """The kernels' source past ``reduce_source.PRIMITIVES`` (read at build time, so the
    emulator can stand its own :data:`NT_SMEM` in)."""
    return NT_SMEM + GEMV_NT_BODY


#: Dynamic shared memory a normalising launch may stage its rows in (bytes): a block may hold
#: 48 KiB without opting in, its static arrays included.
NORM_SMEM_BUDGET = 44 * 1024


def norm_fits(m: int, k: int, dtype: Any) -> bool:
    """Whether ``m`` rows of ``k`` values of ``dtype`` stage within the budget."""
    return 1 <= m <= GEMV_NT_MAX_M and m * k * np.dtype(dtype).itemsize <= NORM_SMEM_BUDGET


def use_warps(m: int, outputs: int, sms: int) -> bool:
    """Whether a warp per output (``m`` rows by ``outputs`` columns, the gate/up pairs of a
    SwiGLU counted once) beats cuBLAS: the ``m * outputs`` row-products fit in
    :data:`MAX_WAVES` waves of the device's resident warps. Past that the GEMV is no longer
    bound by latency and cuBLAS's tiles reuse A and B better."""
    return 1 <= m <= GEMV_NT_MAX_M and m * outputs <= MAX_WAVES * sms * WARPS_PER_SM


#: The fewest 16-byte chunks of a row a warp's slice keeps (two loads a lane): below it the
#: slices' merge costs more than the latency it hides.
MIN_SLICE_CHUNKS = 64


def k_split(rows: int, chunks: int, sms: int) -> int:
    """Warps sharing one output (1, 2, 4 or 8, all in one block): a GEMV with few, long
    weight rows (a decode step's down projection: 1536 rows of 8960) leaves most of the
    device's warp slots empty with a warp per row, each streaming its row in turn, so the
    rows are split while the warps still fit one wave of resident warps and each slice keeps
    :data:`MIN_SLICE_CHUNKS`. ``rows``: the weight's rows (a SwiGLU's gate and up rows both,
    so the fused and the unfused product split alike and sum in the same order)."""
    split = 1
    while (
        split < BLOCK // WARP
        and rows * split * 2 <= sms * WARPS_PER_SM
        and chunks // (split * 2) >= MIN_SLICE_CHUNKS
    ):
        split *= 2
    return split


class GemvNT:
    """The warp-per-output launches of one node; :meth:`takes` says which products are its
    case (the caller runs cuBLAS on the others)."""

    def __init__(self, xp: Any, dtype: Any = None, norm: bool = False) -> None:
        self.xp = xp
        self.norm = norm
        dtypes = K.dtypes_for(dtype)
        self.fns: dict[np.dtype, dict[str, Any]] = {
            dt: K.compile_kernels(source(), kernel_names(dt, norm)) for dt in dtypes
        }
        self.sms = K.sm_count()
        self.contiguous = K.contiguity_test(xp)
        self._launch = self.emulated if xp is np else self.driver(dtypes)
        self._dummy = {dt: xp.zeros(1, dt) for dt in dtypes}
        self._plans = K.PlanCache(self._plan)

    def driver(self, dtypes: list[np.dtype]) -> Any:
        """Launches straight through the driver (``launch.Launcher``), as ``Gemv`` does."""
        from ..elementwise import stream_ptr_fn
        from ..launch import Launcher

        stream = stream_ptr_fn()
        # dependent: gemv_nt waits (pdl_wait) before it reads A or writes anything
        launchers = {
            (dt, name): Launcher(fn, "p" * 8 + "q" * 8 + "d", dependent=True)
            for dt in dtypes
            for name, fn in self.fns[dt].items()
        }

        def launch(dt, name, grid, arrays, ints, smem=0) -> None:
            ptrs = tuple(0 if x is None else x.data.ptr for x in arrays)
            launchers[dt, name](grid, BLOCK, ptrs + ints, stream(), smem)

        return launch

    def emulated(self, dt, name, grid, arrays, ints, smem=0) -> None:
        """NumPy arrays (the tests' kernel emulator, whose shared memory stands in for the
        dynamic one): the kernel called as CuPy calls one."""
        if smem > NORM_SMEM_BUDGET:
            raise ValueError(f"{name}: {smem} bytes of shared memory")
        args = arrays + tuple(np.int64(v) for v in ints[:-1]) + (np.float64(ints[-1]),)
        self.fns[dt][name]((grid,), (BLOCK,), args)

    def _plan(
        self, shape: tuple, dt: np.dtype, wshape: tuple, swiglu: bool, no_bias: bool, vec: bool
    ) -> tuple[str, int, tuple, tuple]:
        """A plain launch for A of ``shape``: kernel name, grid, integer arguments, y's shape."""
        n, k = wshape
        cols = n // 2 if swiglu else n
        lead = shape[:-1]
        m = 1
        for d in lead:
            m *= d
        v = vector_width(dt) if vec else 1
        split = k_split(n, k // vector_width(dt), self.sms)
        name = f"gemv_nt<{CTYPE[dt]}, {v}, {row_tile(m)}, {int(swiglu)}, 0, {int(split > 1)}>"
        grid = -(-cols * split * WARP // BLOCK)
        ints = (m, cols, k, int(not no_bias), 1, 32, 0, split, 0.0)
        return name, grid, ints, (*lead, cols)

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

    def __call__(
        self, a: Any, wt: Any, bias: Any = None, swiglu: bool = False, norm: tuple | None = None
    ) -> Any:
        """``a @ wt.T (+ bias)``, then the SwiGLU of its halves when ``swiglu``; the caller
        checked :meth:`takes` (and that ``bias``, when given, is N values of a's dtype).

        ``norm`` (this object built with ``norm=True``): ``(skip, skip_rows, nbias, gamma,
        sum_out, eps)``; ``a`` is then the norm's input x, every block normalises its rows
        as ``norm_rows`` would and multiplies those (the caller checked :func:`norm_fits`
        and that every operand is C-contiguous)."""
        xp = self.xp
        if not self.contiguous(a):
            a = xp.ascontiguousarray(a)
        if bias is not None and not self.contiguous(bias):
            bias = xp.ascontiguousarray(bias)
        dt = a.dtype
        bias_arg = self._dummy[dt] if bias is None else bias
        if norm is None:  # the decode path: its launch made once per shape
            vec = (wt.shape[1] * dt.itemsize) % 16 == 0 and not (K.address(a) | K.address(wt)) & 15
            name, grid, ints, shape = self._plans(a.shape, dt, wt.shape, swiglu, bias is None, vec)
            y = xp.empty(shape, dt)
            self._launch(dt, name, grid, (a, wt, bias_arg, y, None, None, None, None), ints, 0)
            return y
        n, k = wt.shape
        cols = n // 2 if swiglu else n
        lead = a.shape[:-1]
        m = 1
        for d in lead:
            m *= d
        y = xp.empty((*lead, cols), dt)
        split = k_split(n, k // vector_width(dt), self.sms)
        grid = -(-cols * split * WARP // BLOCK)
        # A is read from the staged rows (aligned); x's own alignment picks nvec
        vec = (k * dt.itemsize) % 16 == 0 and K.all_aligned((wt,))
        skip, skip_rows, nbias, gamma, sum_out, eps = norm
        nvec = k % vector_width(dt) == 0 and K.all_aligned((a, skip, nbias, gamma, sum_out))
        extra = (skip, nbias, gamma, sum_out)
        tail, smem = (skip_rows, K.row_threads(k), int(nvec), split, eps), m * k * dt.itemsize
        v = vector_width(dt) if vec else 1
        name = f"gemv_nt<{CTYPE[dt]}, {v}, {row_tile(m)}, {int(swiglu)}, 1, {int(split > 1)}>"
        ints = (m, cols, k, int(bias is not None), *tail)
        self._launch(dt, name, grid, (a, wt, bias_arg, y, *extra), ints, smem)
        return y
