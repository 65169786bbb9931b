from onnxep.providers.kernel import kernel

from .elementwise import unary


@kernel("Ceil", since=(1, 6, 13))
def ceil(node, xp):
    return unary(xp, xp.ceil)
