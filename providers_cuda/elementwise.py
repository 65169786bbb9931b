"""Raw NVRTC kernels for the hot elementwise ops, launched straight through the driver.

A CuPy ufunc costs 13-18 us of host time per call; most of a decoder's
elementwise nodes are float32 or float16 arithmetic on contiguous arrays
where one operand is the same shape, a scalar, a trailing block (a bias) or
a leading block (a per-row scale). Those take one kernel here, with an index
``(i / d) % m`` per operand; anything else (other dtypes, strided views,
general broadcasting, legacy ``broadcast`` attributes) goes to the generic
kernel. float16 is loaded into float32, computed, and rounded once on store,
as NumPy computes float16 arithmetic.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from . import nvrtc
from .launch import Launcher
from .ops.attention_cuda import sm_count

#: Binary ops: name -> C expression of floats ``x`` and ``y``.
BINARY = {"add": "x + y", "sub": "x - y", "mul": "x * y", "div": "x / y"}
#: Unary ops: name -> C expression of the float ``x`` (NaN propagates as in NumPy).
UNARY = {
    "relu": "(x > 0.f || x != x) ? x : 0.f",
    "neg": "-x",
    "abs": "fabsf(x)",
    "sqrt": "sqrtf(x)",
    "exp": "expf(x)",
    "tanh": "tanhf(x)",
    "sigmoid": "1.f / (1.f + expf(-x))",
    "reciprocal": "1.f / x",
}
TYPES = {"float32": "float", "float16": "half_t"}

_PRELUDE = r"""
typedef unsigned short half_t;
__device__ __forceinline__ float ld(const float* p, long long i) { return p[i]; }
__device__ __forceinline__ float ld(const half_t* p, long long i) {
    float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(p[i])); return f;
}
__device__ __forceinline__ void st(float* p, long long i, float v) { p[i] = v; }
__device__ __forceinline__ void st(half_t* p, long long i, float v) {
    half_t h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v)); p[i] = h;
}
__device__ __forceinline__ long long at(long long i, long long n, long long d, long long m) {
    return m == n ? i : (d == 1 ? i % m : (i / d) % m);
}
"""

_BINARY_TEMPLATE = r"""
template <typename T>
__global__ void {name}_k(const T* a, const T* b, T* out, long long n,
                         long long da, long long ma, long long db, long long mb) {{
    long long step = (long long)blockDim.x * gridDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {{
        float x = ld(a, at(i, n, da, ma));
        float y = ld(b, at(i, n, db, mb));
        st(out, i, {expr});
    }}
}}
"""

_UNARY_TEMPLATE = r"""
template <typename T>
__global__ void {name}_k(const T* a, T* out, long long n) {{
    long long step = (long long)blockDim.x * gridDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {{
        float x = ld(a, i);
        st(out, i, {expr});
    }}
}}
"""

SOURCE = (
    _PRELUDE
    + "".join(_BINARY_TEMPLATE.format(name=k, expr=v) for k, v in BINARY.items())
    + "".join(_UNARY_TEMPLATE.format(name=k, expr=v) for k, v in UNARY.items())
)
NAMES = tuple(f"{op}_k<{t}>" for op in (*BINARY, *UNARY) for t in TYPES.values())

BLOCK = 256


def _max_grid() -> int:
    return sm_count() * 32


def launchers(op: str, sig: str) -> dict[Any, Launcher]:
    """This op's kernel per dtype (keyed by the NumPy dtype), loaded on the current device."""
    import numpy as np

    return {
        np.dtype(dt): Launcher(nvrtc.function(SOURCE, f"{op}_k<{ct}>", name_expressions=NAMES), sig)
        for dt, ct in TYPES.items()
    }


def c_contiguous() -> Callable[[Any], bool]:
    """The cheapest C-contiguity test this CuPy offers (``flags`` builds an object per call)."""
    import operator

    import cupy

    probe = cupy.empty(1)
    if isinstance(getattr(probe, "c_contiguous", None), bool):
        return operator.attrgetter("c_contiguous")
    return lambda x: x.flags.c_contiguous


def block_index(shape: tuple[int, ...], out: tuple[int, ...]) -> tuple[int, int] | None:
    """``(d, m)`` so that element ``i`` of ``out`` reads element ``(i // d) % m`` of an
    operand of ``shape`` broadcast to ``out``; None unless the operand's non-1 dims
    are one run of ``out``'s dims."""
    pad = (1,) * (len(out) - len(shape)) + tuple(shape)
    keep = [k for k, s in enumerate(pad) if s != 1]
    if not keep:
        return 1, 1
    lo, hi = keep[0], keep[-1] + 1
    for k in range(lo, hi):
        if pad[k] != out[k]:
            return None
    return math.prod(out[hi:]), math.prod(out[lo:hi])


def broadcast_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    n = max(len(a), len(b))
    pa = (1,) * (n - len(a)) + a
    pb = (1,) * (n - len(b)) + b
    out = []
    for x, y in zip(pa, pb):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            return None
    return tuple(out)


def binary_runner(op: str, fallback: Callable[..., tuple]) -> Callable[..., tuple]:
    """``run(a, b)`` through the raw kernel where it applies, else ``fallback``."""
    import cupy

    table = launchers(op, "pppqqqqq")
    grid_cap = _max_grid()
    empty = cupy.ndarray  # allocates from the current pool, one Python frame less
    stream_ptr = stream_ptr_fn()
    contiguous = c_contiguous()

    def run(a: Any, b: Any) -> tuple:
        dt = a.dtype
        la = table.get(dt)
        if la is None or b.dtype != dt or not (contiguous(a) and contiguous(b)):
            return fallback(a, b)
        sa, sb = a.shape, b.shape
        if sa == sb:
            shape = sa
            n = a.size
            da = db = 1
            ma = mb = n
        else:
            shape = broadcast_shape(sa, sb)
            if shape is None:
                return fallback(a, b)
            ia, ib = block_index(sa, shape), block_index(sb, shape)
            if ia is None or ib is None:
                return fallback(a, b)
            n = math.prod(shape)
            da, ma = ia
            db, mb = ib
        out = empty(shape, dt)
        if n:
            grid = min((n + BLOCK - 1) // BLOCK, grid_cap)
            args = (a.data.ptr, b.data.ptr, out.data.ptr, n, da, ma, db, mb)
            la(grid, BLOCK, args, stream_ptr())
        return (out,)

    return run


def unary_runner(op: str, fallback: Callable[..., tuple]) -> Callable[..., tuple]:
    """``run(x)`` through the raw kernel for contiguous float32/float16, else ``fallback``."""
    import cupy

    table = launchers(op, "ppq")
    grid_cap = _max_grid()
    empty = cupy.ndarray  # allocates from the current pool, one Python frame less
    stream_ptr = stream_ptr_fn()
    contiguous = c_contiguous()

    def run(x: Any) -> tuple:
        la = table.get(x.dtype)
        if la is None or not contiguous(x):
            return fallback(x)
        out = empty(x.shape, x.dtype)
        n = x.size
        if n:
            grid = min((n + BLOCK - 1) // BLOCK, grid_cap)
            la(grid, BLOCK, (x.data.ptr, out.data.ptr, n), stream_ptr())
        return (out,)

    return run


def stream_ptr_fn() -> Callable[[], int]:
    from cupy_backends.cuda import stream as stream_module

    fast = getattr(stream_module, "get_current_stream_ptr", None)
    if fast is not None:
        return fast
    import cupy

    return lambda: cupy.cuda.get_current_stream().ptr
