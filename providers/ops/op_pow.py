from onnxep.providers.kernel import kernel

from .elementwise import F32, F64, NARROW_FLOATS, align_legacy, legacy_axis


def _int_pow(xp, x, y):
    """Integer power with integer exponents; negative exponents truncate like 1 / x**-y."""
    neg = y < 0
    r = xp.power(x, xp.where(neg, 0, y).astype(x.dtype))
    if y.dtype.kind == "u" or x.dtype.kind == "u":
        return r
    # 1 / x**k truncates to 0 except for x = +-1 (x = 0 is undefined).
    odd = (y % 2) != 0
    inv = xp.where(x == 1, 1, xp.where(x == -1, xp.where(odd, -1, 1), 0)).astype(x.dtype)
    return xp.where(neg, inv, r)


@kernel("Pow", since=(1, 7, 12, 13, 15))
def pow_(node, xp):
    axis = legacy_axis(node)

    # The result keeps the base's dtype whatever the exponent's.
    def run(x, y):
        if axis is not None:
            y = align_legacy(y, x.ndim, axis)
        dt = x.dtype
        if dt in NARROW_FLOATS:
            return (xp.asarray(xp.power(x.astype(F32), y.astype(F32))).astype(dt),)
        if dt.kind == "f":
            return (xp.asarray(xp.power(x, y.astype(dt))),)
        if y.dtype.kind in "iu":
            return (xp.asarray(_int_pow(xp, x, y)),)
        return (xp.asarray(xp.power(x.astype(F64), y.astype(F64))).astype(dt),)

    return run
