from onnxep.providers.kernel import kernel

from .elementwise import unary


@kernel("Cosh", since=(9, 22))
def cosh(node, xp):
    return unary(xp, xp.cosh)
