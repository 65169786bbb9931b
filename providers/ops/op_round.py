from onnxep.providers.kernel import kernel

from .elementwise import unary


# xp.round rounds halves to even, as ONNX Round does.
@kernel("Round", since=(11, 22))
def round(node, xp):
    return unary(xp, xp.round)
