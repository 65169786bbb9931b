from onnxep.providers.kernel import kernel

from .elementwise import binary


def _trunc_div(xp):
    """Integer division rounding toward zero (C semantics), as ONNX Div does."""

    def f(a, b):
        q = xp.floor_divide(a, b)
        if a.dtype.kind == "u":
            return q
        # floor and trunc differ where the division is inexact and the signs differ.
        fix = (xp.remainder(a, b) != 0) & ((a < 0) != (b < 0))
        return q + fix.astype(q.dtype)

    return f


@kernel("Div", since=(1, 6, 7, 13, 14))
def div(node, xp):
    dt = node.input_dtype(0)
    if dt is not None and dt.kind in "iu":
        return binary(node, xp, _trunc_div(xp))
    if dt is not None:
        # the ufunc itself, which the executor calls directly and may run in place
        return binary(node, xp, xp.divide)

    def f(a, b):
        if a.dtype.kind in "iu":
            return _trunc_div(xp)(a, b)
        return xp.divide(a, b)

    return binary(node, xp, f)
