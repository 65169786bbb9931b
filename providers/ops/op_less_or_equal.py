from onnxep.providers.kernel import kernel

from .elementwise import binary


@kernel("LessOrEqual", since=(12, 16))
def less_or_equal(node, xp):
    return binary(node, xp, xp.less_equal, cast_back=False)
