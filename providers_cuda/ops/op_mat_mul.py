"""MatMul: float16/32/64 through cuBLAS on the provider's stream (capture-safe); others via CuPy.

The GEMV kernel (``gemv_cuda``) is not used for a plain MatMul: on the H200 it took 4.2-7.5 us
at Qwen2.5 decode shapes against cuBLAS's 3.4-6.4 us (bench/gpu_gemv_bench.py, 2026-12-01); it
serves onnxep::MatMulBias, where it saves the bias launch (``op_matmul_bias``)."""

from onnxep.providers.kernel import kernel
from onnxep.providers.ops import op_mat_mul as generic

from .. import blas


@kernel("MatMul", since=(1, 9, 13))
def mat_mul(node, xp):
    # Integer MatMul goes to CuPy's own integer kernel, which does not use cuBLAS.
    fallback = generic.mat_mul(node, xp)
    supported = blas.SUPPORTED

    def run(a, b):
        if a.dtype == b.dtype and a.dtype in supported:
            return (blas.matmul(a, b),)
        return fallback(a, b)

    return run
