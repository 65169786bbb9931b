from onnxep.providers.kernel import kernel

from .elementwise import unary


@kernel("Tanh", since=(1, 6, 13))
def tanh(node, xp):
    return unary(xp, xp.tanh)
