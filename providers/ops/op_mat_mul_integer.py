"""MatMulInteger: int8/uint8 matrix product with zero points, accumulated in int32."""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo


@kernel("MatMulInteger", since=10)
def mat_mul_integer(node: NodeInfo, xp: Any):
    def run(a, b, a_zero_point=None, b_zero_point=None):
        ai = a.astype(np.int32)
        bi = b.astype(np.int32)
        if a_zero_point is not None:
            azp = a_zero_point.astype(np.int32)
            # A 1-D zero point of length M is per row of A.
            if azp.ndim == 1 and azp.shape[0] != 1 and a.ndim >= 1:
                azp = azp.reshape(-1, 1)
            ai = ai - azp
        if b_zero_point is not None:
            # A 1-D zero point of length N is per column: it broadcasts on the last axis.
            bi = bi - b_zero_point.astype(np.int32)
        return (xp.matmul(ai, bi),)

    return run
