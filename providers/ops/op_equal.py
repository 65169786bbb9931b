from onnxep.providers.kernel import kernel

from .elementwise import binary


# Strings are object arrays on the CPU, which ``equal`` compares too.
@kernel("Equal", since=(1, 7, 11, 13, 19))
def equal(node, xp):
    return binary(node, xp, xp.equal, cast_back=False)
