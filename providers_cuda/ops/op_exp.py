"""Exp: float32/float16 through one raw kernel launch; other cases through the generic kernel."""

from onnxep.providers.kernel import kernel
from onnxep.providers.ops import op_exp as generic

from .fast import fast_unary


@kernel("Exp", since=(1, 6, 13))
def exp(node, xp):
    return fast_unary("exp", node, xp, generic.exp)
