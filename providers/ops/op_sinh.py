from onnxep.providers.kernel import kernel

from .elementwise import unary


@kernel("Sinh", since=(9, 22))
def sinh(node, xp):
    return unary(xp, xp.sinh)
