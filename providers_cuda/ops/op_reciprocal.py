"""Reciprocal: float32/float16 in one raw kernel launch; other cases via the generic kernel."""

from onnxep.providers.kernel import kernel
from onnxep.providers.ops import op_reciprocal as generic

from .fast import fast_unary


@kernel("Reciprocal", since=(1, 6, 13))
def reciprocal(node, xp):
    return fast_unary("reciprocal", node, xp, generic.reciprocal)
