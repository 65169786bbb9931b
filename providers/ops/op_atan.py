from onnxep.providers.kernel import kernel

from .elementwise import unary


@kernel("Atan", since=(7, 22))
def atan(node, xp):
    return unary(xp, xp.arctan)
