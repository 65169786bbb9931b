"""Softmax and LogSoftmax on NumPy float32/float64: the generic kernels' operations in
the same order (the same bits), with the reductions as ufunc calls and the rest in one
buffer. The generic form allocates three full-size temporaries and calls np.max and
np.sum through their wrappers: a decoder step's softmax over a few hundred logits took
12 us against onnxruntime's 3-4, an attention map's three times onnxruntime's."""

from __future__ import annotations

import math

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.ops.op_log_softmax import log_softmax_kernel as generic_log
from onnxep.providers.ops.op_softmax import softmax_kernel as generic
from onnxep.providers.ops.reduce import coerced_axes

from .ufuncs import BLAS_FLOATS


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


def _builder(make_generic, f):
    def build(node, xp):
        general = make_generic(node, xp)
        axes_for = coerced_axes(node, 1 if node.opset < 13 else -1)

        def run(x):
            if x.dtype not in BLAS_FLOATS or x.ndim == 0:
                return general(x)
            return (f(x, axes_for(x.ndim)),)

        return run

    return build


softmax = kernel("Softmax", since=(1, 11, 13))(_builder(generic, _softmax))
log_softmax = kernel("LogSoftmax", since=(1, 11, 13))(_builder(generic_log, _log_softmax))
