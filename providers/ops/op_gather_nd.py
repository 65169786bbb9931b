import math

from onnxep.providers.kernel import kernel

from .indices import check_nd_shapes, checked_index_tuples


@kernel("GatherND", since=(11, 12))
def gather_nd(node, xp):
    batch_dims = node.attr("batch_dims", 0) if node.opset >= 12 else 0

    def run(x, indices):
        b = batch_dims
        check_nd_shapes("GatherND", x.shape, indices.shape, b)
        k = indices.shape[-1]
        bshape = x.shape[:b]
        nb = math.prod(bshape)
        data = xp.reshape(x, (nb, *x.shape[b:]))
        idx = checked_index_tuples(xp, indices, x.shape[b : b + k], "GatherND", first_axis=b)
        idx = xp.reshape(idx, (nb, math.prod(indices.shape[b:-1]), k))
        # one index array per indexed axis, plus the batch row it belongs to
        cols = [idx[..., i] for i in range(k)]
        rows = xp.arange(nb).reshape(nb, 1)
        picked = data[(rows, *cols)]
        return (xp.reshape(picked, (*indices.shape[:-1], *x.shape[b + k :])),)

    return run
