"""Gemm: alpha * op(A) @ op(B) + beta * C in one cuBLAS call (C broadcast into the output first)."""

from onnxep.providers.kernel import kernel
from onnxep.providers.ops import op_gemm as generic

from .. import blas


@kernel("Gemm", since=(1, 6, 7, 9, 11, 13))
def gemm(node, xp):
    alpha = float(node.attr("alpha", 1.0))
    beta = float(node.attr("beta", 1.0))
    trans_a = bool(node.attr("transA", 0))
    trans_b = bool(node.attr("transB", 0))
    fallback = generic.gemm(node, xp)
    supported = blas.SUPPORTED

    def run(a, b, c=None):
        if a.dtype != b.dtype or a.dtype not in supported or a.ndim != 2 or b.ndim != 2:
            return fallback(a, b, c)
        if c is None or beta == 0.0:
            return (blas.gemm(a, b, trans_a=trans_a, trans_b=trans_b, alpha=alpha),)
        m = a.shape[1] if trans_a else a.shape[0]
        n = b.shape[0] if trans_b else b.shape[1]
        out = xp.empty((m, n), dtype=a.dtype)
        out[...] = c  # C broadcasts to (M, N); cuBLAS then adds beta * out in the compute type
        blas.gemm(a, b, trans_a=trans_a, trans_b=trans_b, alpha=alpha, beta=beta, out=out)
        return (out,)

    return run
