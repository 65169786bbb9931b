"""InstanceNormalization: per (sample, channel) statistics over the spatial dims."""

from onnxep.providers.kernel import kernel

from .reduce import compute_dtype, moments


@kernel("InstanceNormalization", since=(1, 6, 22))
def instance_normalization(node, xp):
    eps = float(node.attr("epsilon", 1e-5))

    def run(x, scale, bias):
        cdt = compute_dtype(x.dtype)
        xc = x.astype(cdt, copy=False)
        axes = tuple(range(2, x.ndim))
        pshape = (x.shape[1],) + (1,) * (x.ndim - 2)
        mean, var = moments(xc, axes, xp)
        s = xp.reshape(scale.astype(cdt, copy=False), pshape)
        b = xp.reshape(bias.astype(cdt, copy=False), pshape)
        y = (xc - mean) / xp.sqrt(var + eps) * s + b
        return (y.astype(x.dtype, copy=False),)

    return run
