from onnxep.providers.kernel import kernel

from .elementwise import binary


@kernel("And", since=(1, 7))
def and_(node, xp):
    return binary(node, xp, xp.logical_and)
