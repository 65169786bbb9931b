"""onnxep::MatMulBias on CUDA: one launch that adds the bias in its float32 accumulator.

Few rows of A by a 2-D float16/32 B run the GEMV kernel with the bias in its
epilogue (``gemv_cuda``); other products run one cuBLAS GEMM. There the bias is
broadcast into the output first and the GEMM runs with beta = 1 (as the CUDA
Gemm kernel does with C), so the product is rounded once with the bias in it. Operands
the GEMM does not take (mixed or other dtypes, a batched right operand, a bias that is
not a vector over the last axis) run the CUDA MatMul and Add kernels one after the other,
which is what the two nodes would have run.
"""

from __future__ import annotations

from typing import Any

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo
from onnxep.providers.ops.fused import FLOATS

from .. import blas
from . import op_add, op_mat_mul
from .gemv_cuda import Gemv


@kernel("MatMulBias", domain="onnxep", dtypes=FLOATS)
def matmul_bias(node: NodeInfo, xp: Any):
    matmul, add = op_mat_mul.mat_mul(node, xp), op_add.add(node, xp)
    supported = blas.SUPPORTED
    gemv = Gemv(xp, node.input_dtype(0))

    def run(a, b, bias):
        if (
            bias.dtype == a.dtype
            and bias.ndim == 1
            and b.ndim == 2
            and bias.shape[0] == b.shape[1]
            and gemv.takes(a, b)
        ):
            return (gemv(a, b, bias),)
        if not (
            a.dtype == b.dtype == bias.dtype
            and a.dtype in supported
            and a.ndim >= 2
            and b.ndim == 2
            and bias.ndim == 1
            and bias.shape[0] == b.shape[1]
        ):
            return add(matmul(a, b)[0], bias)
        out = xp.empty((*a.shape[:-1], b.shape[1]), a.dtype)
        out[...] = bias
        blas.gemm(a, b, beta=1.0, out=out)
        return (out,)

    return run
