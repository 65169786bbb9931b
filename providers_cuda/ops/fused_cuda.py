"""One-launch CUDA kernels for the elementwise ops the fusion passes emit, and their runners.

Each kernel does in one pass over memory what the nodes it replaced did in
several, and rounds where they rounded:

* ``rsqrt_k``: ``1 / sqrt(x)`` with the square root rounded to X's type first
  (Sqrt then Reciprocal);
* ``silu_k``: ``x * sigmoid(x)``, the sigmoid rounded first (Sigmoid then Mul);
* ``swiglu_k``: ``(g * sigmoid(g)) * u`` rounded after each step, reading gate
  and up rows at any row stride, so the packed ``[gate | up]`` output of one
  GEMM is read in place; ``swiglu_v`` the same 16 bytes at a time where the
  widths and addresses allow;
* ``gelu_k``: GELU of ``x (+ bias)`` in float32, the erf form as
  ``0.5 x erfc(-x / sqrt 2)`` or the tanh form, as the generic com.microsoft
  kernels compute them, rounded once (the bias is one value per last-axis
  element).

The sigmoid is the elementwise Sigmoid kernel's own expression
(``providers_cuda/elementwise.py``), so the exact fusions are byte-identical
to the nodes they replace: the same float32 operations in the same order,
with no multiply-add to contract. Everything else (other dtypes, strided or
broadcast operands) goes to the fallback each op module gives, which is the
unfused nodes' own CUDA kernels run one after the other.

The source is built on ``reduce_source.PRIMITIVES`` and compiled through
``reduce_cuda.compile_kernels``, so the tests' kernel emulator can run it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from . import reduce_cuda as K
from .reduce_source import CTYPE

Runner = Callable[..., tuple]
BLOCK = 256
#: Grid-stride blocks per SM: enough to fill the device, few enough to reuse threads.
BLOCKS_PER_SM = 32

FUSED_BODY = r"""
__device__ __forceinline__ float sigmoid_f(float x) { return 1.f / (1.f + expf(-x)); }

// x rounded to T and widened again: where the unfused graph stored an intermediate.
template <typename T> __device__ __forceinline__ float rnd(float x) { return to_f(from_f<T>(x)); }

template <typename T>
__global__ void rsqrt_k(const T* __restrict__ x, T* __restrict__ y, i64 n) {
  const i64 step = (i64)blockDim.x * gridDim.x;
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
    y[i] = from_f<T>(1.f / rnd<T>(sqrtf(to_f(x[i]))));
  }
}

template <typename T>
__global__ void silu_k(const T* __restrict__ x, T* __restrict__ y, i64 n) {
  const i64 step = (i64)blockDim.x * gridDim.x;
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
    const float v = to_f(x[i]);
    y[i] = from_f<T>(v * rnd<T>(sigmoid_f(v)));
  }
}

// Element (r, j) of an n-element output with `cols` columns reads g[r * gs + j], u[r * us + j].
template <typename T>
__global__ void swiglu_k(const T* __restrict__ g, const T* __restrict__ u, T* __restrict__ y,
                         i64 n, i64 cols, i64 gs, i64 us) {
  const i64 step = (i64)blockDim.x * gridDim.x;
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
    const i64 r = i / cols, j = i - r * cols;
    const float gv = to_f(g[r * gs + j]);
    const float act = rnd<T>(gv * rnd<T>(sigmoid_f(gv)));
    y[i] = from_f<T>(act * to_f(u[r * us + j]));
  }
}

// swiglu_k a 16-byte chunk at a time: cols, gs and us multiples of V = 16 / sizeof(T) and
// g, u, y 16-byte aligned (the runner checks). One row/column split per chunk instead of a
// 64-bit division and 2-byte accesses per element, which held swiglu_k to ~40% of the
// bandwidth (2.4 of a 2000-token 1.5B prefill's 16.8 ms of kernels on the H100).
template <typename T>
__global__ void swiglu_v(const T* __restrict__ g, const T* __restrict__ u, T* __restrict__ y,
                         i64 chunks, i64 cols_v, i64 gs, i64 us) {
  constexpr int V = 16 / sizeof(T);
  const i64 step = (i64)blockDim.x * gridDim.x;
  for (i64 c = (i64)blockIdx.x * blockDim.x + threadIdx.x; c < chunks; c += step) {
    const i64 r = c / cols_v, j = (c - r * cols_v) * V;
    const uint4 gw = load16(g + r * gs + j);
    const uint4 uw = load16(u + r * us + j);
    const T* gt = reinterpret_cast<const T*>(&gw);
    const T* ut = reinterpret_cast<const T*>(&uw);
    uint4 yw;
    T* yt = reinterpret_cast<T*>(&yw);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float gv = to_f(gt[e]);
      const float act = rnd<T>(gv * rnd<T>(sigmoid_f(gv)));
      yt[e] = from_f<T>(act * to_f(ut[e]));
    }
    store16(y + c * V, yw);
  }
}

// GELU of x (+ b[i % nb] when nb > 0); tanh_form picks the approximation.
template <typename T>
__global__ void gelu_k(const T* __restrict__ x, const T* __restrict__ b, T* __restrict__ y,
                       i64 n, i64 nb, int tanh_form) {
  const i64 step = (i64)blockDim.x * gridDim.x;
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
    float v = to_f(x[i]);
    if (nb > 0) v += to_f(b[i % nb]);
    float r;
    if (tanh_form) {
      r = 0.5f * v * (1.f + tanhf(0.7978845608028654f * (v + 0.044715f * (v * v * v))));
    } else {
      r = 0.5f * v * erfcf(-v * 0.7071067811865476f);
    }
    y[i] = from_f<T>(r);
  }
}
"""

KERNELS = ("rsqrt_k", "silu_k", "swiglu_k", "swiglu_v", "gelu_k")
FUSED_NAMES = tuple(f"{k}<{c}>" for k in KERNELS for c in CTYPE.values())


def kernels_for(kernel: str, dtype: Any) -> dict[np.dtype, Any]:
    """``{dtype: compiled kernel}`` for the dtypes the kernels take (both when unknown)."""
    dtypes = K.dtypes_for(dtype)
    if not dtypes:
        return {}
    names = [f"{kernel}<{CTYPE[dt]}>" for dt in dtypes]
    compiled = K.compile_kernels(FUSED_BODY, names)
    return {dt: compiled[n] for dt, n in zip(dtypes, names, strict=True)}


def grid(n: int) -> tuple[int]:
    return (max(1, min(-(-n // BLOCK), K.sm_count() * BLOCKS_PER_SM)),)


def unary_runner(kernel: str, node: Any, xp: Any, fallback: Runner) -> Runner:
    """``run(x)``: the one-launch ``kernel`` for contiguous float32/float16, else ``fallback``."""
    fns = kernels_for(kernel, node.input_dtype(0))
    if not fns:
        return fallback
    contiguous = K.contiguity_test(xp)

    def run(x: Any) -> tuple:
        fn = fns.get(x.dtype)
        if fn is None or not contiguous(x):
            return fallback(x)
        y = xp.empty(x.shape, x.dtype)
        if x.size:
            fn(grid(x.size), (BLOCK,), (x, y, np.int64(x.size)))
        return (y,)

    return run


def swiglu_runner(node: Any, xp: Any, fallback: Runner) -> Runner:
    """``run(gate, up)`` (same shape, contiguous) or ``run(packed)`` (contiguous, gate then up
    along the last axis, read in place) through ``swiglu_k``; anything else to ``fallback``."""
    fns = kernels_for("swiglu_k", node.input_dtype(0))
    if not fns:
        return fallback
    vec_fns = kernels_for("swiglu_v", node.input_dtype(0))
    contiguous = K.contiguity_test(xp)

    def run(gate: Any, up: Any = None) -> tuple:
        fn = fns.get(gate.dtype)
        if fn is None or gate.ndim == 0 or not contiguous(gate):
            return fallback(gate) if up is None else fallback(gate, up)
        if up is None:
            width = gate.shape[-1]
            if width % 2:
                return fallback(gate)  # the generic kernel says what is wrong
            cols = width // 2
            g, u, stride = gate, gate.reshape(-1)[cols:], width
        else:
            if up.dtype != gate.dtype or up.shape != gate.shape or not contiguous(up):
                return fallback(gate, up)
            cols = gate.shape[-1]
            g, u, stride = gate, up, cols
        y = xp.empty((*gate.shape[:-1], cols), gate.dtype)
        if not y.size:
            return (y,)
        v = K.vector_width(gate.dtype)
        if cols % v == 0 and stride % v == 0 and K.all_aligned((g, u, y)):
            chunks = y.size // v
            args = (g, u, y, np.int64(chunks), np.int64(cols // v), np.int64(stride))
            vec_fns[gate.dtype](grid(chunks), (BLOCK,), (*args, np.int64(stride)))
        else:
            n, c, st = np.int64(y.size), np.int64(cols), np.int64(stride)
            fn(grid(y.size), (BLOCK,), (g, u, y, n, c, st, st))
        return (y,)

    return run


def gelu_runner(node: Any, xp: Any, fallback: Runner, tanh_form: bool) -> Runner:
    """``run(x[, bias])`` through ``gelu_k`` for contiguous operands and a last-axis bias."""
    fns = kernels_for("gelu_k", node.input_dtype(0))
    if not fns:
        return fallback
    contiguous = K.contiguity_test(xp)
    form = np.int32(1 if tanh_form else 0)

    def run(x: Any, bias: Any = None) -> tuple:
        fn = fns.get(x.dtype)
        fits = bias is None or (
            bias.dtype == x.dtype
            and bias.ndim == 1
            and x.ndim >= 1
            and bias.shape[0] == x.shape[-1]
            and contiguous(bias)
        )
        if fn is None or not fits or not contiguous(x):
            return fallback(x) if bias is None else fallback(x, bias)
        y = xp.empty(x.shape, x.dtype)
        if x.size:
            nb = np.int64(0 if bias is None else bias.shape[0])
            fn(grid(x.size), (BLOCK,), (x, bias, y, np.int64(x.size), nb, form))
        return (y,)

    return run
