from onnxep.providers.kernel import kernel

from .elementwise import HALF_FLOATS, unary


@kernel("Selu", since=(1, 6, 22))
def selu(node, xp):
    # Selu-1 had rounder defaults; opset 6 gave the exact self-normalizing constants.
    if node.opset < 6:
        alpha0, gamma0 = 1.6732, 1.0507
    else:
        alpha0, gamma0 = 1.67326319217681884765625, 1.05070102214813232421875
    alpha = float(node.attr("alpha", alpha0))
    gamma = float(node.attr("gamma", gamma0))

    def f(x):
        return gamma * xp.where(x > 0, x, alpha * xp.expm1(xp.minimum(x, 0)))

    return unary(xp, f, HALF_FLOATS)
