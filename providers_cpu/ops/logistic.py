"""The logistic sigmoid(alpha * x), times x or not, for Sigmoid, onnxep::SiLU, QuickGelu,
Swish and FusedConv's Sigmoid/SiLU activations on the CPU.

float32 with numba: one compiled pass (``jit._logistic_value``) that computes exp(-|w|) by
range reduction and a polynomial instead of calling libm's ``exp`` per value, so LLVM
vectorises it: 0.2 ns a value on one core against 0.6 for NumPy's three passes (exp, add,
reciprocal) and 0.24 for onnxruntime's Sigmoid (MLAS's rational approximation). Largest
error 9e-8 against the exact sigmoid, MLAS's 1.7e-7; NaN, infinities and large |x| give
what 1 / (1 + exp(-x)) gives. Every user calls this one loop, so a fused node has the
unfused nodes' bits. float64, or numba off (``ONNXEP_CPU_JIT=0``): NumPy's exp in three
in-place passes, the CPU kernels' bits before this loop existed.

One call on the caller's thread, whatever the run's thread count: split over the
provider's pool (``parallel_rows``, chunks of 16384 values) it was slower at every size on
the shared 2-core machine it was measured on (0.28-0.30 ns a value against 0.20-0.21 on
400k-1.6M values; docs/cpu_kernels.md).
"""

from __future__ import annotations

import functools

import numpy as np

from .. import jit

_F32 = np.dtype(np.float32)
_FLOATS = (_F32, np.dtype(np.float64))


def compiled(dtype: np.dtype) -> bool:
    """Whether ``logistic`` runs the compiled loop on ``dtype`` (float32, numba on)."""
    return np.dtype(dtype) == _F32 and jit.ENABLED


def logistic(
    x: np.ndarray, alpha: float = 1.0, mul: bool = False, out: np.ndarray | None = None
) -> np.ndarray:
    """``(x if mul else 1) * sigmoid(alpha * x)`` for float32 or float64 ``x``.

    Into ``out`` (same shape and dtype; it may be ``x`` itself), else into a fresh array;
    returns it (a 0-d input gives a 0-d array).
    """
    if out is None:
        out = np.empty(x.shape, x.dtype)
    elif not out.flags.c_contiguous:
        np.copyto(out, logistic(x, alpha, mul))
        return out
    if x.dtype != _F32 or not jit.ENABLED:
        return _numpy(x, alpha, mul, out)
    if not x.flags.c_contiguous:
        x = np.ascontiguousarray(x)
    # (a kernel's call costs about 1 us besides the loop: reshapes only where needed)
    xf = x if x.ndim == 1 else x.reshape(-1)
    of = out if out.ndim == 1 else out.reshape(-1)
    a = alpha if type(alpha) is np.float32 else np.float32(alpha)
    _loop()(xf, of, a, mul, 0, xf.shape[0])
    return out


def sigmoid(x: np.ndarray) -> np.ndarray:
    """``logistic(x)`` in a fresh array, the same loop and bits, with less in front of it:
    the Sigmoid node calls this. On a 4-value input the call's glue (an alpha converted,
    six arguments typed by numba's dispatcher, two reshapes) was three quarters of the
    node's 4 us against onnxruntime's 1 (``bench/node_floor.py``)."""
    if x.dtype is _F32 and x.flags.c_contiguous and jit.ENABLED:
        out = np.empty(x.shape, _F32)
        _flat()(x.ravel(), out.ravel())  # views: both are C-contiguous
        return out
    return logistic(x)


def x_sigmoid(general, alpha: float):
    """A kernel's ``run`` for ``x * sigmoid(alpha * x)`` (QuickGelu, Swish): float32 and
    float64 here in one pass, other dtypes through ``general`` (the generic kernel)."""

    def run(x):
        if x.dtype not in _FLOATS:
            return general(x)
        return (logistic(x, alpha, mul=True),)

    return run


# jit.loop compiles once and caches; these keep its dict lookup off the per-call path
_loop = functools.cache(lambda: jit.loop("logistic_span"))
_flat = functools.cache(lambda: jit.loop("sigmoid_flat"))


def _numpy(x: np.ndarray, alpha: float, mul: bool, out: np.ndarray) -> np.ndarray:
    # x * s needs x after s is made: s goes to a temporary when it would overwrite x
    t = np.empty(x.shape, x.dtype) if mul and np.shares_memory(x, out) else out
    if alpha == 1.0:
        np.negative(x, out=t)
    else:
        # -(alpha * x) rounds as alpha * x does: the negation is exact
        np.multiply(x, x.dtype.type(-alpha), out=t)
    with np.errstate(over="ignore"):  # exp(-w) = inf for very negative w gives the right 0
        np.exp(t, out=t)
    t += 1
    np.reciprocal(t, out=t)
    if mul:
        np.multiply(x, t, out=out)
    return out
