"""onnxep::SiLU on CUDA: one launch of ``silu_k`` (sigmoid rounded, then the product).

Other dtypes and strided inputs run the CUDA Sigmoid and Mul kernels one after the other,
which is what the two nodes would have run.
"""

from __future__ import annotations

from typing import Any

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo
from onnxep.providers.ops.fused import FLOATS

from . import op_mul, op_sigmoid
from .fused_cuda import unary_runner


@kernel("SiLU", domain="onnxep", dtypes=FLOATS)
def silu(node: NodeInfo, xp: Any):
    sigmoid, mul = op_sigmoid.sigmoid(node, xp), op_mul.mul(node, xp)
    return unary_runner("silu_k", node, xp, lambda x: mul(x, sigmoid(x)[0]))
