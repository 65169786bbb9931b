from onnxep.providers.kernel import kernel

from .elementwise import unary


@kernel("Relu", since=(1, 6, 13, 14))
def relu(node, xp):
    return unary(xp, lambda x: xp.maximum(x, 0))
