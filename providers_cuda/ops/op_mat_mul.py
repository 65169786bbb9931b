"""MatMul: float16/32/64 through cuBLAS on the provider's stream (capture-safe); others via CuPy."""

from onnxep.providers.kernel import kernel
from onnxep.providers.ops import op_mat_mul as generic

from .. import blas


@kernel("MatMul", since=(1, 9, 13))
def mat_mul(node, xp):
    # Integer MatMul goes to CuPy's own integer kernel, which does not use cuBLAS.
    fallback = generic.mat_mul(node, xp)
    supported = blas.SUPPORTED_DTYPES

    def run(a, b):
        if a.dtype == b.dtype and a.dtype.name in supported:
            return (blas.matmul(a, b),)
        return fallback(a, b)

    return run
