from onnxep.providers.kernel import kernel

from ._shape import check_reduction, norm_indices, scatter


@kernel("ScatterND", since=(11, 16))
def scatter_nd(node, xp):
    reduction = node.attr("reduction", "none") if node.opset >= 16 else "none"
    check_reduction("ScatterND", reduction)

    def run(data, indices, updates):
        out = data.copy()  # inputs may be shared constants: never write them
        k = indices.shape[-1]
        batch = indices.ndim - 1
        tail = data.ndim - k
        # index arrays for the addressed axes, aranges for the sliced trailing ones
        lead = [
            norm_indices(xp, indices[..., i], data.shape[i]).reshape(
                indices.shape[:-1] + (1,) * tail
            )
            for i in range(k)
        ]
        rest = [
            xp.arange(data.shape[d]).reshape(
                (1,) * (batch + d - k) + (-1,) + (1,) * (data.ndim - d - 1)
            )
            for d in range(k, data.ndim)
        ]
        index = tuple(lead + rest)
        return (scatter(xp, out, index, updates, reduction),)

    return run
