from onnxep.providers.kernel import kernel

from .elementwise import variadic


@kernel("Min", since=(1, 6, 8, 12, 13))
def min(node, xp):
    return variadic(xp, xp.minimum)
