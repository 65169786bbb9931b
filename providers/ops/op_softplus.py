from onnxep.providers.kernel import kernel

from . import elementwise as ew


@kernel("Softplus", since=(1, 22))
def softplus(node, xp):
    return ew.unary(xp, lambda x: ew.softplus(xp, x), ew.HALF_FLOATS)
