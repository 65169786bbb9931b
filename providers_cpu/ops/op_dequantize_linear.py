"""DequantizeLinear of 8-bit values by constant per-tensor parameters: a 256-entry table.

The generic kernel's float32 operations (``(float32(x) - float32(zp)) * float32(scale)``)
are five NumPy calls and three passes over the tensor, 6 us on tashkeel's [2, 9, 128]
embedding against onnxruntime's 2. With the scale and zero point constant (what
quantizers write) and one of each, an 8-bit value has 256 possible results: the table
holds them, computed once per session by the same operations on every byte value, so a
run is one ``take`` and its results are the generic kernel's bit for bit. Anything else
(other dtypes, per-axis or blocked parameters, parameters fed at run time, another
output type) keeps the generic kernel.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo
from onnxep.providers.ops.op_dequantize_linear import dequantize_linear as generic

_BYTES = (np.dtype(np.uint8), np.dtype(np.int8))
F32 = np.dtype(np.float32)


def _table(node: NodeInfo) -> np.ndarray | None:
    """The float32 result of each byte value (indexed by its unsigned byte), or None."""
    x_dt = node.input_dtype(0)
    scale = node.const_input(1)
    zp = node.const_input(2) if node.has_input(2) else None
    if x_dt is None or np.dtype(x_dt) not in _BYTES or scale is None:
        return None
    if node.has_input(2) and zp is None:
        return None  # a zero point fed at run time
    if int(node.attr("block_size", 0) or 0) or int(node.attr("output_dtype", 0) or 0) not in (0, 1):
        return None
    scale = np.asarray(scale)
    if scale.dtype != F32 or scale.size != 1 or scale.ndim > 1:
        return None
    if zp is not None:
        zp = np.asarray(zp)
        if zp.dtype != x_dt or zp.size != 1 or zp.ndim > 1:
            return None
    values = np.arange(256, dtype=np.uint8).view(x_dt)
    v = values.astype(F32)
    if zp is not None:
        v = v - zp.reshape(()).astype(F32)
    return np.ascontiguousarray((v * scale.reshape(())).astype(F32))


@kernel("DequantizeLinear", since=(10, 13, 19, 21, 23, 24, 25, 28))
def dequantize_linear(node: NodeInfo, xp: Any):
    general = generic(node, xp)
    table = _table(node)
    if table is None:
        return general
    x_dt = np.dtype(node.input_dtype(0))

    def run(x, x_scale, x_zero_point=None):
        if x.dtype != x_dt or x.ndim == 0:  # a 0-d x by [1] parameters is [1] there
            return general(x, x_scale, x_zero_point)
        return (np.asarray(table.take(x.view(np.uint8))),)

    return run
