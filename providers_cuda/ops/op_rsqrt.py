"""onnxep::Rsqrt on CUDA: one launch of ``rsqrt_k`` (square root rounded, then reciprocal).

Other dtypes and strided inputs run the CUDA Sqrt and Reciprocal kernels one after the
other, which is what the two nodes would have run.
"""

from __future__ import annotations

from typing import Any

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo
from onnxep.providers.ops.fused import FLOATS

from . import op_reciprocal, op_sqrt
from .fused_cuda import unary_runner


@kernel("Rsqrt", domain="onnxep", dtypes=FLOATS)
def rsqrt(node: NodeInfo, xp: Any):
    root, inverse = op_sqrt.sqrt(node, xp), op_reciprocal.reciprocal(node, xp)
    return unary_runner("rsqrt_k", node, xp, lambda x: inverse(root(x)[0]))
