from onnxep.providers.kernel import kernel

from .elementwise import HALF_FLOATS, unary


@kernel("Celu", since=(12, 28))
def celu(node, xp):
    alpha = float(node.attr("alpha", 1.0))

    def f(x):
        return xp.maximum(x, 0) + alpha * xp.expm1(xp.minimum(x, 0) / alpha)

    return unary(xp, f, HALF_FLOATS)
