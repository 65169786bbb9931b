from onnxep.providers.kernel import kernel

from .elementwise import unary


@kernel("Sign", since=(9, 13))
def sign(node, xp):
    return unary(xp, xp.sign)
