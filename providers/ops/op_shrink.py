from onnxep.providers.kernel import kernel

from .elementwise import F32, F64, NARROW_FLOATS


@kernel("Shrink", since=9)
def shrink(node, xp):
    lambd = float(node.attr("lambd", 0.5))
    bias = float(node.attr("bias", 0.0))

    def run(x):
        dt = x.dtype
        # Integer inputs meet the float attributes in float64, then truncate back.
        w = x.astype(F32) if dt in NARROW_FLOATS else x.astype(F64) if dt.kind in "iu" else x
        y = xp.where(w < -lambd, w + bias, xp.where(w > lambd, w - bias, 0))
        return (xp.asarray(y).astype(dt),)

    return run
