from onnxep.providers.kernel import kernel

from . import elementwise as ew


@kernel("Mish", since=(18, 22))
def mish(node, xp):
    return ew.unary(xp, lambda x: x * xp.tanh(ew.softplus(xp, x)), ew.HALF_FLOATS)
