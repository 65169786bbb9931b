"""onnxep::NormMatMulNBits: an RMS norm (with a skip, or without) and the MatMulNBits reading it.

Inputs ``(x, skip?, gamma, norm_bias?, B, scales, zero_points?, g_idx?, bias?)``, outputs
``(y, sum?)``, attributes ``epsilon`` and onnxep::MatMulNBits's (``K``, ``N``, ``bits``,
``block_size``, ``accuracy_level``, ``activation``; ``norm_prologue`` describes the
layout). The generic kernel is the two nodes' generic kernels in sequence; the CUDA kernel
normalises in the tensor-core GEMV's prologue.
"""

from __future__ import annotations

from typing import Any

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from . import norm_prologue as P
from . import op_onnxep_matmul_nbits
from .op_onnxep_norm_matmul_nt import norm_builder


@kernel("NormMatMulNBits", domain="onnxep", dtypes=("float", "float16", "bfloat16"))
def norm_matmul_nbits(node: NodeInfo, xp: Any):
    sub = P.gemv_node(node, "MatMulNBits", "onnxep")
    gemv = op_onnxep_matmul_nbits.matmul_nbits(sub, xp)
    return P.split_runner(node, norm_builder(node, xp), gemv)
