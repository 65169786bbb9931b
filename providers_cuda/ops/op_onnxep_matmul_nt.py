"""onnxep::MatMulNT on CUDA: ``A @ Wt^T (+ bias)`` (then the SwiGLU) over the ``[N, K]`` weight.

Few rows of A, where :func:`gemv_nt_cuda.use_warps` says the product is bound by
latency, run one launch of the warp-per-output GEMV with the bias and the SwiGLU in its
epilogue. Other products run one cuBLAS GEMM with ``trans_b`` on ``Wt`` (no copy), the
bias broadcast into the output first and added with beta = 1 (rounded once, as
MatMulBias), then the one-launch SwiGLU kernel. Dtypes cuBLAS does not take run the CUDA
MatMul on ``Wt``'s transposed view, Add and SwiGLU kernels, as the unfused nodes did.
"""

from __future__ import annotations

from typing import Any

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo
from onnxep.providers.ops.fused import FLOATS
from onnxep.providers.ops.op_onnxep_matmul_nt import activation, check_operands

from .. import blas
from . import op_add, op_mat_mul, op_onnxep_swiglu
from .gemv_nt_cuda import GemvNT


@kernel("MatMulNT", domain="onnxep", dtypes=FLOATS)
def matmul_nt(node: NodeInfo, xp: Any):
    act = activation(node)
    swiglu = act == "swiglu"
    gemv = GemvNT(xp, node.input_dtype(0))
    matmul, add = op_mat_mul.mat_mul(node, xp), op_add.add(node, xp)
    glu = op_onnxep_swiglu.swiglu(node, xp) if swiglu else None
    supported = blas.SUPPORTED

    def gemm(a, wt, bias):
        if a.dtype != wt.dtype or a.dtype not in supported:
            y = matmul(a, wt.T)[0]
            return y if bias is None else add(y, bias)[0]
        if bias is not None and bias.dtype != a.dtype:
            return add(blas.gemm(a, wt, trans_b=True), bias)[0]
        if bias is None:
            return blas.gemm(a, wt, trans_b=True)
        out = xp.empty((*a.shape[:-1], wt.shape[0]), a.dtype)
        out[...] = bias
        return blas.gemm(a, wt, trans_b=True, beta=1.0, out=out)

    contiguous = gemv.contiguous
    routes: dict[tuple, bool] = {}  # operands' shapes and dtypes -> whether the GEMV takes them

    def run(a, wt, bias=None):
        meta = None if bias is None else (bias.shape, bias.dtype)
        key = (a.shape, a.dtype, wt.shape, wt.dtype, contiguous(wt), meta)
        warp = routes.get(key)
        if warp is None:  # checked once per shape: a decode step's operands keep theirs
            check_operands(node, a, wt, bias, act)
            warp = (bias is None or bias.dtype == a.dtype) and gemv.takes(a, wt, swiglu)
            if len(routes) < 64:
                routes[key] = warp
        if warp:
            return (gemv(a, wt, bias, swiglu),)
        y = gemm(a, wt, bias)
        return glu(y) if swiglu else (y,)

    return run
