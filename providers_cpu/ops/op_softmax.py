"""Softmax and LogSoftmax on NumPy float32/float64: the generic kernels' operations in
the same order (the same bits), with the reductions as ufunc calls and the rest in one
buffer. The generic form allocates three full-size temporaries and calls np.max and
np.sum through their wrappers: a decoder step's softmax over a few hundred logits took
12 us against onnxruntime's 3-4, an attention map's three times onnxruntime's.

float32 inputs over trailing axes, with numba, take one compiled call first
(``softmax_loops.softmax_flat``: the compiled exp, tolerance-level against these bits);
rows with NaN or an infinite maximum, and every other input, take the paths below."""

from __future__ import annotations

import math

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.ops.op_log_softmax import log_softmax_kernel as generic_log
from onnxep.providers.ops.op_softmax import softmax_kernel as generic
from onnxep.providers.ops.reduce import coerced_axes

from .. import jit
from .ufuncs import BLAS_FLOATS

_F32 = np.dtype(np.float32)
#: Whether float32 inputs up to ``softmax_loops.MAX_SIZE`` take ``softmax_loops.softmax_flat``'s
#: one call (an A/B switch, read per call: bench/cpu_softmax_ab.py); larger Softmax inputs
#: take it either way
ONE_CALL = True


def _shifted(x: np.ndarray, axis) -> np.ndarray:
    """x - max over ``axis``, in a new buffer; an all -inf slice is shifted by 0, as the
    generic kernel does (inf - inf would be NaN)."""
    m = np.maximum.reduce(x, axis=axis, keepdims=True)
    # A finite sum says every max is finite in one reduction (isfinite then all() was two
    # calls and a Python wrapper); a sum that overflows only takes the exact check below.
    if not math.isfinite(np.add.reduce(m, axis=None)):
        finite = np.isfinite(m)
        m = np.where(finite, m, m.dtype.type(0))
    return np.subtract(x, m)


def _softmax(x: np.ndarray, axis) -> np.ndarray:
    e = _shifted(x, axis)
    np.exp(e, out=e)
    e /= np.add.reduce(e, axis=axis, keepdims=True)
    return e


def _log_softmax(x: np.ndarray, axis) -> np.ndarray:
    s = _shifted(x, axis)
    s -= np.log(np.add.reduce(np.exp(s), axis=axis, keepdims=True))
    return s


def _trailing(axes, ndim: int) -> bool:
    """Whether ``axes`` (an int or a tuple) are the last dims of a rank-``ndim`` input."""
    if isinstance(axes, tuple):
        return bool(axes) and axes == tuple(range(ndim - len(axes), ndim))
    return axes == ndim - 1


def _rows_softmax(loops, x2: np.ndarray, out: np.ndarray) -> None:
    loops.shift(x2, out)
    np.exp(out, out=out)
    loops.divide_by_sums(out)


def _rows_log_softmax(loops, x2: np.ndarray, out: np.ndarray) -> None:
    loops.shift(x2, out)
    sums = np.empty((x2.shape[0], 1), _F32)
    loops.sums(np.exp(out), sums)
    np.log(sums, out=sums)
    out -= sums


def _builder(make_generic, f, rows):
    def build(node, xp):
        general = make_generic(node, xp)
        axes_for = coerced_axes(node, 1 if node.opset < 13 else -1)
        loops = None
        log = f is _log_softmax
        if jit.ENABLED:
            from . import softmax_loops as loops

        # input shape -> the trailing dims' size where the one-call Softmax applies, else 0
        # (the axes are checked once per shape, not per call)
        flat_cols: dict[tuple, int] = {}

        def cols_of(shape: tuple) -> int:
            if len(flat_cols) > 64:  # a model feeding ever new shapes: stay bounded
                flat_cols.clear()
            cols = 0
            size = math.prod(shape)
            if shape and size > 0:
                axes = axes_for(len(shape))
                if _trailing(axes, len(shape)):
                    k = len(axes) if isinstance(axes, tuple) else 1
                    cols = math.prod(shape[len(shape) - k :])
            flat_cols[shape] = cols
            return cols

        def run(x):
            # (``is`` first: NumPy's own descriptor; an equal one, such as a float32 read with
            # an explicit byte order, must take the same path for the same bits)
            if loops is not None and (x.dtype is _F32 or x.dtype == _F32):
                cols = flat_cols.get(x.shape)
                if cols is None:
                    cols = cols_of(x.shape)
                # past MAX_SIZE the NumPy calls' fixed cost is small, and their exp is the
                # time: Softmax takes the one pass there whatever ONE_CALL says
                if cols and (ONE_CALL or (not log and x.size > loops.MAX_SIZE)):
                    # one compiled call, exp by ``softmax_loops.exp_nonpositive``
                    # (tolerance-level: 2e-7 relative against NumPy's exp); rows with NaN or
                    # an infinite maximum go on to the steps below, whose rules they need.
                    # A strided input is copied first: the same values give the same bits
                    # whatever the layout (a Gemm's output read as a view or a copy).
                    xc = x if x.flags.c_contiguous else np.ascontiguousarray(x)
                    out = np.empty(x.shape, _F32)
                    if loops.softmax_flat(xc.ravel(), out.ravel(), cols, log):
                        return (out,)
            if x.dtype not in BLAS_FLOATS or x.ndim == 0:
                return general(x)
            axes = axes_for(x.ndim)
            if (
                loops is not None
                and 0 < x.size <= loops.MAX_SIZE
                and x.dtype == _F32
                and _trailing(axes, x.ndim)
            ):
                # the same steps, the reductions compiled, on rows of the trailing dims
                k = len(axes) if isinstance(axes, tuple) else 1
                x2 = np.ascontiguousarray(x).reshape(-1, math.prod(x.shape[x.ndim - k :]))
                out = np.empty(x.shape, _F32)
                rows(loops, x2, out.reshape(x2.shape))
                return (out,)
            return (f(x, axes),)

        return run

    return build


softmax = kernel("Softmax", since=(1, 11, 13))(_builder(generic, _softmax, _rows_softmax))
log_softmax = kernel("LogSoftmax", since=(1, 11, 13))(
    _builder(generic_log, _log_softmax, _rows_log_softmax)
)
