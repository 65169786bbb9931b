from onnxep.providers.kernel import kernel

from .elementwise import unary


@kernel("Abs", since=(1, 6, 13))
def abs(node, xp):
    return unary(xp, xp.abs)
