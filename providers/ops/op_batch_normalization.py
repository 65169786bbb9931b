"""BatchNormalization, inference and training forms, every opset.

Training mode (``training_mode=1`` from opset 14; earlier, extra outputs
requested and ``is_test`` not set) normalizes with the batch statistics and
returns the updated running statistics, whatever ``momentum`` says.
"""

from onnxep.providers.kernel import kernel

from .reduce import compute_dtype, moments


@kernel("BatchNormalization", since=(1, 6, 7, 9, 14, 15))
def batch_normalization(node, xp):
    eps = float(node.attr("epsilon", 1e-5))
    momentum = float(node.attr("momentum", 0.9))
    # spatial=0 (before opset 9): one statistic per (C, D1, ..., Dn) element.
    spatial = bool(node.attr("spatial", 1)) if node.opset < 9 else True
    if node.opset >= 14:
        training = bool(node.attr("training_mode", 0))
    else:
        training = node.has_output(1) and not (node.opset < 7 and node.attr("is_test", 0))
    legacy_outputs = node.opset < 14

    def run(x, scale, bias, mean, var):
        cdt = compute_dtype(x.dtype)
        xc = x.astype(cdt, copy=False)
        rank = x.ndim
        if spatial:
            pshape = (x.shape[1],) + (1,) * max(rank - 2, 0)
            axes = tuple(i for i in range(rank) if i != 1)
        else:
            pshape = tuple(x.shape[1:])
            axes = (0,)

        def p(v):
            return xp.reshape(v.astype(cdt, copy=False), pshape)

        if training:
            bmean, bvar = moments(xc, axes, xp)
            bmean = xp.reshape(bmean, pshape)
            bvar = xp.reshape(bvar, pshape)
            use_mean, use_var = bmean, bvar
        else:
            use_mean, use_var = p(mean), p(var)
        y = (xc - use_mean) / xp.sqrt(use_var + eps) * p(scale) + p(bias)
        y = y.astype(x.dtype, copy=False)
        if not training:
            return (y,)
        run_mean = p(mean) * momentum + bmean * (1 - momentum)
        run_var = p(var) * momentum + bvar * (1 - momentum)
        outs = [
            y,
            xp.reshape(run_mean, mean.shape).astype(mean.dtype, copy=False),
            xp.reshape(run_var, var.shape).astype(var.dtype, copy=False),
        ]
        if legacy_outputs:
            outs.append(xp.reshape(bmean, mean.shape).astype(mean.dtype, copy=False))
            outs.append(xp.reshape(bvar, var.shape).astype(var.dtype, copy=False))
        return tuple(outs)

    return run
