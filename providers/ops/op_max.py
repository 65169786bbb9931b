from onnxep.providers.kernel import kernel

from .elementwise import variadic


@kernel("Max", since=(1, 6, 8, 12, 13))
def max(node, xp):
    return variadic(xp, xp.maximum)
