"""com.microsoft FusedConv on NumPy: Conv, then ``+ Z`` and an activation, in place.

The op onnxruntime's Conv+Activation and Conv+Add+Relu fusions emit; running
them here saves one or two full passes over every convolution output.
"""

from __future__ import annotations

import numpy as np

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel
from onnxep.providers.ops.nn import str_attr

from .op_conv import build_conv


def activation(name: str, params):
    """An in-place activation on a float array, or None for an unknown name."""
    p = [float(v) for v in (params or [])]
    if name == "Relu":
        return lambda y: np.maximum(y, 0, out=y)
    if name == "LeakyRelu":
        a = p[0] if p else 0.01
        return lambda y: np.multiply(y, np.where(y < 0, y.dtype.type(a), y.dtype.type(1)), out=y)
    if name == "Sigmoid":

        def sigmoid(y):
            np.negative(y, out=y)
            np.exp(y, out=y)
            y += 1
            np.reciprocal(y, out=y)

        return sigmoid
    if name == "Tanh":
        return lambda y: np.tanh(y, out=y)
    if name == "Clip":
        lo = p[0] if len(p) > 0 else -np.inf
        hi = p[1] if len(p) > 1 else np.inf
        return lambda y: np.clip(y, lo, hi, out=y)
    if name == "HardSigmoid":
        a = p[0] if len(p) > 0 else 0.2
        b = p[1] if len(p) > 1 else 0.5

        def hard_sigmoid(y):
            y *= a
            y += b
            np.clip(y, 0, 1, out=y)

        return hard_sigmoid
    return None


@kernel("FusedConv", since=1, domain="com.microsoft")
def fused_conv(node, xp):
    name = str_attr(node, "activation", "")
    act = activation(name, node.attr("activation_params", None)) if name else None
    if name and act is None:
        raise NotSupported(f"FusedConv: activation {name!r} is not supported")

    def post(y, z):
        if z is not None:
            y += z.astype(y.dtype, copy=False)
        if act is not None:
            act(y)

    return build_conv(node, post)
