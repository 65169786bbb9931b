"""LayerNormalization (opset 17): normalize over dims ``axis..``, with Mean/InvStdDev outputs."""

from onnxep.providers.dtypes import np_dtype
from onnxep.providers.kernel import kernel

from .reduce import compute_dtype, moments, norm_axis, out_dtype, stash_dtype


@kernel("LayerNormalization", since=17)
def layer_normalization(node, xp):
    axis = int(node.attr("axis", -1))
    eps = float(node.attr("epsilon", 1e-5))
    want_mean, want_inv = node.has_output(1), node.has_output(2)
    stat_dt = out_dtype(
        node, 1, out_dtype(node, 2, compute_dtype(np_dtype(int(node.attr("stash_type", 1)))))
    )

    def run(x, scale, bias=None):
        sdt = stash_dtype(node, x.dtype)
        a = norm_axis(axis, x.ndim, "LayerNormalization")
        axes = tuple(range(a, x.ndim))
        xc = x.astype(sdt, copy=False)
        mean, var = moments(xc, axes, xp)
        inv = 1 / xp.sqrt(var + eps)
        normalized = ((xc - mean) * inv).astype(x.dtype, copy=False)
        # Stage two runs in X's type (widened for half floats) per the spec.
        cdt = compute_dtype(x.dtype)
        y = normalized.astype(cdt, copy=False) * scale.astype(cdt, copy=False)
        if bias is not None:
            y = y + bias.astype(cdt, copy=False)
        outs = [y.astype(x.dtype, copy=False)]
        if want_mean or want_inv:
            outs.append(mean.astype(stat_dt, copy=False) if want_mean else None)
            outs.append(inv.astype(stat_dt, copy=False) if want_inv else None)
        return tuple(outs)

    return run
