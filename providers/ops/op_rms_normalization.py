"""RMSNormalization (opset 23): X / sqrt(mean(X^2 over dims axis..) + epsilon) * scale."""

from onnxep.providers.kernel import kernel

from .reduce import compute_dtype, norm_axis, stash_dtype


@kernel("RMSNormalization", since=23)
def rms_normalization(node, xp):
    axis = int(node.attr("axis", -1))
    eps = float(node.attr("epsilon", 1e-5))

    def run(x, scale):
        sdt = stash_dtype(node, x.dtype)
        a = norm_axis(axis, x.ndim, "RMSNormalization")
        xc = x.astype(sdt, copy=False)
        ms = xp.mean(xc * xc, axis=tuple(range(a, x.ndim)), keepdims=True)
        normalized = (xc / xp.sqrt(ms + eps)).astype(x.dtype, copy=False)
        cdt = compute_dtype(x.dtype)
        y = normalized.astype(cdt, copy=False) * scale.astype(cdt, copy=False)
        return (y.astype(x.dtype, copy=False),)

    return run
