"""Sigmoid: float32/float16 in one raw kernel launch; other cases via the generic kernel."""

from onnxep.providers.kernel import kernel
from onnxep.providers.ops import op_sigmoid as generic

from .fast import fast_unary


@kernel("Sigmoid", since=(1, 6, 13))
def sigmoid(node, xp):
    return fast_unary("sigmoid", node, xp, generic.sigmoid)
