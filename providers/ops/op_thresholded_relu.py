from onnxep.providers.kernel import kernel

from .elementwise import unary


@kernel("ThresholdedRelu", since=(10, 22))
def thresholded_relu(node, xp):
    alpha = float(node.attr("alpha", 1.0))
    return unary(xp, lambda x: xp.where(x > alpha, x, 0))
