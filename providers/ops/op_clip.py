from onnxep.providers.kernel import kernel

from .elementwise import F32, NARROW_FLOATS


def _clip(xp, x, lo, hi):
    # max then min: where min > max every value becomes max, as ONNX says.
    dt = x.dtype
    narrow = dt in NARROW_FLOATS
    y = x.astype(F32) if narrow else x
    if lo is not None:
        y = xp.maximum(y, lo.astype(y.dtype, copy=False) if hasattr(lo, "astype") else lo)
    if hi is not None:
        y = xp.minimum(y, hi.astype(y.dtype, copy=False) if hasattr(hi, "astype") else hi)
    return (xp.asarray(y).astype(dt) if narrow else xp.asarray(y),)


@kernel("Clip", since=(1, 6))
def clip_attrs(node, xp):
    lo = node.attr("min", None)
    hi = node.attr("max", None)
    lo = None if lo is None else float(lo)
    hi = None if hi is None else float(hi)

    def run(x):
        return _clip(xp, x, lo, hi)

    return run


@kernel("Clip", since=(11, 12, 13))
def clip(node, xp):
    def run(x, lo=None, hi=None):
        return _clip(xp, x, lo, hi)

    return run
