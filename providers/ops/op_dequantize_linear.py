"""DequantizeLinear: per-tensor, per-axis and blocked, from int, sub-byte and float8/4 types."""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from .quant import expand_param, onnx_dtype, to_float


@kernel("DequantizeLinear", since=(10, 13, 19, 21, 23, 24, 25, 28))
def dequantize_linear(node: NodeInfo, xp: Any):
    axis = int(node.attr("axis", 1))
    block_size = int(node.attr("block_size", 0) or 0)
    out_elem = int(node.attr("output_dtype", 0) or 0)
    sdt = node.input_dtype(1)
    if out_elem:
        out_dt = onnx_dtype(out_elem, "DequantizeLinear output_dtype")
    elif sdt is not None and np.dtype(sdt).name in ("float32", "float16", "bfloat16"):
        out_dt = np.dtype(sdt)
    elif node.has_output(0) and node.outputs[0].dtype is not None:
        out_dt = np.dtype(node.outputs[0].dtype)
    else:
        out_dt = np.dtype(np.float32)
    # int32 inputs exceed float32's exact range; widen them further.
    xdt = node.input_dtype(0)
    acc_dt = np.float64 if xdt is not None and np.dtype(xdt) == np.int32 else np.float32

    def run(x, x_scale, x_zero_point=None):
        v = to_float(x, acc_dt)
        if x_zero_point is not None:
            zp = x_zero_point
            if x.ndim:
                zp = expand_param(zp, x.shape, axis, block_size, xp)
            v = v - to_float(zp, acc_dt)
        s = x_scale
        if x.ndim:
            s = expand_param(s, x.shape, axis, block_size, xp)
        return ((v * to_float(s, acc_dt)).astype(out_dt),)

    return run
