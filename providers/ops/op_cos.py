from onnxep.providers.kernel import kernel

from .elementwise import unary


@kernel("Cos", since=(7, 22))
def cos(node, xp):
    return unary(xp, xp.cos)
