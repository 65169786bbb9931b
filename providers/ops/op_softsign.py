from onnxep.providers.kernel import kernel

from .elementwise import HALF_FLOATS, unary


@kernel("Softsign", since=(1, 22))
def softsign(node, xp):
    return unary(xp, lambda x: x / (1 + xp.abs(x)), HALF_FLOATS)
