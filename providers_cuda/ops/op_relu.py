"""Relu: float32/float16 through one raw kernel launch; other cases through the generic kernel."""

from onnxep.providers.kernel import kernel
from onnxep.providers.ops import op_relu as generic

from .fast import fast_unary


@kernel("Relu", since=(1, 6, 13, 14))
def relu(node, xp):
    return fast_unary("relu", node, xp, generic.relu)
