"""com.microsoft FusedMatMul: alpha * op(A) @ op(B) with optional transposes.

transA/transB swap the last two axes; transBatchA/transBatchB first move axis 0
behind the batch axes (to position -2), so a (K, B..., M)-shaped operand is
read as batches of (K, M) matrices. Rank-1 operands ignore both flags, as in
numpy.matmul.
"""

from __future__ import annotations

from typing import Any

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from . import contrib as C


def _operand(x: Any, trans: bool, trans_batch: bool, xp: Any) -> Any:
    if x.ndim < 2:
        return x
    if trans_batch and x.ndim > 2:
        x = xp.moveaxis(x, 0, -2)
    if trans:
        x = xp.swapaxes(x, -1, -2)
    return x


@kernel("FusedMatMul", domain="com.microsoft", dtypes=("float", "float16", "bfloat16", "double"))
def fused_matmul(node: NodeInfo, xp: Any):
    alpha = float(node.attr("alpha", 1.0))
    ta = bool(node.attr("transA", 0))
    tb = bool(node.attr("transB", 0))
    tba = bool(node.attr("transBatchA", 0))
    tbb = bool(node.attr("transBatchB", 0))

    def run(a, b):
        y = C.matmul(_operand(a, ta, tba, xp), _operand(b, tb, tbb, xp), xp)
        if alpha != 1.0:
            y = y * alpha
        return (C.down(y, a.dtype),)

    return run
