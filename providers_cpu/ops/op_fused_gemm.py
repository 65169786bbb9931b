"""com.microsoft FusedGemm: Gemm followed by an activation, as onnxruntime's Gemm fusion emits.

``activation`` names the op (Relu, LeakyRelu, Sigmoid, Tanh, HardSigmoid, Clip) and
``activation_alpha``/``activation_beta`` its parameters.
"""

from __future__ import annotations

from typing import Any

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel
from onnxep.providers.ops.inplace_activation import inplace_activation
from onnxep.providers.ops.nn import str_attr

from .op_gemm import gemm


@kernel("FusedGemm", since=1, domain="com.microsoft", dtypes=("float",))
def fused_gemm(node: Any, xp: Any):
    name = str_attr(node, "activation", "")
    params = [
        node.attr(k)
        for k in ("activation_alpha", "activation_beta")
        if node.attr(k, None) is not None
    ]
    act = inplace_activation(xp, name, params) if name else None
    if name and act is None:
        raise NotSupported(f"FusedGemm: activation {name!r} is not supported")
    base = gemm(node, xp)

    def run(a, b, c=None):
        (y,) = base(a, b, c)
        y = y.copy() if y is a or y is b or y is c else y
        if act is not None:
            act(y)
        return (y,)

    return run
