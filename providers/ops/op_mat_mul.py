"""MatMul: NumPy matmul semantics (N-D batch broadcasting, 1-D operands promoted)."""

from onnxep.providers.kernel import kernel

from .reduce import widen


@kernel("MatMul", since=(1, 9, 13))
def mat_mul(node, xp):
    def run(a, b):
        y = xp.matmul(widen(a, xp), widen(b, xp))
        return (xp.asarray(y).astype(a.dtype, copy=False),)

    return run
