"""com.microsoft MatMulNBits: A @ dequantize(B).T (+ bias) with block-quantized 2/4/8-bit weights.

When the packed weight and its quantization parameters are constants, the
float matrix is dequantized once here in the builder and cached; otherwise it
is dequantized on every run.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from . import contrib as C


def _weight_dtype(a_dtype: Any, xp: Any) -> Any:
    # NumPy multiplies half types without BLAS, so CPU keeps float32 weights; a GPU library
    # keeps half weights (half the memory) and accumulates their products in float32 itself.
    if a_dtype is None or C.is_numpy(xp) or np.dtype(a_dtype).name != "float16":
        return np.float32 if a_dtype is None or a_dtype != np.float64 else np.float64
    return a_dtype


@kernel("MatMulNBits", domain="com.microsoft", dtypes=("float", "float16", "bfloat16"))
def matmul_nbits(node: NodeInfo, xp: Any):
    k, n, bits, block_size, int8_a = C.nbits_attrs(node)
    wdt = _weight_dtype(node.input_dtype(0), xp)
    qargs = dict(n=n, k=k, bits=bits, block_size=block_size, xp=xp)

    def dequant(b, scales, zp, g_idx, dtype):
        return C.dequantize_nbits(b, scales, zp, g_idx, dtype=dtype, **qargs).T

    consts = C.nbits_constants(node)
    cached = None
    if consts is not None and np.asarray(consts[0]).size != 0:
        b, s, zp, gi = (None if c is None else xp.asarray(c) for c in consts)
        # (K, N) view of the row-major (N, K) matrix: BLAS reads the transpose in place.
        cached = dequant(b, s, zp, gi, wdt)

    def run(a, b, scales, zero_points=None, g_idx=None, bias=None):
        out_shape = a.shape[:-1] + (n,)
        if b.size == 0:
            # An omitted projection: the output is the (broadcast) bias or zeros.
            y = xp.zeros(out_shape, dtype=a.dtype)
            return (y if bias is None else C.down(y + bias, a.dtype),)
        w = cached
        if w is None:
            w = dequant(b, scales, zero_points, g_idx, _weight_dtype(a.dtype, xp))
        y = C.matmul(C.int8_blocks(a, block_size, xp) if int8_a else a, w, xp)
        if bias is not None:
            y = y + C.up(bias, xp, y.dtype)
        return (C.down(y, a.dtype),)

    return run
