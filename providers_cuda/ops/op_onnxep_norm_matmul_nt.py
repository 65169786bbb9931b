"""onnxep::NormMatMulNT on CUDA: the RMS norm in the warp-per-output GEMV's prologue.

Rows and operands the prologue and the GEMV take (``norm_fold``; ``gemv_nt_cuda``'s
routing rule, with the normalised rows within its staging budget) run one launch: every
block normalises the rows as ``norm_rows`` does, block 0 writes the residual sum, and the
GEMV (bias and SwiGLU in its epilogue) reads the normalised rows from shared memory.
Anything else (an LM head the rule gives to cuBLAS, prefill rows) runs the norm's CUDA
kernel, then onnxep::MatMulNT's, as the unfused nodes did.
"""

from __future__ import annotations

from typing import Any

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo
from onnxep.providers.ops import norm_prologue as P
from onnxep.providers.ops.fused import FLOATS
from onnxep.providers.ops.op_onnxep_matmul_nt import activation, check_operands

from . import op_onnxep_matmul_nt, op_simplified_layer_normalization
from . import op_skip_simplified_layer_normalization as skip_norm
from . import reduce_cuda as K
from .gemv_nt_cuda import GemvNT, norm_fits
from .norm_fold import prologue_skip_rows, rows_of


def norm_builder(node: NodeInfo, xp: Any):
    """The CUDA kernel of the norm part (``norm_rows``, or the generic kernel where it does
    not take the operands)."""
    sub = P.norm_node(node)
    if P.has_skip(node):
        return skip_norm.skip_simplified_layer_normalization(sub, xp)
    return op_simplified_layer_normalization.simplified_layer_normalization(sub, xp)


@kernel("NormMatMulNT", domain="onnxep", dtypes=FLOATS)
def norm_matmul_nt(node: NodeInfo, xp: Any):
    sub = P.gemv_node(node, "MatMulNT", "onnxep")
    gemv = op_onnxep_matmul_nt.matmul_nt(sub, xp)
    split = P.split_runner(node, norm_builder(node, xp), gemv)
    dtypes = K.dtypes_for(node.input_dtype(0))
    if not dtypes:
        return split
    act = activation(node)
    swiglu = act == "swiglu"
    fused = GemvNT(xp, node.input_dtype(0), norm=True)
    eps = P.epsilon(node)
    want_sum = node.has_output(1)
    width = max(node.num_outputs, 1)
    contiguous = K.contiguity_test(xp)

    def run(x, skip, gamma, nbias, wt, bias=None):
        rows = prologue_skip_rows(x, skip, gamma, nbias, contiguous)
        if (
            rows is None
            or (bias is not None and (bias.dtype != x.dtype or not contiguous(bias)))
            or not fused.takes(x, wt, swiglu)
            or not norm_fits(rows_of(x), x.shape[-1], x.dtype)
        ):
            return split(x, skip, gamma, nbias, wt, bias)
        check_operands(sub, x, wt, bias, act)
        total = xp.empty(x.shape, x.dtype) if want_sum else None
        y = fused(x, wt, bias, swiglu, (skip, rows, nbias, gamma, total, eps))
        return (y, total)[:width]

    return run
