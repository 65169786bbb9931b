"""com.microsoft NhwcMaxPool: MaxPool of 8-bit (N, *spatial, C) tensors, onnxruntime's layout op.

Max pooling commutes with the (monotonic) quantization, so the values are pooled as they are.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.ops.op_max_pool import max_pool


@kernel("NhwcMaxPool", since=1, domain="com.microsoft", dtypes=("uint8", "int8"))
def nhwc_max_pool(node: Any, xp: Any):
    pool = max_pool(node, xp)

    def run(x):
        y = pool(np.moveaxis(x, -1, 1))[0]
        return (np.ascontiguousarray(np.moveaxis(y, 1, -1)),)

    return run
