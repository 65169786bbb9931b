from onnxep.providers.kernel import kernel

from . import elementwise as ew


@kernel("Sigmoid", since=(1, 6, 13))
def sigmoid(node, xp):
    return ew.unary(xp, lambda x: ew.sigmoid(xp, x), ew.HALF_FLOATS)
