"""onnxep::NormMatMulNT: an RMS norm (with a skip, or without) and the MatMulNT that reads it.

Inputs ``(x, skip?, gamma, norm_bias?, Wt, bias?)``, outputs ``(y, sum?)``, attributes
``epsilon`` and MatMulNT's ``activation`` (``norm_prologue`` describes the layout). The
generic kernel is the two nodes' generic kernels in sequence, so it gives what they gave;
the CUDA kernel normalises in the GEMV's prologue.
"""

from __future__ import annotations

from typing import Any

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from . import norm_prologue as P
from . import op_onnxep_matmul_nt, op_simplified_layer_normalization
from . import op_skip_simplified_layer_normalization as skip_norm
from .fused import FLOATS


def norm_builder(node: NodeInfo, xp: Any):
    """The generic kernel of the norm part."""
    sub = P.norm_node(node)
    if P.has_skip(node):
        return skip_norm.skip_simplified_layer_normalization(sub, xp)
    return op_simplified_layer_normalization.simplified_layer_normalization(sub, xp)


@kernel("NormMatMulNT", domain="onnxep", dtypes=FLOATS)
def norm_matmul_nt(node: NodeInfo, xp: Any):
    gemv = op_onnxep_matmul_nt.matmul_nt(P.gemv_node(node, "MatMulNT", "onnxep"), xp)
    return P.split_runner(node, norm_builder(node, xp), gemv)
