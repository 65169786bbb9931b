from onnxep.providers.kernel import kernel

from .elementwise import unary


@kernel("LeakyRelu", since=(1, 6, 16))
def leaky_relu(node, xp):
    alpha = float(node.attr("alpha", 0.01))
    return unary(xp, lambda x: xp.where(x < 0, x * alpha, x))
