from onnxep.providers.kernel import kernel

from .elementwise import unary


@kernel("Not", since=1)
def not_(node, xp):
    return unary(xp, xp.logical_not)
