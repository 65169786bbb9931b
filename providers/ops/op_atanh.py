from onnxep.providers.kernel import kernel

from .elementwise import unary


@kernel("Atanh", since=(9, 22))
def atanh(node, xp):
    return unary(xp, xp.arctanh)
