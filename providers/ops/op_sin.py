from onnxep.providers.kernel import kernel

from .elementwise import unary


@kernel("Sin", since=(7, 22))
def sin(node, xp):
    return unary(xp, xp.sin)
