from onnxep.providers.kernel import kernel

from .elementwise import unary


@kernel("Tan", since=(7, 22))
def tan(node, xp):
    return unary(xp, xp.tan)
