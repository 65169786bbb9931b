from onnxep.providers.kernel import kernel

from .elementwise import binary


@kernel("GreaterOrEqual", since=(12, 16))
def greater_or_equal(node, xp):
    return binary(node, xp, xp.greater_equal, cast_back=False)
