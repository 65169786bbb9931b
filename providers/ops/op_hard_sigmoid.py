from onnxep.providers.kernel import kernel

from .elementwise import HALF_FLOATS, unary


@kernel("HardSigmoid", since=(1, 6, 22))
def hard_sigmoid(node, xp):
    alpha = float(node.attr("alpha", 0.2))
    beta = float(node.attr("beta", 0.5))
    return unary(xp, lambda x: xp.minimum(xp.maximum(alpha * x + beta, 0), 1), HALF_FLOATS)
