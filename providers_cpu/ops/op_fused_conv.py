"""com.microsoft FusedConv on NumPy: Conv, then ``+ Z`` and an activation, in place.

The op onnxruntime's Conv+Activation and Conv+Add+Relu fusions emit; running
them here saves one or two full passes over every convolution output.
"""

from __future__ import annotations

import numpy as np

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel
from onnxep.providers.ops.inplace_activation import inplace_activation
from onnxep.providers.ops.nn import str_attr

from .op_conv import build_conv


@kernel("FusedConv", since=1, domain="com.microsoft")
def fused_conv(node, xp):
    name = str_attr(node, "activation", "")
    act = inplace_activation(np, name, node.attr("activation_params", None)) if name else None
    if name and act is None:
        raise NotSupported(f"FusedConv: activation {name!r} is not supported")

    def post(y, z):
        if z is not None:
            y += z.astype(y.dtype, copy=False)
        if act is not None:
            act(y)

    return build_conv(node, post)
