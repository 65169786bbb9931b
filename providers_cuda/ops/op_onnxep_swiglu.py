"""onnxep::SwiGLU on CUDA: one launch of ``swiglu_k`` for (gate, up) or the packed input.

Broadcast or strided operands and other dtypes run the CUDA Sigmoid and Mul kernels one
after the other (the packed input split first), which is what the unfused nodes ran.
"""

from __future__ import annotations

from typing import Any

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo
from onnxep.providers.ops.fused import FLOATS
from onnxep.providers.ops.op_onnxep_swiglu import split_packed

from . import op_mul, op_sigmoid
from .fused_cuda import swiglu_runner


@kernel("SwiGLU", domain="onnxep", dtypes=FLOATS)
def swiglu(node: NodeInfo, xp: Any):
    sigmoid, mul = op_sigmoid.sigmoid(node, xp), op_mul.mul(node, xp)

    def unfused(gate, up=None):
        if up is None:
            gate, up = split_packed(gate)
        return mul(mul(gate, sigmoid(gate)[0])[0], up)

    return swiglu_runner(node, xp, unfused)
