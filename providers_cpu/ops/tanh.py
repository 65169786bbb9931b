"""tanh for the CPU Tanh kernel and FusedConv's Tanh activation.

NumPy 2.4's float32 ``tanh`` is a scalar libm call per value on AVX2 (its SIMD loop is
AVX-512 only): 2.8 ns a value on the Zen 3 machine, against 0.4 for onnxruntime's MLAS
rational approximation (magika's two Tanh nodes, 1.2M values, 3.3 ms a run against 0.5).
float32 with numba: the recurrent kernels' ``tanh32`` (``recurrent_loops.py``: x P(x^2) /
Q(x^2) on x clamped to [-9, 9], at most 3e-7 relative against float64 tanh; NaN stays
NaN, -0 stays -0, the result stays in [-1, 1]) in one pass LLVM vectorises: 0.2-0.3 ns a
value. Every float32 array takes it, whatever its size or strides (a small one costs
0.3 us more than NumPy's call, 16 values: 0.9 against 0.6; from about 100 values it is
ahead), so that a Tanh node and a fused convolution's Tanh block give the same bits;
other dtypes, and numba off, take NumPy's ufunc.

One call on the caller's thread, as ``logistic.py``'s loop: the pass is memory-bound past
a few hundred kilobytes, and the provider's pool's hand-off measured slower there.
"""

from __future__ import annotations

import numpy as np

from .. import jit

_F32 = np.dtype(np.float32)


def compiled(dtype: np.dtype) -> bool:
    """Whether :func:`tanh` runs the compiled loop on arrays of ``dtype``."""
    return np.dtype(dtype) == _F32 and jit.ENABLED


def tanh(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``tanh(x)`` into ``out`` (same shape and dtype; may be ``x``) or a fresh array, which
    it returns (a 0-d float32 input gives a 0-d array)."""
    if not compiled(x.dtype):
        return np.tanh(x) if out is None else np.tanh(x, out=out)
    if out is not None and not out.flags.c_contiguous:
        np.copyto(out, tanh(x))
        return out
    if out is None:
        out = np.empty(x.shape, _F32)
    if x.size:
        _loop()(np.ascontiguousarray(x).reshape(-1), out.reshape(-1))
    return out


def _loop():
    global _compiled_loop
    if _compiled_loop is None:
        from .recurrent_loops import tanh_array

        _compiled_loop = tanh_array
    return _compiled_loop


_compiled_loop = None
