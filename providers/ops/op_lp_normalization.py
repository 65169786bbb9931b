"""LpNormalization: X divided by its L1 or L2 norm along ``axis``."""

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel

from .reduce import norm_axis, widen


@kernel("LpNormalization", since=(1, 22))
def lp_normalization(node, xp):
    axis = int(node.attr("axis", -1))
    p = int(node.attr("p", 2))
    if p not in (1, 2):
        raise NotSupported(f"LpNormalization: p={p}; the spec allows only 1 or 2")

    def run(x):
        a = norm_axis(axis, x.ndim, "LpNormalization")
        xc = widen(x, xp)
        if p == 1:
            norm = xp.sum(xp.abs(xc), axis=a, keepdims=True)
        else:
            norm = xp.sqrt(xp.sum(xc * xc, axis=a, keepdims=True))
        # A zero norm gives 0, not 0/0 (the ONNX tests expect this).
        safe = xp.where(norm == 0, xp.ones((), dtype=norm.dtype), norm)
        y = xp.where(norm == 0, xp.zeros((), dtype=xc.dtype), xc / safe)
        return (y.astype(x.dtype, copy=False),)

    return run
