from onnxep.providers.kernel import kernel

from .elementwise import unary


@kernel("Acos", since=(7, 22))
def acos(node, xp):
    return unary(xp, xp.arccos)
