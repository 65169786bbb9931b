from onnxep.providers.kernel import kernel

from .elementwise import binary


@kernel("BitwiseOr", since=18)
def bitwise_or(node, xp):
    return binary(node, xp, xp.bitwise_or)
