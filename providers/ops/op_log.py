from onnxep.providers.kernel import kernel

from .elementwise import unary


@kernel("Log", since=(1, 6, 13))
def log(node, xp):
    return unary(xp, xp.log)
