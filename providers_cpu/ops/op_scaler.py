"""Scaler (ai.onnx.ml): (x - offset) * scale in float, offset and scale per column or one."""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from ._ml_common import floats


@kernel("Scaler", since=1, domain="ai.onnx.ml", dtypes=["float", "double", "int64", "int32"])
def scaler(node: NodeInfo, xp: Any):
    offset = floats(node, "offset", np.float32)
    scale = floats(node, "scale", np.float32)
    offset = np.zeros(1, np.float32) if offset is None or not offset.size else offset
    scale = np.ones(1, np.float32) if scale is None or not scale.size else scale

    def run(x):
        x = np.asarray(x)
        if x.ndim == 0:
            raise ValueError("Scaler: the input is a scalar; it needs at least one dimension")
        # onnxruntime indexes offset and scale by the flat position modulo dim 1 (dim 0 for 1-D).
        stride = x.shape[0] if x.ndim == 1 else x.shape[1]
        for name, v in (("offset", offset), ("scale", scale)):
            if v.size not in (1, stride):
                raise ValueError(
                    f"Scaler: {name} has {v.size} values; give one, or one per column ({stride})"
                )
        flat = x.astype(np.float32).reshape(-1)
        col = np.arange(flat.size) % max(stride, 1)
        off = offset if offset.size == 1 else offset[col]
        sc = scale if scale.size == 1 else scale[col]
        return (((flat - off) * sc).reshape(x.shape).astype(np.float32),)

    if not (offset.size and scale.size):
        raise NotSupported("Scaler: offset and scale must not be empty")
    return run
