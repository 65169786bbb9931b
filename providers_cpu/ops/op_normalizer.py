"""Normalizer (ai.onnx.ml): each row divided by its MAX, L1 or L2 norm (axis 1), in float.

A row whose norm is 0 is returned unchanged, as onnxruntime does; MAX divides by the
largest value itself, not its magnitude, and leaves NaN entries out of it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from .. import jit
from .ml_common import enum_attr

_NORMS = {"MAX": 0, "L1": 1, "L2": 2}
_LOWEST = np.finfo(np.float32).min


@kernel("Normalizer", since=1, domain="ai.onnx.ml", dtypes=["float", "double", "int64", "int32"])
def normalizer(node: NodeInfo, xp: Any):
    norm = enum_attr(node, "norm", _NORMS, "MAX")
    compiled = None
    if jit.ENABLED:
        from . import linear_loops as compiled

    def run(x):
        x = np.asarray(x)
        if x.ndim == 0:
            raise ValueError("Normalizer: the input is a scalar; it needs at least one dimension")
        # NumPy adds rows of fewer than 8 in order, as the loop does: the same sums
        if compiled is not None and x.ndim == 2 and x.dtype == np.float32:
            if norm == 0 or x.shape[1] < 8:
                out = np.empty(x.shape, np.float32)
                compiled.normalize(x, norm, out)
                return (out,)
        axis = 0 if x.ndim == 1 else 1
        xf = x if x.dtype == np.float32 else x.astype(np.float32)
        if norm == 0:
            # onnxruntime's running std::max from float's lowest skips NaN entries
            d = np.fmax.reduce(xf, axis=axis, keepdims=True, initial=_LOWEST)
        elif norm == 1:
            d = np.add.reduce(np.abs(xf), axis=axis, keepdims=True)
        else:
            sq = (x.astype(np.float64) * x).astype(np.float32)
            d = np.sqrt(sq.sum(axis=axis, keepdims=True))
        if d.all():  # no zero norm (NaN counts as nonzero, and divides as before)
            return (xf / d,)
        safe = np.where(d == 0, 1, d)
        return (np.where(d == 0, xf, xf / safe).astype(np.float32, copy=False),)

    return run
