"""Neg: float32/float16 through one raw kernel launch; other cases through the generic kernel."""

from onnxep.providers.kernel import kernel
from onnxep.providers.ops import op_neg as generic

from .fast import fast_unary


@kernel("Neg", since=(1, 6, 13))
def neg(node, xp):
    return fast_unary("neg", node, xp, generic.neg)
