from onnxep.providers.kernel import kernel

from .elementwise import unary


@kernel("Sqrt", since=(1, 6, 13))
def sqrt(node, xp):
    return unary(xp, xp.sqrt)
