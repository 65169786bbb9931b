from onnxep.providers.kernel import kernel

from .elementwise import binary


@kernel("Greater", since=(1, 7, 9, 13))
def greater(node, xp):
    return binary(node, xp, xp.greater, cast_back=False)
