"""MatMul: few rows of A by a 2-D float16/32 B through the GEMV kernel (``_gemv_cuda``), other
float16/32/64 products through cuBLAS on the provider's stream (both capture-safe); others via
CuPy."""

from onnxep.providers.kernel import kernel
from onnxep.providers.ops import op_mat_mul as generic

from .. import blas
from ._gemv_cuda import Gemv


@kernel("MatMul", since=(1, 9, 13))
def mat_mul(node, xp):
    # Integer MatMul goes to CuPy's own integer kernel, which does not use cuBLAS.
    fallback = generic.mat_mul(node, xp)
    supported = blas.SUPPORTED_DTYPES
    gemv = Gemv(xp, node.input_dtype(0))

    def run(a, b):
        if gemv.takes(a, b):
            return (gemv(a, b),)
        if a.dtype == b.dtype and a.dtype.name in supported:
            return (blas.matmul(a, b),)
        return fallback(a, b)

    return run
