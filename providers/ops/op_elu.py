from onnxep.providers.kernel import kernel

from .elementwise import HALF_FLOATS, unary


@kernel("Elu", since=(1, 6, 22))
def elu(node, xp):
    alpha = float(node.attr("alpha", 1.0))
    # expm1 of the clamped input: exact near 0 and no overflow for large x.
    return unary(xp, lambda x: xp.where(x < 0, alpha * xp.expm1(xp.minimum(x, 0)), x), HALF_FLOATS)
