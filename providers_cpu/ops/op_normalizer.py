"""Normalizer (ai.onnx.ml): each row divided by its MAX, L1 or L2 norm (axis 1), in float.

A row whose norm is 0 is returned unchanged, as onnxruntime does; MAX divides by the
largest value itself, not its magnitude.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from ._ml_common import enum_attr

_NORMS = {"MAX": 0, "L1": 1, "L2": 2}


@kernel("Normalizer", since=1, domain="ai.onnx.ml", dtypes=["float", "double", "int64", "int32"])
def normalizer(node: NodeInfo, xp: Any):
    norm = enum_attr(node, "norm", _NORMS, "MAX")

    def run(x):
        x = np.asarray(x)
        if x.ndim == 0:
            raise ValueError("Normalizer: the input is a scalar; it needs at least one dimension")
        axis = 0 if x.ndim == 1 else 1
        xf = x.astype(np.float32)
        if norm == 0:
            d = xf.max(axis=axis, keepdims=True) if x.shape[axis] else np.ones_like(xf)
        elif norm == 1:
            d = np.abs(xf).sum(axis=axis, keepdims=True)
        else:
            sq = (x.astype(np.float64) * x).astype(np.float32)
            d = np.sqrt(sq.sum(axis=axis, keepdims=True))
        safe = np.where(d == 0, 1, d)
        return (np.where(d == 0, xf, xf / safe).astype(np.float32),)

    return run
