"""onnxep::MatMulNBits: com.microsoft MatMulNBits, then (``activation="swiglu"``) the SwiGLU.

The inputs and attributes are com.microsoft MatMulNBits's, plus ``activation``:
``"none"``, or ``"swiglu"``, where the weight holds the gate rows then the up rows
(N = 2H) and the output is ``silu(gate) * up`` of width H, as onnxep::MatMulNT's
(``fuse_quantized_swiglu`` makes it from a joined gate/up MatMulNBits and the packed
onnxep::SwiGLU after it). The generic kernel is those two nodes' generic kernels in
sequence.
"""

from __future__ import annotations

from typing import Any

from onnxep.errors import InvalidModel
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from . import op_matmul_nbits, op_onnxep_swiglu
from .op_onnxep_matmul_nt import activation


def plain_node(node: NodeInfo) -> NodeInfo:
    """The com.microsoft MatMulNBits the node multiplies with (its attributes, no activation)."""
    attrs = {k: v for k, v in node.attrs.items() if k != "activation"}
    return NodeInfo("MatMulNBits", "com.microsoft", node.name, 1, attrs, node.inputs,
                    node.outputs, opsets=node.opsets)  # fmt: skip


def check_swiglu(node: NodeInfo) -> None:
    """A SwiGLU's gate and up halves need an even N."""
    n = int(node.attr("N"))
    if n % 2:
        raise InvalidModel(
            f"onnxep::MatMulNBits node {node.name!r}: activation 'swiglu' takes gate rows then "
            f"up rows, an even N; got N = {n}"
        )


@kernel("MatMulNBits", domain="onnxep", dtypes=("float", "float16", "bfloat16"))
def matmul_nbits(node: NodeInfo, xp: Any):
    act = activation(node)
    gemm = op_matmul_nbits.matmul_nbits(plain_node(node), xp)
    if act == "none":
        return gemm
    check_swiglu(node)
    swiglu = op_onnxep_swiglu.swiglu(node, xp)

    def run(*inputs: Any) -> tuple:
        return swiglu(gemm(*inputs)[0])

    return run
