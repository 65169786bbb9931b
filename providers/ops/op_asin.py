from onnxep.providers.kernel import kernel

from .elementwise import unary


@kernel("Asin", since=(7, 22))
def asin(node, xp):
    return unary(xp, xp.arcsin)
