from onnxep.providers.kernel import kernel

from .indices import check_nd_shapes, checked_index_tuples
from .shape import check_reduction, scatter


@kernel("ScatterND", since=(11, 16))
def scatter_nd(node, xp):
    reduction = node.attr("reduction", "none") if node.opset >= 16 else "none"
    check_reduction("ScatterND", reduction)

    def run(data, indices, updates):
        check_nd_shapes("ScatterND", data.shape, indices.shape)
        k = indices.shape[-1]
        want = (*indices.shape[:-1], *data.shape[k:])
        if tuple(updates.shape) != want:
            raise ValueError(
                f"ScatterND: updates shape {list(updates.shape)} must be indices.shape[:-1] + "
                f"data.shape[{k}:] = {list(want)}"
            )
        checked = checked_index_tuples(xp, indices, data.shape[:k], "ScatterND")
        out = data.copy()  # inputs may be shared constants: never write them
        batch = indices.ndim - 1
        tail = data.ndim - k
        # index arrays for the addressed axes, aranges for the sliced trailing ones
        lead = [checked[..., i].reshape(indices.shape[:-1] + (1,) * tail) for i in range(k)]
        rest = [
            xp.arange(data.shape[d]).reshape(
                (1,) * (batch + d - k) + (-1,) + (1,) * (data.ndim - d - 1)
            )
            for d in range(k, data.ndim)
        ]
        index = tuple(lead + rest)
        return (scatter(xp, out, index, updates, reduction),)

    return run
