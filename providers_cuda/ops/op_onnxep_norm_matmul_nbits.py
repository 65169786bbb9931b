"""onnxep::NormMatMulNBits on CUDA: the RMS norm in the tensor-core GEMV's prologue.

Rows and operands the prologue and the tensor-core GEMV take (``norm_fold``,
``nbits_mma_cuda``) run one launch: every block normalises the rows as ``norm_rows``
does, block 0 writes the residual sum, and the GEMV (with its SwiGLU epilogue when the
node has one) reads the normalised rows from shared memory. Anything else runs the norm's
CUDA kernel, then onnxep::MatMulNBits's, as the unfused nodes did.
"""

from __future__ import annotations

from typing import Any

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo
from onnxep.providers.ops import norm_prologue as P
from onnxep.providers.ops.op_onnxep_matmul_nt import activation

from . import nbits_mma_cuda as MMA
from . import op_onnxep_matmul_nbits
from . import reduce_cuda as K
from .norm_fold import prologue_skip_rows, rows_of
from .op_onnxep_norm_matmul_nt import norm_builder


@kernel("NormMatMulNBits", domain="onnxep", dtypes=("float", "float16"), capture_safe=True)
def norm_matmul_nbits(node: NodeInfo, xp: Any):
    sub = P.gemv_node(node, "MatMulNBits", "onnxep")
    gemv = op_onnxep_matmul_nbits.matmul_nbits(sub, xp)
    split = P.split_runner(node, norm_builder(node, xp), gemv)
    swiglu = activation(node) == "swiglu"
    base = gemv.base if swiglu else gemv
    if getattr(base, "mma", None) is None:
        return split
    w = base.w
    fused = MMA.NbitsMma(
        xp, base.a_dtype, w.scales.host.dtype, w.zp_kind, w.block,
        q8=base.mma.q8, swiglu=swiglu, norm=True,
    )  # fmt: skip
    eps = P.epsilon(node)
    want_sum = node.has_output(1)
    width = max(node.num_outputs, 1)
    contiguous = K.contiguity_test(xp)
    n_out = base.n // 2 if swiglu else base.n

    def run(x, skip, gamma, nbias, b, scales, zero_points=None, g_idx=None, bias=None):
        m = rows_of(x) if x.ndim else 0
        rows = prologue_skip_rows(x, skip, gamma, nbias, contiguous)
        if (
            rows is None
            or x.dtype != base.a_dtype
            or x.shape[-1] != base.k
            or not fused.fits(m, w.chunks, w.kb)
        ):
            return split(x, skip, gamma, nbias, b, scales, zero_points, g_idx, bias)
        total = xp.empty(x.shape, x.dtype) if want_sum else None
        tables = base.tables(b, scales, zero_points)[:3]
        norm = (skip, rows, nbias, gamma, total, eps)
        y = fused(x, m, n_out, base.k, tables, base.layout, base.bias_for(bias), norm)
        return (y.reshape(x.shape[:-1] + (n_out,)), total)[:width]

    return run
