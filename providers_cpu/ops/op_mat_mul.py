"""MatMul on NumPy: one 2-D BLAS call for an N-D activation times a 2-D weight; a
constant half-precision weight widened once, at session creation.

``[..., M, K] @ [K, N]`` is the projection of every transformer layer. NumPy runs a
stacked matmul as a loop over the leading dimensions, which measured slower than one
``[prod(...) * M, K] @ [K, N]`` on the same data even with one leading entry
(``[1, 32, 256] @ [256, 512]``: 157 against 87 us on one thread, 2157 against 179 us
on two threads of a loaded machine), so such products are reshaped to 2-D and back
(a view when the activation is contiguous). A few rows in all (a decoder's step with
a batch of two, an RNN cell) run few_rows.py's products instead (SGEMM is at its
slowest there, 2x the GEMVs): two to eight rows in one compiled loop on the weight's
[N, K] transpose (for a constant, one copy shared by every node that uses it:
shared_weights.py), else one GEMV a row.

NumPy has no BLAS for float16 or bfloat16, so the generic kernel widens both
operands to float32 on every call. For a constant B (a weight) that widening
is the same every time, and it dominates a decode step: an fp16 0.8B-parameter
decoder spent about 6x the product's own time converting its weights each
token. Widened once here, the product is the generic kernel's bit for bit (the same
float32 operands, the same BLAS call, so that path keeps NumPy's own matmul), at the
price of keeping a float32 copy of each such weight beside the model's own (as
MatMulNBits keeps its dequantized weights). Everything else runs the generic kernel.
"""

from __future__ import annotations

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.ops.op_mat_mul import mat_mul as generic

from ..threads import run_threads
from . import few_rows, gemv, shared_weights
from .weight_gemm import WeightGemm

_HALF = ("float16", "bfloat16")
_BLAS = (np.dtype(np.float32), np.dtype(np.float64))


def matmul_2d(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` for a 2-D ``b``, as one 2-D product when ``a`` has leading dimensions."""
    if a.ndim <= 2:
        return np.matmul(a, b)
    y = np.matmul(a.reshape(-1, a.shape[-1]), b)
    return y.reshape(*a.shape[:-1], b.shape[-1])


@kernel("MatMul", since=(1, 9, 13))
def mat_mul(node, xp):
    general = generic(node, xp)
    const = node.const_input(1)
    if const is not None and np.asarray(const).dtype.name in _HALF:
        half = np.asarray(const).dtype
        wide = np.asarray(const).astype(np.float32)

        def run_half(a, b):
            if a.dtype != half:
                return general(a, b)
            y = np.asarray(np.matmul(a.astype(np.float32), wide))
            return (y.astype(half, copy=False),)

        return run_half

    weight = packed = streamed = None
    if isinstance(const, np.ndarray) and const.ndim == 2 and const.dtype in _BLAS:
        weight = shared_weights.shared(const)
        if const.dtype == np.float32:
            packed = WeightGemm(weight, False)
            if gemv.fits(weight.array):
                streamed = weight.array

    def run(a, b):
        k = a.shape[-1] if a.ndim >= 2 else 0
        if k and a.size == k and b.ndim == 2 and b.shape[0] == k and a.dtype == b.dtype:
            if streamed is not None:
                # one row against a large constant float32 weight (``b``, so ``a`` is float32
                # too): the compiled GEMV on both cores
                return (gemv.row_times(a, streamed).reshape(*a.shape[:-1], b.shape[1]),)
            if a.dtype in _BLAS:
                # One row (a decode step's projection): every branch below ends in NumPy's
                # GEMV on the 2-D row (matmul's), which ndarray.dot calls bit for bit with
                # 0.3 us less dispatch; the checks and reshapes on the way cost 2 of the
                # node's 5-7 us.
                if a.ndim == 2:
                    return (a.dot(b),)
                return (a.reshape(1, k).dot(b).reshape(*a.shape[:-1], b.shape[1]),)
        if (
            b.ndim == 2
            and a.ndim >= 2
            and a.dtype == b.dtype
            and a.dtype in _BLAS
            and a.shape[-1] == b.shape[0]
        ):
            a2 = a.reshape(-1, k) if k else a.reshape(int(np.prod(a.shape[:-1])), 0)
            if few_rows.fits(a2, b, 0):
                bt = None
                if weight is not None and few_rows.compiled(a2):
                    bt = weight.transposed
                y = few_rows.rows_times(a2, b, bt)
                return (y.reshape(a.shape[:-1] + (b.shape[1],)),)
            # the product's size first: run_threads() asks the OS for the affinity mask,
            # 1 us of a decode step's 5 us MatMul
            if packed is not None and packed.worth(a2) and packed.fits(a2, run_threads()):
                return (packed(a2).reshape(*a.shape[:-1], b.shape[-1]),)
            if a.ndim > 2:
                return (np.matmul(a2, b).reshape(a.shape[:-1] + (b.shape[1],)),)
        return general(a, b)

    return run
