from onnxep.providers.kernel import kernel

from .elementwise import HALF_FLOATS, unary


@kernel("HardSwish", since=(14, 22))
def hard_swish(node, xp):
    # x * HardSigmoid(x) with alpha = 1/6, beta = 0.5.
    return unary(xp, lambda x: x * xp.minimum(xp.maximum(x / 6 + 0.5, 0), 1), HALF_FLOATS)
