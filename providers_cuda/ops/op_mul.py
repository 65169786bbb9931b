"""Mul: float32/float16 through one raw kernel launch; other cases through the generic kernel."""

from onnxep.providers.kernel import kernel
from onnxep.providers.ops import op_mul as generic

from .fast import fast_binary


@kernel("Mul", since=(1, 6, 7, 13, 14))
def mul(node, xp):
    return fast_binary("mul", node, xp, generic.mul)
