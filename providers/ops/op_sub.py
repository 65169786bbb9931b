from onnxep.providers.kernel import kernel

from .elementwise import binary


@kernel("Sub", since=(1, 6, 7, 13, 14))
def sub(node, xp):
    return binary(node, xp, xp.subtract)
