from onnxep.providers.kernel import kernel

from .elementwise import binary


@kernel("Xor", since=(1, 7))
def xor(node, xp):
    return binary(node, xp, xp.logical_xor)
