"""Abs: float32/float16 through one raw kernel launch; other cases through the generic kernel."""

from onnxep.providers.kernel import kernel
from onnxep.providers.ops import op_abs as generic

from .fast import fast_unary


@kernel("Abs", since=(1, 6, 13))
def abs(node, xp):
    return fast_unary("abs", node, xp, generic.abs)
