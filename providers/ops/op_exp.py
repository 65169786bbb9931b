from onnxep.providers.kernel import kernel

from .elementwise import unary


@kernel("Exp", since=(1, 6, 13))
def exp(node, xp):
    return unary(xp, xp.exp)
