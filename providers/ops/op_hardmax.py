"""Hardmax: one-hot of the first maximum; before opset 13 over the input seen as 2-D at ``axis``."""

from onnxep.providers.kernel import kernel

from .reduce import norm_axis


@kernel("Hardmax", since=(1, 11, 13))
def hardmax(node, xp):
    legacy = node.opset < 13
    axis = int(node.attr("axis", 1 if legacy else -1))

    def run(x):
        shape = x.shape
        a = norm_axis(axis, x.ndim, "Hardmax")
        if legacy:
            outer = 1
            for d in shape[:a]:
                outer *= d
            x2 = xp.reshape(x, (outer, -1) if outer else (0, 0))
            a2 = 1
        else:
            x2, a2 = x, a
        n = x2.shape[a2]
        if n == 0 or x2.size == 0:
            return (xp.zeros(shape, dtype=x.dtype),)
        idx = xp.argmax(x2, axis=a2, keepdims=True)
        iota_shape = [1] * x2.ndim
        iota_shape[a2] = n
        iota = xp.reshape(xp.arange(n, dtype=idx.dtype), tuple(iota_shape))
        y = (iota == idx).astype(x.dtype)
        return (xp.reshape(y, shape),)

    return run
