"""Det: determinant of the trailing square matrices."""

from onnxep.providers.kernel import kernel

from .reduce import widen


@kernel("Det", since=(11, 22))
def det(node, xp):
    def run(x):
        y = xp.linalg.det(widen(x, xp))
        return (xp.asarray(y).astype(x.dtype, copy=False),)

    return run
