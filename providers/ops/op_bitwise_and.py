from onnxep.providers.kernel import kernel

from .elementwise import binary


@kernel("BitwiseAnd", since=18)
def bitwise_and(node, xp):
    return binary(node, xp, xp.bitwise_and)
