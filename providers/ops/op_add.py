from onnxep.providers.kernel import kernel

from .elementwise import binary


@kernel("Add", since=(1, 6, 7, 13, 14))
def add(node, xp):
    return binary(node, xp, xp.add)
