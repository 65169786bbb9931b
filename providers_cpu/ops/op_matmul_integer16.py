"""com.microsoft MatMulInteger16: int16/uint16 matrix product accumulated in int32."""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.providers.kernel import kernel


@kernel(
    "MatMulInteger16",
    since=1,
    domain="com.microsoft",
    dtypes={0: ("int16", "uint16"), 1: ("int16", "uint16")},
)
def matmul_integer16(node: Any, xp: Any):
    out = node.outputs[0].dtype if node.has_output(0) else None
    out = np.dtype(np.int32) if out is None else np.dtype(out)

    # A 32-bit accumulator wraps on overflow; an int64 product cut to 32 bits does the same.
    def run(a, b):
        return (np.matmul(a.astype(np.int64), b.astype(np.int64)).astype(out),)

    return run
