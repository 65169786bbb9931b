"""MatMul on NumPy with a constant half-precision weight widened once, at session creation.

NumPy has no BLAS for float16 or bfloat16, so the generic kernel widens both
operands to float32 on every call. For a constant B (a weight) that widening
is the same every time, and it dominates a decode step: an fp16 0.8B-parameter
decoder spent about 6x the product's own time converting its weights each
token. Widened once here, the product is the generic kernel's bit for bit
(the same float32 operands, the same BLAS call), at the price of keeping a
float32 copy of each such weight beside the model's own (as MatMulNBits keeps
its dequantized weights). Everything else runs the generic kernel.
"""

from __future__ import annotations

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.ops.op_mat_mul import mat_mul as generic

_HALF = ("float16", "bfloat16")


@kernel("MatMul", since=(1, 9, 13))
def mat_mul(node, xp):
    general = generic(node, xp)
    const = node.const_input(1)
    if const is None or np.asarray(const).dtype.name not in _HALF:
        return general
    half = np.asarray(const).dtype
    wide = np.asarray(const).astype(np.float32)

    def run(a, b):
        if a.dtype != half:
            return general(a, b)
        y = np.asarray(np.matmul(a.astype(np.float32), wide))
        return (y.astype(half, copy=False),)

    return run
