"""Tanh: float32/float16 through one raw kernel launch; other cases through the generic kernel."""

from onnxep.providers.kernel import kernel
from onnxep.providers.ops import op_tanh as generic

from .fast import fast_unary


@kernel("Tanh", since=(1, 6, 13))
def tanh(node, xp):
    return fast_unary("tanh", node, xp, generic.tanh)
