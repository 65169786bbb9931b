"""onnxep::SiLU(x) = x * Sigmoid(x), the sigmoid rounded to x's type first."""

from __future__ import annotations

from typing import Any

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from . import op_mul, op_sigmoid
from .fused import FLOATS


@kernel("SiLU", domain="onnxep", dtypes=FLOATS)
def silu(node: NodeInfo, xp: Any):
    sigmoid = op_sigmoid.sigmoid(node, xp)
    mul = op_mul.mul(node, xp)

    def run(x):
        return mul(x, sigmoid(x)[0])

    return run
