from onnxep.providers.kernel import kernel

from .elementwise import unary


@kernel("Asinh", since=(9, 22))
def asinh(node, xp):
    return unary(xp, xp.arcsinh)
