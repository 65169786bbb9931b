from onnxep.providers.kernel import kernel

from .elementwise import binary


@kernel("Or", since=(1, 7))
def or_(node, xp):
    return binary(node, xp, xp.logical_or)
