"""com.microsoft TransposeMatMul: FusedMatMul's former name (transA, transB, alpha), kept by
onnxruntime for models written before the rename."""

from __future__ import annotations

from typing import Any

from onnxep.providers.kernel import kernel
from onnxep.providers.ops.op_fused_matmul import fused_matmul


@kernel("TransposeMatMul", since=1, domain="com.microsoft", dtypes=("float", "float16", "double"))
def transpose_matmul(node: Any, xp: Any):
    return fused_matmul(node, xp)
