"""MatMul and Gemm on torch's BLAS."""

from __future__ import annotations

from typing import Any

import torch

from onnxep.providers import NodeInfo, kernel

from .common import FLOATS

#: torch's CPU matmul has no kernels for the narrow integer types.
_MATMUL_TYPES = [*FLOATS, "int32", "int64"]


@kernel("MatMul", since=1, dtypes={0: _MATMUL_TYPES, 1: _MATMUL_TYPES})
def mat_mul(node: NodeInfo, xp: Any):
    return lambda a, b: (torch.matmul(a, b),)


@kernel("Gemm", since=1, dtypes={0: ["float", "double"], 1: ["float", "double"]})
def gemm(node: NodeInfo, xp: Any):
    alpha = float(node.attr("alpha", 1.0))
    beta = float(node.attr("beta", 1.0))
    trans_a = bool(node.attr("transA", 0))
    trans_b = bool(node.attr("transB", 0))

    def run(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None = None):
        y = torch.matmul(a.T if trans_a else a, b.T if trans_b else b)
        if alpha != 1.0:
            y = y * alpha
        if c is not None:
            y = y + (c * beta if beta != 1.0 else c)
        return (y,)

    return run
