"""onnxep::MatMulNT(A, Wt, bias?) = A @ Wt^T (+ bias), optionally with the SwiGLU after it.

``Wt`` is a 2-D ``[N, K]`` weight: the transpose of a MatMul's ``[K, N]``
constant, made once at session creation by ``fuse_transposed_weights`` so a
GEMV reads each output's weights as one contiguous row. Attribute
``activation``: ``"none"``, or ``"swiglu"``, where ``Wt`` holds the gate rows
then the up rows (N = 2H) and the output is ``silu(gate) * up`` of width H.

The generic kernel is the unfused nodes' generic kernels in sequence (MatMul
on ``Wt``'s transposed view, the bias Add, the packed onnxep::SwiGLU), each
rounded to the storage type as those nodes round. The BLAS reads the view
with its transpose flag, which may sum in another order than on the ``[K, N]``
copy: equal within tolerance, not always byte for byte.
"""

from __future__ import annotations

from typing import Any

from onnxep.errors import InvalidArgument, InvalidModel
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from . import op_add, op_mat_mul, op_onnxep_swiglu
from .fused import FLOATS

ACTIVATIONS = ("none", "swiglu")


def activation(node: NodeInfo) -> str:
    """The node's ``activation`` attribute, checked."""
    act = node.attrs.get("activation", "none")
    if isinstance(act, bytes):
        act = act.decode()
    if act not in ACTIVATIONS:
        raise InvalidModel(
            f"{node.domain or 'onnxep'}::{node.op_type} node {node.name!r}: activation must be "
            f"one of {', '.join(ACTIVATIONS)}; got {act!r}"
        )
    return act


def check_operands(node: NodeInfo, a: Any, wt: Any, bias: Any, act: str) -> None:
    """Raise a clear error for operands the op does not take (any provider's kernel)."""
    where = f"onnxep::MatMulNT node {node.name!r}"
    if wt.ndim != 2:
        raise InvalidArgument(f"{where}: Wt must be a 2-D [N, K] matrix; got shape {wt.shape}")
    if a.ndim < 1 or a.shape[-1] != wt.shape[1]:
        raise InvalidArgument(
            f"{where}: A's last axis must be K = Wt.shape[1] = {wt.shape[1]}; "
            f"got A of shape {tuple(a.shape)}"
        )
    if bias is not None and (bias.ndim != 1 or bias.shape[0] != wt.shape[0]):
        raise InvalidArgument(
            f"{where}: bias must be a vector of N = {wt.shape[0]} values; "
            f"got shape {tuple(bias.shape)}"
        )
    if act == "swiglu" and wt.shape[0] % 2:
        raise InvalidArgument(
            f"{where}: activation 'swiglu' takes gate rows then up rows, an even N; "
            f"got N = {wt.shape[0]}"
        )


@kernel("MatMulNT", domain="onnxep", dtypes=FLOATS)
def matmul_nt(node: NodeInfo, xp: Any):
    act = activation(node)
    matmul = op_mat_mul.mat_mul(node, xp)
    add = op_add.add(node, xp)
    swiglu = op_onnxep_swiglu.swiglu(node, xp)

    def run(a, wt, bias=None):
        check_operands(node, a, wt, bias, act)
        y = matmul(a, wt.T)[0]
        if bias is not None:
            y = add(y, bias)[0]
        if act == "swiglu":
            y = swiglu(y)[0]
        return (y,)

    return run
