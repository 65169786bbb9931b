from onnxep.providers.kernel import kernel

from .elementwise import unary


@kernel("Neg", since=(1, 6, 13))
def neg(node, xp):
    return unary(xp, xp.negative)
