from onnxep.providers.kernel import kernel

from . import elementwise as ew


@kernel("Swish", since=24)
def swish(node, xp):
    alpha = float(node.attr("alpha", 1.0))
    return ew.unary(xp, lambda x: x * ew.sigmoid(xp, alpha * x), ew.HALF_FLOATS)
