from onnxep.providers.kernel import kernel

from .elementwise import F32, NARROW_FLOATS


@kernel("PRelu", since=(1, 6, 7, 9, 16))
def p_relu(node, xp):
    legacy = node.opset < 7

    def run(x, slope):
        if legacy and slope.ndim == 1 and x.ndim > 2 and slope.shape[0] == x.shape[1] != 1:
            # Before opset 7 a 1-D slope was per channel (axis 1).
            slope = slope.reshape((-1,) + (1,) * (x.ndim - 2))
        dt = x.dtype
        if dt in NARROW_FLOATS:
            xf = x.astype(F32)
            return (xp.where(xf < 0, xf * slope.astype(F32), xf).astype(dt),)
        return (xp.asarray(xp.where(x < 0, x * slope, x)).astype(dt),)

    return run
