"""FusedConv on NumPy: Conv, then ``+ Z`` and an activation, on the fresh output.

com.microsoft FusedConv is the op onnxruntime's Conv+Activation and Conv+Add+Relu
fusions emit; onnxep::FusedConv is the same node with the activations onnxruntime's
does not define (HardSwish, SiLU, ClipSwish: see ``conv_epilogue``), which only the
CPU provider's ``fuse_conv_activation`` emits. Running them here saves one or more
full passes over every convolution output; the depthwise loop applies the
activation as it writes each row.
"""

from __future__ import annotations

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel
from onnxep.providers.ops.nn import str_attr

from .conv_epilogue import NAMES, Epilogue
from .op_conv import build_conv

#: com.microsoft FusedConv's activations (onnxruntime's); onnxep::FusedConv takes every one.
MS_NAMES = ("Relu", "Clip", "HardSigmoid", "LeakyRelu", "Sigmoid", "Tanh")


def _add_z(y, z):
    if z is not None:
        y += z.astype(y.dtype, copy=False)


def _build(node, names):
    name = str_attr(node, "activation", "")
    if name and name not in names:
        raise NotSupported(
            f"{node.domain or 'ai.onnx'} FusedConv: activation {name!r} is not supported "
            f"(known: {', '.join(names)})"
        )
    epilogue = Epilogue(name, node.attr("activation_params", None)) if name else None
    return build_conv(node, _add_z, epilogue=epilogue)


@kernel("FusedConv", since=1, domain="com.microsoft")
def fused_conv(node, xp):
    return _build(node, MS_NAMES)


@kernel("FusedConv", since=1, domain="onnxep")
def fused_conv_onnxep(node, xp):
    return _build(node, NAMES)
