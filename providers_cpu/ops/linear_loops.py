"""LinearClassifier's and Normalizer's runs on a few rows, compiled (numba).

Imported only once ``jit.ENABLED`` has said numba is there and wanted. On a few rows
(onnxruntime's logreg_iris: 3 x 2 features, 3 classes) the NumPy path was about ten
calls of 0.5-3 us each on 3 x 3 arrays (the cast, the product, the intercepts, argmax,
and LOGISTIC's five ufuncs and a ``where``), three times onnxruntime's whole node; one
call here does the product, intercepts, argmax and post transform.

**Values**: the scores are float64 sums over the features in order (NumPy's product
goes through BLAS's dgemm, whose order may differ in the last float64 bit: the float32
outputs do not show it but at a rounding tie); argmax is ``np.argmax``'s (the first
largest, the first NaN); the post transforms are ``tree_loops._post_row``, the
``ml_common`` formulas in float64. Normalizer's norms are taken in float32 over each row
in order (NumPy's reductions of a few elements add in order too), MAX skipping NaN as
onnxruntime's ``std::max`` from float's lowest does, and a row whose norm is 0 is left as
it is.
"""

from __future__ import annotations

import math

import numpy as np

from .. import jit
from .tree_loops import _post_row

if not jit.ENABLED:  # reading it imports numba, or says why not
    raise ImportError("providers_cpu.ops.linear_loops needs numba (see providers_cpu/jit.py)")
nb = jit.nb

#: Multiply-adds (rows x features x classes) up to which the loop beats the cast, BLAS's
#: product and the ufuncs; past it the NumPy path's dgemm is the faster one.
MAX_WORK = 1 << 16

_LOWEST = np.float32(np.finfo(np.float32).min)


@nb.njit(inline="always", nogil=True, error_model="numpy")
def _finish_row(s, r, b, post, out, top):
    """Row ``r`` of the raw scores ``s``: intercepts added, its top index, the transform."""
    c = s.shape[1]
    best = 0
    m = s[r, 0] + b[0]
    s[r, 0] = m
    for k in range(1, c):
        v = s[r, k] + b[k]
        s[r, k] = v
        if m == m and (v > m or v != v):
            best, m = k, v
    top[r] = best
    _post_row(s, r, post, out)


@nb.njit(cache=True, nogil=True, boundscheck=False, error_model="numpy")
def classify(x, w, b, post, out, top):
    """Scores of ``x`` [N, F] (float32) by ``w`` [F, C] and ``b`` [C] (float64), the index of
    each row's top score into ``top`` and the post-transformed scores into ``out`` (float32)."""
    n, f = x.shape
    c = w.shape[1]
    s = np.empty((n, c))
    for r in range(n):
        for k in range(c):
            s[r, k] = 0.0
        for j in range(f):
            v = np.float64(x[r, j])
            for k in range(c):
                s[r, k] += v * w[j, k]
        _finish_row(s, r, b, post, out, top)


@nb.njit(cache=True, nogil=True, boundscheck=False, error_model="numpy")
def finish(s, b, post, out, top):
    """``classify`` after the product, for scores ``s`` [N, C] (float64, changed in place)
    that BLAS computed: on many rows the NumPy path's per-row reductions over a few classes
    (argmax, the softmax's max and sum) cost more than the product."""
    for r in range(s.shape[0]):
        _finish_row(s, r, b, post, out, top)


@nb.njit(cache=True, nogil=True, boundscheck=False, error_model="numpy")
def normalize(x, norm, out):
    """Each row of ``x`` [N, C] (float32) over its MAX (0), L1 (1) or L2 (2) norm, into ``out``."""
    n, c = x.shape
    for r in range(n):
        if norm == 0:
            d = _LOWEST
            for k in range(c):
                v = x[r, k]
                if v > d:  # NaN is never larger: skipped, as np.fmax skips it
                    d = v
        elif norm == 1:
            d = np.float32(0.0)
            for k in range(c):
                d += abs(x[r, k])
        else:
            d = np.float32(0.0)
            for k in range(c):
                v = np.float64(x[r, k])
                d += np.float32(v * v)
            d = np.float32(math.sqrt(d))
        if d == 0:
            for k in range(c):
                out[r, k] = x[r, k]
        else:
            for k in range(c):
                out[r, k] = x[r, k] / d
