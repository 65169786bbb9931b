from onnxep.providers.kernel import kernel

from .elementwise import binary


@kernel("BitwiseXor", since=18)
def bitwise_xor(node, xp):
    return binary(node, xp, xp.bitwise_xor)
