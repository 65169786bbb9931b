"""MeanVarianceNormalization: (X - E[X]) / (sqrt(E[X^2] - E[X]^2) + 1e-9) over ``axes``."""

from onnxep.providers.kernel import kernel

from .reduce import norm_axes, widen


@kernel("MeanVarianceNormalization", since=(9, 13))
def mean_variance_normalization(node, xp):
    axes_attr = node.attr("axes", [0, 2, 3])

    def run(x):
        axes = norm_axes(axes_attr, x.ndim, "MeanVarianceNormalization")
        xc = widen(x, xp)
        mean = xp.mean(xc, axis=axes, keepdims=True)
        # The spec's function form: variance as E[X^2] - E[X]^2, epsilon added to the std.
        var = xp.mean(xc * xc, axis=axes, keepdims=True) - mean * mean
        y = (xc - mean) / (xp.sqrt(xp.maximum(var, 0)) + 1e-9)
        return (y.astype(x.dtype, copy=False),)

    return run
