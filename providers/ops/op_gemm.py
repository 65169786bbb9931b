"""Gemm: alpha * op(A) @ op(B) + beta * C, C optional (from opset 11) and broadcast."""

from onnxep.providers.kernel import kernel

from .reduce import widen


@kernel("Gemm", since=(1, 6, 7, 9, 11, 13))
def gemm(node, xp):
    alpha = float(node.attr("alpha", 1.0))
    beta = float(node.attr("beta", 1.0))
    trans_a = bool(node.attr("transA", 0))
    trans_b = bool(node.attr("transB", 0))

    def run(a, b, c=None):
        am, bm = widen(a, xp), widen(b, xp)
        if trans_a:
            am = am.T
        if trans_b:
            bm = bm.T
        y = xp.matmul(am, bm)
        # Skip unit factors so integer Gemm stays exact.
        if alpha != 1.0:
            y = alpha * y
        if c is not None and beta != 0.0:
            cc = widen(c, xp)
            y = y + (cc if beta == 1.0 else beta * cc)
        return (xp.asarray(y).astype(a.dtype, copy=False),)

    return run
