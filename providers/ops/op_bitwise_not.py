from onnxep.providers.kernel import kernel

from .elementwise import unary


# ``invert`` is the name NumPy and CuPy share for bitwise NOT.
@kernel("BitwiseNot", since=18)
def bitwise_not(node, xp):
    return unary(xp, xp.invert)
