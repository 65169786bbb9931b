from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel

from .elementwise import binary


@kernel("BitShift", since=(11, 28))
def bit_shift(node, xp):
    direction = node.attr("direction")
    if isinstance(direction, bytes):
        direction = direction.decode()
    if direction not in ("LEFT", "RIGHT"):
        raise NotSupported(f"BitShift: direction must be LEFT or RIGHT, got {direction!r}")
    left = direction == "LEFT"

    # A shift by a negative amount or by the bit width or more is undefined in
    # C (and so on a GPU); ONNX gives what sign extension alone produces.
    def f(x, y):
        bits = x.dtype.itemsize * 8
        ok = (y >= 0) & (y < bits)
        s = xp.where(ok, y, 0).astype(x.dtype)
        if left:
            return xp.where(ok, xp.left_shift(x, s), 0).astype(x.dtype)
        fill = xp.where(x < 0, -1, 0) if x.dtype.kind == "i" else 0
        return xp.where(ok, xp.right_shift(x, s), fill).astype(x.dtype)

    return binary(node, xp, f)
