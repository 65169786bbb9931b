import math

from onnxep.providers.kernel import kernel

from ._shape import norm_indices


@kernel("GatherND", since=(11, 12))
def gather_nd(node, xp):
    batch_dims = node.attr("batch_dims", 0) if node.opset >= 12 else 0

    def run(x, indices):
        b = batch_dims
        k = indices.shape[-1]
        bshape = x.shape[:b]
        nb = math.prod(bshape)
        data = xp.reshape(x, (nb, *x.shape[b:]))
        idx = xp.reshape(indices, (nb, math.prod(indices.shape[b:-1]), k))
        # one index array per indexed axis, plus the batch row it belongs to
        cols = [norm_indices(xp, idx[..., i], x.shape[b + i]) for i in range(k)]
        rows = xp.arange(nb).reshape(nb, 1)
        picked = data[(rows, *cols)]
        return (xp.reshape(picked, (*indices.shape[:-1], *x.shape[b + k :])),)

    return run
