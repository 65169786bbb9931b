from onnxep.providers.kernel import kernel

from .elementwise import unary


@kernel("Reciprocal", since=(1, 6, 13))
def reciprocal(node, xp):
    return unary(xp, xp.reciprocal)
