from onnxep.providers.kernel import kernel

from .elementwise import binary


@kernel("Mul", since=(1, 6, 7, 13, 14))
def mul(node, xp):
    return binary(node, xp, xp.multiply)
