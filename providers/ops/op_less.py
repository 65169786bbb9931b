from onnxep.providers.kernel import kernel

from .elementwise import binary


@kernel("Less", since=(1, 7, 9, 13))
def less(node, xp):
    return binary(node, xp, xp.less, cast_back=False)
