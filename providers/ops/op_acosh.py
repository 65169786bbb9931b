from onnxep.providers.kernel import kernel

from .elementwise import unary


@kernel("Acosh", since=(9, 22))
def acosh(node, xp):
    return unary(xp, xp.arccosh)
