from onnxep.providers.kernel import kernel

from ._elementwise import HALF_FLOATS, unary


@kernel("Selu", since=(1, 6, 22))
def selu(node, xp):
    alpha = float(node.attr("alpha", 1.67326319217681884765625))
    gamma = float(node.attr("gamma", 1.05070102214813232421875))

    def f(x):
        return gamma * xp.where(x > 0, x, alpha * xp.expm1(xp.minimum(x, 0)))

    return unary(xp, f, HALF_FLOATS)
