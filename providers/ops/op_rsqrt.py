"""onnxep::Rsqrt(x) = Reciprocal(Sqrt(x)), the square root rounded to x's type first."""

from __future__ import annotations

from typing import Any

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from . import op_reciprocal, op_sqrt
from .fused import FLOATS


@kernel("Rsqrt", domain="onnxep", dtypes=FLOATS)
def rsqrt(node: NodeInfo, xp: Any):
    root = op_sqrt.sqrt(node, xp)
    inverse = op_reciprocal.reciprocal(node, xp)

    def run(x):
        return inverse(root(x)[0])

    return run
