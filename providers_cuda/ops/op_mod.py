"""Mod with fmod=0 on floats: NumPy's remainder exactly (CuPy's differs at infinities and zeros).

NumPy computes ``fmod(a, b)`` and moves it to the divisor's sign, keeping a
zero's sign from the divisor; CuPy's ``remainder`` goes through
``a - floor(a / b) * b``, which turns ``remainder(-1, inf)`` into NaN where
NumPy (and the ONNX suite) give ``inf``. float16 is computed in float32, as
NumPy's float16 loop does. Integers and fmod=1 use the generic kernel.
"""

from onnxep.providers.kernel import kernel
from onnxep.providers.ops import op_mod as generic

_BODY = """
    C x = (C)a, y = (C)b;
    C r = fmod(x, y);
    if (y != 0) {
        if (r != 0) {
            if ((y < 0) != (r < 0)) r += y;
        } else {
            r = copysign((C)0, y);
        }
    }
    out = (T)r;
"""
_kernels: dict[str, object] = {}


def _kernel(compute: str):
    import cupy

    k = _kernels.get(compute)
    if k is None:
        k = _kernels[compute] = cupy.ElementwiseKernel(
            "T a, T b",
            "T out",
            f"typedef {compute} C;" + _BODY,
            f"onnxep_np_remainder_{compute}",
        )
    return k


@kernel("Mod", since=(10, 13, 28))
def mod(node, xp):
    fallback = generic.mod(node, xp)
    if node.attr("fmod", 0):
        return fallback
    kernels = {
        "float16": _kernel("float"),
        "float32": _kernel("float"),
        "float64": _kernel("double"),
    }

    def run(a, b):
        k = kernels.get(a.dtype.name)
        if k is None or b.dtype != a.dtype:
            return fallback(a, b)
        return (k(a, b),)

    return run
