from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel

from .elementwise import binary


@kernel("Mod", since=(10, 13, 28))
def mod(node, xp):
    fmod = node.attr("fmod", 0)
    if fmod not in (0, 1):
        raise NotSupported(f"Mod: fmod must be 0 or 1, got {fmod}")
    # fmod takes the dividend's sign (C fmod); remainder takes the divisor's
    # (Python %), which is ONNX's A - floor(A / B) * B with its special cases.
    return binary(node, xp, xp.fmod if fmod else xp.remainder)
