from onnxep.providers.kernel import kernel

from .elementwise import unary


@kernel("Floor", since=(1, 6, 13))
def floor(node, xp):
    return unary(xp, xp.floor)
