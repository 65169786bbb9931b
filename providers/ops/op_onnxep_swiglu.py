"""onnxep::SwiGLU: SiLU(gate) * up, each step rounded to the storage type as the unfused nodes.

Two inputs ``(gate, up)`` broadcast as Mul does. One input is the packed
form ``fuse_shared_input_matmuls`` makes from the gate and up projections:
its last axis holds gate then up, in two equal halves.
"""

from __future__ import annotations

from typing import Any

from onnxep.errors import InvalidArgument
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from . import op_mul
from .fused import FLOATS
from .op_silu import silu


def split_packed(gu: Any) -> tuple[Any, Any]:
    """The gate and up halves of a packed input's last axis."""
    n = gu.shape[-1] if gu.ndim else 0
    if gu.ndim == 0 or n % 2:
        raise InvalidArgument(
            f"onnxep::SwiGLU with one input takes gate and up packed along the last axis, "
            f"which must have an even size; got shape {tuple(gu.shape)}"
        )
    return gu[..., : n // 2], gu[..., n // 2 :]


@kernel("SwiGLU", domain="onnxep", dtypes=FLOATS)
def swiglu(node: NodeInfo, xp: Any):
    act = silu(node, xp)
    mul = op_mul.mul(node, xp)

    def run(gate, up=None):
        if up is None:
            gate, up = split_packed(gate)
        return mul(act(gate)[0], up)

    return run
