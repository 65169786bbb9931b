"""onnxep::MatMulBias(a, b, bias) = MatMul(a, b) + bias, each rounded to the storage type."""

from __future__ import annotations

from typing import Any

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from . import op_add, op_mat_mul
from .fused import FLOATS


@kernel("MatMulBias", domain="onnxep", dtypes=FLOATS)
def matmul_bias(node: NodeInfo, xp: Any):
    matmul = op_mat_mul.mat_mul(node, xp)
    add = op_add.add(node, xp)

    def run(a, b, bias):
        return add(matmul(a, b)[0], bias)

    return run
