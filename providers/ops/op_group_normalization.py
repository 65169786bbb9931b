"""GroupNormalization: opset 18 takes scale/bias per group, opset 21 per channel."""

from onnxep.providers.kernel import kernel

from .reduce import compute_dtype, moments, stash_dtype


@kernel("GroupNormalization", since=(18, 21))
def group_normalization(node, xp):
    eps = float(node.attr("epsilon", 1e-5))
    groups = int(node.attr("num_groups"))
    per_group = node.opset < 21

    def run(x, scale, bias):
        n, c = x.shape[0], x.shape[1]
        if c % groups:
            raise ValueError(f"GroupNormalization: {c} channels do not split into {groups} groups")
        sdt = stash_dtype(node, x.dtype)
        xg = xp.reshape(x.astype(sdt, copy=False), (n, groups, -1))
        mean, var = moments(xg, (2,), xp)
        normalized = xp.reshape((xg - mean) / xp.sqrt(var + eps), x.shape)
        normalized = normalized.astype(x.dtype, copy=False)
        cdt = compute_dtype(x.dtype)
        s, b = scale.astype(cdt, copy=False), bias.astype(cdt, copy=False)
        # Opset 18 scale/bias hold one value per group; spread them over its channels.
        if per_group and s.shape[0] == groups and groups != c:
            s = xp.repeat(s, c // groups)
            b = xp.repeat(b, c // groups)
        pshape = (c,) + (1,) * (x.ndim - 2)
        y = normalized.astype(cdt, copy=False) * xp.reshape(s, pshape) + xp.reshape(b, pshape)
        return (y.astype(x.dtype, copy=False),)

    return run
