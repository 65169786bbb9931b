"""QuantizeLinear: per-tensor, per-axis and blocked, to int, sub-byte and float8/4 types."""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from .quant import expand_param, is_int_dtype, onnx_dtype, saturate_cast, to_float

_FLOATS = (np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.float64))


def _division_dtype(node: NodeInfo) -> Any:
    """The dtype x / y_scale is computed in: ``precision``, else y_scale's type."""
    prec = int(node.attr("precision", 0) or 0)
    if prec:
        return onnx_dtype(prec, "QuantizeLinear precision")
    sdt = node.input_dtype(1)
    if sdt is None or is_int_dtype(sdt):
        # An int32 scale divides exactly enough in float64.
        return np.dtype(np.float64) if sdt is not None else np.dtype(np.float32)
    sdt = np.dtype(sdt)
    if sdt in _FLOATS or sdt.name == "bfloat16":
        return sdt
    return np.dtype(np.float32)  # float8e8m0 scales are powers of two


@kernel("QuantizeLinear", since=(10, 13, 19, 21, 23, 24, 25, 28))
def quantize_linear(node: NodeInfo, xp: Any):
    axis = int(node.attr("axis", 1))
    block_size = int(node.attr("block_size", 0) or 0)
    saturate = bool(node.attr("saturate", 1))
    out_elem = int(node.attr("output_dtype", 0) or 0)
    if out_elem:
        out_dt = onnx_dtype(out_elem, "QuantizeLinear output_dtype")
    elif node.has_input(2) and node.input_dtype(2) is not None:
        out_dt = np.dtype(node.input_dtype(2))
    elif node.has_output(0) and node.outputs[0].dtype is not None:
        out_dt = np.dtype(node.outputs[0].dtype)
    else:
        out_dt = np.dtype(np.uint8)
    div_dt = _division_dtype(node)
    # Rounding and the zero-point add happen in a type wide enough for int16 targets.
    acc_dt = np.float64 if div_dt == np.dtype(np.float64) else np.float32

    def run(x, y_scale, y_zero_point=None):
        s = expand_param(y_scale, x.shape, axis, block_size, xp) if x.ndim else y_scale
        q = (to_float(x, div_dt) / to_float(s, div_dt)).astype(acc_dt)
        if is_int_dtype(out_dt):
            q = xp.round(q)
        if y_zero_point is not None:
            zp = y_zero_point
            if x.ndim:
                zp = expand_param(zp, x.shape, axis, block_size, xp)
            q = q + to_float(zp, acc_dt)
        return (saturate_cast(q, out_dt, xp, saturate),)

    return run
